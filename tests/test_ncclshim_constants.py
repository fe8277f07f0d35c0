"""ncclshim.constants: the NCCL v2.30.7 tables as transcribed (docs/nccl.md §0-§2)."""

import pytest

from ncclshim import constants as C


def test_enumerations_keep_nccl_order():
    """Algorithm and protocol order decides ties in the selection scan."""
    assert C.ALGOS == ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
    assert C.PROTOS == ("LL", "LL128", "SIMPLE")
    assert C.COST_COLLECTIVES == ("broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce")


def test_latency_tables():
    """Spot values: ring base 6.6/14/8.4 us; NVLink ring 0.6/1.9/3.4; NET tree Simple 14; NVLS 25/18;
    NVLS_TREE NET 20.9 (v2.30)."""
    assert C.BASE_LAT_US["RING"] == (6.6, 14.0, 8.4)
    assert C.BASE_LAT_US["TREE"] == (6.8, 14.0, 8.4)
    assert C.HW_LAT_US["NVLINK"]["RING"] == (0.6, 1.9, 3.4)
    assert C.HW_LAT_US["NET"]["TREE"][2] == 14.0
    assert (C.HW_LAT_US["NVLINK"]["NVLS"][2], C.HW_LAT_US["NET"]["NVLS"][2]) == (25.0, 18.0)
    assert C.HW_LAT_US["NET"]["NVLS_TREE"][2] == 20.9
    for table in C.HW_LAT_US.values():
        assert set(table) == set(C.ALGOS) and all(len(v) == 3 for v in table.values())


def test_bandwidth_tables_have_four_archs_by_three_scales():
    """Every cap table is [Volta, Ampere, Hopper, Blackwell] x [N1, N2, N4]."""
    for table in (C.LL_MAX_BW, C.PER_CH_MAX_RING_LL128_BW, C.PER_CH_MAX_TREE_LL128_BW, C.PER_CH_MAX_TREE_BW,
                  C.PER_CH_MAX_NVLS_TREE_BW):
        assert len(table) == 4 and all(len(row) == 3 for row in table)
    assert C.LL_MAX_BW[1] == (87.7, 22.5, 19.0)
    assert C.PER_CH_MAX_TREE_BW[2] == (38.7, 41.4, 36.0)
    assert C.PER_CH_MAX_NVLS_TREE_BW[2] == (0.0, 57.7, 45.5)
    assert C.NVLS_EFFICIENCY == (0.0, 0.0, 0.85, 0.74)


def test_tree_correction_covers_24_sizes():
    """treeCorrectionFactor has 24 entries per protocol (64 B x 2^i)."""
    assert {len(v) for v in C.TREE_CORRECTION.values()} == {24}
    assert C.TREE_CORRECTION["SIMPLE"][11] == 0.5


def test_speed_arrays_descend():
    """Channel-search speeds are tried from fastest to slowest."""
    for table in (C.INTRA_SPEEDS, C.INTER_SPEEDS):
        for speeds in table.values():
            assert list(speeds) == sorted(speeds, reverse=True)
    assert C.INTRA_SPEEDS[2][:3] == (60, 50, 40) and C.INTER_SPEEDS[2][0] == 48


def test_support_matrix_and_protocol_efficiency():
    """Tree only all-reduces; NVLS/PAT are Simple-only; LL carries half, LL128 120/128 of a line."""
    assert C.SUPPORT[("all_reduce", "TREE")] == ("LL", "LL128", "SIMPLE")
    assert ("all_gather", "TREE") not in C.SUPPORT
    assert C.SUPPORT[("all_gather", "PAT")] == ("SIMPLE",)
    assert C.PROTO_EFFICIENCY == pytest.approx({"LL": 0.5, "LL128": 0.9375, "SIMPLE": 1.0})
