"""A plain DeepSpeed ZeRO training script: a small GPT of torch.nn modules, bf16, ZeRO stage 1, 2 or 3.

It follows DeepSpeed's getting-started pattern (``deepspeed.initialize(model=..., config=...)``,
``engine.backward(loss)``, ``engine.step()``) and knows nothing of HeteroSim. On GPUs:

    deepspeed --num_gpus 8 examples/deepspeed_gpt.py --stage 2

and captured as a 64-GPU job, then replayed, with:

    python -m capture --world-size 64 -o /tmp/ds_trace examples/deepspeed_gpt.py --stage 2
    python -m replay simulate /tmp/ds_trace --cluster dgx-h100

The optimizer is DeepSpeed's ``AdamW`` with ``"torch_adam": true``: ``torch.optim.AdamW`` (its
multi-tensor path), which runs without DeepSpeed's compiled ops (FusedAdam is JIT-built with CUDA;
``pip install deepspeed`` on Linux pre-builds no ops, ``DS_BUILD_OPS=0``). ``--fp32-comm`` sets
``"communication_data_type": "fp32"`` (older DeepSpeed's ``"fp32_allreduce": true``): gradients
are reduced in fp32, twice the bytes of bf16. ``--ds-config FILE`` merges a config JSON over the
built-in one.

Parameters: per layer 12 h^2 + 13 h (QKV and output projections, a 4h MLP, two LayerNorms, with
biases); plus the token and position embeddings (V h + s h), the final LayerNorm (2 h) and the
untied output head (V h).
"""

import argparse
import json

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, heads, s, h / heads)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, seq: int, hidden: int, heads: int, layers: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def ds_config(stage: int, batch: int, hidden: int, fp32_comm: bool) -> dict:
    """The DeepSpeed config (what a ``ds_config.json`` would hold)."""
    config = {
        "train_micro_batch_size_per_gpu": batch,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage},
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1, "torch_adam": True}},
        "steps_per_print": 10**9,
    }
    if stage == 3:
        # Sized for the model, as Hugging Face's DeepSpeed integration sizes them ("auto"), and
        # parameters released after each use (reuse distance 0), as in a model of billions of
        # parameters: DeepSpeed's defaults (1e9 elements live, 5e7 prefetched) keep all of a small
        # model's parameters gathered from forward into backward.
        config["zero_optimization"].update({
            "reduce_bucket_size": hidden * hidden,
            "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
            "stage3_param_persistence_threshold": 10 * hidden,
            "stage3_max_reuse_distance": 0,
        })
    if fp32_comm:
        config["communication_data_type"] = "fp32"
    return config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage", type=int, default=2, choices=(1, 2, 3), help="ZeRO stage")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=8, help="sequences per GPU per iteration")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--fp32-comm", action="store_true", help="reduce gradients in fp32")
    ap.add_argument("--ds-config", help="a DeepSpeed config JSON whose keys replace the built-in ones "
                    "(zero_optimization key by key)")
    ap.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    a = ap.parse_args()

    config = ds_config(a.stage, a.batch, a.hidden, a.fp32_comm)
    if a.ds_config:
        with open(a.ds_config) as f:
            extra = json.load(f)
        config["zero_optimization"].update(extra.pop("zero_optimization", {}))
        config.update(extra)
    deepspeed.init_distributed()
    torch.manual_seed(0)
    model = GPT(a.vocab, a.seq, a.hidden, a.heads, a.layers)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    for _ in range(a.iters):
        idx = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=engine.device)
        logits = engine(idx[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, a.vocab), idx[:, 1:].reshape(-1))
        engine.backward(loss)
        engine.step()


if __name__ == "__main__":
    main()
