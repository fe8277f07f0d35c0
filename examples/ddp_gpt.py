"""A plain PyTorch DDP training script: a small GPT built from torch.nn modules, AdamW, a short loop.

Nothing in it knows about HeteroSim. It runs under torchrun on GPUs:

    torchrun --nproc-per-node 8 examples/ddp_gpt.py

and is captured as a 64-GPU job, then replayed, with:

    python -m capture --world-size 64 -o /tmp/ddp_trace examples/ddp_gpt.py
    python -m replay simulate /tmp/ddp_trace --cluster dgx-h100

Parameters: per layer 12 h^2 + 13 h (QKV and output projections, a 4h MLP, two LayerNorms, with
biases); plus the token and position embeddings (V h + s h), the final LayerNorm (2 h) and the
untied output head (V h).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


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
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=8, help="sequences per GPU per iteration")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--bf16", action="store_true", help="autocast the forward to bfloat16")
    a = ap.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    torch.manual_seed(0)
    model = GPT(a.vocab, a.seq, a.hidden, a.heads, a.layers).to(device)
    model = DDP(model, device_ids=[local_rank])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    for _ in range(a.iters):
        idx = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.bf16):
            logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, a.vocab), idx[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
