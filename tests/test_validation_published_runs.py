"""Tests for heterosim.validation.published_runs: launch settings published apart from a results table."""

from __future__ import annotations

import re

import pytest

from heterosim.errors import ConfigError
from heterosim.validation.cases import Case
from heterosim.validation.published_runs import load_published_runs, published_settings

SC21 = {"title": "Narayanan et al. (SC'21), Table 1", "url": "https://arxiv.org/abs/2104.04473"}


def _case(source=SC21, layers=60, hidden=10240, tp=8, pp=4, glob=1792) -> Case:
    return Case(id="c", category="end_to_end", source=source,
                model={"layers": layers, "hidden": hidden}, parallelism={"tp": tp, "pp": pp},
                batch={"global": glob})


def test_bundled_file_has_the_sc21_table():
    """The bundled file carries the ten rows of Megatron-LM's examples/sc21/run_table_1.sh."""
    runs = [r for r in load_published_runs() if r.source == "2104.04473"]
    assert len(runs) == 10
    assert {r.settings["micro_batch"] for r in runs} == {16, 8, 4, 2, 1}


def test_match_needs_source_and_every_value():
    """The 76B row matches on source and shape; another source or a different global batch does not."""
    settings, script = published_settings(_case())
    assert settings == {"micro_batch": 2, "layers_per_virtual_stage": 5, "ddp": "local"}
    assert script == "Megatron-LM examples/sc21/run_table_1.sh, 76B"
    assert published_settings(_case(source={"title": "another paper"})) == ({}, None)
    assert published_settings(_case(glob=1536)) == ({}, None)


@pytest.mark.parametrize("body,message", [
    ("schema_version: 2\nruns: []\n", "schema_version 2 is not supported; write schema_version: 1"),
    ("schema_version: 1\n", "needs a 'runs:' list"),
    ("schema_version: 1\nruns:\n- {source: x, script: s, match: {}, settings: {mbs: 2}}\n",
     "run #0: unknown setting(s) mbs; valid: micro_batch, layers_per_virtual_stage, virtual_stages, ddp, "),
    ("schema_version: 1\nruns:\n- {source: x, script: s, match: {}, settings: {ddp: fsdp}}\n",
     "run #0: ddp 'fsdp' is unknown; valid: torch, local, distributed"),
    ("schema_version: 1\nruns:\n- {source: x, script: s, match: {}, settings: {sequence_parallel: yes please}}\n",
     "run #0: sequence_parallel must be true or false, not 'yes please'"),
    ("schema_version: 1\nruns:\n- {source: x, script: s, match: {}, settings: {hidden_dropout: 1.5}}\n",
     "run #0: hidden_dropout must be a probability in [0, 1), not 1.5"),
    ("schema_version: 1\nruns:\n- {source: x, script: s, match: {}, settings: {recompute: partial}}\n",
     "run #0: recompute 'partial' is unknown; valid: none, selective, full"),
    ("schema_version: 1\nruns:\n- {source: x, script: s, match: {}, settings: {micro_batch: 0}}\n",
     "run #0: micro_batch must be a positive integer, not 0"),
    ("schema_version: 1\nruns:\n- {source: x, script: s, match: {}, settings: {tp_comm_aggregate: [qkv_dgrad]}}\n",
     "run #0: tp_comm_aggregate must be a list of fc1_fprop, fc2_dgrad, proj_dgrad, qkv_fprop; 'qkv_dgrad' is not one"),
    ("schema_version: 1\nruns:\n- {source: x, script: s, match: {}, settings: {tp_comm_sm_margin: {qkv_fprop: 4}}}\n",
     "run #0: tp_comm_sm_margin names unknown 'qkv_fprop'; valid: proj_fprop, fc2_fprop"),
    ("schema_version: 1\nruns:\n- {source: x, script: s, match: {}, settings: {tp_comm_sm_margin: {proj_fprop: 0}}}\n",
     "run #0: tp_comm_sm_margin.proj_fprop must be a positive integer, not 0"),
    ("schema_version: 1\nruns:\n- {source: x, script: s, match: {}, settings: {tp_comm_sm_margin: [proj_fprop]}}\n",
     "run #0: tp_comm_sm_margin must be a mapping of proj_fprop, fc2_fprop to a value, not ['proj_fprop']"),
    ("schema_version: 1\nruns:\n- {source: x, script: s, match: {}, settings: {nccl_env: {NVLS: 0}}}\n",
     "run #0: nccl_env entry 'NVLS': 0 is not an NCCL_* variable with a string or integer value, e.g. NCCL_NVLS_ENABLE: '0'"),
    ("schema_version: 1\nruns:\n- {source: x, script: s, match: {}, settings: {nccl_env: [NCCL_NVLS_ENABLE]}}\n",
     "run #0: nccl_env must be a mapping of NCCL_* variables to values, not ['NCCL_NVLS_ENABLE']"),
    ("schema_version: 1\nruns:\n- {source: x, match: {}, settings: {}}\n",
     "run #0 needs source, script, match and settings"),
    ("schema_version: 1\nruns: [\n", "not valid YAML"),
])
def test_bad_file_is_one_clear_error(tmp_path, body, message):
    p = tmp_path / "runs.yaml"
    p.write_text(body)
    with pytest.raises(ConfigError, match=f"published runs file {p}.*" + re.escape(message)):
        load_published_runs(p)


def test_tp_overlap_names_are_the_models_ones():
    """The recipe settings name exactly the overlaps models/ knows (validation never imports models
    at run time, so the two lists are kept apart and held equal here)."""
    from heterosim.validation.published_runs import SETTINGS
    from models.layers.tp_overlap import PIPELINE_OPS, RING_EXCHANGE_OPS

    assert SETTINGS["tp_comm_aggregate"] == frozenset(RING_EXCHANGE_OPS)
    assert tuple(SETTINGS["tp_comm_sm_margin"]) == PIPELINE_OPS


def test_recompute_module_names_are_the_models_ones():
    """recompute_modules accepts exactly what models/layers/recompute.py recomputes."""
    from heterosim.validation.published_runs import SETTINGS
    from models.layers.recompute import RECOMPUTE_MODULES

    assert SETTINGS["recompute_modules"] == frozenset(RECOMPUTE_MODULES)


BRIDGE = {"title": "NVIDIA Megatron Bridge performance summary, 26.04.01 NeMo Container",
          "url": "https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/x/docs/performance-summary-archive.md"}
H100 = {"gpu": "NVIDIA H100 80GB HBM3 (SXM5)", "gpus_per_node": 8}


def _bridge_70b(precision="FP8", pp=8, source=BRIDGE, hardware=H100) -> Case:
    return Case(id="b", category="end_to_end", source=source, hardware=hardware, precision=precision,
                model={"layers": 80, "hidden": 8192}, parallelism={"tp": 4, "pp": pp, "cp": 1, "vpp": 5},
                batch={"global": 256})


def test_bridge_recipe_matches_framework_gpu_precision_and_layout():
    """Megatron Bridge's Llama 3 70B H100 fp8 recipe: its layout and NCCL environment, laid over the
    framework's defaults (expert_tp 1, current-scaling fp8); not for bf16, another pp, another GPU, or
    a source that does not name Megatron Bridge."""
    settings, script = published_settings(_bridge_70b())
    assert settings["pipeline_layout"] == "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL"
    assert settings["nccl_env"] == {"NCCL_NVLS_ENABLE": "0", "NCCL_P2P_NET_CHUNKSIZE": "2097152"}
    assert (settings["expert_tp"], settings["fp8_scaling"], settings["ddp"]) == (1, "tensorwise", "distributed")
    assert script.endswith("llama3_70b_pretrain_64gpu_h100_fp8cs_config")
    assert published_settings(_bridge_70b(precision="FP8-CS"))[1] == script
    assert published_settings(_bridge_70b(precision="MXFP8")) == ({}, None)
    assert published_settings(_bridge_70b(pp=4)) == ({}, None)
    assert published_settings(_bridge_70b(source={"title": "a NeMo 2 run"})) == ({}, None)
    assert published_settings(_bridge_70b(hardware={"gpu": "NVIDIA B200"})) == ({}, None)


def test_bridge_recipe_matches_a_released_model_named_alone():
    """A case naming Nemotron 3 Nano without its shape matches Bridge's recipes through the released
    configuration (52 layers, hidden 2,688): HybridEP on H100 and B200, not on an unlisted GPU; a
    stated shape that differs does not match. Qwen3 30B-A3B on 16 H100s: bf16 with HybridEP's permute
    fusion, fp8 without."""
    def nano(**kw) -> Case:
        base = dict(id="n", category="end_to_end", source=BRIDGE, hardware=H100, precision="FP8",
                    model={"name": "Nemotron 3 Nano 30B-A3B"}, parallelism={"tp": 1, "pp": 1, "ep": 8},
                    batch={"global": 1024})
        return Case(**{**base, **kw})

    settings, script = published_settings(nano())
    assert settings["moe_dispatcher"] == "hybridep" and "nemotron_3_nano_pretrain_16gpu_h100" in script
    # the recipe's selective recomputation: fp8cs recomputes the norms, bf16 the MoE layers too
    assert (settings["recompute"], settings["recompute_modules"]) == ("selective", ["layernorm"])
    assert published_settings(nano(precision="BF16"))[0]["recompute_modules"] == ["moe", "layernorm"]
    assert published_settings(nano(hardware={"gpu": "NVIDIA B200"}))[0]["moe_dispatcher"] == "hybridep"
    assert published_settings(nano(hardware={"gpu": "NVIDIA A100 80GB"})) == ({}, None)
    assert published_settings(nano(model={"name": "Nemotron 3 Nano", "layers": 40})) == ({}, None)

    def qwen(precision: str) -> Case:
        return Case(id="q", category="end_to_end", source=BRIDGE, hardware=H100, precision=precision,
                    model={"layers": 48, "hidden": 2048}, parallelism={"tp": 1, "pp": 1, "ep": 16},
                    batch={"global": 1024})

    assert published_settings(qwen("BF16"))[0]["hybridep_permute_fusion"] is True
    assert "hybridep_permute_fusion" not in published_settings(qwen("FP8"))[0]


def test_precision_kinds():
    from heterosim.validation.published_runs import precision_kind
    assert [precision_kind(t) for t in ("FP8-CS", "fp8 (hybrid) with bf16", "MXFP8", "FP8 (MX)", "FP8-MX", "NVFP4",
                                        "BF16", "mixed precision (A100)")] \
        == ["fp8", "fp8", "mxfp8", "mxfp8", "mxfp8", "nvfp4", "bf16", "bf16"]


@pytest.mark.parametrize("match,settings,message", [
    ("{framework: nemo}", "{}", "run #0: match.framework 'nemo' is unknown; valid: megatron-bridge"),
    ("{precision: fp16}", "{}", "run #0: match.precision 'fp16' is unknown; valid: bf16, fp8, mxfp8, nvfp4"),
    ("{gpu: H100}", "{}", "run #0: match.gpu 'H100' is not a canonical GPU name; give 'H100-SXM5-80GB'"),
    ("{gpu: Z9000}", "{}", "run #0: match.gpu: unknown GPU 'Z9000'"),
    ("{}", "{pipeline_layout: 'Et|tx'}", "run #0: pipeline_layout must be a Megatron-core layout string "
     "(e.g. 'Et|(tt|)*30mL'): --pipeline-model-parallel-layout 'Et|tx': unknown symbol 'x'"),
    ("{}", "{pipeline_layout: 'tE|tL'}", "run #0: pipeline_layout must be a Megatron-core layout string "
     "(e.g. 'Et|(tt|)*30mL'): --pipeline-model-parallel-layout 'tE|tL': E may only open the first virtual stage"),
    ("{}", "{pipeline_layout: 3}", "run #0: pipeline_layout must be a Megatron-core layout string "
     "(e.g. 'Et|(tt|)*30mL'), not 3"),
])
def test_bad_match_or_layout_is_one_clear_error(tmp_path, match, settings, message):
    p = tmp_path / "runs.yaml"
    p.write_text(f"schema_version: 1\nruns:\n- {{source: x, script: s, match: {match}, settings: {settings}}}\n")
    with pytest.raises(ConfigError, match=f"published runs file {p}.*" + re.escape(message)):
        load_published_runs(p)


def test_kimi_k2_recipes_match_by_the_released_shape():
    """A row naming Kimi K2 alone on 256 GB200s (pp 4 x vp 4, ep 64) takes Bridge's recipe: the layout
    of 16 virtual stages (embedding + 4 layers, 14 x 4, the last layer + loss), HybridEP, mla_up_proj
    recomputed; DeepSeek-V3 (128 heads, same layers and hidden) on the same layout does not match."""
    def case(name: str) -> Case:
        return Case(id="k", category="end_to_end", source=BRIDGE, hardware={"gpu": "NVIDIA GB200"}, precision="BF16",
                    model={"name": name}, parallelism={"tp": 1, "pp": 4, "vpp": 4, "ep": 64}, batch={"global": 2048})

    settings, script = published_settings(case("Kimi K2"))
    assert (settings["pipeline_layout"], settings["moe_dispatcher"], settings["recompute_modules"]) \
        == ("Etttt|(tttt|)*14tL", "hybridep", ["mla_up_proj"])
    assert script.endswith("kimi_k2_pretrain_256gpu_gb200_{bf16,fp8cs,fp8mx}_config")
    assert published_settings(case("DeepSeek-V3")) == ({}, None)
