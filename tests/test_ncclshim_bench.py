"""ncclshim.bench: the nccl-tests-like sweep and its table."""

import pytest

from heterosim.errors import ConfigError
from ncclshim.bench import format_table, parse_size, rows_to_json, sweep
from ncclshim.view import preset_view


def test_parse_size_uses_powers_of_1024():
    """8 -> 8, 64K -> 65536, 128M -> 2^27, 8G -> 2^33 (nccl-tests' -b/-e syntax)."""
    assert [parse_size(s) for s in ("8", "64K", "128M", "8G", "1k")] == [8, 65536, 1 << 27, 1 << 33, 1024]
    with pytest.raises(ConfigError, match="size '8 GB!' is not understood; write e.g. 8, 64K, 128M or 8G"):
        parse_size("8 GB!")


def test_sweep_doubles_and_rounds_to_the_group():
    """Sizes double from min to max; all_gather sizes round down to ranks x element size."""
    v = preset_view("dgx-a100")
    rows = sweep(v, "all_gather", 8, 1024)
    assert [r.size_bytes for r in rows] == [16, 32, 64, 128, 256, 512, 1024]  # 8 B < 8 ranks x 2 B: skipped
    assert rows[0].count == 8 and rows[0].dtype == "bf16"
    ar = sweep(v, "all_reduce", 1 << 30, 1 << 30)
    assert (ar[0].algo, ar[0].proto) == ("RING", "SIMPLE")
    assert ar[0].busbw_GBps == pytest.approx(ar[0].algbw_GBps * 14 / 8)


def test_table_and_json_rows():
    """The table has nccl-tests' columns plus algo/proto; JSON rows carry units in their keys."""
    rows = sweep(preset_view("dgx-h100"), "all_reduce", 1 << 20, 1 << 21)
    text = format_table(rows, title="t")
    assert text.splitlines()[1].split() == ["#", "size", "count", "type", "time", "algbw", "busbw", "algo", "proto",
                                            "nch"]
    assert "# Avg bus bandwidth" in text.splitlines()[-1]
    assert set(rows_to_json(rows)[0]) == {"size_bytes", "count", "dtype", "time_us", "algbw_GBps", "busbw_GBps",
                                          "algo", "proto", "nchannels"}


def test_sweep_errors():
    """Unknown ops and dtypes and inverted ranges are named."""
    v = preset_view("dgx-a100")
    with pytest.raises(ConfigError, match="--op 'allreduce' is not a collective ncclshim benchmarks"):
        sweep(v, "allreduce", 8, 16)
    with pytest.raises(ConfigError, match="--dtype 'fp12' is unknown"):
        sweep(v, "all_reduce", 8, 16, dtype="fp12")
    with pytest.raises(ConfigError, match=r"need 1 <= min-bytes \(64\) <= max-bytes \(8\)"):
        sweep(v, "all_reduce", 64, 8)
