"""heterosim.cluster.gpus (the GPU-types registry): datasheet figures, SI units, name resolution, errors."""

import pytest

from heterosim.errors import ConfigError, UnknownGPUError
from heterosim.cluster.gpus import OPTIONAL_DTYPES, DTYPES, canonical_key, get_gpu, load_catalogue

REQUIRED = ["V100", "A100-SXM4-40GB", "A100-SXM4-80GB", "A100-PCIe-40GB", "A100-PCIe-80GB", "A800", "H100",
            "H100-PCIe", "H800", "H20", "H200", "B200", "GB200", "L40S", "MI300X"]


def test_required_gpus_present():
    """Every GPU the issue lists resolves, with all five dtype peaks and a source."""
    for name in REQUIRED:
        g = get_gpu(name)
        assert set(DTYPES) <= set(g.peak_flops) <= set(DTYPES + OPTIONAL_DTYPES)
        assert g.sources
        assert g.hbm_bw > 0 and g.hbm_bytes > 0 and g.sm_count > 0 and g.l2_bytes > 0


def test_h100_datasheet_values_in_si():
    """H100 SXM: 989.4 dense bf16 TFLOP/s, 3.35 TB/s, 80 GiB, 132 SMs, 50 MiB L2, 450 GB/s/dir NVLink."""
    g = get_gpu("H100")
    assert g.name == "H100-SXM5-80GB"
    assert g.peak_flops["bf16"] == pytest.approx(989.4e12)
    assert g.peak_flops["fp8"] == pytest.approx(1978.9e12)
    assert g.hbm_bw == pytest.approx(3.35e12)
    assert g.hbm_bytes == 80 * 2**30
    assert g.sm_count == 132
    assert g.l2_bytes == 50 * 2**20
    assert g.nvlink_bw == pytest.approx(450e9)
    assert g.compute_capability == 90
    assert g.launch_overhead_s == pytest.approx(3.5e-6)
    assert g.ridge("bf16") == pytest.approx(989.4e12 / 3.35e12)


def test_aliases_case_and_punctuation_insensitive():
    """'H100', 'h100-sxm' and the CUDA device name all resolve to the same entry."""
    names = ["H100", "h100-sxm", "NVIDIA H100 80GB HBM3", "h100_sxm5", " H100 SXM5 "]
    assert {get_gpu(n).name for n in names} == {"H100-SXM5-80GB"}
    assert get_gpu("NVIDIA A100-PCIE-40GB").name == "A100-PCIe-40GB"
    assert canonical_key("H100-SXM") == "h100sxm"


def test_unknown_gpu_lists_known_names():
    """An unknown name raises UnknownGPUError naming it and listing the catalogue."""
    with pytest.raises(UnknownGPUError, match=r"unknown GPU 'Z9000'; known GPUs: V100-SXM2-32GB, .*H100-SXM5-80GB"):
        get_gpu("Z9000")


def test_export_variants_differ_only_in_nvlink():
    """A800 and H800 keep A100/H100 compute and memory but have 400 GB/s bidir NVLink (200 per dir)."""
    for cut, full in (("A800", "A100-SXM4-80GB"), ("H800", "H100")):
        a, b = get_gpu(cut), get_gpu(full)
        assert a.peak_flops == b.peak_flops and a.hbm_bw == b.hbm_bw
        assert a.nvlink_bw == pytest.approx(200e9)


def test_bad_catalogue_rejected(tmp_path):
    """A catalogue with a missing key or a wrong schema_version fails naming the problem."""
    p = tmp_path / "g.yaml"
    p.write_text("schema_version: 2\ngpus: []\n")
    with pytest.raises(ConfigError, match="schema_version 2 is not supported; write schema_version: 1"):
        load_catalogue(p)
    p.write_text("schema_version: 1\ngpus:\n  - {name: X, vendor: nvidia}\n")
    with pytest.raises(ConfigError, match="GPU entry 'X' has unknown keys \\[\\] / missing keys"):
        load_catalogue(p)
    import yaml

    entry = {"name": "X", "vendor": "nvidia", "arch": "turing", "compute_capability": 75,
             "peak_TFLOPs": {"fp32": 8, "tf32": 8, "bf16": 8, "fp16": 65, "fp8": 65}, "hbm_bw_GBps": 320,
             "memory_GiB": 16, "sm_count": 40, "l2_MiB": 4, "nvlink_bw_GBps": 0, "pcie_bw_GBps": 16,
             "tdp_W": 70, "sources": "test", "sustained_clock_ratio": 1.5}
    p.write_text(yaml.safe_dump({"schema_version": 1, "gpus": [entry]}))
    with pytest.raises(ConfigError, match=r"X: sustained_clock_ratio must be a fraction in \(0, 1\] of the boost "
                                          r"clock's tensor throughput, got 1.5"):
        load_catalogue(p)


def test_fp4_peak_is_optional_and_only_fp4(tmp_path):
    """peak_TFLOPs gives the five dtypes, plus fp4 only where the GPU has fp4 tensor cores (the
    Blackwell entries: B200 9,000 = 144 PF sparse / 8 / 2; B300 13,500 = its 108 PF dense / 8)."""
    import yaml

    assert get_gpu("B200").peak_flops["fp4"] == 9000e12 and get_gpu("B300").peak_flops["fp4"] == 13500e12
    assert get_gpu("GB200").peak_flops["fp4"] == 10000e12 and get_gpu("GB300").peak_flops["fp4"] == 15000e12
    assert "fp4" not in get_gpu("H100").peak_flops
    entry = {"name": "X", "vendor": "nvidia", "arch": "blackwell", "compute_capability": 100,
             "peak_TFLOPs": {"fp32": 8, "tf32": 8, "bf16": 8, "fp16": 8, "fp8": 16, "fp4": 32}, "hbm_bw_GBps": 320,
             "memory_GiB": 16, "sm_count": 40, "l2_MiB": 4, "nvlink_bw_GBps": 0, "pcie_bw_GBps": 16,
             "tdp_W": 70, "sources": "test"}
    p = tmp_path / "g.yaml"
    p.write_text(yaml.safe_dump({"schema_version": 1, "gpus": [entry]}))
    assert load_catalogue(p).get("X").peak("fp4") == 32e12
    entry["peak_TFLOPs"] = {**entry["peak_TFLOPs"], "fp6": 32}
    p.write_text(yaml.safe_dump({"schema_version": 1, "gpus": [entry]}))
    with pytest.raises(ConfigError, match=r"X: peak_TFLOPs must give exactly \('fp32', 'tf32', 'bf16', 'fp16', "
                                          r"'fp8'\), and \('fp4',\) where the GPU has tensor cores for it"):
        load_catalogue(p)


def test_bad_yaml_is_one_clear_error(tmp_path):
    """A catalogue that is not YAML names the file (the project's common wording)."""
    from heterosim.cluster.gpus import load_catalogue

    p = tmp_path / "gpus.yaml"
    p.write_text("gpus: [\n")
    with pytest.raises(ConfigError, match=f"GPU catalogue {p}: not valid YAML"):
        load_catalogue(p)


def test_older_and_consumer_gpus_from_their_datasheets():
    """T4, TITAN RTX, A10, RTX 3090/4090, L4 and MI250X (per GCD), checked by hand against the sources."""
    t4 = get_gpu("Tesla T4")
    assert (t4.peak_flops["fp16"], t4.peak_flops["bf16"], t4.hbm_bw, t4.hbm_bytes) == (65e12, 8.1e12, 320e9, 16 * 2**30)
    assert get_gpu("RTX 3090").peak_flops["bf16"] == 71e12  # fp32 accumulate: half of 142
    assert get_gpu("RTX 4090").peak_flops["fp8"] == 330.3e12 and get_gpu("RTX 4090").nvlink_bw == 0
    assert get_gpu("TITAN RTX").peak_flops["fp16"] == 130.5e12
    assert get_gpu("A10").peak_flops["tf32"] == 62.5e12 and get_gpu("L4").peak_flops["fp8"] == 242.5e12
    mi = get_gpu("MI250X")
    assert mi.peak_flops["bf16"] == 383e12 / 2 and mi.hbm_bytes == 128 * 2**30 / 2 and mi.hbm_bw == 3276.8e9 / 2


def test_gb200_is_the_nvl72_datasheet_per_gpu():
    """GB200 NVL72 datasheet / 72 GPUs, sparse halved: bf16 360 PF -> 2.5 PF dense, fp8 720 PF -> 5 PF,
    576 TB/s -> 8 TB/s; NVLink 130 TB/s bidirectional -> 900 GB/s per direction; the same die as B200."""
    g, b = get_gpu("NVIDIA GB200"), get_gpu("B200")
    assert (g.peak_flops["bf16"], g.peak_flops["fp8"]) == (2.5e15, 5.0e15)
    assert g.hbm_bw == 8.0e12 and g.nvlink_bw == 900e9
    assert (g.arch, g.compute_capability, g.sm_count, g.l2_bytes) == (b.arch, b.compute_capability, b.sm_count, b.l2_bytes)
    assert g.peak_flops["bf16"] / b.peak_flops["bf16"] == pytest.approx(2500 / 2250)


def test_blackwell_ultra_keeps_blackwells_bf16_and_fp8_rates():
    """HGX B300 / GB300 NVL72 specifications: the B200 / GB200 bf16 and fp8 tensor rates (36 / 72 PF
    sparse per 8 GPUs, 360 / 720 PF per 72), 288 GB at 8 TB/s per B300, sm_103 and 160 SMs."""
    b3, g3 = get_gpu("NVIDIA B300"), get_gpu("GB300 NVL72")
    for ultra, base in ((b3, get_gpu("B200")), (g3, get_gpu("GB200"))):
        assert (ultra.peak_flops["bf16"], ultra.peak_flops["fp8"]) == (base.peak_flops["bf16"], base.peak_flops["fp8"])
        assert (ultra.arch, ultra.compute_capability, ultra.sm_count) == ("blackwell", 103, 160)
    assert b3.hbm_bytes == 288 * 2**30 and b3.hbm_bw == 8.0e12


def test_expected_largest_normal_draw_by_bloms_formula():
    """Blom: Phi^-1((n - 0.375) / (n + 0.25)); 0 for one draw; within 0.03 of the exact integral
    E[max] = int x n phi(x) Phi(x)^(n-1) dx (8 draws: 1.4236, 2,048: 3.4418)."""
    import math

    import numpy as np

    from heterosim.cluster.gpus import expected_max_normal

    assert expected_max_normal(1) == 0.0 and expected_max_normal(0) == 0.0
    assert expected_max_normal(8) == pytest.approx(1.4342, abs=1e-4)  # Phi^-1(7.625 / 8.25 = 0.92424)
    x = np.linspace(-10, 10, 200001)
    phi = np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x]))
    for n in (2, 8, 128, 2048):
        exact = float(np.trapezoid(x * n * phi * cdf ** (n - 1), x))
        assert expected_max_normal(n) == pytest.approx(exact, abs=0.03)
    zs = [expected_max_normal(n) for n in (2, 16, 256, 4096)]
    assert zs == sorted(zs)


def test_the_slowest_of_n_power_capped_boards():
    """Power-capped boards spread 1.5% (gpus.yaml defaults, [BOARD-SPREAD]); the slowest of 8 H100s
    runs 0.86 x (1 - 1.4342 x 0.015) = 0.8415 of boost; boards at boost (A100 SXM4) do not spread."""
    h100 = get_gpu("H100")
    assert (h100.clock_spread, h100.board_spread) == (0.015, 0.015)
    assert h100.slowest_of(1) is h100
    slow = h100.slowest_of(8)
    assert slow.power_clock_ratio == pytest.approx(0.86 * (1 - 1.4342 * 0.015), abs=1e-5)
    assert slow.power_clock_ratio == pytest.approx(0.8415, abs=1e-4)
    assert h100.slowest_of(2048).power_clock_ratio < slow.power_clock_ratio
    assert slow.peak("bf16") == h100.peak("bf16")  # the datasheet peak stays; the clock moves
    a100 = get_gpu("A100-SXM4-80GB")
    assert (a100.power_clock_ratio, a100.board_spread) == (1.0, 0.0)
    assert a100.slowest_of(1024) is a100
    pcie = get_gpu("A100-PCIe-40GB")  # 250 W: (250 / 400) ** (1/3) = 0.855, capped, so it spreads
    assert pcie.slowest_of(8).power_clock_ratio == pytest.approx(0.855 * (1 - 1.4342 * 0.015), abs=1e-3)


def test_bad_board_spread_is_one_clear_error(tmp_path):
    import yaml

    entry = {"name": "X", "vendor": "nvidia", "arch": "turing", "compute_capability": 75,
             "peak_TFLOPs": {"fp32": 8, "tf32": 8, "bf16": 8, "fp16": 65, "fp8": 65}, "hbm_bw_GBps": 320,
             "memory_GiB": 16, "sm_count": 40, "l2_MiB": 4, "nvlink_bw_GBps": 0, "pcie_bw_GBps": 16,
             "tdp_W": 70, "sources": "test", "sustained_clock_spread": 0.5}
    p = tmp_path / "g.yaml"
    p.write_text(yaml.safe_dump({"schema_version": 1, "gpus": [entry]}))
    with pytest.raises(ConfigError, match=r"X: sustained_clock_spread must be a relative standard deviation in "
                                          r"\[0, 0.2\) of the sustained tensor throughput across boards, got 0.5"):
        load_catalogue(p)
    entry["sustained_clock_spread"] = 0.02
    p.write_text(yaml.safe_dump({"schema_version": 1, "defaults": {"sustained_clock_spread": 0.01},
                                 "gpus": [entry]}))
    assert load_catalogue(p).get("X").clock_spread == 0.02  # the entry over the file's default
    del entry["sustained_clock_spread"]
    p.write_text(yaml.safe_dump({"schema_version": 1, "defaults": {"sustained_clock_spread": 0.01},
                                 "gpus": [entry]}))
    assert load_catalogue(p).get("X").clock_spread == 0.01


def test_with_specs_replaces_by_name_and_keeps_aliases():
    from heterosim.cluster.gpus import with_specs

    cat = load_catalogue()
    slow = cat.get("H100").slowest_of(64)
    new = with_specs(cat, {slow.name: slow})
    assert new.get("H100") is slow and new.get("h100-sxm5-80gb") is slow
    assert new.get("A100") is cat.get("A100") and new.names() == cat.names()
    assert with_specs(cat, {}) is cat


def test_every_catalogue_gpu_round_trips_through_its_entry():
    from heterosim.cluster.gpus import entry_of, spec_from_entry

    for g in load_catalogue().gpus:
        assert spec_from_entry(entry_of(g), {}, "test") == g


def test_a_board_at_another_power_limit_by_the_cube_law():
    """H100 SXM: 0.86 of boost at 700 W, so P_boost = 700 / 0.86^3 = 1100.6 W and at 500 W
    (500 / 1100.6)^(1/3) = 0.7688; A100 SXM4 holds boost at 400 W (P_boost 400): 300 W gives
    0.75^(1/3) = 0.9086; a limit above the boost power holds boost."""
    h = get_gpu("H100").at_power_limit(500)
    assert h.name == "H100-SXM5-80GB@500W" and h.tdp_w == 500 and h.aliases == ()
    assert h.power_clock_ratio == pytest.approx(0.86 * (500 / 700) ** (1 / 3), rel=1e-12)
    assert h.power_clock_ratio == pytest.approx(0.7688, abs=1e-4)
    assert get_gpu("H100").at_power_limit(700).power_clock_ratio == pytest.approx(0.86, rel=1e-12)
    assert get_gpu("A100-SXM4-80GB").at_power_limit(300).power_clock_ratio == pytest.approx(0.75 ** (1 / 3))
    assert get_gpu("A100-SXM4-80GB").at_power_limit(450).power_clock_ratio == 1.0
    with pytest.raises(ConfigError, match=r"H100-SXM5-80GB: power limit must be a finite number > 0 W, got -5"):
        get_gpu("H100").at_power_limit(-5)
