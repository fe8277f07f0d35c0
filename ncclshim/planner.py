"""``plan()``: NCCL's choice for one collective call, its uncontended time, and its flows.

Semantics the replay engine relies on (checked by ``tests/test_ncclshim_planner.py``):

- ``Plan.time_s`` is the call's time alone: NCCL's own estimate (``ncclTopoGetAlgoTime``) for the
  NCCL algorithms, except where the algorithm models how the call runs (``Algorithm.run_time``:
  the one-node NVLS all-reduce); for send/recv and all_to_all (no NCCL cost model) it is the same
  form, ``latency + max over links(bytes on link / NCCL link bandwidth)``. Latencies include the
  cluster's stated link latencies beyond their defaults (``ncclshim.graph.extra_latency_us``).
- ``Plan.flows`` move ``Flow.bytes`` *payload* bytes each. Phases run in order; flows of one phase
  start together. Run on an idle network, with every flow moving ``bytes / Plan.efficiency`` wire
  bytes and links shared max-min fairly between the plan's own flows (equivalently: each flow at
  its fair share of ``Link.bw`` times ``efficiency``), the phases take
  ``sum over phases of max over links(phase bytes on link / (Link.bw * efficiency))`` and
  ``Plan.latency_s + that == Plan.time_s``. ``efficiency`` folds the protocol's payload fraction
  (LL 1/2, LL128 120/128) and NCCL's achieved-vs-wire ratio into one number in (0, 1]; when
  NCCL's estimate beats the wires (it can for 2-node trees) it is clamped to 1 and
  ``Plan.flow_time_s`` exceeds ``time_s``. ``latency_s`` already holds NCCL's hardware latencies:
  the engine should not add link latencies on top.
- Plans are cached by (collective, size, ranks, dtype, env, root); the NCCL decision by
  (collective, size, group-topology signature), so every TP group of a cluster shares one.
- One-rank groups are not collectives: ``plan`` raises, and callers skip them (``is_trivial``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral
from typing import Mapping, NamedTuple, Sequence

from heterosim.cluster.bandwidth import nccl_nvlink_bw
from heterosim.errors import UnsupportedCollectiveError
from heterosim.trace.vocab import DTYPE_BYTES, P2P
from ncclshim.constants import BASE_LAT_US, COST_COLLECTIVES, HW_LAT_US, PROTO_EFFICIENCY, PROTOS
from ncclshim.flows import FlowSpec, template
from ncclshim.graph import GroupGraph, analyze, extra_latency_us, latency_stated
from ncclshim.topology import TopologyView, per_view
from ncclshim.translate import NodeTranslator
from ncclshim.tuning import Choice, Settings, parse_env, select

__all__ = ["COLLECTIVES", "Flow", "Plan", "Planner", "plan", "is_trivial", "busbw_factor"]

COLLECTIVES: tuple[str, ...] = COST_COLLECTIVES + ("all_to_all",) + P2P
"""What :func:`plan` plans: the trace's collectives (:data:`heterosim.trace.vocab.COLLECTIVES`) but
``barrier``, which runs as an all_reduce (:func:`heterosim.trace.vocab.as_planned`)."""
_P2P_LL_THRESHOLD = 16384  # NCCL_P2P_LL_THRESHOLD, bytes per channel
_P2P_LAT_ROW = "RING"
"""Row of NCCL's latency tables p2p operations are priced with: NCCL has no p2p cost model, so
HeteroSim charges one ring step (base + hop latency); this ignores NCCL's per-peer handshakes."""


class Flow(NamedTuple):
    """Payload bytes from GPU ``src`` to GPU ``dst`` over ``path`` (link ids) in ``phase``.

    NB: an immutable NamedTuple rather than a frozen dataclass because plans hold up to tens of
    thousands of flows and a NamedTuple builds about 3x faster; fields are read by name.
    """

    src: int
    dst: int
    bytes: float
    channel: int
    """Distinct ring/tree (or NVLS head, PAT dimension) the flow belongs to."""
    path: tuple[int, ...]
    phase: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """NCCL's plan for one call (see the module docstring for the time semantics)."""

    collective: str
    nbytes: int
    """nccl-tests' size (whole buffer; gathered output; unscattered input; one rank's a2a send)."""
    ranks: tuple[int, ...]
    algo: str
    proto: str
    nchannels: int
    """Runtime channels (CTAs) NCCL would launch for this size."""
    time_s: float
    latency_s: float
    efficiency: float
    flows: tuple[Flow, ...]
    algbw: float
    """``nbytes / time_s``, B/s."""
    busbw: float
    """``algbw`` times the nccl-tests factor (``busbw_factor``), B/s."""
    bottleneck: int | None
    """Link id with the most bytes per B/s of hardware bandwidth (None when nothing moves)."""
    flow_time_s: float
    """``latency_s`` plus the flows' alone time at ``efficiency`` (equals ``time_s`` unless clamped)."""
    nccl_time_s: float = 0.0
    """NCCL's own estimate (``ncclTopoGetAlgoTime``), which made the choice; equals ``time_s``
    unless the algorithm models how the call runs (one-node NVLS all-reduce)."""


def busbw_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw/algbw factor (``doc/PERFORMANCE.md``; ``docs/nccl.md`` §4)."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective in ("broadcast", "reduce", "send", "recv"):
        return 1.0
    raise UnsupportedCollectiveError(f"unknown collective {collective!r}; valid: {', '.join(COLLECTIVES)}")


def is_trivial(ranks: Sequence[int]) -> bool:
    """True for a one-rank group: nothing moves; callers skip it with zero time."""
    return len(ranks) <= 1


@dataclass(frozen=True, slots=True)
class _Template:
    specs: tuple[FlowSpec, ...]
    wire_per_byte: float
    """Alone time of the flows per byte of nbytes at efficiency 1, s/B."""
    load_per_byte: tuple[tuple[int, float], ...]
    """(link, bytes on it per byte of nbytes), for the NCCL-bandwidth time of p2p operations."""
    bottleneck: int | None
    extra_lat_us: float
    """Largest latency beyond the links' defaults over the flows' paths, us (p2p operations)."""


_CHANNEL_ORDERED = {"RING": 1, "TREE": 2}
"""Algorithms whose template channel ``k`` is NCCL's run-time channel ``k`` for ``k`` below the
template's channel count, with that count per distinct ring of the group (``GroupGraph.rings``):
ring ``k`` of the search (run-time channels repeat the search's rings,
``connect.cc:ncclTopoPostset``) and, for trees, pattern ``k mod R`` of tree ``k div R`` (the second
half of the channels takes the dual tree, ``connectTrees``)."""


def _rescaled(specs: Sequence[FlowSpec], channels: int, used: int) -> tuple[FlowSpec, ...]:
    """Flows of the first ``used`` channels of a ``channels``-channel template (as the RING and
    TREE builders give them, each with its fraction of the full set), each channel now carrying
    ``1/used`` of the buffer instead of ``1/channels``.

    A call smaller than ``channels x threads x threshold`` bytes runs on fewer channels
    (``enqueue.cc:topoGetAlgoInfo``, docs/nccl.md §1.5), so its bytes cross only those channels'
    rings or trees. NB: with ``used`` >= ``channels`` the even spread over the template's channels
    stands for every run-time channel (§7), whether or not ``used`` is a multiple of ``channels``.
    """
    scale = channels / used
    return tuple((a, b, frac * scale, ch, path, ph) for a, b, frac, ch, path, ph in specs)


class Planner:
    """Plans for one topology view, with its caches. ``plan()`` keeps one per view."""

    def __init__(self, view: TopologyView, *, translate: bool = True) -> None:
        self.view = view
        self.translate = translate
        """Plan one-node groups on the first node of their kind and move the plan over
        (:mod:`ncclshim.translate`; equal to planning them where they are)."""
        self._translator = NodeTranslator(view)
        self._graphs: dict[tuple, GroupGraph] = {}
        self._choices: dict[tuple, Choice] = {}
        self._templates: dict[tuple, _Template] = {}
        self._plans: dict[tuple, Plan] = {}
        self._settings: dict[tuple, Settings] = {}
        self._nvswitch = all(n.fabric.kind == "nvswitch" for n in view.nodes)
        self._latency_stated = latency_stated(view)
        """Whether any link's latency differs from its kind's default (else every path's extra is 0)."""

    def plan(self, collective: str, nbytes: int, ranks: Sequence[int], *, env: Mapping[str, str] | None = None,
             dtype: str = "bf16", root: int = 0) -> Plan:
        """See :func:`ncclshim.plan`."""
        ranks_t = ranks if type(ranks) is tuple else tuple(ranks)
        env_key = tuple(sorted(env.items())) if env else ()
        key = (collective, nbytes, ranks_t, dtype, env_key, root)
        hit = self._plans.get(key)
        if hit is not None:
            return hit
        self._validate(collective, nbytes, ranks_t, dtype, root)
        settings = self._settings.get(env_key)
        if settings is None:
            settings = self._settings[env_key] = parse_env(env)
        result = None
        moved = self._translator.source(ranks_t) if self.translate else None
        if moved is not None:  # a one-node group off its kind's first node (ncclshim.translate)
            base = self.plan(collective, nbytes, moved[1], env=env, dtype=dtype, root=root)
            result = self._translator.translate(base, moved[0], ranks_t)
        if result is None:
            result = self._make(collective, int(nbytes), ranks_t, settings, dtype, ranks_t[root])
        self._plans[key] = result
        return result

    def _validate(self, coll: str, nbytes: int, ranks: tuple[int, ...], dtype: str, root: int) -> None:
        if coll not in COLLECTIVES:
            raise UnsupportedCollectiveError(f"unknown collective {coll!r}; valid: {', '.join(COLLECTIVES)}")
        if dtype not in DTYPE_BYTES:
            raise UnsupportedCollectiveError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPE_BYTES)}")
        if len(ranks) < 2:
            raise UnsupportedCollectiveError(
                f"{coll} on a group of {len(ranks)} rank(s) moves nothing; skip one-rank groups "
                "(ncclshim.is_trivial(ranks)) instead of planning them")
        if coll in P2P and len(ranks) != 2:
            raise UnsupportedCollectiveError(f"{coll} takes ranks=(src, dst), got {len(ranks)} ranks")
        if isinstance(nbytes, bool) or not isinstance(nbytes, Integral) or nbytes < 0:
            raise UnsupportedCollectiveError(f"nbytes must be a non-negative integer, got {nbytes!r}")
        n = len(ranks)
        if coll in ("all_gather", "reduce_scatter", "all_to_all") and nbytes % (n * DTYPE_BYTES[dtype]):
            raise UnsupportedCollectiveError(
                f"{coll} of {nbytes} bytes over {n} ranks: the size must be a multiple of ranks x element size "
                f"({n} x {DTYPE_BYTES[dtype]} B for {dtype}); pass the total (gathered / unscattered) buffer size")
        if not 0 <= root < n:
            raise UnsupportedCollectiveError(f"root {root} is not a position in the group of {n} ranks")

    def graph(self, ranks: tuple[int, ...], pxn: bool = True) -> GroupGraph:
        """The communicator analysis for ``ranks`` (cached)."""
        key = (ranks, pxn)
        g = self._graphs.get(key)
        if g is None:
            g = self._graphs[key] = analyze(ranks, self.view, pxn=pxn)
        return g

    def _template(self, coll: str, algo: str, ranks: tuple[int, ...], pxn: bool, root: int,
                  used: int | None = None) -> _Template:
        """The flow template of ``coll`` by ``algo`` over ``ranks`` (cached); with ``used``, the
        template of a call NCCL runs on only its first ``used`` channels (:data:`_CHANNEL_ORDERED`)."""
        key = (coll, algo, ranks, pxn, root if coll in ("broadcast", "reduce") else 0, used)
        t = self._templates.get(key)
        if t is None:
            if used is not None:  # only the used channels' flows are built (a world tree has 10^5)
                g = self.graph(ranks, pxn)
                specs = _rescaled(template(coll, algo, g, self.view, pxn=pxn, root=root, channels=used),
                                  _CHANNEL_ORDERED[algo] * len(g.rings), used)
            elif coll in P2P:  # a single path: no communicator analysis needed
                a, b = ranks
                specs = ((a, b, 1.0, 0, self.view.route(a, b, 0, pxn=pxn), 0),)
            else:
                specs = template(coll, algo, self.graph(ranks, pxn), self.view, pxn=pxn, root=root)
            t = self._templates[key] = self._summarize(specs)
        return t

    def _summarize(self, specs: tuple[FlowSpec, ...]) -> _Template:
        """Link loads, alone time per byte, bottleneck and extra latency of a template's flows."""
        links = self.view.links
        load: dict[int, float] = {}
        phases: dict[int, dict[int, float]] = {}
        if len({sp[5] for sp in specs}) == 1:  # one phase (rings, trees, p2p): its load is the load
            for _, _, frac, _, path, _ in specs:
                for link in path:
                    load[link] = load.get(link, 0.0) + frac
            phases[specs[0][5]] = load
        else:
            for _, _, frac, _, path, phase in specs:
                per = phases.setdefault(phase, {})
                for link in path:
                    per[link] = per.get(link, 0.0) + frac
                    load[link] = load.get(link, 0.0) + frac
        wire = sum(max((b / links[i].bw for i, b in per.items()), default=0.0) for per in phases.values())
        ratio = {i: b / links[i].bw for i, b in load.items()}
        top = max(ratio.values(), default=0.0)
        bottleneck = min((i for i, r in ratio.items() if r >= top * (1 - 1e-9)), default=None)
        # Links at their default latency add nothing: skip the paths when the view has no other.
        extra = (max((extra_latency_us(self.view, p) for p in {sp[4] for sp in specs}), default=0.0)
                 if self._latency_stated else 0.0)
        return _Template(specs, wire, tuple(sorted(load.items())), bottleneck, extra)

    def _p2p_choice(self, coll: str, nbytes: int, n: int, t: _Template, s: Settings) -> Choice:
        """send/recv and all_to_all: NCCL has no cost model; same form, per-peer protocol rule (§1.6)."""
        links = self.view.links
        per_peer = nbytes if coll in P2P else nbytes / n
        net = any(links[i].kind == "net" for i, _ in t.load_per_byte)
        nvl = all(links[i].kind == "nvlink" for i, _ in t.load_per_byte)
        peer_ch = self._peer_channels(t.specs[0][0], t.specs[0][4], net, nvl)
        proto = "LL" if per_peer <= peer_ch * _P2P_LL_THRESHOLD and "LL" in s.protos else "SIMPLE"
        hw = "NET" if net else "NVLINK" if nvl else "PCI"
        p = PROTOS.index(proto)
        hop = max(0.0, HW_LAT_US[hw][_P2P_LAT_ROW][p] + t.extra_lat_us)
        lat = (BASE_LAT_US[_P2P_LAT_ROW][p] + hop) * 1e-6
        slowest = max((f / links[i].model_bw for i, f in t.load_per_byte), default=0.0)
        time = lat + nbytes * slowest / PROTO_EFFICIENCY[proto]
        return Choice(algo="P2P", proto=proto, time_s=time, latency_s=lat, nccl_time_s=time,
                      alg_bw=nbytes / max(time - lat, 1e-30), nchannels=peer_ch)

    def _peer_channels(self, src: int, path: tuple[int, ...], net: bool, nvl: bool) -> int:
        """Channels NCCL gives one peer (``paths.cc:ncclTopoGetNchannels``), a power of two <= 32.

        NVLink peer: ``2 * max(1, pathBw / per-lane NVLink bw)``; network peer:
        ``max(local NICs, ceil(NIC bw / 14 GB/s))``; PCIe peer: 2. NB: the cap uses 32, NCCL's
        ``pow2Up(min(nChannels, 64))`` for the usual 24-32 runtime channels.
        """
        links, gpu = self.view.links, self.view.gpus[src]
        if nvl and path:
            lane = nccl_nvlink_bw(gpu.sm, 1)
            raw = 2 * max(1, round(min(links[i].model_bw for i in path) / lane))
        elif net:
            nic_bw = min((self.view.nics[n].nccl_bw for n in gpu.nics), default=12e9)
            raw = max(len(gpu.nics), math.ceil(nic_bw / 14e9))
        else:
            raw = 2
        return min(32, 1 << (raw.bit_length() - 1))

    def _make(self, coll: str, nbytes: int, ranks: tuple[int, ...], s: Settings, dtype: str, root: int) -> Plan:
        n = len(ranks)
        if nbytes == 0:
            return Plan(collective=coll, nbytes=0, ranks=ranks, algo="NONE", proto="NONE", nchannels=0, time_s=0.0,
                        latency_s=0.0, efficiency=1.0, flows=(), algbw=0.0, busbw=0.0, bottleneck=None,
                        flow_time_s=0.0, nccl_time_s=0.0)
        if coll in COST_COLLECTIVES:
            g = self.graph(ranks, s.pxn)
            sig = _signature(g)
            key = (coll, nbytes, sig, dtype, s, self.view.collnet, self._nvswitch)
            choice = self._choices.get(key)
            if choice is None:
                choice = self._choices[key] = select(coll, nbytes, g, s, dtype=dtype, collnet=self.view.collnet,
                                                     nvswitch=self._nvswitch,
                                                     net_latency_us=self.view.net_latency * 1e6)
            per_ring = _CHANNEL_ORDERED.get(choice.algo, 0)
            used = choice.nchannels if choice.nchannels < per_ring * len(g.rings) else None
            t = self._template(coll, choice.algo, ranks, s.pxn, root, used)
        else:
            t = self._template(coll, "P2P", ranks, s.pxn, root)
            choice = self._p2p_choice(coll, nbytes, n, t, s)
        bw_time = choice.time_s - choice.latency_s
        wire = t.wire_per_byte * nbytes
        eff = min(1.0, wire / bw_time) if bw_time > 0 and wire > 0 else 1.0
        flows = tuple([Flow(a, b, f * nbytes, c, path, ph) for a, b, f, c, path, ph in t.specs])
        algbw = nbytes / choice.time_s
        return Plan(collective=coll, nbytes=nbytes, ranks=ranks, algo=choice.algo, proto=choice.proto,
                    nchannels=choice.nchannels, time_s=choice.time_s, latency_s=choice.latency_s, efficiency=eff,
                    flows=flows, algbw=algbw, busbw=algbw * busbw_factor(coll, n), bottleneck=t.bottleneck,
                    flow_time_s=choice.latency_s + wire / eff, nccl_time_s=choice.nccl_time_s)


def _signature(g: GroupGraph) -> tuple:
    """Everything the NCCL cost model reads from a group: groups with equal signatures tune alike.

    ``len(g.rings)`` is NCCL's ``sameChannels`` (broadcast / reduce latency); the step latencies
    carry the cluster's stated link latencies.
    """
    return (len(g.ranks), g.n_nodes, g.ppn, g.arch, g.same_sm, g.cpu_vendor, g.n_channels, g.bw_intra, g.bw_inter,
            g.runtime_channels, g.type_intra, g.type_inter, g.nvls_channels, g.nvls_bw_intra, g.nvls_bw_inter,
            g.coherent, len(g.rings), g.lat_intra_us, g.lat_inter_us, g.gpu_bw)


def plan(collective: str, nbytes: int, ranks: Sequence[int], topology: TopologyView, *,
         env: Mapping[str, str] | None = None, dtype: str = "bf16", root: int = 0) -> Plan:
    """NCCL's plan for ``collective`` of ``nbytes`` over GPUs ``ranks`` of ``topology``.

    Args:
        collective: one of :data:`COLLECTIVES`.
        nbytes: nccl-tests' size (see :class:`Plan`).
        ranks: GPU indices of the group members in rank order (send/recv: ``(src, dst)``).
        topology: the view; one :class:`Planner` (and its caches) is kept per view object.
        env: NCCL environment overrides (NCCL_ALGO, NCCL_PROTO, NCCL_MIN/MAX_NCHANNELS,
            NCCL_NVLS_ENABLE, NCCL_PXN_DISABLE).
        dtype: element type; sizes of all_gather / reduce_scatter / all_to_all must divide into
            ranks x element size.
        root: position in ``ranks`` of the broadcast / reduce root.

    Raises:
        UnsupportedCollectiveError: unknown collective/dtype/algorithm, a one-rank group, a size
            that does not divide, or no algorithm left by the environment.
        TopologyError: ranks that are not GPUs of the view, or repeat one.

    Example:
        >>> from ncclshim import plan
        >>> from ncclshim.view import preset_view
        >>> p = plan("all_reduce", 1 << 30, range(8), preset_view("dgx-a100"))
        >>> p.algo, p.proto, round(p.busbw / 1e9)
        ('RING', 'SIMPLE', 238)
    """
    planner = per_view("planner", topology, Planner)
    return planner.plan(collective, nbytes, ranks, env=env, dtype=dtype, root=root)
