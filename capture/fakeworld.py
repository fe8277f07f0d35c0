"""The fake world: what torchrun would set and torch's ``fake`` process group at the full world size.

One CPU process plays rank ``r`` of a ``world_size`` job. Whatever backend the script asks for
(``nccl``, ``gloo``, ...) is routed to the built-in ``fake`` backend at the full world size, so
every process group of the job is created (groups the rank is not in included) and every
collective "succeeds" without moving data. :class:`FakeWorld` also remembers each group's global
ranks and *family* (the groups one loop creates, e.g. all TP groups) so a captured rank's program
can be replayed for the other ranks of its role.

Known limitations: the fake backend does not coalesce (``batch_isend_irecv`` issues separate
ops); we tag the batch so the trace keeps NCCL's grouped launch. The CUDA device the script
sees is :mod:`capture.fakecuda`'s.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch.distributed as dist

from capture.groupdesc import dim_of_desc

__all__ = ["GroupRecord", "FakeWorld", "torchrun_env", "MESH_AXIS_DIMS"]

MESH_AXIS_DIMS = {"fsdp": "dp", "hsdp": "dp", "batch": "dp", "efsdp": "dp"}
"""DeviceMesh axis names that are data parallelism without a ``dp`` prefix (torchtitan's ``fsdp``
= dp_shard x cp and ``batch`` = dp_replicate x dp_shard); other names label by prefix."""

_MESH_DATA_METHODS = ("__init__", "_init_process_groups", "_get_all_submeshes", "_compute_coordinates_from_mesh",
                      "_get_mesh_tensor_from_full_mesh", "mesh", "__repr__", "_concatenate", "from_group",
                      "_sym_get_coordinate")
"""DeviceMesh code that reads its (tiny, integer) rank map back with ``tolist()`` / ``nonzero()``:
run on real tensors (torch 2.13, ``torch/distributed/device_mesh.py``)."""

_MESH_MAKERS = ("init_device_mesh", "_flatten", "_unflatten", "__getitem__")
"""What returns a new DeviceMesh whose named axes label their groups."""


def torchrun_env(rank: int, world_size: int, nproc_per_node: int) -> dict[str, str]:
    """The environment variables torchrun sets for ``rank``."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank % nproc_per_node),
        "LOCAL_WORLD_SIZE": str(nproc_per_node),
        "GROUP_RANK": str(rank // nproc_per_node),
        "NODE_RANK": str(rank // nproc_per_node),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "heterosim-capture",
    }


@dataclass(slots=True)
class GroupRecord:
    """A process group as the capture sees it."""

    gid: str
    ranks: tuple[int, ...]
    family: str
    dim: str = "other"


@dataclass
class FakeWorld:
    """Patches torch.distributed for one fake rank and records every group created."""

    rank: int
    world_size: int
    groups: list[GroupRecord] = field(default_factory=list)
    by_name: dict[str, str] = field(default_factory=dict)
    """torch group_name -> our gid, for groups this rank belongs to."""
    batch_hook: Callable[[bool], None] | None = None
    """Called with True/False around ``batch_isend_irecv`` (the recorder tags the batch)."""
    quiet: Callable[[], Any] = contextlib.nullcontext
    """Context in which the recorder records nothing (set by the runner)."""
    _saved: list[tuple[Any, str, Any]] = field(default_factory=list)
    _family_of_site: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    _family_members: dict[str, set[int]] = field(default_factory=dict)
    _family_dim: dict[str, str] = field(default_factory=dict)
    _last_site: str | None = None

    # ---- group bookkeeping -------------------------------------------------------------------
    def _family_for(self, site: str, ranks: tuple[int, ...], kind: str = "") -> str:
        # Groups created one after another from the same call site form a family, as long as
        # they are disjoint (a family partitions the ranks it covers). ``kind`` (backend and
        # description) keeps apart groups one loop creates in pairs (Megatron's NCCL group and its
        # gloo twin) or one helper creates for every dimension (megatron-core's create_group).
        fams = self._family_of_site.setdefault((site, kind), [])
        if fams and self._last_site == site:
            fam = fams[-1]
            members = self._family_members[fam]
            if members.isdisjoint(ranks):
                members.update(ranks)
                return fam
        fam = f"f{len(self._family_members) - 1}"
        fams.append(fam)
        self._family_members[fam] = set(ranks)
        return fam

    def _register(self, ranks: tuple[int, ...], pg: Any, site: str, backend: Any = None, desc: str | None = None) -> None:
        gid = str(len(self.groups))
        if gid == "0":
            fam = "world"
            self._family_members["world"] = set(ranks)
        else:
            fam = self._family_for(site, ranks, f"{backend}|{desc}")
            dim = dim_of_desc(desc)
            if dim is not None:
                self._family_dim[fam] = dim
        self._last_site = site
        self.groups.append(GroupRecord(gid, ranks, fam, "world" if gid == "0" else self._family_dim.get(fam, "other")))
        if isinstance(pg, dist.ProcessGroup):
            self.by_name[pg.group_name] = gid

    def gid_of(self, pg: Any) -> str:
        """Our id of a process group object (the world group is ``"0"``)."""
        name = pg.group_name
        if name not in self.by_name:
            raise RuntimeError(f"process group {name!r} was not created through the fake world")
        return self.by_name[name]

    def label(self, pg: Any, dim: str) -> None:
        """Record the parallel dimension of ``pg`` (and of its whole family)."""
        if not isinstance(pg, dist.ProcessGroup):
            return  # this rank is not a member: the family gets labelled by a member call
        fam = self.groups[int(self.gid_of(pg))].family
        self._family_dim[fam] = dim  # groups of the family created later get it too
        for g in self.groups:
            if g.family == fam:
                g.dim = dim

    def label_mesh(self, mesh: Any) -> None:
        """Label a DeviceMesh's dimension groups by their names (``dp_shard`` -> dp, ``tp``, ``pp``,
        ``cp``, ``ep``; torchtitan's names, ``fsdp`` and ``batch`` included), so roles and
        breakdowns know them."""
        for name in mesh.mesh_dim_names or ():
            dim = MESH_AXIS_DIMS.get(name) or next(
                (d for d in ("dp", "tp", "pp", "cp", "ep") if name == d or name.startswith(d + "_")), None)
            if dim is not None:
                self.label(mesh.get_group(name), dim)

    # ---- patching ----------------------------------------------------------------------------
    def _patch(self, obj: Any, name: str, value: Any) -> None:
        # getattr_static: a staticmethod or property is restored as itself, not as what it returns
        self._saved.append((obj, name, inspect.getattr_static(obj, name)))
        setattr(obj, name, value)

    def _patch_device_mesh(self) -> None:
        """DeviceMesh bookkeeping runs on real tensors and records nothing; every mesh it makes
        (``init_device_mesh``, ``_unflatten``, ``_flatten``, slicing) labels its axes' groups."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        from torch.distributed import device_mesh

        world = self

        def on_real_tensors(fn: Callable) -> Callable:
            @functools.wraps(fn)
            def run(*args: Any, **kwargs: Any) -> Any:
                with unset_fake_temporarily(), world.quiet():
                    return fn(*args, **kwargs)
            return run

        def labelling(fn: Callable) -> Callable:
            @functools.wraps(fn)
            def make(*args: Any, **kwargs: Any) -> Any:
                mesh = on_real_tensors(fn)(*args, **kwargs)
                world.label_mesh(mesh)
                return mesh
            return make

        cls = device_mesh.DeviceMesh
        for name, wrap in [*((n, on_real_tensors) for n in _MESH_DATA_METHODS), *((n, labelling) for n in _MESH_MAKERS)]:
            owner = device_mesh if name == "init_device_mesh" else cls
            attr = inspect.getattr_static(owner, name, None)
            if isinstance(attr, staticmethod):
                self._patch(owner, name, staticmethod(wrap(attr.__func__)))
            elif isinstance(attr, property):
                self._patch(owner, name, property(wrap(attr.fget)))
            elif attr is not None:
                self._patch(owner, name, wrap(attr))

    @staticmethod
    def _call_site() -> str:
        # The first frame outside torch.distributed and this module names the loop creating groups.
        f = sys._getframe(2)
        while f is not None:
            name = f.f_code.co_filename
            if "torch/distributed" not in name and name != __file__:
                return f"{os.path.basename(name)}:{f.f_lineno}"
            f = f.f_back
        return "?"

    def install(self) -> None:
        """Patch ``init_process_group`` / ``new_group`` / ``batch_isend_irecv`` for the fake world."""
        from torch.testing._internal.distributed.fake_pg import FakeStore

        orig_init = dist.init_process_group
        orig_new = dist.new_group
        orig_batch = dist.batch_isend_irecv
        world = self

        def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> None:
            for k in ("init_method", "store", "world_size", "rank", "backend", "device_id"):
                kwargs.pop(k, None)
            args = ()
            orig_init("fake", store=FakeStore(), world_size=world.world_size, rank=world.rank, **kwargs)
            world._register(tuple(range(world.world_size)), dist.group.WORLD, "init")

        def new_group(ranks: Any = None, *args: Any, **kwargs: Any) -> Any:
            backend = kwargs.pop("backend", args[1] if len(args) > 1 else None)
            kwargs.pop("pg_options", None)
            if args:
                args = (args[0],)  # timeout; a positional backend is dropped
            pg = orig_new(ranks, *args, backend="fake", **kwargs)
            rs = tuple(sorted(ranks)) if ranks is not None else tuple(range(world.world_size))
            world._register(rs, pg, world._call_site(), backend, kwargs.get("group_desc"))
            return pg

        def batch_isend_irecv(p2p_op_list: Any) -> Any:
            if world.batch_hook is not None:
                world.batch_hook(True)
            try:
                return orig_batch(p2p_op_list)
            finally:
                if world.batch_hook is not None:
                    world.batch_hook(False)

        from torch.distributed import device_mesh

        self._patch_ddp()
        self._patch_object_collectives()
        orig_init_mesh = device_mesh.init_device_mesh
        self._patch_device_mesh()
        # Re-exported by name (torch.distributed, torch.distributed.tensor[.device_mesh]): ours everywhere.
        import torch.distributed.tensor as dtensor_mod
        import torch.distributed.tensor.device_mesh as dtensor_mesh_mod

        for mod in (dist, dtensor_mod, dtensor_mesh_mod):
            if getattr(mod, "init_device_mesh", None) is orig_init_mesh:
                self._patch(mod, "init_device_mesh", device_mesh.init_device_mesh)
        # DeviceMesh imported these by name: its per-dimension groups must be ours too.
        self._patch(device_mesh, "new_group", new_group)
        self._patch(device_mesh, "init_process_group", init_process_group)
        self._patch(dist, "init_process_group", init_process_group)
        self._patch(dist, "new_group", new_group)
        self._patch(dist, "batch_isend_irecv", batch_isend_irecv)
        import torch.distributed.distributed_c10d as c10d_mod

        self._patch(c10d_mod, "init_process_group", init_process_group)
        self._patch(c10d_mod, "new_group", new_group)
        self._patch(c10d_mod, "batch_isend_irecv", batch_isend_irecv)

    def _patch_ddp(self) -> None:
        """DistributedDataParallel: skip its cross-rank parameter-shape check, label its group ``dp``.

        The check all-gathers real shape metadata in C++ (it reads tensor data, which fake tensors
        do not have); every rank of a capture runs the same model code, and a rank whose shapes
        differed would show as a collective size mismatch in replay anyway.
        """
        from torch.distributed import utils as dist_utils
        from torch.nn.parallel import distributed as ddp_mod

        def no_check(*args: Any, **kwargs: Any) -> None:
            return None

        self._patch(dist_utils, "_verify_param_shape_across_processes", no_check)
        self._patch(ddp_mod, "_verify_param_shape_across_processes", no_check)
        orig_init = ddp_mod.DistributedDataParallel.__init__
        world = self

        def ddp_init(ddp_self: Any, *args: Any, **kwargs: Any) -> None:
            orig_init(ddp_self, *args, **kwargs)
            world.label(ddp_self.process_group, "dp")

        self._patch(ddp_mod.DistributedDataParallel, "__init__", ddp_init)
        # After its first backward the reducer re-buckets parameters in the order their gradients
        # became ready (first bucket 1 MiB, then bucket_cap_mb), agreeing on that order through a
        # broadcast whose data it reads back (fake tensors have none). Instead the initial buckets
        # get the rebuilt sizes (torch 2.13 starts with one bucket of every parameter), in reverse
        # registration order: the ready order of a model whose layers run in registration order.
        self._patch(dist.Reducer, "_rebuild_buckets", lambda reducer_self: False)
        config = ddp_mod._BucketCapacityConfig
        orig_limits = config.compute_bucket_size_limits

        def limits(cfg: Any, static_graph: bool, find_unused_parameters: bool) -> Any:
            return orig_limits(cfg, static_graph=False, find_unused_parameters=True)

        self._patch(config, "compute_bucket_size_limits", limits)
        orig_assign = dist._compute_bucket_assignment_by_size

        def assign(params: Any, size_limits: Any, *args: Any, **kwargs: Any) -> Any:
            # Fill buckets from the last parameter (ready first in backward), as the rebuild does;
            # DDP reverses the list it gets, so hand it the buckets last-ready first.
            n = len(params)
            buckets, caps = orig_assign(list(reversed(params)), size_limits, *args, **kwargs)
            buckets = [sorted(n - 1 - i for i in b) for b in buckets]
            return buckets[::-1], list(caps)[::-1]

        self._patch(dist, "_compute_bucket_assignment_by_size", assign)

    def _patch_object_collectives(self) -> None:
        """``all_gather_object`` / ``gather_object`` / ``broadcast_object_list`` /
        ``scatter_object_list``: answered as if every rank of the group held this rank's object.

        They pickle Python objects through tensors and read them back, which fake tensors cannot
        do. Every rank of a capture runs the same code (the assumption roles rest on), so the other
        ranks' objects (Megatron's optimizer param-group keys) are copies of this one's. Nothing
        is recorded: these are setup-time host messages, not an iteration's traffic.
        """
        import copy

        import torch.distributed.distributed_c10d as c10d_mod

        def all_gather_object(object_list: list, obj: Any, group: Any = None) -> None:
            object_list[:] = [copy.deepcopy(obj) for _ in object_list]

        def gather_object(obj: Any, object_gather_list: list | None = None, *args: Any, **kwargs: Any) -> None:
            if object_gather_list is not None:
                object_gather_list[:] = [copy.deepcopy(obj) for _ in object_gather_list]

        def broadcast_object_list(object_list: list, *args: Any, **kwargs: Any) -> None:
            return None  # the source's list is taken to equal this rank's

        def scatter_object_list(output: list, inputs: list | None = None, *args: Any, **kwargs: Any) -> None:
            if inputs is not None:  # the source: its own entry (others keep what they passed)
                group = kwargs.get("group")
                output[0] = copy.deepcopy(inputs[dist.get_rank(group) if group is not None else dist.get_rank()])

        for name, fn in (("all_gather_object", all_gather_object), ("gather_object", gather_object),
                         ("broadcast_object_list", broadcast_object_list),
                         ("scatter_object_list", scatter_object_list)):
            self._patch(dist, name, fn)
            self._patch(c10d_mod, name, fn)

    def uninstall(self) -> None:
        """Undo every patch (in reverse order) and tear down the process group."""
        for obj, name, value in reversed(self._saved):
            setattr(obj, name, value)
        self._saved.clear()
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
