"""A case whose source names torchtitan runs torchtitan's own trainer (heterosim/validation/titan.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from heterosim.errors import ConfigError
from heterosim.validation.cases import Case
from heterosim.validation.titan import CONFIG, asset_args, names_torchtitan, titan_inputs, write_assets

SOURCE = {"title": "pytorch/torchtitan docs/performance.md, Table 1",
          "url": "https://github.com/pytorch/torchtitan/blob/eaea6f6/docs/performance.md"}
HARDWARE = {"gpu": "NVIDIA H100 96GB HBM2e (SXM, 500 W power limit)", "gpus_per_node": 8,
            "hbm_bandwidth_TBps": 2.4, "intra_node": "NVLink, 8 GPUs fully connected",
            "inter_node": "backend RDMA network, 400 Gb/s per GPU"}


def _case(**kw) -> Case:
    base = dict(id="e2e-titan", category="end_to_end", source=SOURCE, hardware=HARDWARE,
                model={"name": "Llama 3.1 8B", "seq_len": 8192}, parallelism={"fsdp": 8, "dp": 8},
                batch={"micro": 2, "global": 16}, precision="bf16", measured={"tokens_per_s_per_gpu": 5762})
    base.update(kw)
    return Case(**base)


def _arg(flags, name):
    f = list(flags)
    return f[f.index(name) + 1]


def test_the_source_names_torchtitan():
    assert names_torchtitan(_case())
    assert names_torchtitan(_case(source={"title": "a blog", "software": "TorchTitan 0.2"}))
    assert not names_torchtitan(_case(source={"title": "NVIDIA/dgxc-benchmarking", "url": "https://github.com/NVIDIA"}))


def test_fsdp_on_one_node_reads_as_torchtitans_command_line():
    """Llama 3.1 8B, FSDP 8, local batch 2, global 16 (torchtitan's Table 1): the flavor, batch and
    degrees on torchtitan's command line, the config's selective 'op' checkpointing said so."""
    ci = titan_inputs(_case())
    assert ci.module == "torchtitan.train" and ci.world_size == 8
    assert ci.global_batch == 16 and ci.seq_len == 8192
    assert list(ci.flags) == [
        "--job.config_file", str(CONFIG), "--model.flavor", "8B", "--training.seq_len", "8192",
        "--training.local_batch_size", "2", "--training.global_batch_size", "16",
        "--parallelism.data_parallel_shard_degree", "8", "--parallelism.data_parallel_replicate_degree", "1",
        "--parallelism.tensor_parallel_degree", "1", "--parallelism.pipeline_parallel_degree", "1",
        "--parallelism.context_parallel_degree", "1"]
    assert ci.assumptions[:2] == (
        "torchtitan named by the source: torchtitan's own trainer captured (torchtitan 0.2.2, torchtitan_llama3.toml)",
        "model: torchtitan's Llama 3 8B (torchtitan 0.2.2 models/llama3: 32 layers, hidden 4096, 32 heads, "
        "8 KV heads, vocabulary 128,256)")
    assert "activation checkpointing not stated: selective, option op (torchtitan's Llama 3 configs)" in ci.assumptions
    assert ci.cluster["node_groups"][0]["gpu"] == "H100-SXM5-96GB@500W"


def test_degrees_schedule_and_checkpointing():
    """70B on 256 GPUs as FSDP 32 x TP 8 with full checkpointing; 405B FSDP 8 x TP 8 x PP 8 with
    an interleaved schedule; FSDP 4 of 16 data-parallel ranks is HSDP (4 replicas)."""
    ci = titan_inputs(_case(model={"name": "Llama 3.1 70B", "seq_len": 8192},
                            parallelism={"fsdp": 32, "tp": 8, "recompute": "full"},
                            batch={"micro": 16, "global": 512}))
    assert ci.world_size == 256
    assert (_arg(ci.flags, "--parallelism.data_parallel_shard_degree"),
            _arg(ci.flags, "--parallelism.tensor_parallel_degree"),
            _arg(ci.flags, "--activation_checkpoint.mode")) == ("32", "8", "full")
    ci = titan_inputs(_case(model={"name": "Meta Llama 3.1 405B", "seq_len": 8192},
                            parallelism={"fsdp": 8, "tp": 8, "pp": 8, "pipeline_schedule": "Interleaved 1F1B"},
                            batch={"micro": 32, "global": 256}))
    assert ci.world_size == 512 and _arg(ci.flags, "--parallelism.pipeline_parallel_schedule") == "Interleaved1F1B"
    ci = titan_inputs(_case(parallelism={"fsdp": 8, "tp": 1, "pp": 2}))
    assert _arg(ci.flags, "--parallelism.pipeline_parallel_schedule") == "1F1B"
    assert "pipeline schedule not stated: 1F1B (torchtitan's default)" in ci.assumptions
    ci = titan_inputs(_case(parallelism={"fsdp": 4, "dp": 16}, batch={"micro": 1, "global": 16}))
    assert (_arg(ci.flags, "--parallelism.data_parallel_shard_degree"),
            _arg(ci.flags, "--parallelism.data_parallel_replicate_degree")) == ("4", "4")
    assert "data parallelism 16: FSDP over 4, replicated 4 times (HSDP)" in ci.assumptions
    ci = titan_inputs(_case(parallelism={"dp": 8}, batch={"micro": 2}))
    assert ci.global_batch == 16
    assert "FSDP not stated: torchtitan's default, parameters sharded over all 8 data-parallel ranks" in ci.assumptions
    assert "global batch not stated: local 2 x 8 data-parallel ranks = 16" in ci.assumptions


def test_compile_and_async_tp_where_named_and_not_negated():
    assert "--compile.enable" in titan_inputs(_case(precision="bf16, torch.compile")).flags
    assert "--compile.enable" in titan_inputs(_case(notes="FSDP + torch.compile")).flags
    assert "--compile.enable" not in titan_inputs(_case(notes="eager: no torch.compile")).flags
    assert "--compile.enable" not in titan_inputs(_case(notes="run without torch.compile")).flags
    ci = titan_inputs(_case(model={"name": "Llama 3.1 70B", "seq_len": 8192},
                            parallelism={"fsdp": 32, "tp": 8}, batch={"micro": 16, "global": 512},
                            precision="bf16 + torch.compile + AsyncTP"))
    assert "--parallelism.enable_async_tensor_parallel" in ci.flags and "--compile.enable" in ci.flags


def test_float8_is_torchaos_float8_linear():
    ci = titan_inputs(_case(precision="FSDP + torch.compile + Float8"))
    assert list(ci.flags)[-5:] == ["--model.converters", "quantize.linear.float8",
                                   "--quantize.linear.float8.recipe_name", "tensorwise", "--compile.enable"]
    ci = titan_inputs(_case(precision="Float8 (rowwise)"))
    assert _arg(ci.flags, "--quantize.linear.float8.recipe_name") == "rowwise"
    for precision in ("fp8 (delayed scaling)", "fp16", "FP8-SC"):
        with pytest.raises(ConfigError, match="torchtitan runs of it are not supported; bf16 and Float8"):
            titan_inputs(_case(precision=precision))


@pytest.mark.parametrize("kw,message", [
    ({"model": {"name": "Llama 3.1 13B", "seq_len": 8192}},
     "case e2e-titan: torchtitan runs of 'Llama 3.1 13B' are not supported; torchtitan's Llama 3 flavors "
     "8B, 70B, 405B are (name one in model.name)"),
    ({"model": {"name": "Qwen3 8B", "seq_len": 8192}}, "torchtitan runs of 'Qwen3 8B' are not supported"),
    ({"model": {"name": "Llama 3.1 8B", "seq_len": 8192, "layers": 40}},
     "case e2e-titan: model.layers 40 is not torchtitan's Llama 3 8B (32); fix the field or the model name"),
    ({"model": {"name": "Llama 3.1 8B"}},
     "case e2e-titan: model.seq_len not stated; torchtitan's configs differ by model, give it"),
    ({"parallelism": {"fsdp": 3, "dp": 8}},
     "case e2e-titan: parallelism.dp 8 is not a multiple of the FSDP group 3"),
    ({"batch": {"micro": 2, "global": 20}},
     "case e2e-titan: batch.global 20 is not a multiple of local batch 2 x data-parallel 8"),
])
def test_what_cannot_be_read_is_one_error(kw, message):
    with pytest.raises(ConfigError) as e:
        titan_inputs(_case(**kw))
    assert message in str(e.value)


def test_assets_are_written_once_and_the_same_everywhere(tmp_path):
    a, b = write_assets(tmp_path / "a"), write_assets(tmp_path / "b")

    def digest(root: Path) -> str:
        return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())).hexdigest()

    assert digest(a) == digest(b)
    vocab = json.loads((a / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) == 2048 and vocab["<|begin_of_text|>"] == 0 and vocab["w2044"] == 2047
    docs = (a / "c4_test" / "train.json").read_text().splitlines()
    assert len(docs) == 64 and all(len(json.loads(d)["text"].split()) == 600 for d in docs)
    before = (a / "c4_test" / "train.json").stat().st_mtime_ns
    write_assets(a)
    assert (a / "c4_test" / "train.json").stat().st_mtime_ns == before
    assert sorted(p.name for p in a.iterdir()) == ["c4_test", "tokenizer"]
    assert asset_args(a) == ["--model.hf_assets_path", str(a / "tokenizer"), "--training.dataset_path",
                             str(a / "c4_test"), "--job.dump_folder", str(a / "out")]


def test_a_torchtitan_row_is_captured_and_replayed(tmp_path):
    """The 8B row at a short sequence through ``replay validate`` (a fresh process: importing
    torchtitan here would bind its command-line default to pytest's arguments): its measured
    TPS/GPU read as global batch x seq / (TPS x GPUs) = 16 x 1024 / (6000 x 8) = 0.34133 s."""
    import importlib.util
    import subprocess
    import sys

    import yaml

    if importlib.util.find_spec("torchtitan") is None:
        pytest.skip("torchtitan is not installed (the titan extra)")
    row = {"id": "e2e-titan", "category": "end_to_end", "source": SOURCE, "hardware": HARDWARE,
           "model": {"name": "Llama 3.1 8B", "seq_len": 1024}, "parallelism": {"fsdp": 8, "dp": 8},
           "batch": {"micro": 2, "global": 16}, "precision": "bf16", "measured": {"tokens_per_s_per_gpu": 6000}}
    (tmp_path / "cases.yaml").write_text(yaml.safe_dump({"schema_version": 1, "cases": [row]}))
    p = subprocess.run([sys.executable, "-m", "replay", "validate", str(tmp_path / "cases.yaml"), "--json",
                        "--cache-dir", str(tmp_path / "cache")], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[1])
    assert p.returncode == 0, p.stderr[-2000:]
    (case,) = json.loads(p.stdout)["cases"]
    assert case["status"] == "ok", case.get("message")
    (t,) = [c for c in case["comparisons"] if c["metric"] == "iteration_time_s"]
    assert t["measured"] == pytest.approx(16 * 1024 / (6000 * 8), rel=1e-12)
    assert 0 < t["predicted"] < 10
    assert case["detail"]["flags"][:4] == ["--job.config_file", str(CONFIG), "--model.flavor", "8B"]
    assert list((tmp_path / "cache").glob("*.log"))  # torchtitan's own log, kept beside the trace
    assert "[titan]" not in p.stdout + p.stderr  # ... and not on the terminal


def test_the_cache_key_follows_the_config_files_content(tmp_path):
    """A trace captured from a config file is captured again when the file changes (same path, same
    flags); flags naming no file keep the key they had."""
    from heterosim.validation.validate import cached_key

    cfg = tmp_path / "run.toml"
    cfg.write_text("[training]\nsteps = 2\n")
    a = cached_key(["--job.config_file", str(cfg)], 8, module="torchtitan.train")
    assert cached_key(["--job.config_file", str(cfg)], 8, module="torchtitan.train") == a
    cfg.write_text("[training]\nsteps = 3\n")
    assert cached_key(["--job.config_file", str(cfg)], 8, module="torchtitan.train") != a
    assert cached_key(["--num-layers", "2"], 8) == cached_key(["--num-layers", "2"], 8)
