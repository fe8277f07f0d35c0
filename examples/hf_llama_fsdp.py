"""Hugging Face ``LlamaForCausalLM`` built from a config (no weights) trained under FSDP2, plain PyTorch.

    torchrun --nproc-per-node 8 examples/hf_llama_fsdp.py
    python -m capture --world-size 64 -o /tmp/hf_fsdp_trace examples/hf_llama_fsdp.py
    python -m replay simulate /tmp/hf_fsdp_trace --cluster dgx-h100

The model is built on the meta device; ``fully_shard`` wraps each decoder layer and then the root
(embeddings, final norm, head) over a 1-D DeviceMesh, as torchtitan does; ``to_empty`` allocates
each rank's shards on the GPU and the model's own ``init_weights`` fills them (and recomputes the
rotary buffers). Parameters are kept in fp32; FSDP2 all-gathers them in bf16 and reduce-scatters
gradients in fp32 (``MixedPrecisionPolicy``).

Needs ``transformers`` (the ``hf`` extra of pyproject.toml).
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import LlamaConfig, LlamaForCausalLM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=1408)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4, help="sequences per GPU per iteration")
    ap.add_argument("--iters", type=int, default=3)
    a = ap.parse_args()

    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    mesh = init_device_mesh("cuda", (dist.get_world_size(),), mesh_dim_names=("dp_shard",))
    config = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn,
                         num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                         max_position_embeddings=a.seq, attn_implementation="sdpa")
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    model.to_empty(device="cuda")
    model.init_weights()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(a.iters):
        ids = torch.randint(0, a.vocab, (a.batch, a.seq), device="cuda")
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
