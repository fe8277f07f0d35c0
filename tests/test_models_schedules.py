"""Pipeline schedules: compute order, p2p pairing and counts, block keys, deadlock freedom.

Every rank of a small pipeline is run in this process in turn, in torch's fake process group
under FakeTensorMode, with a dispatch mode that lists the c10d ops issued and an annotator that
lists the scopes and blocks. The model is a stand-in (a couple of bf16 Linear layers per stage).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from heterosim.errors import ConfigError
from fake_env import TagAnnotator, fake_world
from heterosim import annotate
from models.p2p import PipelineComm
from models.schedules import forward_backward, interleaved_order, one_f_one_b_order

H, S, B, V = 16, 8, 2, 32
SHAPE = (S, B, H)


class Ann(TagAnnotator):
    """Counts compute blocks (``blocks``), p2p blocks (``p2p_blocks``) and scopes; with ``cache``
    it replays blocks like a capture does (outputs: a tensor, None or a tuple of them)."""

    def __init__(self, cache: bool = False) -> None:
        super().__init__()
        self.blocks: list[tuple] = []
        self.p2p_blocks: list[tuple] = []
        self.cache = cache
        self.seen: dict = {}
        self.kinds: list[str] = []

    def block(self, key, fn, *args, bare_key=None, bare_without=None, any_chunk=False, shared_waits=False):
        self.kinds.append(key[0])
        where = self.p2p_blocks if key[0].startswith("p2p") else self.blocks
        where.append((key, self.tags.get("phase"), self.tags.get("mb"), self.tags.get("chunk")))
        if self.cache and key in self.seen:
            return _mimic(self.seen[key])
        out = fn(*args)
        if not _open_comm(out):  # as a capture: a block leaving comm in flight runs every time
            self.seen[key] = _meta(out)
        return out


def _open_comm(out):
    return isinstance(out, list) or (isinstance(out, tuple) and any(map(_open_comm, out)))


def _meta(out):
    if isinstance(out, tuple):
        return tuple(map(_meta, out))
    return None if out is None else ("t", out.shape, out.dtype, out.requires_grad)


def _mimic(meta):
    if meta is None:
        return None
    if meta[0] != "t":
        return tuple(map(_mimic, meta))
    return torch.empty(meta[1], dtype=meta[2], requires_grad=meta[3])


class CommLog(TorchDispatchMode):
    """Lists c10d ops: (op, global peer or group ranks, bytes, phase)."""

    def __init__(self, ann: Ann) -> None:
        super().__init__()
        self.ann = ann
        self.ops: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            pg = next(dist.ProcessGroup.unbox(a) for a in args if isinstance(a, torch.ScriptObject))
            ranks = tuple(dist.get_process_group_ranks(pg))
            name = func._overloadpacket.__name__
            first = args[0][0] if isinstance(args[0], list) else args[0]
            nbytes = first.numel() * first.element_size()
            who = ranks[args[2]] if name in ("send", "recv_") else ranks
            self.ops.append((name, who, nbytes, self.ann.tags.get("phase")))
        return func(*args, **(kwargs or {}))


class Stage(nn.Module):
    """Stand-in pipeline chunk: embedding on the first virtual stage, two bf16 Linear layers."""

    def __init__(self, first: bool) -> None:
        super().__init__()
        self.emb = nn.Parameter(torch.randn(V, H, dtype=torch.bfloat16)) if first else None
        self.l1 = nn.Linear(H, H, dtype=torch.bfloat16)
        self.l2 = nn.Linear(H, H, dtype=torch.bfloat16)

    def forward(self, x):
        if x is None:
            x = self.emb[torch.randint(0, V, (B, S))].transpose(0, 1)  # [s, b, h]
        return self.l2(torch.relu(self.l1(x)))


def run_rank(rank, pp, m, vpp=1, cache=False, batches=None, grad_sync_factory=None, overlap=False):
    """Run one iteration on ``rank`` of a pure pipeline (world = pp); return (ann, comm log)."""
    ann = Ann(cache=cache)
    prev = annotate.set_annotator(ann)
    try:
        with fake_world(rank, pp):
            chunks = [Stage(first=rank == 0 and c == 0) for c in range(vpp)]
            gs = grad_sync_factory(chunks) if grad_sync_factory else None
            comm = PipelineComm(group=dist.group.WORLD, rank=rank, size=pp, shape=SHAPE, dtype=torch.bfloat16,
                                overlap=overlap)

            def step(chunk, mb, x):
                y = chunks[chunk](x)
                return y.float().square().mean() if rank == pp - 1 and chunk == vpp - 1 else y

            log = CommLog(ann)
            orig = dist.batch_isend_irecv

            def batched(ops):
                if batches is not None:
                    batches.setdefault(rank, []).append(
                        [("send" if o.op is dist.isend else "recv", o.group_peer) for o in ops])
                return orig(ops)

            dist.batch_isend_irecv = batched
            try:
                with log:
                    losses = forward_backward(step, num_microbatches=m, num_chunks=vpp, comm=comm, grad_sync=gs)
            finally:
                dist.batch_isend_irecv = orig
    finally:
        annotate.set_annotator(prev)
    return ann, log, losses


def compute_order(ann):
    return [("F" if k[0] == "fwd" else "B", chunk, mb) for k, _, mb, chunk in ann.blocks]


def test_one_f_one_b_order_hand_computed():
    """Stage 1 of 4 with 8 micro-batches: 2 warm-up forwards, 1F1B pairs, 2 cool-down backwards."""
    assert one_f_one_b_order(4, 1, 8) == [
        ("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("F", 4), ("B", 2),
        ("F", 5), ("B", 3), ("F", 6), ("B", 4), ("F", 7), ("B", 5), ("B", 6), ("B", 7)]
    assert one_f_one_b_order(4, 3, 2) == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]


def test_interleaved_order_hand_computed():
    """pp 2, vpp 2, 4 micro-batches, rank 0: warm-up 2*(2-0-1) + (2-1)*2 = 4, chunks as Megatron."""
    assert interleaved_order(2, 0, 4, 2) == [
        ("F", 0, 0), ("F", 0, 1), ("F", 1, 0), ("F", 1, 1),
        ("F", 0, 2), ("B", 1, 0), ("F", 0, 3), ("B", 1, 1),
        ("F", 1, 2), ("B", 0, 0), ("F", 1, 3), ("B", 0, 1),
        ("B", 1, 2), ("B", 1, 3), ("B", 0, 2), ("B", 0, 3)]


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_1f1b_run_follows_order_and_sends_per_microbatch(rank):
    """A real run issues blocks in 1F1B order, one activation send per micro-batch forward and
    one gradient send per backward (none off the pipeline ends), each [s, b, h] bf16."""
    pp, m = 4, 8
    ann, log, losses = run_rank(rank, pp, m)
    assert compute_order(ann) == [(d, 0, mb) for d, mb in one_f_one_b_order(pp, rank, m)]
    sends = Counter(who for name, who, _, _ in log.ops if name == "send")
    recvs = Counter(who for name, who, _, _ in log.ops if name == "recv_")
    expect_next = m if rank < pp - 1 else 0
    expect_prev = m if rank > 0 else 0
    assert sends == Counter({k: v for k, v in {rank + 1: expect_next, rank - 1: expect_prev}.items() if v})
    assert recvs == sends
    assert {nbytes for name, _, nbytes, _ in log.ops} == {S * B * H * 2}
    assert len(losses) == (m if rank == pp - 1 else 0)


def test_sends_per_stage_boundary_are_twice_microbatches():
    """Over the whole pipeline every boundary carries 2 x micro-batches messages (fwd + bwd)."""
    pp, m = 4, 8
    per_pair = Counter()
    for rank in range(pp):
        _, log, _ = run_rank(rank, pp, m)
        for name, who, _, _ in log.ops:
            if name == "send":
                per_pair[tuple(sorted((rank, who)))] += 1
    assert per_pair == Counter({(0, 1): 2 * m, (1, 2): 2 * m, (2, 3): 2 * m})


def _deadlock_free(batches: dict[int, list[list[tuple]]]) -> bool:
    """Replay blocking batches: a batch completes once all its ops' partners are posted."""
    pos = {r: 0 for r in batches}
    posted: dict[tuple, int] = Counter()   # (kind, src, dst) -> posted count
    # Number every op: k-th send src->dst pairs with k-th recv on dst from src.
    numbered = {}
    for r, bl in batches.items():
        seen = Counter()
        numbered[r] = []
        for b in bl:
            nb = []
            for kind, peer in b:
                key = (r, peer) if kind == "send" else (peer, r)
                nb.append((kind, key, seen[(kind, key)]))
                seen[(kind, key)] += 1
            numbered[r].append(nb)
    progress = True
    while progress:
        progress = False
        for r in batches:
            if pos[r] == len(numbered[r]):
                continue
            batch = numbered[r][pos[r]]
            for op in batch:
                posted[op] = 1
            ok = all(posted.get(("recv" if k == "send" else "send", key, i)) for k, key, i in batch)
            if ok:
                pos[r] += 1
                progress = True
    return all(pos[r] == len(numbered[r]) for r in batches)


@pytest.mark.parametrize("pp,vpp,m", [(4, 1, 8), (4, 1, 2), (2, 2, 4), (4, 2, 8), (4, 2, 4), (2, 3, 6)])
def test_p2p_pairs_match_and_never_deadlock(pp, vpp, m):
    """Sends and receives pair up across ranks with equal sizes, and the batched exchanges
    complete when each batch blocks until its partners are posted (NCCL group semantics)."""
    batches: dict[int, list] = {}
    logs = {}
    for rank in range(pp):
        _, log, _ = run_rank(rank, pp, m, vpp=vpp, batches=batches)
        logs[rank] = log.ops
    for src in range(pp):
        for dst in range(pp):
            s = [n for name, who, n, _ in logs[src] if name == "send" and who == dst]
            r = [n for name, who, n, _ in logs[dst] if name == "recv_" and who == src]
            assert s == r, (src, dst)
    assert _deadlock_free(batches)


@pytest.mark.parametrize("pp,vpp,m", [(2, 2, 4), (4, 2, 8), (4, 2, 4), (2, 3, 6)])
def test_overlapped_p2p_keeps_order_and_messages_and_waits_before_use(pp, vpp, m):
    """--overlap-p2p-communication: the same compute order and the same messages per stage pair
    as the synchronous exchanges; a step's input arrives through a receive waited before it
    starts; in the steady phase a forward's exchange is still open when the backward runs."""
    for rank in range(pp):
        ann, log, _ = run_rank(rank, pp, m, vpp=vpp, overlap=True)
        sync_ann, sync_log, _ = run_rank(rank, pp, m, vpp=vpp)
        assert compute_order(ann) == compute_order(sync_ann)
        for who in range(pp):
            for kind in ("send", "recv_"):
                assert ([n for name, w, n, _ in log.ops if name == kind and w == who]
                        == [n for name, w, n, _ in sync_log.ops if name == kind and w == who])
        kinds = ann.kinds
        assert "p2p-wait" in kinds
        steady = 0 if m == pp else m * vpp - min((pp - rank - 1) * 2 + (vpp - 1) * pp, m * vpp)
        if steady > 1:  # forward, its exchange issued, (the last backward's exchange waited), the
            # backward and its exchange, and only then the wait for the forward's before the next one
            step = ["fwd", "p2p", "p2p-wait", "bwd", "p2p", "p2p-wait", "fwd"]
            assert any(kinds[i:i + 7] == step for i in range(len(kinds))), kinds


def test_interleaved_run_follows_order_and_boundary_counts():
    """pp 2 x vpp 2: blocks in interleaved order; boundary 0->1 carries 2 x mb x vpp messages,
    the wrap-around 1->0 (chunk c of the last stage feeds chunk c+1 of the first) 2 x mb x (vpp-1)."""
    pp, vpp, m = 2, 2, 4
    sends = Counter()
    for rank in range(pp):
        ann, log, _ = run_rank(rank, pp, m, vpp=vpp)
        assert compute_order(ann) == [(d, c, mb) for d, c, mb in interleaved_order(pp, rank, m, vpp)]
        for name, who, _, _ in log.ops:
            if name == "send":
                sends[(rank, who)] += 1
    # 0->1: activations of chunks 0 and 1 (8) + grads of chunk 1 into rank 1's chunk 0 (4).
    assert sends == Counter({(0, 1): 12, (1, 0): 12})


def test_block_keys_with_eight_microbatches():
    """Without a grad-sync object every forward of a stage shares one key and every backward
    another: 8 + 8 occurrences; the first stage's keys carry no input shape."""
    for rank, shape in ((0, None), (2, SHAPE)):
        ann, _, _ = run_rank(rank, 4, 8)
        counts = Counter(k for k, *_ in ann.blocks)
        assert counts == Counter({("fwd", ("chunk", 0), False, False, shape): 8,
                                  ("bwd", ("chunk", 0), False, shape): 8})


class _OverlapSync:
    """Grad-sync stand-in that overlaps: logs the no-sync switch and chunk launches, each with
    the number of backward blocks run so far."""

    overlap_grad_reduce = True

    def __init__(self, ann):
        self.ann, self.events, self.finalized = ann, [], 0

    def _bwds(self):
        return sum(1 for k, *_ in self.ann.blocks if k[0] == "bwd")

    def param_sync_pending(self, chunk):
        return False

    def param_sync_done(self, chunk):
        pass

    def set_grad_sync(self, enabled):
        self.events.append(("sync", enabled, self._bwds()))

    def start_grad_sync(self, chunk):
        self.events.append(("start", chunk, self._bwds()))

    def finalize(self):
        self.finalized += 1


def _overlap_run(rank, pp, m, vpp=1, cache=False, align=True):
    holder = {}

    def factory(chunks):
        holder["gs"] = _OverlapSync(annotate.get_annotator())
        holder["gs"].align_grad_reduce = align
        return holder["gs"]

    ann, _, _ = run_rank(rank, pp, m, vpp=vpp, cache=cache, grad_sync_factory=factory)
    return ann, holder["gs"]


def test_first_stage_overlaps_grad_sync_in_last_backward():
    """1F1B stage 0 with overlapped reduction: grad hooks are switched on just before the last
    backward, whose forward and backward get their own keys (7 + 1 each); finalize runs once."""
    ann, gs = _overlap_run(0, 4, 8)
    # The last micro-batch's two keys also carry the schedule call, ("call", n).
    tails = {k[-1] for k, *_ in ann.blocks if (k[0] == "fwd" and k[3]) or (k[0] == "bwd" and k[2])}
    assert len(tails) == 1 and next(iter(tails))[0] == "call"
    counts = Counter(k[:5] if k[0] == "fwd" else k[:4] for k, *_ in ann.blocks)
    c0 = ("chunk", 0)
    assert counts == Counter({("fwd", c0, False, False, None): 7, ("fwd", c0, False, True, None): 1,
                              ("bwd", c0, False, None): 7, ("bwd", c0, True, None): 1})
    assert gs.finalized == 1
    assert gs.events[:2] == [("sync", False, 0), ("sync", True, 7)]
    assert ("start", 0, 8) in gs.events  # no-op there: the hooks issued every bucket


def test_later_stages_reduce_after_backward_not_in_hooks():
    """1F1B stages > 0 keep hooks off (Megatron align_grad_reduce) and launch the chunk's
    reduction once the whole backward is done; every micro-batch then shares one key pair."""
    ann, gs = _overlap_run(1, 4, 8)
    assert Counter(ann.blocks[i][0][:5] for i in range(len(ann.blocks))) == Counter(
        {("fwd", ("chunk", 0), False, False, SHAPE): 8, ("bwd", ("chunk", 0), False, SHAPE): 8})
    assert [e for e in gs.events if e[0] == "start" or e[1]] == [
        ("sync", True, 8), ("start", 0, 8), ("sync", True, 8)]  # the last one: finalize


@pytest.mark.parametrize("rank,expect", [(0, [("start", 1, 6), ("start", 0, 8)]),
                                         (1, [("start", 1, 7), ("start", 0, 8)])])
def test_interleaved_launches_chunk_sync_rank_steps_after_its_last_backward(rank, expect):
    """pp 2 x vpp 2 x 4 micro-batches: chunk c's reduction is launched pp_rank backwards after
    the chunk's last one (all stages launch together), the rest after the cool-down."""
    ann, gs = _overlap_run(rank, 2, 4, vpp=2)
    assert [e for e in gs.events if e[0] == "start"] == expect
    assert all(not (k[3] if k[0] == "fwd" else k[2]) for k, *_ in ann.blocks)


@pytest.mark.parametrize("vpp,expect_on", [(1, [4]), (2, [6, 8])])
def test_no_align_grad_reduce_uses_hooks_on_every_stage(vpp, expect_on):
    """With --no-align-grad-reduce every stage (and every interleaved chunk) switches grad hooks
    on right before its last micro-batch's backward; those keys are distinct."""
    ann, gs = _overlap_run(1, 2, 4, vpp=vpp, align=False)
    on = [n + 1 for kind, enabled, n in gs.events if kind == "sync" and enabled][:len(expect_on)]
    assert on == expect_on  # (n backwards done before it) + 1 = the backward that syncs
    distinct = [k for k, *_ in ann.blocks if k[0] == "bwd" and k[2]]
    assert len(distinct) == vpp


class _ParamSync(_OverlapSync):
    """Grad-sync stand-in with overlapped, aligned parameter all-gathers: every chunk starts
    pending; logs each dispatch with the number of forward blocks run so far."""

    overlap_grad_reduce = False
    align_param_gather = True

    def __init__(self, ann, vpp):
        super().__init__(ann)
        self.pending = set(range(vpp))

    def _fwds(self):
        return sum(1 for k, *_ in self.ann.blocks if k[0] == "fwd")

    def param_sync_pending(self, chunk):
        return chunk in self.pending

    def param_sync_done(self, chunk):
        self.events.append(("done", chunk, self._fwds()))
        self.pending.discard(chunk)

    def dispatch_param_sync(self, chunk):
        self.events.append(("dispatch", chunk, self._fwds()))


@pytest.mark.parametrize("rank,expect", [
    # Chunk 2 goes when step k + rank is chunk 1's first micro-batch (step pp = 4), chunk 3 at 8.
    (0, [("dispatch", 0, 0), ("dispatch", 1, 0), ("dispatch", 2, 4), ("dispatch", 3, 8)]),
    (3, [("dispatch", 0, 0), ("dispatch", 1, 0), ("dispatch", 2, 1), ("dispatch", 3, 5)])])
def test_interleaved_dispatches_param_gathers_ahead_of_each_chunk(rank, expect):
    """pp 4 x vpp 4 x 8 micro-batches with aligned overlapped parameter gathers (Megatron's
    param_sync_func): chunks 0 and 1 before the first step, chunk c + 1 before forward step
    k where k + pp_rank is chunk c's first micro-batch, so all stages dispatch together; each
    chunk's first forward (and only it) then waits."""
    holder = {}

    def factory(chunks):
        holder["gs"] = _ParamSync(annotate.get_annotator(), 4)
        return holder["gs"]

    ann, _, _ = run_rank(rank, 4, 8, vpp=4, grad_sync_factory=factory)
    events = holder["gs"].events
    assert [e for e in events if e[0] == "dispatch"] == expect
    # Each chunk's first forward is step 4c; "done" follows it.
    assert [e for e in events if e[0] == "done"] == [("done", c, 4 * c + 1) for c in range(4)]
    assert [k[2] for k, *_ in ann.blocks if k[0] == "fwd"].count(True) == 4


def test_async_grad_sync_blocks_rerun_every_iteration():
    """The micro-batch whose backward leaves grad collectives open gets new keys in every
    iteration (a capture re-runs that backward, which needs its forward's graph); the others
    keep theirs."""
    keys = []
    for _ in range(2):
        ann, _ = _overlap_run(0, 4, 4, cache=True)
        keys.append(set(k for k, *_ in ann.blocks))
    assert len(keys[0]) == len(keys[1]) == 4
    assert len(keys[0] & keys[1]) == 2
    assert all(not (k[3] if k[0] == "fwd" else k[2]) for k in keys[0] & keys[1])


def test_capture_like_block_replay_runs_all_schedules():
    """When blocks are replayed (fresh tensors instead of re-running), every schedule still runs
    the same compute and p2p blocks in the same order as the real run, and the p2p ops a replay
    issues are those of each exchange kind's first occurrence in the real run."""
    for pp, vpp, m in ((4, 1, 8), (2, 2, 4)):
        for rank in range(pp):
            ann_real, real, _ = run_rank(rank, pp, m, vpp=vpp)
            ann_rep, replay, _ = run_rank(rank, pp, m, vpp=vpp, cache=True)
            assert ann_real.blocks == ann_rep.blocks and ann_real.p2p_blocks == ann_rep.p2p_blocks
            kinds = {k for k, *_ in ann_real.p2p_blocks}
            assert len(kinds) < len(ann_real.p2p_blocks)  # exchanges repeat, so blocks pay off
            sent = [o[:3] for o in real.ops if o[0] in ("send", "recv_")]
            assert set(o[:3] for o in replay.ops) <= set(sent)


def test_interleaved_needs_multiple_of_pp():
    """The interleaved schedule rejects micro-batch counts that are not a multiple of pp."""
    comm = PipelineComm(group=None, rank=0, size=4, shape=SHAPE, dtype=torch.bfloat16)
    with pytest.raises(ConfigError, match=r"num_microbatches \(6\) to be a multiple of the pipeline-parallel size \(4\)"):
        forward_backward(lambda c, m, x: x, num_microbatches=6, num_chunks=2, comm=comm)
    with pytest.raises(ConfigError, match="needs --pipeline-model-parallel-size > 1"):
        forward_backward(lambda c, m, x: x, num_microbatches=6, num_chunks=2, comm=None)


def test_scatter_gather_sends_a_tp_slice_and_all_gathers_it():
    """Megatron's scatter/gather p2p (SC'21 section 4.1), tp 2 x pp 2, stage 1 rank 2: it sends its
    half of the gradient to stage 0's rank 0, receives half an activation from it, and all-gathers
    the halves over its TP group (2, 3) into a full [s, b, h] tensor that needs grad."""
    ann = Ann()
    log = CommLog(ann)
    with fake_world(2, 4):
        pp_group, tp_group = dist.new_group([0, 2]), dist.new_group([2, 3])
        comm = PipelineComm(group=pp_group, rank=1, size=2, shape=SHAPE, dtype=torch.bfloat16,
                            scatter_gather_group=tp_group)
        with log:
            got, _ = comm.communicate(send_prev=torch.ones(SHAPE, dtype=torch.bfloat16), recv_prev=True)
    half = S * B * H * 2 // 2
    assert [(n, w, b) for n, w, b, _ in log.ops] == [("send", 0, half), ("recv_", 0, half),
                                                     ("_allgather_base_", (2, 3), 2 * half)]  # logs the output
    assert tuple(got.shape) == SHAPE and got.requires_grad
