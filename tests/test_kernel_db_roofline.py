"""Tests for kernel_db.roofline: hand-checked roofline cases and the efficiency curves' shape."""

import math

import pytest
import yaml

from heterosim.errors import ConfigError
from heterosim.cluster.gpus import get_gpu
from kernel_db.power import loop_seconds, square_gemm_benchmark
from kernel_db.published import compare, load_published
from kernel_db.roofline import attention_efficiency, gemm_efficiency, load_efficiency, roofline_time

EFF = load_efficiency()


def test_large_bf16_gemm_on_h100_is_compute_bound():
    """8192^3 bf16 on H100: 2048 tiles of 256x128 on 132 SMs, 15.5 waves balanced by stream-K (no wave
    loss); eff = 0.84 * 8192/8448, at the H100's sustained clock, 0.86 of boost."""
    g = get_gpu("H100")
    n = 8192
    r = roofline_time("gemm", "bf16", {"m": n, "n": n, "k": n, "batch": 1}, 2.0 * n**3, 3 * n * n * 2, g, EFF.params(g))
    eff = 0.84 * (8192 / (8192 + 256))
    assert r.bound == "compute"
    assert r.efficiency == pytest.approx(eff)
    assert r.seconds == pytest.approx(3.5e-6 + 2.0 * n**3 / (989.4e12 * 0.86 * eff))


def test_large_elementwise_is_bandwidth_bound():
    """A 1 GiB-in / 1 GiB-out bf16 add on H100 runs at 0.90 x 3.35 TB/s plus the launch overhead."""
    g = get_gpu("H100")
    numel = 2**29
    nbytes = 2 * numel * 2
    r = roofline_time("elementwise", "bf16", {"numel": numel}, float(numel), nbytes, g, EFF.params(g))
    assert r.bound == "memory"
    assert r.seconds == pytest.approx(3.5e-6 + nbytes / (3.35e12 * 0.90))


def test_gemm_efficiency_rises_with_size():
    """Square GEMM efficiency is non-decreasing from 256 to 16384 on A100 (beyond wave jitter) and < eff_max."""
    p = EFF.params(get_gpu("A100"))["gemm"]
    effs = [gemm_efficiency(n, n, n, 1, 108, p) for n in (256, 512, 1024, 4096, 16384)]
    assert effs == sorted(effs)
    assert effs[-1] < p["eff_max"] and effs[-1] > 0.95 * p["eff_max"]


def test_split_k_fills_sms_for_small_outputs():
    """A 128x128 output with K=8192 uses split-K: far better than one tile on one SM."""
    p = EFF.params(get_gpu("H100"))["gemm"]
    one_tile = p["eff_max"] * 0.95 * (1 / 132) * 8192 / (8192 + 256)
    assert gemm_efficiency(128, 128, 8192, 1, 132, p) > 10 * one_tile


def test_attention_efficiency_hand_checked():
    """FA fwd b=1,h=16,sq=sk=4096,d=128 on A100: 512 blocks on 108 SMs (5 waves), ramp 4096/5120."""
    p = EFF.params(get_gpu("A100"))["attention"]
    e = attention_efficiency({"b": 1, "h": 16, "sq": 4096, "sk": 4096, "d": 128, "dir": "fwd"}, 108, p)
    assert e == pytest.approx(0.70 * (512 / 540) * (4096 / 5120))
    bwd = attention_efficiency({"b": 1, "h": 16, "sq": 4096, "sk": 4096, "d": 64, "dir": "bwd"}, 108, p)
    assert bwd == pytest.approx(0.60 * (512 / 540) * (4096 / 5120) * 0.5**0.25)


def test_overrides_layer_default_arch_gpu():
    """gpu overrides beat arch overrides beat defaults (H100-PCIe gemm eff_max 0.70, H100 0.84, A100 0.80)."""
    assert EFF.params(get_gpu("H100-PCIe-80GB"))["gemm"]["eff_max"] == 0.70
    assert EFF.params(get_gpu("H100"))["gemm"]["eff_max"] == 0.84
    assert EFF.params(get_gpu("A100"))["gemm"]["eff_max"] == 0.80
    assert EFF.params(get_gpu("A100-PCIe-40GB"))["gemm"]["eff_max"] == 0.80  # no per-board constant
    assert EFF.params(get_gpu("L40S"))["gemm"]["eff_max"] == 0.75
    assert EFF.params(get_gpu("H200"))["attention"]["sk_half"] == 2000


def test_public_a100_pcie_gemm_case_within_10_percent():
    """public_cases.yaml kernel-a100-pcie40: all five sizes within 10% of the published TFLOP/s.

    Small sizes run at boost (their whole run is < 0.1 s of load), 8192/10240 mostly at the 250 W
    power-capped clock; the 2048 dip is wave quantization (128 tiles of 256x128 on 108 SMs)."""
    g = get_gpu("A100-PCIe-40GB")
    published = {1024: 94.89, 2048: 138.46, 4096: 234.14, 8192: 215.26, 10240: 211.72}
    for pt in square_gemm_benchmark(g, EFF.params(g), tuple(published)):
        assert abs(pt.tflops / published[pt.n] - 1) < 0.10, pt


def test_tile_policy_keeps_the_largest_tile_that_fills_a_wave():
    """2048^3 on 108 SMs: 256x128 gives 128 tiles (>= 108) -> 2 waves, 128/216 busy; 'best' would take
    128x64 (512 tiles, 5 waves, 512/540 x 0.85)."""
    p = dict(EFF.params(get_gpu("A100"))["gemm"])
    ramp = 2048 / (2048 + 128)
    assert gemm_efficiency(2048, 2048, 2048, 1, 108, p) == pytest.approx(0.80 * 128 / 216 * ramp)
    assert gemm_efficiency(2048, 2048, 2048, 1, 108, {**p, "tile_policy": "best"}) == pytest.approx(
        0.80 * 0.85 * 512 / 540 * ramp)
    with pytest.raises(ConfigError, match="gemm tile_policy 'fastest' is unknown; valid: best, largest_full_wave"):
        gemm_efficiency(2048, 2048, 2048, 1, 108, {**p, "tile_policy": "fastest"})


def test_power_capped_clock_slows_tensor_math_only():
    """A100-PCIe-40GB (250 W, tensor work draws 400 W at boost): GEMM compute / (250/400)^(1/3); memory unchanged."""
    g = get_gpu("A100-PCIe-40GB")
    assert g.power_clock_ratio == pytest.approx((250 / 400) ** (1 / 3))  # 0.855
    assert get_gpu("A100").power_clock_ratio == 1.0 and get_gpu("A100-PCIe-40GB").at_boost().power_clock_ratio == 1.0
    # Hopper boards carry their measured ratio (gpus.yaml [HOPPER-PWR])
    assert (get_gpu("H100").power_clock_ratio, get_gpu("H200").power_clock_ratio) == (0.86, 0.835)
    dims = {"m": 8192, "n": 8192, "k": 8192, "batch": 1}
    sus = roofline_time("gemm", "bf16", dims, 2.0 * 8192**3, 0, g, EFF.params(g))
    burst = roofline_time("gemm", "bf16", dims, 2.0 * 8192**3, 0, g, EFF.params(g), clock_ratio=1.0)
    assert sus.compute_s == pytest.approx(burst.compute_s / g.power_clock_ratio)
    m1 = roofline_time("elementwise", "bf16", {"numel": 2**28}, 0, 2**30, g, EFF.params(g))
    m2 = roofline_time("elementwise", "bf16", {"numel": 2**28}, 0, 2**30, g, EFF.params(g), clock_ratio=1.0)
    assert m1.seconds == m2.seconds


def test_blackwell_boards_sustain_the_published_b200_throttled_rate():
    """A 1,000 W B200 under back-to-back FlashAttention-4 forwards: 1,450 TFLOP/s at boost, 1,237 once
    throttled (flashinfer PR 2899), 0.853. The GB200 (same die, 1,200 W, best GEMM 1,822 TF/s against the
    B200's 1,745 at boost) sustains the cube root of the power more in absolute rate: 0.853 x 1.2^(1/3)
    x 1,745 / 1,822 = 0.868 of its own boost. The Blackwell Ultra boards are not measured: boost."""
    b, gb = get_gpu("B200"), get_gpu("GB200")
    assert b.power_clock_ratio == pytest.approx(1237 / 1450, abs=5e-4)
    assert gb.power_clock_ratio == pytest.approx(1237 / 1450 * 1.2 ** (1 / 3) * 1745 / 1822, abs=5e-4)
    # the same die: sustained absolute rates go as the cube root of the power limits
    assert gb.power_clock_ratio * 1822 / (b.power_clock_ratio * 1745) == pytest.approx(1.2 ** (1 / 3), rel=1e-3)
    assert get_gpu("B300").power_clock_ratio == 1.0 and get_gpu("GB300").power_clock_ratio == 1.0


def test_t4_sustains_the_published_power_capped_gemm_rate():
    """A T4 under back-to-back 4096^3 fp16 GEMMs runs at about 24 TFLOP/s (NVIDIA forum thread
    264462: power capping at 70 W); the catalogue's measured sustained ratio (0.52 of boost) prices
    that GEMM there, where the boost clock would give 46.5 TFLOP/s."""
    g = get_gpu("T4")
    n = 4096
    dims = {"m": n, "n": n, "k": n, "batch": 1}
    sus = roofline_time("gemm", "fp16", dims, 2.0 * n**3, 6.0 * n * n, g, EFF.params(g))
    burst = roofline_time("gemm", "fp16", dims, 2.0 * n**3, 6.0 * n * n, g, EFF.params(g), clock_ratio=1.0)
    assert g.power_clock_ratio == 0.52
    assert 2.0 * n**3 / sus.seconds / 1e12 == pytest.approx(24.0, rel=0.03)
    assert 2.0 * n**3 / burst.seconds / 1e12 == pytest.approx(46.5, rel=0.01)


def test_loop_seconds_splits_at_the_power_window():
    """10 ms kernels at boost, 12 ms capped, 0.1 s window: kernels 1-10 burst; 6 warm-up + 30 timed
    -> the timed 30 are 4 at 10 ms + 26 at 12 ms = 352 ms."""
    assert loop_seconds(0.010, 0.012, 30, warmup=6) == pytest.approx(0.040 + 26 * 0.012)
    assert loop_seconds(0.001, 0.002, 30, warmup=6) == pytest.approx(0.030)  # all inside the window
    assert loop_seconds(0.015, 0.020, 1) == pytest.approx(0.015)  # straddles nothing: 15 ms < 100 ms


def test_unknown_override_parameter_rejected(tmp_path):
    """An override naming a parameter the defaults lack fails at load, naming it."""
    doc = EFF.to_doc()
    doc["gpu"] = {"H100-SXM5-80GB": {"gemm": {"eff_maxx": 0.5}}}
    p = tmp_path / "e.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="gpu.H100-SXM5-80GB: efficiency override names unknown parameter 'eff_maxx'"):
        load_efficiency(p)


def test_memory_model_is_not_nan_for_zero_work():
    """A zero-byte, zero-FLOP kernel costs exactly the launch overhead."""
    g = get_gpu("B200")
    r = roofline_time("copy", "bf16", {"numel": 0}, 0.0, 0, g, EFF.params(g))
    assert r.seconds == pytest.approx(g.launch_overhead_s) and not math.isnan(r.seconds)


def test_shapeless_attention_uses_eff_max():
    """An attention op without dims is priced at its direction's eff_max (not as a 1-token kernel)."""
    g = get_gpu("H100")
    r = roofline_time("attention", "bf16", {}, 1e12, 0, g, EFF.params(g))
    assert r.efficiency == 0.75 and r.seconds == pytest.approx(3.5e-6 + 1e12 / (989.4e12 * 0.86 * 0.75))


@pytest.mark.parametrize("impl,causal,direction,published", [
    # Shah et al. 2024 (FlashAttention-3), H100 SXM5, hd 128, 16k tokens of 16 heads: TF/s at 2k, 8k keys
    ("fused", True, "fwd", (484, 529)),
    ("fused", False, "fwd", (617, 600)),
    ("fused", False, "bwd", (465, 518)),
    ("flash", True, "fwd", (298, 333)),
    ("flash", False, "fwd", (362, 370)),
    ("flash", False, "bwd", (291, 318)),
])
def test_attention_implementation_curves_reproduce_published_rates(impl, causal, direction, published):
    """On H100 at boost, the cuDNN (fused) and FlashAttention-2 (flash) curves price the published
    kernels within 8%; causal FLOPs are the executed half (as the paper counts them)."""
    g = get_gpu("H100").at_boost()
    for s, tflops in zip((2048, 8192), published):
        b, h, d = 16384 // s, 16, 128
        full = 4.0 * b * h * s * s * d * (2.5 if direction == "bwd" else 1.0)
        flops = full / 2 if causal else full
        dims = {"b": b, "h": h, "hkv": h, "sq": s, "sk": s, "d": d, "causal": causal, "dir": direction, "impl": impl}
        r = roofline_time("attention", "bf16", dims, flops, 0, g, EFF.params(g))
        assert flops / r.compute_s / 1e12 == pytest.approx(tflops, rel=0.08)


def test_attention_without_implementation_keeps_the_class_curve():
    """No impl, or one the arch lists no curve for (ampere has none), prices by the class curve;
    the noncausal entry applies only to kernels without a causal mask."""
    h100, a100 = get_gpu("H100"), get_gpu("A100")
    dims = {"b": 1, "h": 32, "sq": 4096, "sk": 4096, "d": 128, "causal": True, "dir": "fwd"}
    base = attention_efficiency(dims, 132, EFF.params(h100)["attention"])
    assert base == pytest.approx(0.75 * 4096 / 6096 * 1024 / 1056)  # eff_max * ramp * waves (1024 blocks)
    assert attention_efficiency({**dims, "impl": "other"}, 132, EFF.params(h100)["attention"]) == base
    assert attention_efficiency({**dims, "causal": False}, 132, EFF.params(h100)["attention"]) == base
    fused = attention_efficiency({**dims, "impl": "fused"}, 132, EFF.params(h100)["attention"])
    assert fused == pytest.approx(0.575 * 4096 / (4096 + 385) * 1024 / 1056)
    p = EFF.params(a100)["attention"]
    assert attention_efficiency({**dims, "impl": "fused"}, 108, p) == attention_efficiency(dims, 108, p)


def test_stream_k_drops_the_partial_wave_from_one_full_wave_up():
    """Hopper's stream_k policy: 2048x2304x4096 has 144 tiles of 256x128 on 132 SMs (1.09 waves):
    no wave loss, eff = 0.84 * 4096/4352 (measured on an H200: 734 TF/s, efficiency.yaml); best
    would take 128x64 tiles, 576 in 5 waves: 0.84 * 0.85 * 576/660 * 4096/4352. A grid under
    one wave (512x512x512: 8 tiles) is priced alike by both (split-K)."""
    p = EFF.params(get_gpu("H100"))["gemm"]
    assert p["tile_policy"] == "stream_k"
    assert gemm_efficiency(2048, 2304, 4096, 1, 132, p) == pytest.approx(0.84 * 4096 / 4352)
    best = {**p, "tile_policy": "best"}
    assert gemm_efficiency(2048, 2304, 4096, 1, 132, best) == pytest.approx(0.84 * 0.85 * 576 / 660 * 4096 / 4352)
    assert gemm_efficiency(512, 512, 512, 1, 132, p) == gemm_efficiency(512, 512, 512, 1, 132, best)


def test_sm_margin_gemm_runs_on_the_remaining_sms():
    """A GEMM recorded with sm_margin 24 (TE's set_sm_margin under a pipelined reduce-scatter) runs on
    132 - 24 = 108 SMs of the H100: 8192^3 (2048 tiles, stream-K, no wave loss) at 108/132 of the
    unreserved efficiency."""
    g = get_gpu("H100")
    n = 8192
    dims = {"m": n, "n": n, "k": n, "batch": 1}
    full = roofline_time("gemm", "bf16", dims, 2.0 * n**3, 0, g, EFF.params(g))
    kept = roofline_time("gemm", "bf16", {**dims, "sm_margin": 24}, 2.0 * n**3, 0, g, EFF.params(g))
    assert kept.efficiency == pytest.approx(full.efficiency * 108 / 132)
    assert kept.compute_s == pytest.approx(full.compute_s * 132 / 108)


_PUBLISHED = compare()
_MAMF = [(r, c, e) for r, c, e in _PUBLISHED if r.source == "mamf"]
# Best-shape rates the curves do not reach, with the reason (strict: one that starts passing fails).
_MAMF_GAPS = {("A100-SXM4-80GB", "bf16"): "ampere curve set by the public A100 PCIe case; the 400 W SXM4 "
              "board's best shape runs 12% above it (its sustained clock is not measured)"}


@pytest.mark.parametrize("index", [
    pytest.param(i, id=f"{r.gpu}-{r.dtype}",
                 marks=pytest.mark.xfail(strict=True, reason=_MAMF_GAPS[(r.gpu, r.dtype)])
                 if (r.gpu, r.dtype) in _MAMF_GAPS else ())
    for i, (r, _, _) in enumerate(_MAMF)])
def test_gemm_curves_reproduce_published_maximum_matmul_rates(index):
    """At boost (the benchmark's regime), each arch's GEMM curve prices the published best-shape
    torch.matmul rate within 5% (kernel_db/data/published_gemm.yaml: Hopper's curve fitted on this
    project's H100 rows, Blackwell's and CDNA 3's set from these figures)."""
    r, curve, _ = _MAMF[index]
    assert curve == pytest.approx(r.tflops, rel=0.05)


@pytest.mark.parametrize("device,max_mean,max_abs", [("sm_90", 0.03, 0.07), ("gfx942", 0.03, 0.10)])
def test_gemm_curves_follow_xla_measured_dots(device, max_mean, max_abs):
    """XLA's measured dots of 8.6 GFLOP or more: the hopper curve (fitted on other rows) and the
    gfx942 curve (its shape model chosen on these) within 3% on average, 7% / 10% per row (mean
    |log error|)."""
    errs = [e for r, _, e in _PUBLISHED if r.source == f"xla:{device}" and r.flops >= 2**33]
    assert len(errs) == 160
    assert abs(sum(errs) / len(errs)) <= max_mean
    assert sum(map(abs, errs)) / len(errs) <= max_abs


@pytest.mark.parametrize("n", [6144, 8192])
def test_blackwell_fp4_curve_keeps_the_harness_ratio_to_bf16(n):
    """NVFP4 and bf16 GEMMs timed side by side on one B200 (pytorch/ao PR 2427): the curves' fp4 /
    bf16 throughput ratio at n^3 is the harness's within 5% (5,500 / 1,450 = 3.79 at 6144^3,
    5,370 / 1,420 = 3.78 at 8192^3); the curves give 3.67 and 3.70."""
    rates = {r.dtype: (r, c) for r, c, _ in _PUBLISHED if r.source == "harness" and r.m == n}
    measured = rates["fp4"][0].tflops / rates["bf16"][0].tflops
    assert rates["fp4"][1] / rates["bf16"][1] == pytest.approx(measured, rel=0.05)


def test_fp4_gemm_on_a_gpu_without_fp4_tensor_cores_is_refused():
    g = get_gpu("H100")
    with pytest.raises(ConfigError, match=r"^H100-SXM5-80GB has no fp4 tensor cores \(sm_90; fp4 GEMMs such as "
                                          r"NVFP4 need Blackwell, sm_100 or later\): run the job in fp8 or bf16"):
        roofline_time("gemm", "fp4", {"m": 4096, "n": 4096, "k": 4096}, 2.0 * 4096**3, 0, g, EFF.params(g))


def test_published_gemm_file_errors_name_the_row_format(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("schema_version: 1\nmaximum_matmul: {rows: [[H100, bf16, 1]]}\nxla_dots: {rows: {}, devices: {}}\n")
    with pytest.raises(ConfigError, match=r"malformed .*each maximum_matmul and same_harness row is "
                                          r"\[gpu, dtype, m, n, k, TF/s, software\]"):
        load_published(bad)


def test_blackwell_gemm_efficiency_hand_checked():
    """B200, 8192^3 bf16: 256x128 tiles give 32 x 64 = 2048 tiles, >= 148 SMs so stream-K has no
    wave loss; K ramp 8192 / (8192 + 64); eff_max 0.813 -> 0.8067 of 2,250 TF/s."""
    p = EFF.params(get_gpu("B200"))["gemm"]
    assert gemm_efficiency(8192, 8192, 8192, 1, 148, p) == pytest.approx(0.813 * 8192 / 8256)
    gb = EFF.params(get_gpu("GB200"))["gemm"]
    assert (gb["eff_max"], gb["dtype"]["fp8"]["eff_max"], gb["k_half"]) == (0.752, 0.753, 64)


@pytest.mark.parametrize("causal,published", [
    # FlashAttention-4 forward on a B200, head dim 128, 32k tokens of 16 heads: share of 2,250 TF/s
    # at 1k, 2k, 4k, 8k, 16k keys (Dao-AILab/flash-attention PR 2605)
    (False, (0.433, 0.503, 0.558, 0.573, 0.591)),
    (True, (0.293, 0.400, 0.472)),
])
def test_blackwell_attention_curve_reproduces_published_forward_rates(causal, published):
    g = get_gpu("B200")
    p = EFF.params(g)["attention"]
    for s, share in zip((1024, 2048, 4096, 8192, 16384), published):
        dims = {"b": 32768 // s, "h": 16, "sq": s, "sk": s, "d": 128, "causal": causal, "dir": "fwd"}
        assert attention_efficiency(dims, g.sm_count, p) == pytest.approx(share, rel=0.03)


def test_ssm_scan_runs_its_math_at_the_published_fraction_and_its_states_through_hbm():
    """Mamba-2's fused scan (kernel class ssm) on H100: 1 TFLOP forward at 0.137 of the 989.4 TF/s
    bf16 peak at the sustained clock (0.86), 8.6 ms; 40 GB of traffic at 0.9 x 0.9 of 3.35 TB/s
    (14.7 ms) binds instead."""
    g = get_gpu("H100")
    r = roofline_time("ssm", "bf16", {"dir": "fwd"}, 1e12, 0, g, EFF.params(g))
    assert r.bound == "compute" and r.efficiency == 0.137
    assert r.seconds == pytest.approx(3.5e-6 + 1e12 / (989.4e12 * 0.86 * 0.137))
    m = roofline_time("ssm", "bf16", {"dir": "bwd"}, 1e12, 40e9, g, EFF.params(g))
    assert m.bound == "memory" and m.seconds == pytest.approx(3.5e-6 + 40e9 / (3.35e12 * 0.9 * 0.9))


def test_a_sliding_window_kernel_ramps_over_the_keys_it_visits():
    """Window 127 over 8k keys: a query tile of block_m rows visits 127 + block_m keys, so the kernel
    runs at the efficiency of a 127 + block_m-key one, not an 8k-key one."""
    g = get_gpu("H100")
    p = EFF.params(g)["attention"]
    base = {"b": 1, "h": 64, "sq": 8192, "d": 64, "dir": "fwd", "causal": True}
    bm = int(p["block_m"])
    windowed = attention_efficiency({**base, "sk": 8192, "window": 127}, g.sm_count, p)
    assert windowed == pytest.approx(attention_efficiency({**base, "sk": 127 + bm}, g.sm_count, p))
    assert windowed < attention_efficiency({**base, "sk": 8192}, g.sm_count, p)
