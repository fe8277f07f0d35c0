"""Activation recomputation through ``torch.utils.checkpoint`` (non-reentrant), tagged for capture.

The recomputed forward runs inside backward when autograd first needs a saved activation; the
``context_fn`` hook wraps exactly that re-run in ``scope(phase="recompute")`` so the capture
labels those ops "recompute" rather than "bwd" (Megatron's ``CheckpointFunction`` re-runs the
forward at the start of the checkpointed region's backward in the same way).

Which parts of a layer are recomputed follows Megatron-core's ``--recompute-granularity selective``
with ``--recompute-modules`` (``TransformerConfig.recompute_modules``, default ``core_attn``), as
its Transformer Engine layer spec places them (:func:`selective_modules`):

- ``core_attn``: the core attention (``attention.py``);
- ``layernorm``: the MoE layers' pre-MLP norm and the MLA layers' input norm; the other norms are
  Transformer Engine's ``LayerNormLinear`` (fused into the next GEMM: ``IdentityOp`` in the spec),
  which Megatron-core does not recompute (``transformer_layer.py``);
- ``mlp``: a dense layer's MLP, its pre-MLP norm included (fused into ``linear_fc1``);
- ``moe``: the whole MoE layer: router, dispatch and combine exchanges (re-run in backward),
  experts, shared experts (``moe_layer.py``);
- ``moe_act``: the experts' activation and routing weighting (``experts.py``);
- ``shared_experts``: the shared experts' MLP;
- ``mla_up_proj``: MLA's query / key-value up projections, their norms and RoPE
  (``multi_latent_attention.py``).

NB: Megatron-core's ``layernorm``, ``moe_act`` and ``mla_up_proj`` discard only their output
(``CheckpointWithoutOutput``) and recompute it right before the backward that needs it; here they
run through the same checkpoint as the others. The kernels and their count are the same (one
forward again in backward); what is held in memory between forward and backward differs by the
checkpointed function's inputs, which stay alive in both.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, Sequence

import torch
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from heterosim.annotate import get_annotator
from heterosim.errors import ConfigError

__all__ = ["RECOMPUTE_MODULES", "recompute", "selective_modules"]

RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp", "moe", "moe_act", "shared_experts", "mla_up_proj")
"""Megatron-core's ``recompute_modules`` choices that are modelled (its others, ``gdn_norm_out``,
``gdp_in_proj``, ``gdp_qkv`` and ``mhc``, belong to layers this model does not build)."""


def _contexts():
    return nullcontext(), get_annotator().scope(phase="recompute")


def recompute(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` whose activations are dropped after forward and recomputed in backward."""
    if not torch.is_grad_enabled():
        return fn(*args)
    # No early stop: Megatron re-runs the whole checkpointed forward, including ops (such as the
    # last TP all-reduce) whose outputs backward does not need.
    with set_checkpoint_early_stop(False):
        return checkpoint(fn, *args, use_reentrant=False, context_fn=_contexts,
                          preserve_rng_state=True, determinism_check="none")


def selective_modules(granularity: str | None, modules: Sequence[str] | None, *, moe: bool,
                      mla: bool) -> tuple[str, ...]:
    """The modules recomputed under ``--recompute-granularity granularity`` with ``--recompute-modules
    modules`` (None: not given). Megatron-core (``TransformerConfig``) rejects unknown names and
    ``mla_up_proj`` without MLA; here a module that would recompute nothing is an error too (Megatron-core
    ignores modules without selective granularity and MoE modules in a dense model), so a flag never
    silently does nothing.

    Raises:
        ConfigError: a module not in :data:`RECOMPUTE_MODULES`, modules without selective
            granularity, ``moe_act`` / ``moe`` / ``shared_experts`` without experts, ``mla_up_proj``
            without multi-latent attention.
    """
    if granularity != "selective":
        if modules is not None:
            raise ConfigError("--recompute-modules needs --recompute-granularity selective, got "
                              f"{granularity!r}")
        return ()
    chosen = tuple(dict.fromkeys(modules if modules is not None else ("core_attn",)))
    bad = [m for m in chosen if m not in RECOMPUTE_MODULES]
    if bad:
        raise ConfigError(f"--recompute-modules {' '.join(bad)}: not a module; valid: {', '.join(RECOMPUTE_MODULES)}")
    if not moe and any(m in chosen for m in ("moe", "moe_act", "shared_experts")):
        raise ConfigError("--recompute-modules moe, moe_act and shared_experts need an MoE model (--num-experts)")
    if "mla_up_proj" in chosen and not mla:
        raise ConfigError("--recompute-modules mla_up_proj needs --multi-latent-attention")
    return chosen
