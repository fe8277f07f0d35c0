"""Module paths of recorded ops: forward hooks in forward, autograd sequence numbers in backward.

In forward, the innermost module whose ``forward`` is running names the op (global forward pre /
post hooks keep a stack). In backward, the autograd node running names it: every forward op's node
got the sequence number ``torch.autograd._get_sequence_nr() - 1`` when it was created, and the
recorder maps that number to the forward module (:meth:`ModulePaths.map_sequence`); ``AccumulateGrad``
nodes carry no sequence number and are named by the parameter they accumulate into
(``docs/capture.md``, "Interception", item 5).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

__all__ = ["ModulePaths"]


class ModulePaths:
    """Names modules as they run and answers "which module issued the op being dispatched"."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}
        self._param_names: dict[int, str] = {}
        self._stack: list[Any] = []
        self._keep: dict[int, Any] = {}  # named modules stay alive, so their ids stay theirs
        self._hooks: list[Any] = []
        self.seq2mod: dict[int, str] = {}
        """Autograd sequence number of a forward op's node -> its module path (reset per iteration)."""

    def install(self) -> None:
        self._hooks = [
            register_module_forward_pre_hook(self._pre),
            register_module_forward_hook(self._post, always_call=True),
        ]

    def uninstall(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _name(self, mod: Any) -> str:
        name = self._names.get(id(mod))
        if name is None:
            parent = self._stack[-1] if self._stack else None
            name = ""
            if parent is not None:
                pname = self._names.get(id(parent), "")
                # Direct child, or deeper (a layer of a ModuleList the parent iterates itself).
                for child_name, child in parent.named_modules(remove_duplicate=False):
                    if child is mod and child_name:
                        name = f"{pname}.{child_name}" if pname else child_name
                        break
                else:
                    name = f"{pname}.{type(mod).__name__}" if pname else type(mod).__name__
            self._names[id(mod)] = name
            self._keep[id(mod)] = mod
            for pn, p in mod.named_parameters(recurse=False):
                self._param_names[id(p)] = f"{name}.{pn}" if name else pn
        return name

    def _pre(self, mod: Any, args: Any) -> None:
        self._name(mod)
        self._stack.append(mod)

    def _post(self, mod: Any, args: Any, out: Any) -> None:
        if self._stack:
            self._stack.pop()

    def path(self, in_backward: bool) -> str:
        """The module path of the op being dispatched ("" outside any module)."""
        if in_backward:
            node = torch._C._current_autograd_node()
            if node is None:
                return ""
            var = getattr(node, "variable", None)
            if var is not None:  # AccumulateGrad: the parameter being accumulated
                return self._param_names.get(id(var), "")
            return self.seq2mod.get(node._sequence_nr(), "")
        if not self._stack:
            return ""
        return self._names.get(id(self._stack[-1]), "")

    def map_sequence(self, in_backward: bool, module: str) -> None:
        """Remember ``module`` for the autograd node the forward op being dispatched just created."""
        if not in_backward:
            seq = torch.autograd._get_sequence_nr() - 1
            if seq >= 0 and seq not in self.seq2mod:
                self.seq2mod[seq] = module
