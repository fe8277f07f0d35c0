"""pretrain_gpt.py end to end: one rank of a fake world (c10d ops listed by a dispatch mode,
blocks counted by an annotator), the real single-process run (loss falls), and config errors.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode

from fake_env import TagAnnotator, fake_world
from models.args import parse_args
from models.pretrain_gpt import main, synthetic_batch, train

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "models" / "pretrain_gpt.py"


class Ann(TagAnnotator):
    """Records declare(), iterations, block keys and the phase of every c10d op."""

    active = True  # like a capture: no data-dependent logging

    def __init__(self) -> None:
        super().__init__()
        self.blocks: list = []
        self.iterations: list[int] = []
        self.layout: dict = {}

    def declare(self, layout=None, model=None):
        self.layout = dict(layout or {})

    def iteration(self, index):
        self.iterations.append(index)
        self.blocks.clear()

    def block(self, key, fn, *args, bare_key=None, bare_without=None, any_chunk=False, shared_waits=False):
        if key[0] != "p2p":  # compute blocks only
            self.blocks.append(key)
        return fn(*args)


class CommLog(TorchDispatchMode):
    def __init__(self, ann: Ann) -> None:
        super().__init__()
        self.ann, self.ops = ann, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            pg = next(dist.ProcessGroup.unbox(a) for a in args if isinstance(a, torch.ScriptObject))
            ranks = tuple(dist.get_process_group_ranks(pg))
            name = func._overloadpacket.__name__
            t = args[1] if name == "_reduce_scatter_base_" else args[0]
            t = t[0] if isinstance(t, list) else t
            peer = ranks[args[2]] if name in ("send", "recv_") else None
            self.ops.append((name, ranks, t.numel() * t.element_size(), self.ann.tags.get("phase"), peer))
        return func(*args, **(kwargs or {}))


def run_fake(argv: list[str], rank: int, world: int):
    """Run ``train`` as ``rank`` of ``world`` in the fake world; return (annotator, log, cfg)."""
    cfg = parse_args(argv, world)
    ann = Ann()
    log = CommLog(ann)
    with fake_world(rank, world, ann, log):
        train(cfg, rank)
    return ann, log, cfg


TINY = ["--preset", "tiny", "--bf16", "--train-iters", "1"]


def _local_params(cfg, rank, world, only_sequence_parallel=False):
    """Parameter count this rank holds (or of its sequence-parallel ones), built in a fake world."""
    from models import parallel_state
    from models.gpt import GPTModel

    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            ps = parallel_state.initialize(cfg.parallel, rank)
            vpp = cfg.parallel.vpp or 1
            layers = ps.stage_layers(cfg.model.num_layers, explicit=cfg.stage_layers, vpp=vpp)[ps.pp_rank]
            return sum(p.numel() for c in range(vpp) for p in GPTModel(
                cfg.model, cfg.parallel, cfg.train, ps, layers=layers[c], chunk=c,
                pre_process=ps.is_first_stage and c == 0,
                post_process=ps.is_last_stage and c == vpp - 1).parameters()
                if getattr(p, "sequence_parallel", False) or not only_sequence_parallel)
    finally:
        dist.destroy_process_group()


def test_pipeline_dp_sync_and_p2p_counts():
    """tp2 pp2 dp2, 4 micro-batches, stage 1 rank 5: 4 activation receives and 4 gradient sends
    of [s/tp, b, h] bf16 (sequence parallel); one DP all-reduce of every local param x 4 bytes
    (--bf16 reduces fp32 main grads, as Megatron forces); the tied embedding all-reduce over
    first+last stage; one all-reduce of the sequence-parallel (norm, row-parallel bias) grads over
    TP; the grad-norm all-reduce over tp x pp."""
    argv = TINY + ["--global-batch-size", "16", "--tensor-model-parallel-size", "2",
                   "--pipeline-model-parallel-size", "2", "--sequence-parallel"]
    ann, log, cfg = run_fake(argv, rank=5, world=8)
    assert cfg.num_microbatches == 4 and ann.iterations == [0]
    act = 64 // 2 * 2 * 64 * 2  # [s/tp, b, h] bf16 bytes
    p2p = Counter((name, peer, n) for name, _, n, _, peer in log.ops if name in ("send", "recv_"))
    assert p2p == Counter({("recv_", 1, act): 4, ("send", 1, act): 4})
    local = _local_params(cfg, 5, 8)
    dp_sync = [o for o in log.ops if o[0] == "allreduce_" and o[1] == (5, 7)]
    assert [(n, ph) for _, _, n, ph, _ in dp_sync] == [(local * 4, "grad_sync")]
    # (The all-reduce of the zeroed output copy at construction has no phase.)
    emb = [o for o in log.ops if o[0] == "allreduce_" and o[1] == (1, 5) and o[3]]
    assert [(n, ph) for _, _, n, ph, _ in emb] == [(cfg.model.vocab_size // 2 * 64 * 4, "grad_sync")]
    sp = [o for o in log.ops if o[1] == (4, 5) and o[3] == "grad_sync"]
    assert [(o[0], o[2]) for o in sp] == [("allreduce_", _local_params(cfg, 5, 8, True) * 4)]
    norm = [o for o in log.ops if o[3] == "optimizer"]
    assert [(o[0], o[1], o[2]) for o in norm] == [("allreduce_", (0, 1, 4, 5), 4)]


def test_distributed_optimizer_reduce_scatter_plus_all_gather():
    """With --use-distributed-optimizer the DP traffic is one reduce-scatter of the (padded) fp32
    gradient buffer (--bf16 accumulates and reduces in fp32) and one all-gather of the bf16
    parameters, half those bytes, in the optimizer phase."""
    argv = TINY + ["--tensor-model-parallel-size", "2", "--use-distributed-optimizer"]
    ann, log, cfg = run_fake(argv, rank=1, world=8)
    local = _local_params(cfg, 1, 8)
    padded = -(-local // 128) * 128  # lcm(dp 4, 128) = 128
    dp_ops = [(o[0], o[2], o[3]) for o in log.ops if o[1] == (1, 3, 5, 7)]
    assert dp_ops == [("_reduce_scatter_base_", padded * 4, "grad_sync"),
                      ("_allgather_base_", padded * 2, "optimizer")]
    assert [o[1] for o in log.ops if o[3] == "optimizer" and o[0] == "allreduce_"] == [tuple(range(8))]


def test_megatron_fsdp_gathers_each_micro_batch_and_reduces_every_gradient():
    """--use-megatron-fsdp (tp2, dp4, 2 micro-batches): each micro-batch's forward gathers every
    local parameter in bf16 (each unit padded to a multiple of lcm(4, 128)), its backward gathers
    each layer again and reduce-scatters every fp32 gradient; the optimizer gathers nothing."""
    argv = TINY + ["--tensor-model-parallel-size", "2", "--global-batch-size", "16", "--use-megatron-fsdp",
                   "--data-parallel-sharding-strategy", "optim_grads_params"]
    ann, log, cfg = run_fake(argv, rank=1, world=8)
    assert cfg.num_microbatches == 2 and ann.layout["megatron_fsdp"] is True
    dp = [o for o in log.ops if o[1] == (1, 3, 5, 7)]
    fwd = sum(o[2] for o in dp if o[0] == "_allgather_base_" and o[3] == "fwd")
    rs = sum(o[2] for o in dp if o[0] == "_reduce_scatter_base_")
    local = _local_params(cfg, 1, 8)
    layers = cfg.model.num_layers
    units = layers + 4  # at most: embeddings (word, position), final norm, output layer
    assert 2 * 2 * local <= fwd < 2 * 2 * (local + 128 * units) and fwd % (2 * 2 * 128) == 0
    assert rs == 2 * fwd  # fp32 gradients, the same padded elements, every micro-batch
    assert len([o for o in dp if o[3] == "bwd"]) == 2 * layers
    assert not [o for o in log.ops if o[3] == "optimizer" and o[0] == "_allgather_base_"]


def test_grad_reduce_in_bf16_halves_the_gradient_bytes():
    """--grad-reduce-in-bf16 keeps bf16 gradient buffers: the reduce-scatter moves 2 bytes per
    element, as many as the parameter all-gather."""
    argv = TINY + ["--tensor-model-parallel-size", "2", "--use-distributed-optimizer",
                   "--grad-reduce-in-bf16"]
    ann, log, cfg = run_fake(argv, rank=1, world=8)
    assert not cfg.optim.grad_reduce_in_fp32
    padded = -(-_local_params(cfg, 1, 8) // 128) * 128
    dp_ops = [(o[0], o[2]) for o in log.ops if o[1] == (1, 3, 5, 7)]
    assert dp_ops == [("_reduce_scatter_base_", padded * 2), ("_allgather_base_", padded * 2)]


def test_block_keys_interleaved_eight_microbatches():
    """pp2 x vpp2 with 8 micro-batches: on stage 0 each chunk's forward shares one key (8 uses)
    and so does each backward; the first chunk takes token ids (no input shape)."""
    argv = TINY + ["--global-batch-size", "16", "--pipeline-model-parallel-size", "2",
                   "--num-layers-per-virtual-pipeline-stage", "2"]
    ann, log, cfg = run_fake(argv, rank=0, world=2)
    assert cfg.parallel.vpp == 2 and ann.layout["vpp"] == 2
    shape = (64, 2, 64)
    assert Counter(ann.blocks) == Counter({
        ("fwd", ("class", 0), False, False, None): 8, ("fwd", ("class", 1), False, False, shape): 8,
        ("bwd", ("class", 0), False, None): 8, ("bwd", ("class", 1), False, shape): 8})
    sends = Counter(peer for name, _, _, _, peer in log.ops if name == "send")
    assert sends == Counter({1: 8 + 8 + 8})  # chunk 0 acts, chunk 1 acts, chunk 1 grads


def test_overlap_grad_reduce_keys_last_microbatch_apart():
    """With --overlap-grad-reduce the first stage's last micro-batch has its own forward and
    backward keys (its backward issues the DP reduction); stage 1 reduces after its backward."""
    argv = TINY + ["--global-batch-size", "16", "--pipeline-model-parallel-size", "2",
                   "--overlap-grad-reduce"]
    ann, log, _ = run_fake(argv, rank=1, world=4)
    # (those two keys also name the iteration's schedule call, so a capture re-runs them)
    assert Counter(k[:5] if k[0] == "fwd" else k[:4] for k in ann.blocks) == Counter({
        ("fwd", ("class", 0), False, False, None): 3, ("fwd", ("chunk", 0), False, True, None): 1,
        ("bwd", ("class", 0), False, None): 3, ("bwd", ("chunk", 0), True, None): 1})
    assert {o[3] for o in log.ops if o[0] == "allreduce_" and o[1] == (0, 1)} == {"grad_sync"}
    ann, log, _ = run_fake(argv, rank=3, world=4)
    assert len(set(ann.blocks)) == 2


def test_synthetic_batch_same_on_every_stage_and_layout():
    """A micro-batch's ids are reproducible (every stage draws the same), labels are the next
    token, and dp rank r holds samples [r gbs/dp, (r+1) gbs/dp) whatever the dp/mbs split."""
    cfg = parse_args(["--preset", "tiny"], 1)
    ids, labels = synthetic_batch(cfg, 3, 2, 0)
    assert torch.equal(ids, synthetic_batch(cfg, 3, 2, 0)[0]) and ids.shape == (2, 64)
    assert torch.equal(labels, (ids + 1) % cfg.model.vocab_size)
    assert not torch.equal(ids, synthetic_batch(cfg, 3, 3, 0)[0])
    whole = torch.cat([synthetic_batch(cfg, 3, mb, 0)[0] for mb in range(4)])  # gbs 8, dp 1
    dp4 = parse_args(["--preset", "tiny", "--micro-batch-size", "1"], 4)
    split = torch.cat([synthetic_batch(dp4, 3, mb, r)[0] for r in range(4) for mb in range(2)])
    assert torch.equal(whole, split)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _losses(stdout: str) -> list[float]:
    return [float(line.split("lm loss")[1]) for line in stdout.splitlines() if "lm loss" in line]


def test_real_runs_loss_falls_and_data_parallel_matches_single_rank():
    """Real numbers (gloo, fp32): `pretrain_gpt.py --preset tiny` at world size 1 trains (the
    loss falls over 8 iterations), and two ranks with the distributed optimizer (reduce-scatter,
    sharded fp32 Adam, all-gather) and overlapped reduction, or with Megatron-FSDP (layers gathered
    per micro-batch, gradients reduce-scattered per micro-batch and summed), train exactly like one
    rank on the same global batch (first 3 losses equal to 1e-5)."""
    args = [sys.executable, str(SCRIPT), "--preset", "tiny"]
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1"}
    single = subprocess.run(args + ["--train-iters", "8"], capture_output=True, text=True, timeout=120,
                            env={**base, "RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": str(_free_port())})
    assert single.returncode == 0, single.stderr
    one = _losses(single.stdout)
    assert len(one) == 8
    # Synthetic batches differ per iteration, so compare the ends, not every step.
    assert sum(one[-2:]) / 2 < sum(one[:2]) / 2 - 0.15
    for sharded in (["--use-distributed-optimizer", "--overlap-grad-reduce"],
                    ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"]):
        port = str(_free_port())
        procs = [subprocess.Popen(args + ["--train-iters", "3", *sharded],
                                  env={**base, "RANK": str(r), "WORLD_SIZE": "2", "MASTER_PORT": port},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
        outs = [p.communicate(timeout=180) for p in procs]
        assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
        two = _losses(outs[0][0])
        assert len(two) == 3
        assert max(abs(a - b) for a, b in zip(one, two)) < 1e-5, (sharded, one, two)


def test_config_error_exits_2_with_one_line(capsys):
    """Config mistakes print one 'error:' line naming the values and return 2 (no traceback)."""
    os.environ.pop("WORLD_SIZE", None)
    assert main(["--preset", "tiny", "--global-batch-size", "7"]) == 2
    err = capsys.readouterr().err
    assert err == ("pretrain_gpt.py: error: global batch size 7 is not divisible by micro-batch "
                   "size 2 x data-parallel size 1 = 2\n")
    assert main(["--preset", "tiny", "--no-such-flag"]) == 2
    assert capsys.readouterr().err == "pretrain_gpt.py: error: unrecognized arguments: --no-such-flag\n"


def test_script_unknown_flag_subprocess():
    """The script run as a program exits non-zero naming the unknown flag, without a traceback."""
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "4", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(SCRIPT), "--preset", "tiny", "--tensor-model-parallel-size", "3"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip() == ("pretrain_gpt.py: error: world size 4 is not divisible by tp*pp*cp = "
                                  "3*1*1 = 3; choose sizes whose product divides it")


def real_losses(argv: list[str], world: int, variants: list[list[str]]) -> list[list[float]]:
    """Run ``pretrain_gpt.py argv + variant`` for real on ``world`` gloo ranks, once per variant; the
    losses every rank printed, per variant."""
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1"}
    losses = []
    for extra in variants:
        port = str(_free_port())
        procs = [subprocess.Popen([sys.executable, str(SCRIPT), *argv, *extra],
                                  env={**base, "RANK": str(r), "WORLD_SIZE": str(world), "MASTER_PORT": port},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
        outs = [p.communicate(timeout=240) for p in procs]
        assert all(p.returncode == 0 for p in procs), [o[1][-3000:] for o in outs]
        losses.append([l for o in outs for l in _losses(o[0])])
    return losses


def test_real_scatter_gather_p2p_trains_like_plain_p2p():
    """Real numbers (gloo, 4 ranks, tp 2 x pp 2): --scatter-gather-tensors-in-pipeline (each TP rank
    sends half of every activation and gradient, the receivers all-gather) gives the same losses,
    which holds only if replicated parameters and dropout agree across TP ranks."""
    losses = real_losses(["--preset", "tiny", "--train-iters", "2", "--global-batch-size", "4",
                          "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"], 4,
                         [[], ["--scatter-gather-tensors-in-pipeline"]])
    assert len(losses[0]) == 4 and losses[0] == losses[1], losses  # 2 iterations x 2 last-stage TP ranks


def test_nvfp4_job_replays_on_blackwell_and_is_refused_before_it(tmp_path):
    """--fp4-format e2m1 through the capture: the layers' GEMMs are recorded as fp4 and price on a
    B200 (9,000 TF/s fp4 peak); an H100 has no fp4 tensor cores, so its replay fails naming that."""
    import pytest

    from capture import capture
    from heterosim.errors import ConfigError
    from heterosim.trace import load_trace
    from replay import simulate

    argv = ["--preset", "tiny", "--bf16", "--tensor-model-parallel-size", "2", "--sequence-parallel",
            "--fp4-format", "e2m1", "--global-batch-size", "8"]
    out = capture(str(ROOT / "models" / "pretrain_gpt.py"), argv, tmp_path / "t", world_size=8)
    gemms = Counter(o.dtype for o in load_trace(out).roles[0].ops() if o.kernel_class == "gemm")
    assert gemms["fp4"] > 0 and set(gemms) == {"fp4", "bf16"}  # bf16: the output layer, outside TE's autocast
    r = simulate(out, "dgx-b200")
    assert r.iteration_time_s > 0
    with pytest.raises(ConfigError, match=r"H100-SXM5-80GB has no fp4 tensor cores \(sm_90; fp4 GEMMs such as NVFP4 "
                                          r"need Blackwell, sm_100 or later\)"):
        simulate(out, "dgx-h100")


def test_real_two_stage_interleaved_pipeline_sends_each_tensor_to_its_receive():
    """Real numbers (gloo, 2 ranks, pp 2 x vpp 2): with two stages a rank's previous and next stage
    are the same peer, so one exchange sends it an activation and a gradient at once. Tagged by
    direction, each lands in its own receive: the batched exchange (waited at once) trains exactly
    like the overlapped one (each send and receive on its own); untagged, the gradient filled the
    activation's buffer (losses differed from the third micro-batch on)."""
    argv = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
            "--vocab-size", "128", "--micro-batch-size", "1", "--pipeline-model-parallel-size", "2",
            "--num-layers-per-virtual-pipeline-stage", "1", "--global-batch-size", "4", "--train-iters", "2",
            "--hidden-dropout", "0.0"]
    losses = real_losses(argv, 2, [[], ["--overlap-p2p-communication"]])
    assert len(losses[0]) == 2 and losses[0] == losses[1], losses
