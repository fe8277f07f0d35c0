"""Tests for kernel_db.db: versioned CSV, round trip, merging, concurrency, damaged files."""

import multiprocessing as mp

import pandas as pd
import pytest

from heterosim.errors import KernelDBError
from kernel_db.db import KernelDB, KernelRow, dims_key, merge_rows


def _row(i: int, gpu: str = "H100-SXM5-80GB", t: float = 1e-5, when: str = "2026-01-01T00:00:00Z") -> KernelRow:
    return KernelRow(gpu=gpu, kernel_class="gemm", signature=f"aten.mm.default:bf16:{i}x64,64x64", dtype="bf16",
                     dims=dims_key({"m": i, "n": 64, "k": 64, "batch": 1}), time_s=t, samples=5, recorded_utc=when)


def test_round_trip_and_pandas(tmp_path):
    """Rows written and read back are equal; pandas reads the file with comment='#'."""
    p = tmp_path / "db.csv"
    rows = [_row(i) for i in (3, 1, 2)]
    assert merge_rows(p, rows) == 3
    db = KernelDB.load(p)
    assert sorted(db.rows, key=lambda r: r.key) == sorted(rows, key=lambda r: r.key)
    df = pd.read_csv(p, comment="#")
    assert list(df["time_s"]) == [1e-5] * 3 and len(df) == 3
    assert db.to_frame()["signature"].tolist()[0] == "aten.mm.default:bf16:1x64,64x64"


def test_byte_identical_for_same_rows(tmp_path):
    """The same rows in any order give the same bytes."""
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    merge_rows(a, [_row(1), _row(2)])
    merge_rows(b, [_row(2), _row(1)])
    assert a.read_bytes() == b.read_bytes()


def test_newer_row_wins_on_key_collision(tmp_path):
    """Merging a re-measurement of the same key keeps the newer recorded_utc."""
    p = tmp_path / "db.csv"
    merge_rows(p, [_row(1, t=2e-5, when="2026-01-02T00:00:00Z")])
    merge_rows(p, [_row(1, t=1e-5, when="2026-01-01T00:00:00Z")])
    assert KernelDB.load(p).rows[0].time_s == 2e-5


def _writer(path: str, start: int) -> None:
    for i in range(start, start + 20):
        merge_rows(path, [_row(i)])


def test_concurrent_writers_lose_no_rows(tmp_path):
    """Two processes merging into one DB at once end with every row of both."""
    p = str(tmp_path / "db.csv")
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(p, s)) for s in (1, 1000)]
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join()
    assert len(KernelDB.load(p)) == 40


def test_damaged_file_clear_error_and_untouched(tmp_path):
    """A truncated line raises KernelDBError naming the line; a later write refuses and keeps the bytes."""
    p = tmp_path / "db.csv"
    merge_rows(p, [_row(1), _row(2)])
    text = p.read_text()
    damaged = text[: text.rindex(",")]  # cut the last row short
    p.write_text(damaged)
    with pytest.raises(KernelDBError, match=r"line 4 has \d+ fields, expected 18 .* left untouched"):
        KernelDB.load(p)
    with pytest.raises(KernelDBError):
        merge_rows(p, [_row(3)])
    assert p.read_text() == damaged


def test_wrong_version_rejected(tmp_path):
    """A file without the schema_version line is refused with the expected first line."""
    p = tmp_path / "db.csv"
    p.write_text("gpu,time_s\nH100,1\n")
    with pytest.raises(KernelDBError, match="expected '# heterosim-kernel-db schema_version=1'"):
        KernelDB.load(p)


def test_missing_file_is_empty_db(tmp_path):
    """Loading a DB that does not exist yet gives an empty DB."""
    assert len(KernelDB.load(tmp_path / "none.csv")) == 0


def test_new_db_file_mode_follows_umask(tmp_path):
    """A new DB file is created with 0666 & ~umask (not the temp file's 0600); an existing mode is kept."""
    import os

    p = tmp_path / "db.csv"
    old = os.umask(0o022)
    try:
        merge_rows(p, [_row(1)])
    finally:
        os.umask(old)
    assert p.stat().st_mode & 0o777 == 0o644
    os.chmod(p, 0o640)
    merge_rows(p, [_row(2)])
    assert p.stat().st_mode & 0o777 == 0o640


def test_fuzzed_db_file_gives_rows_or_a_kernel_db_error(tmp_path_factory):
    """Any value in any field of a valid DB, or any bytes in a line: KernelDB.load returns or
    raises KernelDBError, nothing else."""
    pytest.importorskip("hypothesis")
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from kernel_db.db import COLUMNS

    root = tmp_path_factory.mktemp("db")
    KernelDB([_row(i) for i in range(3)]).save(root / "good.csv")
    good = (root / "good.csv").read_text().splitlines()
    field = st.one_of(st.text(max_size=12), st.sampled_from(["nan", "inf", "-1", "0", "1e999", "{", "[1]", '""']))

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
    @given(line=st.integers(0, len(good) - 1), col=st.integers(0, len(COLUMNS) - 1), value=field,
           raw=st.one_of(st.none(), st.text(max_size=40)))
    def check(line, col, value, raw):
        import csv
        import io

        lines = list(good)
        if raw is not None:
            lines[line] = raw
        elif line >= 2:
            rec = next(csv.reader([lines[line]]))
            rec[col] = value
            out = io.StringIO()
            csv.writer(out, lineterminator="").writerow(rec)
            lines[line] = out.getvalue()
        p = root / "fuzz.csv"
        p.write_text("\n".join(lines) + "\n")
        try:
            KernelDB.load(p)
        except KernelDBError:
            pass

    check()
