"""ncclshim.sweeps: published nccl-tests sweeps (ncclshim/data/nccl_tests_h100.yaml) against ncclshim.

Every recorded size is one case held to the file's tolerance (5%). Sizes ncclshim does not yet
reach are listed in GAPS with the reason, as strict xfails: one that starts passing fails the
suite, so the list shrinks as the model improves (docs/nccl.md §5 has the table).
"""

import pytest

from heterosim.errors import ConfigError
from ncclshim.sweeps import compare, fit_nvls, load, point_busbw

CATALOG = load()
TOLERANCE, SWEEPS = CATALOG.tolerance_pct, CATALOG.sweeps
_ROWS = {s.id: compare(s) for s in SWEEPS}
_MIB = 1 << 20

# (sweep id, size) -> why ncclshim is off there. 1 MiB: both NVLS sweeps (two providers, NCCL 2.18
# and 2.26) take 42 us, the Together ring too (and 35 us at 8 B on those hosts, NVLS inactive),
# where NVIDIA's one-process-per-GPU sweep takes 27 us (ring LL, +2.4%): a floor of the -g 8
# harness and launch that no NCCL constant holds. Ring 4-8 MiB: NCCL's own LL128 estimate.
GAPS = {(sid, 1 * _MIB): "launch / harness floor (42 us in both sweeps)"
        for sid in ("h100x8-nvls-together-2026-03", "h100x8-nvls-azure-ndv5")}
GAPS.update({
    ("h100x8-ring-together-2026-03", 1 * _MIB): "launch / harness floor (42 us at 1-2 MiB)",
    ("h100x8-ring-together-2026-03", 4 * _MIB): "NCCL's LL128 estimate at 4 MiB (the protocol switch)",
    ("h100x8-ring-together-2026-03", 8 * _MIB): "NCCL's LL128 estimate at 8 MiB",
})

# Ring reduce_scatter / all_gather (one host of the same provider): 1-4 MiB sit at the same 35-42 us
# floor; from 32 MiB NCCL's ring/Simple bandwidth is the asymptote, reached only from ~1 GiB (busbw
# 285 GB/s at 64 MiB, 362 at 8 GiB), where ncclshim (= NCCL's estimate) has no ramp.
for _sid, _mid in (("h100x8-ring-rs-together-2026-03", (64, 128)), ("h100x8-ring-ag-together-2026-03", (32, 64, 128, 256))):
    GAPS.update({(_sid, m * _MIB): "launch / harness floor (35-42 us up to 4 MiB)" for m in (1, 2, 4)})
    GAPS.update({(_sid, m * _MIB): "ring/Simple bandwidth ramp: NCCL's asymptotic busbw from 32 MiB" for m in _mid})

_CASES = [pytest.param(sid, i, id=f"{sid}-{r.size_bytes >> 20}MiB",
                       marks=pytest.mark.xfail(strict=True, reason=GAPS[(sid, r.size_bytes)])
                       if (sid, r.size_bytes) in GAPS else ())
          for sid, rows in _ROWS.items() for i, r in enumerate(rows)]


@pytest.mark.parametrize("sweep_id,index", _CASES)
def test_size_within_tolerance(sweep_id, index):
    r = _ROWS[sweep_id][index]
    assert abs(r.error) <= TOLERANCE / 100, f"{r.size_bytes} B: {r.predicted_us:.1f} us vs {r.measured_us:.1f} us"


@pytest.mark.parametrize("point", CATALOG.points, ids=lambda p: p.id)
def test_published_figure_within_tolerance(point):
    """Single figures: NVLS busbw by GPU count (nccl#1455), 2 and 4 nodes (nccl-tests#309)."""
    busbw, _ = point_busbw(point)
    assert busbw == pytest.approx(point.busbw_GBps, rel=TOLERANCE / 100)


@pytest.mark.parametrize("sweep_id", ["h100x8-nvls-together-2026-03", "h100x8-nvls-azure-ndv5"])
def test_nvls_error_is_bounded_and_beats_nccls_estimate(sweep_id):
    """Worst NVLS size from 2 MiB: within 5% (NCCL's own estimate is 34% fast at 8 MiB); 1 MiB, at the
    harness's 42 us floor, 20% fast."""
    rows = _ROWS[sweep_id]
    assert max(abs(r.error) for r in rows if r.size_bytes >= 2 * _MIB) < 0.05
    assert -0.21 < rows[0].error < -0.19
    assert max(abs(r.nccl_error) for r in rows) > 0.30
    mid = [r for r in rows if 4 * _MIB <= r.size_bytes <= 512 * _MIB]
    assert sum(abs(r.error) for r in mid) < sum(abs(r.nccl_error) for r in mid) / 3


def test_compare_plans_each_size_as_it_ran():
    """Forced NCCL_ALGO=NVLS at 1 MiB plans NVLS (NCCL's default there is RING/LL); the measured
    time is the mean over the hosts."""
    (s,) = [s for s in SWEEPS if s.id == "h100x8-nvls-together-2026-03"]
    first = _ROWS[s.id][0]
    assert (first.size_bytes, first.algo, first.proto) == (_MIB, "NVLS", "SIMPLE")
    assert first.measured_us == pytest.approx((41.64 + 42.78) / 2)


def test_busbw_rows_become_times():
    """A sweep published as busbw: time = size / (busbw / (2(n-1)/n)); 8 GiB at 478.87 GB/s on 8 GPUs."""
    (s,) = [s for s in SWEEPS if s.id == "h100x8-nvls-azure-ndv5"]
    size, us = s.rows[-1]
    assert (size, us) == (8 << 30, pytest.approx((8 << 30) * 1.75 / 478.87e3))


def test_bad_files_are_one_clear_error(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("schema_version: 0\nsweeps: []\n")
    with pytest.raises(ConfigError, match="schema_version 0 is not supported"):
        load(old)
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\nsweeps:\n  - {id: x, source: {}, cluster: dgx-h100, nodes: 1, ranks: 8,\n"
                   "     op: all_reduce, dtype: fp32, rows: {1024: [-3]}}\n")
    with pytest.raises(ConfigError, match=r"sweeps\[0\]\.rows\[1024\]: values must be positive numbers \(time_us\)"):
        load(bad)
    short = tmp_path / "short.yaml"
    short.write_text("schema_version: 1\nsweeps:\n  - {id: x}\n")
    with pytest.raises(ConfigError, match="missing source, cluster, nodes, ranks, op, dtype, rows"):
        load(short)


def test_nvls_constants_are_the_together_sweeps_fit():
    """NVLS_RUN_LATENCY_US / NVLS_RUN_EFFICIENCY / NVLS_STEP_US (Hopper) are the fit of the Together
    sweep from 2 MiB; the Azure sweep (another provider, NCCL 2.18) and NVIDIA's (one process per
    GPU, not fitted) alone give similar triples."""
    from ncclshim.constants import NVLS_RUN_EFFICIENCY, NVLS_RUN_LATENCY_US, NVLS_STEP_US

    def fit(sid):
        return fit_nvls(next(s for s in SWEEPS if s.id == sid))

    lat, eff, step_us = fit("h100x8-nvls-together-2026-03")
    assert (NVLS_RUN_LATENCY_US[2], NVLS_RUN_EFFICIENCY[2], NVLS_STEP_US[2]) == (
        round(lat, 2), round(eff, 3), round(step_us, 3))
    assert fit("h100x8-nvls-azure-ndv5") == pytest.approx((19.60, 0.913, 0.588), abs=5e-3)
    assert fit("h100x8-default-dgxc-nvidia") == pytest.approx((16.55, 0.919, 0.644), abs=5e-3)


def test_fit_needs_three_nvls_sizes():
    ring = next(s for s in SWEEPS if s.id == "h100x8-ring-together-2026-03")
    with pytest.raises(ConfigError, match=r"^sweep 'h100x8-ring-together-2026-03': 0 size\(s\) of one-node NVLS "
                       r"all-reduce from 2097152 B; the fit needs three or more$"):
        fit_nvls(ring)


def test_default_sweep_plans_nccls_own_choice():
    """Without NCCL_ALGO, NVIDIA's sweep runs what NCCL picks on one DGX H100 (nccl-tests#309: RING/LL
    up to 1 MB, NVLS/SIMPLE from 2 MB to 16 GB); ncclshim plans the same at every recorded size."""
    rows = _ROWS["h100x8-default-dgxc-nvidia"]
    assert [(r.algo, r.proto) for r in rows] == [("RING", "LL")] + [("NVLS", "SIMPLE")] * (len(rows) - 1)
    assert (rows[0].size_bytes, rows[-1].size_bytes) == (_MIB, 16 << 30)
    assert rows[0].error == pytest.approx(28.01 / 27.37 - 1, abs=1e-3)
