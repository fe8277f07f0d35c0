"""Tests of ``models.parallel_state``: Megatron rank order, groups, labels and stage layers."""

from __future__ import annotations

import pytest

from heterosim.errors import ConfigError
from models.config import ParallelConfig
from models.parallel_state import parse_pipeline_layout, rank_coords, split_stage_layers
from test_models_mappings import run_fake


def test_rank_coords_follow_tp_cp_ep_dp_pp_order():
    """rank = tp + tp*(cp + cp*(dp + dp*pp)); ep folds into dp*cp with tp fastest."""
    pcfg = ParallelConfig(world_size=32, tp=2, cp=2, pp=2, ep=2)  # dp = 4
    assert rank_coords(pcfg, 0) == {"tp": 0, "cp": 0, "dp": 0, "pp": 0, "ep": 0, "expert_dp": 0}
    # 27 = 1 + 2*(1 + 2*(2 + 4*1)) -> tp 1, cp 1, dp 2, pp 1; ep = (27//2) % 2 = 1, edp = 27//4 % 4 = 2
    assert rank_coords(pcfg, 27) == {"tp": 1, "cp": 1, "dp": 2, "pp": 1, "ep": 1, "expert_dp": 2}


def test_expert_tensor_parallel_one_draws_ep_from_the_stages_consecutive_ranks():
    """etp 1: rank = ep + ep * (expert_dp + expert_dp * pp) over the stage's tp*cp*dp ranks (Megatron-core's
    expert rank generator): tp 2, dp 4, ep 4 -> rank 13 (stage 1, 5th of 8) is ep 1, expert-dp 1."""
    pcfg = ParallelConfig(world_size=16, tp=2, pp=2, ep=4, etp=1)
    assert rank_coords(pcfg, 13) == {"tp": 1, "cp": 0, "dp": 2, "pp": 1, "ep": 1, "expert_dp": 1}
    with pytest.raises(ConfigError, match=r"--expert-tensor-parallel-size 3: give 1 or the tensor-parallel size 2"):
        ParallelConfig(world_size=16, tp=2, pp=2, ep=4, etp=3).check()


def test_initialize_groups_and_labels_in_fake_world():
    """Rank 13 of 32 (tp2 cp2 pp2 dp4 ep2) gets Megatron's groups, each labelled once."""
    res = run_fake("""
        from models import parallel_state
        from models.config import ParallelConfig
        ann = PhaseAnnotator(); set_annotator(ann)
        ps = parallel_state.initialize(ParallelConfig(world_size=32, tp=2, cp=2, pp=2, ep=2), 13)
        rk = lambda g: dist.get_process_group_ranks(g)
        result = dict(tp=rk(ps.tp_group), cp=rk(ps.cp_group), dp=rk(ps.dp_group), dp_cp=rk(ps.dp_cp_group),
                      pp=rk(ps.pp_group), ep=rk(ps.ep_group), edp=rk(ps.expert_dp_group),
                      emb=rk(ps.embedding_group), ranks=[ps.tp_rank, ps.cp_rank, ps.dp_rank, ps.pp_rank, ps.ep_rank],
                      first=ps.is_first_stage, last=ps.is_last_stage, nxt=ps.next_rank, prv=ps.prev_rank,
                      pp_ranks=list(ps.pp_ranks), labels=sorted([list(k), v] for k, v in ann.labels.items()))
    """, rank=13, world=32)
    # 13 = 1 + 2*(0 + 2*(3 + 4*0)): tp 1, cp 0, dp 3, pp 0
    assert res["ranks"] == [1, 0, 3, 0, 0]
    assert res["tp"] == [12, 13]
    assert res["cp"] == [13, 15]
    assert res["dp"] == [1, 5, 9, 13]
    assert res["dp_cp"] == [1, 3, 5, 7, 9, 11, 13, 15]
    assert res["pp"] == res["pp_ranks"] == [13, 29]
    assert res["emb"] == [13, 29]
    assert res["ep"] == [13, 15]
    assert res["edp"] == [1, 5, 9, 13]
    assert res["first"] and not res["last"] and res["nxt"] == 29 and res["prv"] == 29
    labels = dict((tuple(k), v) for k, v in res["labels"])
    assert labels[(12, 13)] == "tp" and labels[(13, 15)] in ("cp", "ep")
    assert labels[(1, 3, 5, 7, 9, 11, 13, 15)] == "dp" and labels[(13, 29)] == "pp"


def test_split_stage_layers_even_uneven_and_interleaved():
    """Even, first/last, explicit and vpp splits number layers as Megatron does."""
    assert split_stage_layers(8, 4) == [[range(0, 2)], [range(2, 4)], [range(4, 6)], [range(6, 8)]]
    assert split_stage_layers(10, 4, first=1, last=3) == [
        [range(0, 1)], [range(1, 4)], [range(4, 7)], [range(7, 10)]]
    assert split_stage_layers(6, 2, explicit=[2, 4]) == [[range(0, 2)], [range(2, 6)]]
    # vpp 2: virtual stages visited chunk-major: (c0,s0) (c0,s1) (c1,s0) (c1,s1)
    assert split_stage_layers(8, 2, vpp=2) == [[range(0, 2), range(4, 6)], [range(2, 4), range(6, 8)]]


def test_split_accounts_for_embedding_and_loss():
    """Megatron-Core's account-for-embedding/loss: 6 layers + 2 slots over pp 2 x vpp 2 are 4 chunks of
    2 slots; the first chunk of stage 0 and the last chunk of stage 1 hold one layer each. Llama 3.1
    405B's 126 layers over pp 8 x vpp 8 (NeMo's recipe) give 1 + 7 x 2 layers on stage 0."""
    assert split_stage_layers(6, 2, vpp=2, embed_slot=True, loss_slot=True) == [
        [range(0, 1), range(3, 5)], [range(1, 3), range(5, 6)]]
    assert split_stage_layers(5, 2, embed_slot=True) == [[range(0, 2)], [range(2, 5)]]
    big = split_stage_layers(126, 8, vpp=8, embed_slot=True, loss_slot=True)
    assert [len(r) for r in big[0]] == [1] + [2] * 7 and [len(r) for r in big[7]] == [2] * 7 + [1]
    assert sorted(i for st in big for r in st for i in r) == list(range(126))
    with pytest.raises(ConfigError, match="cannot be combined with --decoder-first/last"):
        split_stage_layers(6, 2, first=2, embed_slot=True)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_layers=10, pp=4), "10 layers do not split over 4 pipeline stages with first=None, last=None: "
                                "the remaining 10 layers must divide evenly over 4 stages"),
    (dict(num_layers=6, pp=2, explicit=[2, 3]), "explicit stage layers (2, 3) sum to 5, but --num-layers is 6; "
                                                "make them add up"),
    (dict(num_layers=6, pp=2, vpp=2), "stage 0 has 3 layers, not divisible by the 2 virtual pipeline chunks; "
                                      "adjust --num-layers-per-virtual-pipeline-stage"),
])
def test_split_stage_layers_errors(kwargs, message):
    """Impossible splits raise ConfigError naming the numbers and the fix."""
    n, pp = kwargs.pop("num_layers"), kwargs.pop("pp")
    with pytest.raises(ConfigError) as exc:
        split_stage_layers(n, pp, **kwargs)
    assert str(exc.value) == message


def test_initialize_needs_a_matching_process_group():
    """Without torch.distributed, or with a layout that does not fit, initialize says what to do."""
    from models.parallel_state import initialize

    with pytest.raises(ConfigError) as exc:
        initialize(ParallelConfig(world_size=8, tp=2), 0)
    assert str(exc.value) == ("torch.distributed is not initialized; call dist.init_process_group(...) "
                              "before models.parallel_state.initialize")
    with pytest.raises(ConfigError, match=r"world size 8 is not divisible by tp\*pp\*cp = 3\*1\*1 = 3"):
        initialize(ParallelConfig(world_size=8, tp=3), 0)


def test_amax_group_is_the_stage_and_comes_last():
    """Rank 13 of 32 (tp2 cp2 pp2 dp4): the amax group is pipeline stage 0's 16 ranks (tp x dp x cp);
    it is made after every other group, so those keep their numbers (the same ranks per group id)."""
    code = """
        from models import parallel_state
        from models.config import ParallelConfig
        ann = PhaseAnnotator(); set_annotator(ann)
        ps = parallel_state.initialize(ParallelConfig(world_size=32, tp=2, cp=2, pp=2, amax_reduction_group={on}), 13)
        rk = lambda g: dist.get_process_group_ranks(g)
        result = dict(amax=rk(ps.amax_group) if ps.amax_group is not None else None,
                      others=[rk(g) for g in (ps.tp_group, ps.cp_group, ps.dp_group, ps.dp_cp_group, ps.pp_group)],
                      names=[str(g.group_name) for g in (ps.tp_group, ps.cp_group, ps.dp_group, ps.pp_group)])
    """
    on, off = (run_fake(code.format(on=v), rank=13, world=32) for v in (True, False))
    assert on["amax"] == list(range(16)) and off["amax"] is None
    assert on["others"] == off["others"] and on["names"] == off["names"]


def test_pipeline_layout_strings_as_megatron_core_writes_them():
    """DeepSeek-V3 on pp 8 (Megatron Bridge's H100 recipe): 'Et|(tt|)*30mL' is 32 virtual stages
    (vpp 4) of 1, 2 x 30 and 0 transformer layers, one MTP layer; stage s holds virtual stages s,
    s + 8, s + 16, s + 24."""
    counts, vpp, mtp = parse_pipeline_layout("Et|(tt|)*30mL", 8)
    assert (len(counts), vpp, mtp, counts[0], set(counts[1:31]), counts[31], sum(counts)) == (32, 4, 1, 1, {2}, 0, 61)
    split = split_stage_layers(61, 8, vpp=4, virtual=counts)
    assert split[0] == [range(0, 1), range(15, 17), range(31, 33), range(47, 49)]
    assert split[7] == [range(13, 15), range(29, 31), range(45, 47), range(61, 61)]
    assert parse_pipeline_layout("Et*3|t*3L", 2) == ((3, 3), 1, 0)
