"""Tests for heterosim.validation.cases: free text of a validation case -> GPU, cluster, Megatron flags."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from heterosim.cluster import load_cluster
from heterosim.errors import ConfigError, UnknownGPUError
from heterosim.validation.cases import Case, cluster_for, flop_convention, gpu_from_text, load_cases, megatron_flags, source_year
from heterosim.validation.hardware import _nics


def _case(**kw) -> Case:
    base = dict(
        id="t", category="end_to_end",
        hardware={"gpu": "NVIDIA H100 80GB HBM3 (SXM5)", "gpus_per_node": 8, "system": "DGX H100",
                  "intra_node": "NVLink4 + NVSwitch (18 links)", "inter_node": "8 x 400 Gb/s NDR InfiniBand"},
        model={"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336, "seq_len": 4096,
               "vocab": 128256, "arch": "LLaMA (GQA, SwiGLU, RMSNorm, RoPE)"},
        parallelism={"tp": 4, "pp": 2, "dp": 2, "cp": 1, "vpp": 2, "sequence_parallel": True,
                     "recompute": "selective"},
        batch={"micro": 1, "global": 64}, precision="fp8 (hybrid) with bf16",
    )
    base.update(kw)
    return Case(**base)


@pytest.mark.parametrize("text,name", [
    ("NVIDIA H100 80GB HBM3 (SXM5)", "H100-SXM5-80GB"),
    ("NVIDIA A100 (SXM4; 40GB assumed for a 2020 DGX A100 - unverified)", "A100-SXM4-40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
    ("NVIDIA V100-SXM3-32GB (DGX-2; memory size assumed)", "V100-SXM2-32GB"),
    ("NVIDIA A100-PCIE-40GB (NOT SXM; lower power limit)", "A100-PCIe-40GB"),
    ("H200 141GB", "H200-SXM-141GB"),
    ("A3 Mega (H100)", "H100-SXM5-80GB"), ("8 x H100 (AWS p5)", "H100-SXM5-80GB"), ("H100 PCIe", "H100-PCIe-80GB"),
])
def test_gpu_from_text(text, name):
    """Model number, form factor and memory words pick exactly one catalogue GPU; a bare model number
    among other words is the part its alias names ("H100" is the SXM5 board)."""
    assert gpu_from_text(text) == name


def test_gpu_from_text_ambiguous_lists_candidates():
    """Words that fit several GPUs raise, listing them, instead of guessing one."""
    with pytest.raises(UnknownGPUError, match=r"several catalogue GPUs fit \(A100-PCIe-40GB, A100-PCIe-80GB\)"):
        gpu_from_text("some A100 PCIe card")
    with pytest.raises(UnknownGPUError, match="no catalogue GPU fits"):
        gpu_from_text("Quantum Q9000")


@pytest.mark.parametrize("text,want", [
    ("8 x 400 Gb/s NDR InfiniBand", (8, 400.0)),
    ("InfiniBand HDR, 8 x 200 Gb/s HCAs per node for compute", (8, 200.0)),
    ("IB 200Gb x4 per node (dual port)", (4, 200.0)),
    ("InfiniBand HDR 200 Gb/s (count per node not stated)", (None, 200.0)),
    ("InfiniBand NDR", (None, 400.0)),
    ("8x ConnectX-7 400G InfiniBand", (8, 400.0)), ("RoCEv2 8x400GbE", (8, 400.0)), ("8*400Gbps IB", (8, 400.0)),
    ("400G NDR x 8 per node", (8, 400.0)), ("8 NICs at 400 Gb/s", (8, 400.0)), ("InfiniBand NDR400", (None, 400.0)),
    ("HDR100 InfiniBand", (None, 100.0)), ("3.2 Tbps per node (8x400G)", (8, 400.0)),
    ("EFA v2, 3200 Gbps per node", (None, None)),
])
def test_nic_words(text, want):
    """NIC count and line rate come from 'N x R Gb/s', 'N x <NIC words> R G', 'R Gb x N', 'N NICs ...
    R Gb/s', a rate alone or the IB generation name (with its rate: NDR400, HDR100); a rate per node
    gives no per-NIC rate here."""
    assert _nics(text) == want


@pytest.mark.parametrize("text,routing", [
    ("8 x 400 Gb/s NDR InfiniBand", "adaptive"), ("InfiniBand NDR400", "adaptive"), ("RoCEv2 8x400GbE", "ecmp"),
    ("2x 100GbE", "ecmp"), ("Spectrum-X Ethernet 8x400G", "adaptive"), ("EFA v2, 3200 Gbps per node", None),
])
def test_routing_words(text, routing):
    """InfiniBand and Spectrum-X route adaptively; other RoCE / Ethernet by ECMP; EFA names neither."""
    from heterosim.validation.hardware import _routing
    assert _routing(text) == routing


def test_a_rate_per_node_is_shared_by_the_nodes_nics():
    """'3200 Gbps per node' with no NIC count: the node's NICs (one per GPU) share it, said so."""
    hw = {"gpu": "NVIDIA H100 80GB HBM3", "gpus_per_node": 8, "system": "AWS p5.48xlarge",
          "intra_node": "NVLink4 + NVSwitch", "inter_node": "EFA v2, 3,200 Gbps per node"}
    spec, _, notes = cluster_for(hw, 16)
    assert spec["node_types"]["node"]["nics"] == {"count": 8, "bw_Gbps": 400.0}
    assert "3200 Gb/s per node: 8 NICs of 400 Gb/s (the count not stated)" in notes


def test_cluster_from_preset_system_with_case_gpu():
    """A system naming a preset keeps that node's layout but takes the case's GPU and NICs."""
    hw = {"gpu": "NVIDIA A100 (SXM4; 40GB)", "gpus_per_node": 8, "system": "DGX A100 (2020)",
          "intra_node": "NVLink3 + NVSwitch (600 GB/s bidirectional per GPU)",
          "inter_node": "InfiniBand HDR 200 Gb/s (count per node not stated)"}
    spec, gpu, notes = cluster_for(hw, 16)
    assert gpu == "A100-SXM4-40GB"
    node = spec["node_types"]["dgx-a100"]
    assert node["nvlink"]["lanes"] == 12 and node["nvlink"]["lane_GBps"] == 25.0  # 600/2/25
    assert node["nics"] == {"count": 8, "bw_Gbps": 200.0}
    assert "NICs per node not stated: 8" in notes
    c = load_cluster(spec, num_gpus=16)
    assert c.num_nodes == 2 and c.gpu_type(9) == "A100-SXM4-40GB"


def test_cluster_built_from_words():
    """Without a matching preset the node is built from the words: NVLink lanes, NICs, PCIe gen."""
    hw = {"gpu": "NVIDIA A100-SXM4-80GB", "gpus_per_node": 8, "system": "user cluster",
          "intra_node": "NVLink3 + NVSwitch (12 links x 25 GB/s)", "inter_node": "IB 200Gb x4 per node"}
    spec, _, notes = cluster_for(hw, 16)
    node = spec["node_types"]["node"]
    assert node["nics"] == {"count": 4, "bw_Gbps": 200.0} and node["pcie"] == {"gen": 4}
    assert node["nvlink"]["lanes"] == 12
    assert load_cluster(spec, num_gpus=16).num_gpus == 16
    # "IB": InfiniBand, whose fabrics route adaptively; the node built from words says so.
    assert spec["fabric"]["routing"] == "adaptive" and "fabric routing adaptive (InfiniBand in the inter-node text)" in notes
    spec, _, notes = cluster_for({**hw, "inter_node": "RoCE 200 Gb/s x 4"}, 16)
    assert spec["fabric"]["routing"] == "ecmp"
    spec, _, _ = cluster_for({**hw, "system": "DGX A100", "inter_node": "RoCE 200 Gb/s x 8"}, 16)
    assert spec["fabric"]["routing"] == "ecmp"  # a RoCE case on DGX nodes is not the preset's IB fabric


@pytest.mark.parametrize("system,preset", [("DGX A100 80GB (Selene)", "dgx-a100"), ("DGX-A100", "dgx-a100"),
                                           ("DGX H100 reference architecture", "dgx-h100"), ("HGX H20", "hgx-h20"),
                                           ("HGX H200", None), ("DGX H1000", None)])
def test_system_names_a_preset_by_whole_words(system, preset):
    """A preset is the system's when its name's words stand alone in the text: HGX H200 is not hgx-h20."""
    hw = {"gpu": "NVIDIA H100 80GB HBM3", "gpus_per_node": 8, "system": system,
          "intra_node": "NVLink4 + NVSwitch (18 links)", "inter_node": "8 x 400 Gb/s InfiniBand NDR"}
    spec, _, notes = cluster_for(hw, 16)
    assert list(spec["node_types"]) == [preset or "node"]
    assert any(f"of preset {preset}" in n for n in notes) if preset else any("node built from the text" in n for n in notes)


@pytest.mark.parametrize("gpu,intra,gpn,lanes", [
    ("NVIDIA H100 80GB HBM3", "NVLink4 (900 GB/s bidirectional)", 8, 18),
    ("NVIDIA B200", "NVLink 5, 1.8 TB/s per GPU", 8, 18),
    ("NVIDIA V100-SXM2-32GB", "NVLink2 hybrid cube-mesh", 8, None),
    ("NVIDIA A100-PCIe-80GB", "NVLink bridge between pairs", 8, None),
    ("NVIDIA H100 80GB HBM3", "NVLink4", 4, None),
])
def test_nvlink_alone_on_eight_sxm_gpus_is_an_nvswitch_board(gpu, intra, gpn, lanes):
    """8 SM80+ SXM GPUs per node sit on an NVSwitch baseboard even where the text says only
    "NVLink" (said so); a V100 cube-mesh, PCIe cards with bridges or a 4-GPU board still need a mesh."""
    hw = {"gpu": gpu, "gpus_per_node": gpn, "system": "user cluster", "intra_node": intra,
          "inter_node": "8 x 400 Gb/s InfiniBand NDR"}
    if lanes is None:
        with pytest.raises(ConfigError, match="NVLink without NVSwitch needs a mesh; write a cluster YAML"):
            cluster_for(hw, 16)
        return
    spec, _, notes = cluster_for(hw, 16)
    nv = spec["node_types"]["node"]["nvlink"]
    assert (nv["kind"], nv["lanes"]) == ("nvswitch", lanes)
    assert ("intra_node names NVLink without NVSwitch: 8 SM80+ SXM GPUs per node sit on an NVSwitch baseboard "
            "(HGX / DGX A100 and later), taken as one") in notes


@pytest.mark.parametrize("gpu,gpn,lanes", [("NVIDIA H100 80GB HBM3", 8, 18), ("NVIDIA B200", 8, 18),
                                           ("NVIDIA A100-PCIe-80GB", 8, None), ("NVIDIA H100 80GB HBM3", 4, None)])
def test_unstated_intra_node_on_eight_sxm_gpus_is_an_nvswitch_board(gpu, gpn, lanes):
    """No intra_node and no preset system: 8 SM80+ SXM GPUs per node still sit on an NVSwitch
    baseboard at the GPU's datasheet NVLink rate (said so); PCIe cards and 4-GPU nodes get none."""
    spec, _, notes = cluster_for({"gpu": gpu, "gpus_per_node": gpn}, 16)
    nv = spec["node_types"]["node"].get("nvlink")
    if lanes is None:
        assert nv is None
        return
    assert (nv["kind"], nv["lanes"]) == ("nvswitch", lanes)
    assert ("intra_node not stated: an NVSwitch baseboard at the GPU's datasheet NVLink rate (8 SM80+ SXM GPUs "
            "per node: HGX / DGX A100 and later)") in notes


def test_family_layers_where_arch_is_silent():
    """A row naming its family but no architecture words gets the family's layers, noted: Llama
    SwiGLU / RMSNorm / RoPE, Nemotron-4 squared ReLU / LayerNorm / RoPE; words still win."""
    llama = {k: v for k, v in _case().model.items() if k != "arch"} | {"name": "Llama 3.1 70B"}
    ci = megatron_flags(_case(model=llama))
    f = list(ci.flags)
    assert "--swiglu" in f and f[f.index("--normalization") + 1] == "RMSNorm"
    assert f[f.index("--position-embedding-type") + 1] == "rope"
    assert "activation not stated: swiglu (Llama's released configuration)" in ci.assumptions
    nem = {**llama, "name": "Nemotron-4 15B"}
    f = list(megatron_flags(_case(model=nem)).flags)
    assert "--squared-relu" in f and f[f.index("--normalization") + 1] == "LayerNorm"
    f = list(megatron_flags(_case(model={**llama, "arch": "GeLU, LayerNorm"})).flags)
    assert "--swiglu" not in f and f[f.index("--normalization") + 1] == "LayerNorm"


def test_arch_words_for_bias_and_qk_norm():
    """'no bias' in model.arch drops the linear biases even for a GPT (whose default keeps them), said
    so; 'bias' keeps them for a Llama (whose family drops them); QK-norm (or a Qwen3 name) adds
    --qk-layernorm, said so."""
    gpt = {**_case().model, "arch": "GPT (MHA, GeLU, LayerNorm, learned, no bias)", "kv_heads": 32}
    ci = megatron_flags(_case(model=gpt))
    assert "--disable-bias-linear" in ci.flags and "linear layers without bias (model.arch)" in ci.assumptions
    llama = {**_case().model, "arch": "Llama (GQA, SwiGLU, RMSNorm, RoPE, QK-norm, biases)"}
    ci = megatron_flags(_case(model=llama))
    assert "--disable-bias-linear" not in ci.flags and "--qk-layernorm" in ci.flags
    assert "QK-norm: each head's query and key normalized before RoPE (model.arch)" in ci.assumptions
    qwen3 = {**_case().model, "name": "Qwen3 32B", "arch": "not stated"}
    ci = megatron_flags(_case(model=qwen3))
    assert "--qk-layernorm" in ci.flags and ("QK-norm: each head's query and key normalized before RoPE (Qwen3's "
                                             "released configuration, q_norm / k_norm)") in ci.assumptions
    assert "--qk-layernorm" not in megatron_flags(_case()).flags


def test_fully_sharded_case_reads_as_megatron_fsdp():
    """A row run with Megatron-Core FSDP ("FSDP: True" in newer DGX Cloud tables) takes
    --use-megatron-fsdp with parameters, gradients and optimizer state sharded, said so; false
    reads as before; with pipeline parallelism the row fails alone, named."""
    from heterosim.validation.validate import run_case

    par = {**_case().parallelism, "pp": 1, "vpp": None, "dp": 4, "fsdp": "True"}
    ci = megatron_flags(_case(parallelism=par))
    i = ci.flags.index("--use-megatron-fsdp")
    assert list(ci.flags[i:i + 3]) == ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"]
    assert ("parallelism.fsdp: Megatron-FSDP sharding parameters, gradients and optimizer state "
            "(optim_grads_params, Megatron Bridge's default with use_megatron_fsdp)") in ci.assumptions
    assert list(megatron_flags(_case(parallelism={**par, "fsdp": False})).flags) == \
        [x for x in ci.flags if x not in ("--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params")]
    # Megatron Bridge's tables: a count, 0 for DDP, else the sharding group (the DP ranks).
    assert ci.flags == megatron_flags(_case(parallelism={**par, "fsdp": "1 (0)"})).flags
    assert ci.flags == megatron_flags(_case(parallelism={**par, "fsdp": 4})).flags
    assert "--use-megatron-fsdp" not in megatron_flags(_case(parallelism={**par, "fsdp": 0})).flags
    with pytest.raises(ConfigError) as e:
        megatron_flags(_case(parallelism={**par, "fsdp": 2}))
    assert str(e.value) == ("case t: parallelism.fsdp is 2: a sharding group of 2 GPUs, not the 4 data-parallel "
                            "ranks (hybrid sharding), is not supported")
    piped = {**_case().parallelism, "fsdp": "True"}
    want = ("case t: parallelism.fsdp is 'True' with pp 2, ep 1: fully sharded data parallelism with pipeline "
            "or expert parallelism is not supported (models/fsdp.py models it without them)")
    with pytest.raises(ConfigError) as e:
        megatron_flags(_case(parallelism=piped))
    assert str(e.value) == want
    res = run_case(_case(parallelism=piped))
    assert (res.status, res.message) == ("missing_feature", want)


def test_nvlink_sharp_is_nccls_default_on_sm90_nvswitch_nodes():
    """NVLS not stated: on for NVSwitch nodes of SM90+ GPUs (NCCL_NVLS_ENABLE=2, "where supported"),
    off below SM90; what the text states wins, also over a preset's nvls."""
    h100 = {"gpu": "NVIDIA H100 80GB HBM3", "gpus_per_node": 8, "system": "user cluster",
            "intra_node": "NVLink4 + NVSwitch (18 links)", "inter_node": "8 x 400 Gb/s InfiniBand NDR"}
    spec, _, notes = cluster_for(h100, 16)
    assert spec["node_types"]["node"]["nvlink"]["nvls"] is True
    assert "NVLink SHARP not stated: on (NCCL's default on NVSwitch with SM90+ GPUs, NCCL_NVLS_ENABLE=2)" in notes
    a100 = {**h100, "gpu": "NVIDIA A100-SXM4-80GB", "intra_node": "NVLink3 + NVSwitch (12 links)"}
    spec, _, notes = cluster_for(a100, 16)
    assert spec["node_types"]["node"]["nvlink"]["nvls"] is False and not any("SHARP" in n for n in notes)
    for text, want in (("NVLink4 + NVSwitch with NVLink SHARP (NVLS)", True), ("NVLink4 + NVSwitch, NVLS off", False),
                       ("NVLink4 + NVSwitch without SHARP", False), ("NVSwitch (NCCL_NVLS_ENABLE=0)", False)):
        for system in ("user cluster", "DGX H100"):
            spec, _, notes = cluster_for({**h100, "intra_node": text, "system": system}, 16)
            assert next(iter(spec["node_types"].values()))["nvlink"]["nvls"] is want, (text, system)
            assert not any("SHARP not stated" in n for n in notes)


def test_recipe_nccl_environment_reaches_the_case():
    """The DGX Cloud recipes export NCCL_NVLS_ENABLE=0 (405B also NCCL_P2P_NET_CHUNKSIZE): the case
    carries it for the replay and says so; a row without a recipe carries none."""
    ci = megatron_flags(_hopper("e2e-dgxc-v24.11.1-llama3.1-405b-fp8-576gpu"))
    assert ci.nccl_env == {"NCCL_NVLS_ENABLE": "0", "NCCL_P2P_NET_CHUNKSIZE": "262144"}
    recipe = "NVIDIA/dgxc-benchmarking@35a9aec llama3.1/llama3.1_405b.yaml + configure.sh (NeMo 24.09)"
    assert f"NCCL environment NCCL_NVLS_ENABLE=0, NCCL_P2P_NET_CHUNKSIZE=262144 ({recipe})" in ci.assumptions
    ci = megatron_flags(_hopper("e2e-dgxc-v24.11.1-gpt3-175b-bf16-128gpu"))
    assert ci.nccl_env == {"NCCL_NVLS_ENABLE": "0"}
    assert next(iter(ci.cluster["node_types"].values()))["nvlink"]["nvls"] is True  # the node has it; NCCL is told not to
    assert "NVLink SHARP: on the NVSwitch, turned off by the launch script (NCCL_NVLS_ENABLE=0)" in ci.assumptions
    assert not [n for n in ci.assumptions if n.startswith("NVLink SHARP not stated")]
    assert megatron_flags(_case()).nccl_env == {}


def test_partial_node_job():
    """A job on fewer GPUs than a node holds is modelled on a node of just those GPUs."""
    hw = {"gpu": "V100 32GB", "gpus_per_node": 16, "system": "DGX-2 (V100)",
          "intra_node": "NVLink2 + NVSwitch (300 GB/s bidirectional per GPU)", "inter_node": "n/a"}
    spec, _, notes = cluster_for(hw, 4)
    node = spec["node_types"]["dgx-2"]
    assert node["gpus_per_node"] == 4 and node["nvlink"]["lanes"] == 6 and node["nics"]["count"] == 2
    assert load_cluster(spec, num_gpus=4).num_gpus == 4


def test_megatron_flags_llama_fp8():
    """Architecture words, kv heads, vpp, SP, selective recompute and fp8 map to pretrain_gpt flags."""
    ci = megatron_flags(_case())
    f = list(ci.flags)
    assert ci.world_size == 16 and ci.gpu == "H100-SXM5-80GB"
    for seq in (["--group-query-attention", "--num-query-groups", "8"], ["--swiglu"],
                ["--normalization", "RMSNorm"], ["--position-embedding-type", "rope"],
                ["--num-layers-per-virtual-pipeline-stage", "8"], ["--sequence-parallel"],
                ["--recompute-granularity", "selective"], ["--bf16", "--fp8-format", "hybrid"],
                ["--micro-batch-size", "1", "--global-batch-size", "64"], ["--ffn-hidden-size", "14336"]):
        i = f.index(seq[0])
        assert f[i:i + len(seq)] == seq
    assert "--fp16" not in f


def test_megatron_flags_defaults_are_reported():
    """'not stated' fields take Megatron's defaults and each default is listed."""
    c = _case(model={"layers": 24, "hidden": 2304, "heads": 24, "ffn": 9216, "seq_len": 2048, "vocab": 51200,
                     "arch": "GPT (MHA, GeLU MLP, LayerNorm, learned/rotary pos. not specified)"},
              parallelism={"tp": 1, "pp": 2, "dp": 4, "vpp": "not stated", "recompute": "full activation recomputation"},
              batch={"micro": "not stated in Table 1", "global": 512}, precision="mixed precision (fp16/bf16 autocast)")
    ci = megatron_flags(c)
    f = list(ci.flags)
    assert f[f.index("--position-embedding-type") + 1] == "learned_absolute"
    assert f[f.index("--micro-batch-size") + 1] == "1" and "--fp16" in f
    assert f[f.index("--recompute-granularity"):f.index("--recompute-granularity") + 6] == [
        "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    assert "--num-layers-per-virtual-pipeline-stage" not in f
    text = " | ".join(ci.assumptions)
    for word in ("position embedding not stated", "vpp not stated: non-interleaved", "micro-batch not stated: 1",
                 "precision fp16 (first of several named)"):
        assert word in text


def test_unknown_arch_word_is_an_error():
    """An architecture word the reader does not know is one clear error naming it."""
    c = _case(model={**_case().model, "arch": "GPT (MHA, RWKV, LayerNorm)"})
    with pytest.raises(ConfigError, match=r"unknown word 'rwkv'; known words: .*swiglu"):
        megatron_flags(c)


def test_squared_relu_and_mqa():
    """'squared ReLU' and MQA (one kv head) are understood."""
    m = {"layers": 4, "hidden": 512, "heads": 8, "seq_len": 512, "vocab": 1024, "arch": "GPT, MQA, squared ReLU"}
    f = list(megatron_flags(_case(model=m)).flags)
    assert "--squared-relu" in f and f[f.index("--num-query-groups") + 1] == "1"


def test_flop_convention_from_notes():
    """The SC'21 note (96·B·s·l·h², recompute included) means the hardware count; silence means None."""
    assert flop_convention(_case(notes="F = 96*B*s*l*h^2*(1 + s/(6h)) which INCLUDES the recompute forward")) == "hardware"
    assert flop_convention(_case(notes="72*B*s*l*h^2 (MFU)")) == "model"
    assert flop_convention(_case(notes="Single-node runs")) is None


def test_load_cases_checks_schema(tmp_path):
    """Unknown schema versions and duplicate ids are rejected with the fix."""
    p = tmp_path / "c.yaml"
    p.write_text("schema_version: 2\ncases: []\n")
    with pytest.raises(ConfigError, match="schema_version 2 is not supported; write schema_version: 1"):
        load_cases(p)
    p.write_text("schema_version: 1\ncases:\n- {id: a, category: spec}\n- {id: a, category: spec}\n")
    with pytest.raises(ConfigError, match="case id 'a' appears twice"):
        load_cases(p)


def test_public_file_reads():
    """Every case of the public file maps to flags and a cluster without error."""
    path = Path(__file__).resolve().parents[1] / "validation" / "public_cases.yaml"
    n = 0
    for c in load_cases(path):
        if c.category == "end_to_end":
            ci = megatron_flags(c)
            load_cluster(ci.cluster, num_gpus=ci.world_size)
            n += 1
    assert n >= 20


def test_project_gpu_runs_are_the_benchmarks_configurations():
    """validation/heterosim_gpu_runs.yaml states exactly the runs bench_gpu_training.py timed: its
    cases become the same pretrain_gpt configuration (the number of iterations aside) on one H100."""
    import importlib.util
    from dataclasses import replace
    from pathlib import Path

    from models.args import parse_args

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("bench_gpu_training", root / "benchmarks" / "bench_gpu_training.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cases = {c.id: c for c in load_cases(root / "validation" / "heterosim_gpu_runs.yaml")}
    pairs = {"e2e-heterosim-h100-gpt1p3b-1gpu": "gpt-1.3b", "e2e-heterosim-h100-gpt8x4096-1gpu": "gpt-8x4096"}
    assert set(cases) == set(pairs)
    for cid, name in pairs.items():
        ci = megatron_flags(cases[cid])
        assert ci.world_size == 1 and ci.gpu == "H100-SXM5-80GB"
        ran, predicted = parse_args(bench.CONFIGS[name].split(), 1), parse_args(list(ci.flags), 1)
        assert replace(predicted, train=replace(predicted.train, train_iters=ran.train.train_iters)) == ran


def test_attention_backend_from_gpu_and_source_year():
    """Core attention follows the measured run: unfused on sm < 80 (no flash kernel) and for sources
    before 2023 (Megatron-LM gained flash attention then), flash otherwise or when the case says so."""
    v100 = {"gpu": "V100 32GB", "gpus_per_node": 16, "system": "DGX-2", "intra_node": "NVLink2 + NVSwitch",
            "inter_node": "8 x 100 Gb/s EDR"}
    # A Llama's attention dropout is 0 (its released configuration); Megatron's default is 0.1.
    unfused = ["--attention-backend", "unfused", "--attention-dropout", "0.0"]
    gpt = {**_case().model, "arch": "GPT (GQA, GeLU, LayerNorm, learned)"}
    assert megatron_flags(_case(hardware=v100, model=gpt)).flags[-1] == "0.1"
    ci = megatron_flags(_case(hardware=v100))
    assert ci.flags[-4:] == tuple(unfused)
    assert "V100-SXM2-32GB (sm_70) has no flash-attention kernel" in " | ".join(ci.assumptions)
    old = megatron_flags(_case(source={"title": "Narayanan et al. (SC'21), Table 1"}))
    assert old.flags[-4:] == tuple(unfused)
    assert "Megatron-LM's core attention in 2021 (flash attention arrived in 2023)" in " | ".join(old.assumptions)
    new = megatron_flags(_case(source={"title": "a 2024 report", "url": "https://example.org/x"}))
    assert "--attention-backend" not in new.flags
    assert "attention not stated: flash attention (today's Megatron-LM default; source year 2024)" in new.assumptions
    said = megatron_flags(_case(source={"title": "2020"}, model={**_case().model, "attention": "flash"}))
    assert "--attention-backend" not in said.flags
    with pytest.raises(ConfigError, match=r"case t: model.attention says flash, but V100-SXM2-32GB \(sm_70\) has no "
                                          r"flash-attention kernel \(FlashAttention needs sm_80\+\); fix the case"):
        megatron_flags(_case(hardware=v100, model={**_case().model, "attention": "flash"}))
    with pytest.raises(ConfigError, match="case t: model.attention 'sliding window' is not understood; "
                                          "write 'flash' or 'unfused'"):
        megatron_flags(_case(model={**_case().model, "attention": "sliding window"}))


def test_source_year():
    """The software year comes from the source's title, url or id: the earliest year named."""
    assert source_year(_case(source={"title": "Megatron-LM README (Sept 2020) tables"})) == 2020
    assert source_year(_case(source={"title": "Efficient training (SC'21)"})) == 2021
    assert source_year(_case(source={"url": "https://github.com/x/y/blob/abc/images/tables.tex"})) is None




def _sc21(**kw) -> Case:
    return _case(source={"title": "Narayanan et al. (SC'21), Table 1", "url": "https://arxiv.org/abs/2104.04473"},
                 hardware={"gpu": "NVIDIA A100-SXM4-80GB", "gpus_per_node": 8, "system": "DGX A100",
                           "intra_node": "NVLink3 + NVSwitch", "inter_node": "8 x 200 Gb/s HDR"},
                 precision="mixed precision (fp16/bf16 autocast)", **kw)


def test_unstated_settings_come_from_the_published_script():
    """SC'21 rows take micro-batch, interleaving and DDP from Megatron-LM's run_table_1.sh, say so, and run
    the TP backward all-reduce synchronously (2021 Megatron-LM)."""
    gpt = {"layers": 24, "hidden": 2304, "heads": 24, "ffn": 9216, "seq_len": 2048, "vocab": 51200, "arch": "GPT"}
    ci = megatron_flags(_sc21(model=gpt, parallelism={"tp": 1, "pp": 1, "dp": 32, "vpp": "not stated",
                                                      "recompute": "full"},
                              batch={"micro": "not stated", "global": 512}))
    f = list(ci.flags)
    assert f[f.index("--micro-batch-size") + 1] == "16"
    assert f[f.index("--overlap-grad-reduce"):f.index("--overlap-grad-reduce") + 3] == [
        "--overlap-grad-reduce", "--ddp-bucket-size", str(25 * 2**20 // 2)]
    assert "--no-async-tensor-model-parallel-allreduce" not in f  # tp 1: no TP all-reduce
    text = " | ".join(ci.assumptions)
    assert "micro-batch not stated: 16 (Megatron-LM examples/sc21/run_table_1.sh, 1.7B)" in text
    assert "PyTorch DDP (Megatron-LM examples/sc21/run_table_1.sh, 1.7B)" in text
    big = {**gpt, "layers": 60, "hidden": 10240, "heads": 80, "ffn": 40960}
    ci = megatron_flags(_sc21(model=big, parallelism={"tp": 8, "pp": 4, "dp": 32, "vpp": "not stated",
                                                      "recompute": "full"},
                              batch={"micro": "not stated", "global": 1792}))
    f = list(ci.flags)
    assert f[f.index("--num-layers-per-virtual-pipeline-stage") + 1] == "5"
    assert f[f.index("--micro-batch-size") + 1] == "2"
    assert "--overlap-grad-reduce" not in f and "--no-async-tensor-model-parallel-allreduce" in f
    assert "--scatter-gather-tensors-in-pipeline" in f  # 2021, pp 4, tp 8, no SP
    assert "vpp not stated: 3 (5 layers per virtual stage, Megatron-LM examples/sc21/run_table_1.sh, 76B)" in ci.assumptions
    # What the case states wins over the script.
    ci = megatron_flags(_sc21(model=big, parallelism={"tp": 8, "pp": 4, "dp": 32, "vpp": 1, "recompute": "full"},
                              batch={"micro": 1, "global": 1792}))
    f = list(ci.flags)
    assert f[f.index("--micro-batch-size") + 1] == "1" and "--num-layers-per-virtual-pipeline-stage" not in f


def test_fuzzed_case_fails_alone_with_a_typed_error(tmp_path_factory):
    """Any value at any path of a published case: the reader, the flag builder and the collective
    predictor raise only HeteroSimError (or the case carries its problem), in bounded time."""
    pytest.importorskip("hypothesis")
    import time

    import yaml
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from fuzzing import mutated
    from heterosim.errors import HeteroSimError
    from heterosim.validation.validate import run_case

    root = Path(__file__).resolve().parents[1] / "validation"
    cases = [c for f in ("public_cases.yaml", "hopper_cases.yaml")
             for c in yaml.safe_load((root / f).read_text())["cases"] if c["category"] in ("end_to_end", "collective")]

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def check(data):
        doc = {"schema_version": 1, "cases": [mutated(data, data.draw(st.sampled_from(cases)))]}
        p = tmp_path_factory.mktemp("case") / "cases.yaml"
        p.write_text(yaml.safe_dump(doc))
        t0 = time.monotonic()
        try:
            for c in load_cases(p):
                if c.category == "end_to_end" and not c.problem:
                    megatron_flags(c)
                elif c.category == "collective":
                    run_case(c)  # a collective case is planned, not captured: cheap
        except HeteroSimError:
            pass
        assert time.monotonic() - t0 < 5

    check()


HOPPER = Path(__file__).resolve().parents[1] / "validation" / "hopper_cases.yaml"


def test_every_hopper_row_reads():
    """All 70 rows of the DGX H100 file become flags and a cluster as written (no edits)."""
    cases = [c for c in load_cases(HOPPER) if c.category == "end_to_end"]
    assert len(cases) == 70
    for c in cases:
        ci = megatron_flags(c)
        p = c.parallelism
        assert ci.world_size == p["tp"] * p["pp"] * p["dp"] * p["cp"]


BRIDGE = Path(__file__).resolve().parents[1] / "validation" / "bridge_cases.yaml"


def test_every_bridge_row_reads():
    """All 20 rows (18 of the Megatron Bridge tables, 2 of its expert-parallel overlap A/B) become flags
    as written; those sources name Megatron Bridge, so NVLS is off (its recipes' NCCL_NVLS_ENABLE=0) and
    MoE rows with TP keep whole experts; the rows whose recipes run the flex dispatcher get it (HybridEP
    for Qwen3 30B and Nemotron 3 Nano on H100 and B200, the A/B's bf16 one with HybridEP's permute
    fusion; DeepEP for DeepSeek-V3 on B200)."""
    cases = load_cases(BRIDGE)
    assert len(cases) == 20
    for c in cases:
        ci = megatron_flags(c)
        p = c.parallelism
        assert ci.world_size == p["tp"] * p["pp"] * p["dp"] * p["cp"]
        assert ci.nccl_env["NCCL_NVLS_ENABLE"] == "0"
        if "ep" in p and p["tp"] > 1:
            assert ci.flags[ci.flags.index("--expert-tensor-parallel-size") + 1] == "1"
    flex = {c.id: megatron_flags(c).flags for c in cases if "--moe-token-dispatcher-type" in megatron_flags(c).flags}
    assert {k: f[f.index("--moe-flex-dispatcher-backend") + 1] for k, f in flex.items()} == {
        "e2e-bridge-26.06-h100-qwen3-30b-a3b-fp8-16": "hybridep", "e2e-bridge-26.04.01-b200-deepseekv3-mxfp8-256": "deepep",
        "e2e-bridge-26.06-h100-nemotron-3-nano-fp8-16": "hybridep",
        "e2e-bridge-26.04.01-b200-qwen3-30b-a3b-mxfp8-8": "hybridep",
        "e2e-bridge-26.04.01-b200-nemotron-3-nano-mxfp8-8": "hybridep",
        "e2e-bridge-skill-h100-qwen3-30b-a3b-bf16-16-ep-overlap-off": "hybridep",
        "e2e-bridge-skill-h100-qwen3-30b-a3b-bf16-16-ep-overlap-on": "hybridep"}
    assert [k for k, f in flex.items() if "--moe-permute-fusion-into-hybridep" in f] == [
        "e2e-bridge-skill-h100-qwen3-30b-a3b-bf16-16-ep-overlap-off",
        "e2e-bridge-skill-h100-qwen3-30b-a3b-bf16-16-ep-overlap-on"]
    # expert-parallel overlap: the Qwen3 H100 recipes' (235B interleaved, 30B at PP 2 in 25.11), the A/B's
    # one change (its parallelism.ep_overlap)
    assert [c.id for c in cases if "--overlap-moe-expert-parallel-comm" in megatron_flags(c).flags] == [
        "e2e-bridge-26.04.01-h100-qwen3-235b-a22b-fp8-256", "e2e-bridge-25.11-h100-qwen3-235b-a22b-fp8-cs-256",
        "e2e-bridge-25.11-h100-qwen3-30b-a3b-fp8-cs-16", "e2e-bridge-skill-h100-qwen3-30b-a3b-bf16-16-ep-overlap-on"]


def test_ep_overlap_field_and_pipelined_jobs():
    """parallelism.ep_overlap says yes or no; with pipelining it needs virtual stages (Megatron-core),
    else it is noted and run without; a word that is neither fails naming the field."""
    on = next(c for c in load_cases(BRIDGE) if c.id.endswith("ep-overlap-on"))
    piped = dataclasses.replace(on, parallelism={**on.parallelism, "pp": 2, "dp": 8})
    ci = megatron_flags(piped)
    assert "--overlap-moe-expert-parallel-comm" not in ci.flags
    assert ("expert-parallel overlap needs virtual pipeline stages with pipelining (Megatron-core): this job "
            "runs without it") in ci.assumptions
    interleaved = megatron_flags(dataclasses.replace(piped, parallelism={**piped.parallelism, "vpp": 2}))
    assert "--overlap-moe-expert-parallel-comm" in interleaved.flags
    bad = dataclasses.replace(on, parallelism={**on.parallelism, "ep_overlap": "sometimes"})
    with pytest.raises(ConfigError, match=r"ep-overlap-on: parallelism.ep_overlap is 'sometimes'; say true or false"):
        megatron_flags(bad)


def _hopper(case_id: str) -> Case:
    return next(c for c in load_cases(HOPPER) if c.id == case_id)


def test_dgxc_recipe_fills_what_the_row_leaves_unstated():
    """Nemotron-4 340B: SP and selective recompute from nemotron4-340b-synth.yaml, the distributed
    optimizer with 50 MiB bf16 buckets (26,214,400 elements) reduced in bf16, untied embeddings, no
    bias, TP and p2p communication overlapped, and fp8 parameters all-gathered in fp8."""
    ci = megatron_flags(_hopper("e2e-dgxc-v24.11.1-nemotron4-340b-fp8-128gpu"))
    f = list(ci.flags)
    for seq in (["--sequence-parallel"], ["--recompute-granularity", "selective"], ["--use-distributed-optimizer",
                "--overlap-grad-reduce", "--ddp-bucket-size", "26214400", "--overlap-param-gather"],
                ["--fp8-param-gather"],
                ["--num-layers-per-virtual-pipeline-stage", "1"], ["--disable-bias-linear"],
                ["--tp-comm-overlap", "--overlap-p2p-communication"], ["--grad-reduce-in-bf16"],
                ["--untie-embeddings-and-output-weights"], ["--num-attention-heads", "96"],
                ["--num-query-groups", "8"], ["--squared-relu"], ["--position-embedding-type", "rope"],
                ["--bf16", "--fp8-format", "hybrid"]):
        i = f.index(seq[0])
        assert f[i:i + len(seq)] == seq
    recipe = "NVIDIA/dgxc-benchmarking@35a9aec nemotron/nemotron4-340b-synth.yaml + configure.sh (NeMo 24.09)"
    for note in (f"recompute not stated: selective ({recipe})", f"sequence parallelism not stated: on ({recipe})",
                 "model.heads '96 (from memory, unverified)': 96 (the remark is kept out)",
                 f"tensor-parallel communication overlapped with the GEMMs (ub_tp_comm_overlap, {recipe})",
                 f"pipeline p2p overlapped with compute (overlap_p2p_comm, {recipe})",
                 f"fp8 parameters (fp8_params, {recipe}): the transformer layers' weights are fp8, "
                 "all-gathered at 1 byte per element (--fp8-param-gather)"):
        assert note in ci.assumptions


def test_dgxc_recipe_attention_backend_and_aggregated_ring_exchanges():
    """NVTE_FUSED_ATTN=1 (Llama 3.1 configure.sh) -> cuDNN's fused attention; 0 (GPT-3's launch.sh) ->
    FlashAttention-2; the 405B recipe's ub_tp_comm_overlap_cfg sets aggregate on all four ring
    exchanges, GPT-3's on fc2_dgrad only, Llama 3.1 70B's on none."""
    def flags(case_id):
        return list(megatron_flags(_hopper(case_id)).flags)

    f = flags("e2e-dgxc-v24.11.1-llama3.1-405b-bf16-576gpu")
    i = f.index("--tp-comm-overlap-aggregate")
    assert f[i + 1] == "qkv_fprop,fc1_fprop,proj_dgrad,fc2_dgrad"
    assert f[f.index("--attention-backend") + 1] == "fused"
    g = flags("e2e-dgxc-v24.11.1-gpt3-175b-bf16-128gpu")
    assert g[g.index("--tp-comm-overlap-aggregate") + 1] == "fc2_dgrad"
    assert g[g.index("--attention-backend") + 1] == "flash"
    h = flags("e2e-dgxc-v24.11.1-llama3.1-70b-bf16-64gpu")
    assert "--tp-comm-overlap-aggregate" not in h and h[h.index("--attention-backend") + 1] == "fused"


def test_dgxc_recipe_sm_margin_of_pipelined_reduce_scatters():
    """set_sm_margin: 1 with num_sm in ub_tp_comm_overlap_cfg -> --tp-comm-overlap-sm-margin, cited:
    GPT-3 proj 24 / fc2 20, Llama 3.1 70B 24 / 16, 405B 24 / 8; the Nemotron-4 recipes have no cfg
    (TE's initialize_ub defaults: no margin); Llama 3.1 8B runs without TP overlap."""
    def flags(case_id):
        return list(megatron_flags(_hopper(case_id)).flags)

    for case_id, want in (("gpt3-175b-fp8-128gpu", "proj_fprop=24,fc2_fprop=20"),
                          ("llama3.1-70b-bf16-64gpu", "proj_fprop=24,fc2_fprop=16"),
                          ("llama3.1-405b-fp8-32gpu", "proj_fprop=24,fc2_fprop=8")):
        f = flags("e2e-dgxc-v24.11.1-" + case_id)
        assert f[f.index("--tp-comm-overlap-sm-margin") + 1] == want
    for case_id in ("nemotron4-15b-bf16-16gpu", "nemotron4-340b-fp8-128gpu", "llama3.1-8b-bf16-8gpu"):
        assert "--tp-comm-overlap-sm-margin" not in flags("e2e-dgxc-v24.11.1-" + case_id)
    ci = megatron_flags(_hopper("e2e-dgxc-v24.11.1-gpt3-175b-bf16-128gpu"))
    assert ("pipelined reduce-scatter GEMMs leave SMs to their communication kernel (proj_fprop=24,fc2_fprop=20: "
            "ub_tp_comm_overlap_cfg num_sm with set_sm_margin 1, NVIDIA/dgxc-benchmarking@35a9aec "
            "nemo_megatron/gpt3_175b_hydra.yaml + launch.sh (NeMo 24.05))") in ci.assumptions


def test_dgxc_405b_fp8_rows_reduce_scatter_in_fp8():
    """Llama 3.1 405B's configure.sh sets fp8_buf on proj_fprop and fc2_fprop to $FP8_ENABLED: its
    fp8 rows get --tp-comm-overlap-fp8-buf, cited; its bf16 rows and the other models' fp8 rows do not."""
    fp8 = megatron_flags(_hopper("e2e-dgxc-v24.11.1-llama3.1-405b-fp8-576gpu"))
    f = list(fp8.flags)
    assert f[f.index("--tp-comm-overlap-fp8-buf") + 1] == "proj_fprop,fc2_fprop"
    assert ("pipelined reduce-scatters move fp8 (proj_fprop, fc2_fprop: ub_tp_comm_overlap_cfg fp8_buf, "
            "NVIDIA/dgxc-benchmarking@35a9aec llama3.1/llama3.1_405b.yaml + configure.sh (NeMo 24.09))") in fp8.assumptions
    for case_id in ("llama3.1-405b-bf16-576gpu", "llama3.1-70b-fp8-64gpu", "gpt3-175b-fp8-128gpu"):
        assert "--tp-comm-overlap-fp8-buf" not in megatron_flags(_hopper("e2e-dgxc-v24.11.1-" + case_id)).flags


def test_dgxc_recipe_cross_entropy_loss_fusion():
    """cross_entropy_loss_fusion: true in the Llama 3.1 and Nemotron-4 YAMLs -> --cross-entropy-loss-fusion,
    cited; gpt3_175b_hydra.yaml does not set it: the unfused loss, nothing said."""
    recipe = "NVIDIA/dgxc-benchmarking@35a9aec llama3.1/llama3.1_8b.yaml + configure.sh (NeMo 24.09)"
    for case_id in ("e2e-dgxc-v24.11.1-llama3.1-8b-bf16-8gpu", "e2e-dgxc-v24.11.1-nemotron4-340b-fp8-128gpu"):
        assert "--cross-entropy-loss-fusion" in megatron_flags(_hopper(case_id)).flags
    ci = megatron_flags(_hopper("e2e-dgxc-v24.11.1-llama3.1-8b-bf16-8gpu"))
    assert (f"loss: Megatron-core's fused vocab-parallel cross-entropy, one all-reduce fewer "
            f"(cross_entropy_loss_fusion, {recipe})") in ci.assumptions
    gpt3 = megatron_flags(_hopper("e2e-dgxc-v24.11.1-gpt3-175b-bf16-128gpu"))
    assert "--cross-entropy-loss-fusion" not in gpt3.flags
    assert not [a for a in gpt3.assumptions if "cross_entropy" in a]


def test_a_stated_value_unlike_the_recipe_wins_and_is_printed():
    """Llama 3.1 405B: the row says 8 kv heads and vocab 128,256; the recipe ran 16 groups and GPT-2's
    50,257-token tokenizer. The row's values are used, the difference printed."""
    ci = megatron_flags(_hopper("e2e-dgxc-v24.11.1-llama3.1-405b-bf16-576gpu"))
    f = list(ci.flags)
    assert f[f.index("--num-query-groups") + 1] == "8" and f[f.index("--vocab-size") + 1] == "128256"
    recipe = "NVIDIA/dgxc-benchmarking@35a9aec llama3.1/llama3.1_405b.yaml + configure.sh (NeMo 24.09)"
    assert f"model.kv_heads 8 differs from the 16 of {recipe}; the case's value is used" in ci.assumptions
    assert f"model.vocab 128256 differs from the 50257 of {recipe}; the case's value is used" in ci.assumptions
    assert f[f.index("--num-layers-per-virtual-pipeline-stage") + 1] == "2"  # 126 layers / (pp 9 x vpp 7)


def test_not_stated_without_a_recipe_takes_megatron_defaults():
    """No published run fits: sequence parallelism off, no recompute, each said so; no DDP flags."""
    c = _case(parallelism={"tp": 4, "pp": 2, "dp": 2, "vpp": 2, "sequence_parallel": "not stated",
                           "recompute": "not stated"})
    ci = megatron_flags(c)
    assert "--sequence-parallel" not in ci.flags and "--recompute-granularity" not in ci.flags
    assert "--use-distributed-optimizer" not in ci.flags
    assert "sequence parallelism not stated: off (Megatron-LM default without --sequence-parallel)" in ci.assumptions
    assert "recompute not stated: none (Megatron-LM default without --recompute-granularity)" in ci.assumptions


def test_an_unreadable_field_names_the_case():
    """A model size that is not a count fails with the case id, the field and the fix."""
    c = _case(model={**_case().model, "heads": "~32"})
    with pytest.raises(ConfigError, match=re.escape("case t: model.heads is '~32': an approximate count; "
                                                    "give the exact integer")):
        megatron_flags(c)
    c = _case(parallelism={**_case().parallelism, "sequence_parallel": "maybe"})
    with pytest.raises(ConfigError, match=re.escape("case t: parallelism.sequence_parallel is 'maybe'; say true or false")):
        megatron_flags(c)


def test_nemo2_source_takes_nemo2_recipe_settings():
    """No published run fits, the source names NeMo 25.04: SP on (TP 4), TE TP overlap, overlapped p2p
    (vpp 2), distributed optimizer with 128 Mi-element buckets in bf16, each cited."""
    c = _case(source={"title": "NeMo performance summary", "software": "NeMo 25.04"},
              parallelism={"tp": 4, "pp": 2, "dp": 2, "vpp": 2})
    ci = megatron_flags(c)
    f = list(ci.flags)
    for flag in ("--sequence-parallel", "--tp-comm-overlap", "--overlap-p2p-communication",
                 "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
                 "--grad-reduce-in-bf16"):
        assert flag in f
    assert f[f.index("--ddp-bucket-size") + 1] == str(128 * 1024 * 1024)
    assert "--cross-entropy-loss-fusion" in f  # GPTConfig.cross_entropy_loss_fusion = True
    assert any(a.startswith("sequence parallelism not stated: on (NeMo 2 pre-training recipes") for a in ci.assumptions)


def test_nemo_launcher_source_has_no_bucket_size():
    """NeMo 24.05 (the launcher's YAML recipes): the same overlaps, Megatron's own bucket size, and
    the unfused loss (not every YAML sets cross_entropy_loss_fusion)."""
    c = _case(source={"title": "x", "software": "NeMo 24.05"}, parallelism={"tp": 4, "pp": 1, "dp": 4})
    f = list(megatron_flags(c).flags)
    assert "--use-distributed-optimizer" in f and "--tp-comm-overlap" in f and "--ddp-bucket-size" not in f
    assert "--cross-entropy-loss-fusion" not in f


@pytest.mark.parametrize("text,gen", [
    ("NVIDIA/dgxc-benchmarking v25.03 llama3.1/README_70b.md", 1),
    ("https://github.com/NVIDIA/dgxc-benchmarking/blob/v25.04/llama3.1/README.md", 2),
    ("NeMo 2.0 recipes", 2), ("NeMo Framework performance summary", 2), ("NeMo 24.09", 1),
    ("Megatron-LM SC'21", None),
])
def test_nemo_generation(text, gen):
    from heterosim.validation.frameworks import nemo_generation
    assert nemo_generation(text) == gen


@pytest.mark.parametrize("text,bridge", [
    ("Megatron-Bridge performance summary", True), ("NVIDIA-NeMo/Megatron-Bridge r0.2.0", True),
    ("mbridge recipes", True), ("NVIDIA/dgxc-benchmarking v25.10 llama3.1/README.md", True),
    ("dgxc-benchmarking v25.04 llama3.1", False), ("NeMo 2.0 recipes", False), ("Megatron-LM", False),
])
def test_names_megatron_bridge(text, bridge):
    from heterosim.validation.frameworks import names_megatron_bridge
    assert names_megatron_bridge(text) is bridge


def test_megatron_bridge_runs_nemo2_settings_with_current_scaling_fp8():
    """Megatron Bridge's launcher has no delayed scaling: "fp8" is current scaling, said so; a precision
    naming delayed scaling keeps it; NeMo 2 keeps Transformer Engine's delayed scaling."""
    from heterosim.validation.frameworks import BRIDGE_SCRIPT

    src = {"title": "Megatron Bridge performance summary (2025)", "url": "https://example.org/mbridge"}
    ci = megatron_flags(_case(source=src, precision="FP8", parallelism={"tp": 4, "pp": 1, "dp": 4}))
    f = list(ci.flags)
    assert f[f.index("--bf16"):f.index("--bf16") + 5] == ["--bf16", "--fp8-recipe", "tensorwise", "--fp8-format", "hybrid"]
    assert "--sequence-parallel" in f and "--tp-comm-overlap" in f and "--use-distributed-optimizer" in f
    assert (f"fp8 scaling not stated: current scaling ({BRIDGE_SCRIPT}); fp8 GEMMs (hybrid e4m3/e5m2), "
            "bf16 elsewhere") in ci.assumptions
    for precision, src2 in (("fp8 (delayed scaling)", src), ("FP8", {"title": "NeMo 2.0 performance summary"})):
        f = list(megatron_flags(_case(source=src2, precision=precision, parallelism={"tp": 4, "pp": 1, "dp": 4})).flags)
        assert "--fp8-recipe" not in f and "--fp8-format" in f


def test_layers_that_do_not_divide_account_for_embedding_and_loss():
    """126 layers on pp 8 x vpp 8 (NeMo's Llama 3.1 405B): 128 slots of 2, said so."""
    c = _case(model={**_case().model, "layers": 126}, parallelism={"tp": 8, "pp": 8, "dp": 1, "vpp": 8})
    ci = megatron_flags(c)
    f = list(ci.flags)
    assert "--account-for-embedding-in-pipeline-split" in f and "--account-for-loss-in-pipeline-split" in f
    assert f[f.index("--num-layers-per-virtual-pipeline-stage") + 1] == "2"
    assert any("126 layers do not split over 64 pipeline parts" in a for a in ci.assumptions)
    with pytest.raises(ConfigError, match=re.escape("case t: 125 layers do not split into pp 8 x vpp 8")):
        megatron_flags(_case(model={**_case().model, "layers": 125}, parallelism={"tp": 8, "pp": 8, "dp": 1, "vpp": 8}))


def test_moe_words_and_fields():
    """'MoE, 8 experts, top-2 routing' -> --num-experts 8 --moe-router-topk 2; fields win over words;
    a MoE without a count is one error naming the fix; 'NA' for ep is 1."""
    moe = {**_case().model, "arch": "MoE, 8 experts, top-2 routing, SwiGLU, RMSNorm, RoPE"}
    f = list(megatron_flags(_case(model=moe, parallelism={"tp": 1, "pp": 1, "dp": 8, "ep": 8})).flags)
    assert f[f.index("--num-experts"):f.index("--num-experts") + 4] == ["--num-experts", "8", "--moe-router-topk", "2"]
    assert f[f.index("--expert-model-parallel-size") + 1] == "8"
    f = list(megatron_flags(_case(model={**moe, "experts": 16, "topk": 4, "moe_ffn": 1024},
                                  parallelism={"tp": 1, "pp": 1, "dp": 8, "ep": "NA"})).flags)
    assert f[f.index("--num-experts"):f.index("--num-experts") + 6] == [
        "--num-experts", "16", "--moe-router-topk", "4", "--moe-ffn-hidden-size", "1024"]
    assert "--expert-model-parallel-size" not in f
    with pytest.raises(ConfigError, match=re.escape("case t: model.arch names a mixture of experts but no expert "
                                                    "count; give model.experts (and model.topk)")):
        megatron_flags(_case(model={**moe, "arch": "MoE (SwiGLU, RMSNorm, RoPE)"}))


def test_deepseek_reads_mla_shared_experts_and_dense_layers():
    """A DeepSeek-V3 row: MLA with the released ranks and head dims, one shared expert of the expert
    width, the first 3 of its layers dense, SwiGLU / RMSNorm / RoPE, each default said so; fields
    win (a V2 row's 2 shared experts from its name); 'MLA' alone in an arch phrase reads as MLA."""
    v3 = {"name": "DeepSeek-V3", "layers": 61, "hidden": 7168, "heads": 128, "ffn": 18432, "seq_len": 4096,
          "vocab": 129280, "experts": 256, "topk": 8, "moe_ffn": 2048, "arch": "MoE, MLA, MTP"}
    ci = megatron_flags(_case(model=v3, parallelism={"tp": 1, "pp": 1, "dp": 8, "ep": 8}))
    f = list(ci.flags)
    i = f.index("--multi-latent-attention")
    assert f[i:i + 11] == ["--multi-latent-attention", "--q-lora-rank", "1536", "--kv-lora-rank", "512",
                           "--qk-head-dim", "128", "--qk-pos-emb-head-dim", "64", "--v-head-dim", "128"]
    i = f.index("--moe-shared-expert-intermediate-size")
    assert f[i:i + 4] == ["--moe-shared-expert-intermediate-size", "2048", "--moe-layer-freq", "[0]*3+[1]*58"]
    assert "--swiglu" in f and f[f.index("--normalization") + 1] == "RMSNorm"
    assert ("multi-head latent attention, not stated: q_lora_rank 1536, kv_lora_rank 512, qk_head_dim 128, "
            "qk_pos_emb_head_dim 64, v_head_dim 128 (DeepSeek-V3's released configuration (config.json))") in ci.assumptions
    assert "dense layers not stated: 3 (DeepSeek-V3's released configuration (config.json))" in ci.assumptions
    assert f[f.index("--mtp-num-layers") + 1] == "1"
    assert "multi-token prediction depths not stated: 1 (model.arch names MTP)" in ci.assumptions
    # pp 8 x vpp 4 = 32 parts for 61 layers: the embedding, the MTP layer and the loss take a layer's place
    lay = list(megatron_flags(_case(model=v3, parallelism={"tp": 2, "pp": 8, "dp": 4, "ep": 8, "vpp": 4})).flags)
    assert lay[lay.index("--pipeline-model-parallel-layout") + 1] == "|".join(["Et"] + ["tt"] * 30 + ["mL"])
    assert "--num-layers-per-virtual-pipeline-stage" not in lay
    v2 = {**v3, "name": "DeepSeek-V2", "layers": 60, "kv_lora_rank": 256, "dense_layers": 2}
    f = list(megatron_flags(_case(model=v2, parallelism={"tp": 1, "pp": 1, "dp": 8, "ep": 8})).flags)
    assert f[f.index("--kv-lora-rank") + 1] == "256"
    i = f.index("--moe-shared-expert-intermediate-size")
    assert f[i:i + 4] == ["--moe-shared-expert-intermediate-size", "4096", "--moe-layer-freq", "[0]*2+[1]*58"]
    plain = {**_case().model, "arch": "GPT (MLA, SwiGLU, RMSNorm, RoPE)"}
    f = list(megatron_flags(_case(model=plain, parallelism={"tp": 4, "pp": 1, "dp": 4})).flags)
    assert "--multi-latent-attention" in f and "--moe-layer-freq" not in f


def test_kimi_k2_reads_as_deepseek_v3s_architecture_with_its_own_counts():
    """Kimi K2 (DeepSeek-V3's architecture): MLA with the same ranks, one shared expert, one dense layer,
    SwiGLU / RMSNorm / RoPE; the name 'Kimi-K2' is no unknown arch word."""
    k2 = {"name": "Kimi-K2 1T", "layers": 61, "hidden": 7168, "heads": 64, "ffn": 18432, "seq_len": 4096,
          "vocab": 163840, "experts": 384, "topk": 8, "moe_ffn": 2048, "arch": "Kimi K2 (MoE, MLA)"}
    ci = megatron_flags(_case(model=k2, parallelism={"tp": 1, "pp": 4, "dp": 64, "ep": 64}))
    f = list(ci.flags)
    assert "--multi-latent-attention" in f and f[f.index("--q-lora-rank") + 1] == "1536"
    i = f.index("--moe-shared-expert-intermediate-size")
    assert f[i:i + 4] == ["--moe-shared-expert-intermediate-size", "2048", "--moe-layer-freq", "[0]*1+[1]*60"]
    assert "dense layers not stated: 1 (Kimi K2's released configuration (config.json))" in ci.assumptions
    assert "--swiglu" in f and f[f.index("--normalization") + 1] == "RMSNorm"


def test_model_family_configuration_and_absent_keys():
    """A Llama without a recipe: no bias, untied output layer, dropout 0 (its released config); an absent
    sequence_parallel key is as unstated as 'not stated'."""
    ci = megatron_flags(_case(parallelism={"tp": 4, "pp": 1, "dp": 4}))
    f = list(ci.flags)
    assert "--disable-bias-linear" in f and "--untie-embeddings-and-output-weights" in f
    assert f[f.index("--hidden-dropout") + 1] == "0.0"
    assert "linear layers without bias (Llama's released configuration)" in ci.assumptions
    assert "sequence parallelism not stated: off (Megatron-LM default without --sequence-parallel)" in ci.assumptions
    gpt = megatron_flags(_case(model={**_case().model, "arch": "GPT (MHA, GeLU, LayerNorm, learned)", "kv_heads": 32}))
    assert "--disable-bias-linear" not in gpt.flags and "--hidden-dropout" not in gpt.flags


def test_rack_scale_nvlink_domain_is_one_nvswitch_node():
    """GB200 NVL72 (trays of 4): a 128-GPU job spans NVSwitch domains of 64 GPUs (the largest multiple
    of 4 that divides 128 and fits 72), each with its 16 trays' 4 NICs."""
    hw = {"gpu": "NVIDIA GB200 (B200 GPU)", "gpus_per_node": 4, "system": "GB200 NVL72",
          "intra_node": "NVLink5, 72-GPU NVLink domain, 1.8 TB/s per GPU", "inter_node": "4 x 800 Gb/s InfiniBand XDR"}
    d, gpu, notes = cluster_for(hw, 128)
    node = d["node_types"]["node"]
    assert gpu == "GB200" and node["gpus_per_node"] == 64 and node["nvlink"]["kind"] == "nvswitch"
    assert node["nics"] == {"count": 64, "bw_Gbps": 800.0}
    assert "NVLink domain of 72 GPUs: modelled as NVSwitch nodes of 64 GPUs (16 trays of 4) with their trays' NICs" in notes
    assert load_cluster(d, num_gpus=128).num_nodes == 2


@pytest.mark.parametrize("hw,tray", [({"gpu": "NVIDIA GB200", "system": "GB200 NVL72"}, 4), ({"gpu": "GB300"}, 4)])
def test_grace_blackwell_without_fabric_text_is_an_nvl72_rack(hw, tray):
    """A GB200 / GB300 row naming no NVLink (or only "NVL72"): trays of 4 in the rack's 72-GPU NVSwitch
    domain at the GPU's NVLink5 rate (was: PCIe-only nodes), said so."""
    d, gpu, notes = cluster_for(hw, 128)
    node = d["node_types"]["node"]
    assert node["gpus_per_node"] == 64 and node["nvlink"]["kind"] == "nvswitch" and node["nvlink"]["lanes"] == 18
    assert node["nvlink"]["lane_GBps"] == 50.0
    assert "intra_node not stated: the rack's NVSwitch fabric at the GPU's datasheet NVLink rate" in notes
    assert f"NVLink domain of 72 GPUs: modelled as NVSwitch nodes of 64 GPUs (16 trays of {tray}) with their trays' NICs" in notes


def test_grace_hosts_issue_ops_slower():
    """A Grace-Blackwell tray's host is Grace: every op costs the CPU 37.08 / 13.48 = 2.75x the x86
    default (TransformerEngine#2053), so the loaded node's forward dispatch is 10.93 x 2.75 us; an x86
    DGX B200 node keeps the default."""
    from heterosim.cluster.spec import DEFAULT_DISPATCH_US, US
    d, _, notes = cluster_for({"gpu": "NVIDIA GB200", "system": "GB200 NVL72"}, 128)
    assert d["node_types"]["node"]["cpu"]["dispatch_us"]["fwd"] == round(DEFAULT_DISPATCH_US["fwd"] * 2.75, 2) == 30.06
    assert any(n.startswith("host CPU: Grace, 2.75x") for n in notes)
    (t,) = load_cluster(d, num_gpus=128).spec.node_types
    assert t.dispatch.fwd == pytest.approx(30.06 * US)
    b200, _, _ = cluster_for({"gpu": "NVIDIA B200", "gpus_per_node": 8}, 16)
    assert "dispatch_us" not in b200["node_types"]["node"]["cpu"]


@pytest.mark.parametrize("gpu,rate", [("A100-SXM4-80GB", 200.0), ("H100", 400.0), ("H200", 400.0), ("B200", 400.0),
                                      ("B300", 800.0)])
def test_unstated_network_is_the_generations_nic(gpu, rate):
    """No inter-node text: one NIC per GPU at the rate of the GPU's DGX system (HDR 200 for A100 and
    before, ConnectX-7 400 for Hopper / Blackwell, ConnectX-8 800 for Blackwell Ultra)."""
    d, _, notes = cluster_for({"gpu": gpu, "gpus_per_node": 8}, 16)
    assert d["node_types"]["node"]["nics"] == {"count": 8, "bw_Gbps": rate}
    assert any(n.startswith(f"no inter-node network stated: one {rate:g} Gb/s NIC per GPU") for n in notes)


def test_global_batch_from_gradient_accumulation():
    """A row with micro-batch 4, GA 4 and DP 16 (CP 2 aside) runs a global batch of 256 (Megatron:
    global = micro x accumulation steps x data-parallel), said so; a stated global batch wins and a
    disagreeing GA is printed; neither given is one error naming both fields."""
    par = {"tp": 1, "pp": 1, "cp": 2, "dp": 16}
    ci = megatron_flags(_case(parallelism=par, batch={"micro": 4, "ga": 4}))
    f = list(ci.flags)
    assert f[f.index("--global-batch-size") + 1] == "256"
    assert "batch.global not stated: 256 = micro-batch 4 x 4 accumulation steps x data-parallel 16" in ci.assumptions
    ci = megatron_flags(_case(parallelism=par, batch={"micro": 4, "global": 256, "gradient_accumulation": 2}))
    assert "batch.global 256 differs from micro-batch 4 x 2 accumulation steps x data-parallel 16 = 128; the global " \
           "batch is used" in ci.assumptions
    with pytest.raises(ConfigError, match=r"^case t: batch.global is None; give an integer, or batch.ga"):
        megatron_flags(_case(parallelism=par, batch={"micro": 4}))


def test_a_stated_power_limit_and_memory_make_a_board_variant():
    """'96GB HBM2e ... 500 W power limit' on an H100 (torchtitan's Grand Teton boards): the memory
    size and its stated bandwidth, and tensor work at 500 W's sustained clock, as a GPU of the
    cluster file's own; a board the catalogue has as stated keeps its datasheet figures."""
    hw = {"gpu": "NVIDIA H100 96GB HBM2e (SXM, 500 W power limit)", "gpus_per_node": 8,
          "hbm_bandwidth_TBps": "2.4 TB/sec"}
    spec, gpu, notes = cluster_for(hw, 16)
    assert gpu == "H100-SXM5-80GB"
    assert spec["node_groups"][0]["gpu"] == "H100-SXM5-96GB@500W"
    (entry,) = spec["gpus"]
    assert entry["memory_GiB"] == 96 and entry["hbm_bw_GBps"] == 2400 and entry["tdp_W"] == 500
    assert entry["sustained_clock_ratio"] == pytest.approx(0.86 * (500 / 700) ** (1 / 3))
    assert notes[:2] == [
        "96 GB of memory (the catalogue's H100-SXM5-80GB has 80): 2.4 TB/s as stated",
        "power limit 500 W (the H100-SXM5-80GB's is 700 W): tensor work at 0.769 of boost (cube law through "
        "0.860 at 700 W; docs/kernel_db.md)"]
    c = load_cluster(spec, num_gpus=16)
    assert c.gpu_type(3) == "H100-SXM5-96GB@500W" and c.catalogue.get("H100-SXM5-96GB@500W").hbm_bw == 2.4e12
    same, _, notes = cluster_for({"gpu": "NVIDIA H100 80GB HBM3 (SXM5, 700 W TDP)", "gpus_per_node": 8,
                                  "hbm_bandwidth_TBps": 3.2}, 16)
    assert "gpus" not in same and same["node_groups"][0]["gpu"] == "H100-SXM5-80GB"
    assert not [n for n in notes if "power limit" in n or "memory" in n]
    kw, _, notes = cluster_for({"gpu": "NVIDIA GB200 (1,200 W)", "gpus_per_node": 4}, 8)
    assert "gpus" not in kw  # 1,200 W is the GB200's own limit, read with its thousands separator


def test_a_global_batch_given_in_tokens_and_an_8k_sequence():
    """'4M tokens' of an '8K' sequence (8,192): 512 sequences, each reading said with the case."""
    ci = megatron_flags(_case(model={"layers": 2, "hidden": 1024, "heads": 16, "seq_len": "8K", "vocab": 32000},
                              batch={"micro": 1, "global": "4M tokens"}))
    f = list(ci.flags)
    assert f[f.index("--seq-length") + 1] == "8192" and f[f.index("--global-batch-size") + 1] == "512"
    assert "model.seq_len '8K': 8192 (K read as 1,024)" in ci.assumptions
    assert ("batch.global '4M tokens': 4,194,304 tokens = 512 sequences of 8,192 (M read as 1,048,576)"
            in ci.assumptions)


def test_gpus_per_node_may_carry_a_remark():
    spec, _, _ = cluster_for({"gpu": "NVIDIA H100 80GB HBM3", "gpus_per_node": "8 (HGX)"}, 16)
    assert next(iter(spec["node_types"].values()))["gpus_per_node"] == 8


def test_released_models_by_name_and_an_unknown_one():
    """Llama 3.3 70B has Llama 3.1 70B's shape; Llama 2 and Qwen3's dense models are known by name
    (their config.json); a name the reader does not know, with no shape, is one error listing the
    known ones."""
    def flags(name):
        f = list(megatron_flags(_case(model={"name": name, "seq_len": 4096})).flags)
        return tuple(int(f[f.index(k) + 1]) for k in ("--num-layers", "--hidden-size", "--num-attention-heads",
                                                        "--vocab-size"))

    assert flags("Llama 3.3 70B") == (80, 8192, 64, 128256)
    assert flags("LLaMA-2 70B") == (80, 8192, 64, 32000)
    assert flags("Llama-2-13b-hf") == (40, 5120, 40, 32000)
    assert flags("Qwen3-32B") == (64, 5120, 64, 151936)
    with pytest.raises(ConfigError, match=r"case .*: model.layers not stated, and model.name 'Llama 3.2 3B' is "
                                          r"not a released model the reader knows \(deepseek-v3, .*qwen3 8b\); "
                                          r"state model.layers \(and the shape around it\)"):
        megatron_flags(_case(model={"name": "Llama 3.2 3B", "seq_len": 4096}))
