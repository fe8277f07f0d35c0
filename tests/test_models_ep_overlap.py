"""Tests of ``models.ep_overlap`` (Megatron-core's expert-parallel overlap, the combined 1F1B):
the merged steps compute what plain forwards and backwards compute, the exchanges are issued where
a GPU runs them beside the other micro-batch's compute, and bad flags fail as Megatron-core's do."""

from __future__ import annotations

import pytest

from heterosim.errors import ConfigError
from models.args import parse_args

SAME_BODY = """
from models import parallel_state
from models.config import ModelConfig, ParallelConfig, TrainConfig
from models.ep_overlap import ChunkPlan, run_step
from models.gpt import GPTModel
mcfg = ModelConfig(num_layers=3, hidden_size=16, num_attention_heads=2, ffn_hidden_size=24, seq_length=8,
                   vocab_size=64, num_experts=4, moe_router_topk=2, activation="swiglu", hidden_dropout=0.0,
                   moe_layer_pattern=(0, 1, 1), moe_shared_expert_intermediate_size=8,
                   normalization="RMSNorm", position_embedding_type="rope")
ps = parallel_state.initialize(ParallelConfig(world_size=world, ep=world, ep_nvl_domain=DOMAIN), rank)
models = []
for _ in range(2):
    torch.manual_seed(0)
    models.append(GPTModel(mcfg, ParallelConfig(world_size=world, ep=world), TrainConfig(params_dtype="fp32"), ps,
                           layers=range(3), pre_process=True, post_process=True))
g = torch.Generator().manual_seed(rank)
batches = [torch.randint(0, 64, (2, 8), generator=g) for _ in range(3)]
ref, ovl = models
plain = []
for ids in batches:  # plain forward and backward per micro-batch
    loss = ref(ids, (ids + 1) % 64) / 3
    loss.backward()
    plain.append(float(loss))
plans = [ChunkPlan(ovl, ids, (ids + 1) % 64, finish=lambda y: y / 3) for ids in batches]
merged = [run_step(plans[0], None, None)[0]]
merged += [run_step(plans[i], plans[i - 1], None)[0] for i in (1, 2)]
assert run_step(None, plans[2], None) == (None, None)
grads = [float((a.grad - b.grad).abs().max() / b.grad.abs().max()) for a, b in zip(ovl.parameters(), ref.parameters())]
result = dict(loss=max(abs(float(m) - p) for m, p in zip(merged, plain)), grad=max(grads),
              n=sum(p.grad is not None for p in ovl.parameters()), total=len(list(ovl.parameters())))
"""


@pytest.mark.parametrize("world,domain", [(2, "None"), (4, "2")])
def test_merged_steps_compute_what_plain_steps_compute(tmp_path, world, domain):
    """Three micro-batches through a dense layer and two MoE layers with shared experts, EP over
    2 gloo ranks (all-to-all dispatcher) or 4 in two NVLink domains (flex dispatcher): F0, F1 + B0,
    F2 + B1, B2 as nodes give the losses and every parameter gradient of plain forwards and
    backwards (fp32; the sums into the residual run in another order)."""
    from test_models_mappings import run_gloo

    res = run_gloo(SAME_BODY.replace("DOMAIN", domain), world=world, tmp_path=tmp_path, timeout=240)
    assert res["n"] == res["total"]  # every parameter got a gradient
    assert res["loss"] < 1e-6, res
    assert res["grad"] < 1e-5, res


BASE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--vocab-size", "128", "--num-experts", "4", "--bf16", "--overlap-moe-expert-parallel-comm"]


def test_flag_reaches_train_config():
    t = parse_args(BASE + ["--expert-model-parallel-size", "2"], world_size=2).train
    assert t.overlap_moe_expert_parallel_comm is True
    assert parse_args(BASE[:-1], world_size=1).train.overlap_moe_expert_parallel_comm is False


@pytest.mark.parametrize("extra,world,message", [
    ([], 1, "--overlap-moe-expert-parallel-comm needs --num-experts and --expert-model-parallel-size > 1"),
    (["--expert-model-parallel-size", "2", "--recompute-granularity", "full", "--recompute-method", "uniform",
      "--recompute-num-layers", "1"], 2,
     "--overlap-moe-expert-parallel-comm needs no full recomputation and no --recompute-method"),
    (["--expert-model-parallel-size", "2", "--recompute-granularity", "selective", "--recompute-modules", "moe"], 2,
     "--overlap-moe-expert-parallel-comm needs 'moe' out of --recompute-modules"),
    (["--expert-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"], 4,
     "--overlap-moe-expert-parallel-comm with --pipeline-model-parallel-size > 1 needs virtual pipeline stages "
     "(Megatron-core runs it in the interleaved schedule only)"),
])
def test_flag_checks_as_megatron_core(extra, world, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)") + "$"):
        parse_args(BASE + extra, world_size=world)


def test_needs_bf16_or_fp16():
    argv = [a for a in BASE if a != "--bf16"] + ["--expert-model-parallel-size", "2"]
    with pytest.raises(ConfigError, match="^--overlap-moe-expert-parallel-comm needs --bf16 or --fp16$"):
        parse_args(argv, world_size=2)


def _signature(ops) -> str:
    """Communication, waits, expert GEMMs and attention of ``ops`` in issue order, repeats counted:
    ``all`` + phase (``H``: issued after a host sync), ``w`` a compute-stream wait, ``e`` + phase a
    batched expert GEMM, ``a`` + phase core attention."""
    out: list[list] = []
    for o in ops:
        if o.kind == "collective":
            s = ("H" if o.host_sync else "") + o.collective[:3] + o.phase[0]
        elif o.kind == "wait":
            s = "w"
        elif o.name.endswith("bmm.default") or "flash" in o.name:
            s = ("e" if "bmm" in o.name else "a") + o.phase[0]
        else:
            continue
        if out and out[-1][0] == s:
            out[-1][1] += 1
        else:
            out.append([s, 1])
    return " ".join(s + (f"x{n}" if n > 1 else "") for s, n in out)


def test_capture_issues_each_exchange_beside_the_other_micro_batch(tmp_path):
    """Captured (8 ranks, EP 8, two MoE layers, 4 micro-batches): F0, then F1 + B0 recorded once and
    referenced for F2 + B1 and F3 + B2, then B3. In a merged step, per layer pair: the backward's
    combine all-to-all; attention forward; the token counts' all-gather; the dispatch all-to-alls of
    tokens (after the host read of the counts) and weights; the compute stream waits for the combine
    only before the experts' backward GEMMs; the backward's dispatch; waits for the forward's
    dispatch only before the experts' forward GEMMs; the forward's combine; waits for the backward's
    dispatch before attention backward. So every exchange has the other micro-batch's compute
    beside it (models/ep_overlap.py)."""
    from pathlib import Path

    from capture import capture
    from heterosim.trace import load_trace

    argv = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
            "--vocab-size", "256", "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
            "--num-experts", "16", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32", "--micro-batch-size", "1",
            "--bf16", "--expert-model-parallel-size", "8", "--global-batch-size", "32",
            "--overlap-moe-expert-parallel-comm"]
    root = Path(__file__).resolve().parents[1]
    out = capture(str(root / "models" / "pretrain_gpt.py"), argv, tmp_path / "t", world_size=8)
    role = load_trace(out).roles[0]
    blocks = [s.block for s in role.program if s.mb >= 0]
    assert len(blocks) == 5 and blocks[1] == blocks[2] == blocks[3] and len(set(blocks)) == 3
    pair = "allb af allf w Hallf allf w ebx4 allbx2 wx2 efx2 allf wx2 ab"
    assert _signature(o for o in role.ops() if o.mb == 2) == f"{pair} {pair.replace('allb af', 'allb w af')} w"


def test_capture_without_pipelining_reduces_grads_in_the_last_backward_every_iteration(tmp_path):
    """3 iterations with the distributed optimizer's overlapped reduction: the last backward issues the
    reduce-scatters, so it is recorded every iteration on its own forward's plan (the first two steps
    recorded every iteration too, and the step holding that backward's forward); the kept iteration
    holds five distinct blocks (F2 + B1 the one referenced from the first iteration), and the last
    backward's reduce-scatters."""
    from pathlib import Path

    from capture import capture
    from heterosim.trace import load_trace

    argv = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
            "--vocab-size", "256", "--swiglu", "--num-experts", "16", "--moe-router-topk", "2",
            "--moe-ffn-hidden-size", "32", "--micro-batch-size", "1", "--bf16", "--expert-model-parallel-size", "8",
            "--global-batch-size", "32", "--overlap-moe-expert-parallel-comm", "--train-iters", "3",
            "--use-distributed-optimizer", "--overlap-grad-reduce"]
    out = capture(str(Path(__file__).resolve().parents[1] / "models" / "pretrain_gpt.py"), argv, tmp_path / "t",
                  world_size=8)
    role = load_trace(out).roles[0]
    steps = [s.block for s in role.program if s.mb >= 0]
    assert len(steps) == len(set(steps)) == 5
    assert any(o.collective == "reduce_scatter" for o in role.ops() if o.mb == 3)


def test_real_interleaved_run_trains_exactly_like_the_plain_schedule():
    """Real numbers (gloo, 4 ranks, bf16): pp 2 x vpp 2 x EP 2 MoE with overlapped p2p. The combined
    schedule (one more warm-up forward, every steady step a merged forward and backward, both
    receives waited before it and both exchanges left in flight after it) trains exactly like the
    plain interleaved schedule: the same losses over 3 iterations on both last-stage ranks."""
    from test_pretrain_gpt import real_losses

    argv = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
            "--vocab-size", "128", "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
            "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "16", "--micro-batch-size", "1",
            "--bf16", "--expert-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
            "--num-layers-per-virtual-pipeline-stage", "1", "--global-batch-size", "8", "--train-iters", "3",
            "--hidden-dropout", "0.0", "--overlap-p2p-communication"]
    losses = real_losses(argv, 4, [[], ["--overlap-moe-expert-parallel-comm"]])
    assert len(losses[0]) == 6 and losses[0] == losses[1], losses


PP_ARGV = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
           "--vocab-size", "256", "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
           "--num-experts", "8", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32", "--micro-batch-size", "1",
           "--bf16", "--expert-model-parallel-size", "4", "--pipeline-model-parallel-size", "2",
           "--num-layers-per-virtual-pipeline-stage", "1", "--global-batch-size", "32", "--overlap-moe-expert-parallel-comm"]


def test_interleaved_schedule_has_one_more_warmup_forward():
    """pp 2 x vpp 2, 8 micro-batches (16 virtual steps): Megatron-core's combined schedule warms up
    with (pp - rank - 1) * 2 + (vpp - 1) * pp + 1 forwards (5 on stage 0, 3 on stage 1, one more than
    the plain interleaved schedule), then merges each forward with a backward, then cools down."""
    from test_pretrain_gpt import run_fake

    for rank, kinds in ((0, "F" * 5 + "M" * 11 + "B" * 5), (4, "F" * 3 + "M" * 13 + "B" * 3)):
        ann, _, _ = run_fake(PP_ARGV + ["--train-iters", "1"], rank=rank, world=8)
        assert all(k[0] == "1f1b" for k in ann.blocks)
        assert "".join("M" if k[1] and k[3] else "F" if k[1] else "B" for k in ann.blocks) == kinds


def test_interleaved_capture_records_each_step_kind_once_and_replays(tmp_path):
    """Captured over 3 iterations with the distributed optimizer, overlapped grad reduction and
    parameter all-gathers: every recorded backward finds a forward's autograd graph (the steps
    Runner.plan_combined forces), equal steps share one block, and the trace replays on a DGX H100
    cluster."""
    from pathlib import Path

    from capture import capture
    from heterosim.trace import load_trace
    from replay import simulate

    argv = PP_ARGV + ["--train-iters", "3", "--use-distributed-optimizer", "--overlap-grad-reduce",
                      "--overlap-param-gather", "--overlap-p2p-communication"]
    out = capture(str(Path(__file__).resolve().parents[1] / "models" / "pretrain_gpt.py"), argv, tmp_path / "t",
                  world_size=8)
    trace = load_trace(out)
    assert len(trace.roles) == 2
    for role in trace.roles:
        steps = [s.block for s in role.program if s.mb >= 0]
        assert len(set(steps)) < len(steps) / 2
    r = simulate(out, "dgx-h100")
    assert 0 < r.iteration_time_s < 1
