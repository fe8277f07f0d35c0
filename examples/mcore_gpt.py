"""megatron-core's GPTModel trained the way megatron-core's own examples train it, plain PyPI package.

Written after megatron-core's ``examples/run_simple_mcore_train_loop.py`` and Megatron-LM's
``training.py``: ``parallel_state.initialize_model_parallel``, ``GPTModel`` with the local
(non-Transformer-Engine) layer spec ``get_gpt_layer_local_spec``, megatron-core's
``DistributedDataParallel`` and optimizer (``get_megatron_optimizer``), and the pipeline schedule
of ``get_forward_backward_func``. Nothing in it knows about HeteroSim. On GPUs:

    torchrun --nproc-per-node 8 examples/mcore_gpt.py --tensor-model-parallel-size 2

and captured as a 64-GPU job, then replayed, with:

    python -m capture --world-size 64 -o /tmp/mcore_trace examples/mcore_gpt.py \\
        --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel
    python -m replay simulate /tmp/mcore_trace --cluster dgx-h100

Flags are Megatron-LM's names. The data are random token ids (a real run would read a
``GPTDataset``); ``--bf16`` builds the model in bf16 with fp32 master weights in the optimizer and
fp32 gradient reduction, as Megatron-LM does by default. Needs ``megatron-core`` (the ``mcore``
extra of pyproject.toml).

Context parallelism: the local spec's ``DotProductAttention`` asserts ``context_parallel_size ==
1`` ("Context parallelism is only supported by TEDotProductAttention!"), so ``--context-parallel-size``
needs the Transformer Engine spec, a CUDA extension. Experts (``--num-experts``,
``--expert-model-parallel-size``) run on GPUs; a capture stops where megatron-core reads the
tokens per expert back to the host (``tokens_per_expert.tolist()``), integers fake tensors lack.
"""

import argparse
import os
from functools import partial

import torch
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.distributed.finalize_model_grads import finalize_model_grads
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer.moe import moe_utils
from megatron.core.transformer.module import Float16Module
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
from megatron.core.transformer.transformer_config import TransformerConfig


# megatron-core 0.16.1 reads moe_utils.te_general_gemm without Transformer Engine (a NameError in
# the MoE router); its fallback GEMM runs when it is None.
if not hasattr(moe_utils, "te_general_gemm"):
    moe_utils.te_general_gemm = None


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-layers", type=int, default=4)
    ap.add_argument("--hidden-size", type=int, default=512)
    ap.add_argument("--num-attention-heads", type=int, default=8)
    ap.add_argument("--ffn-hidden-size", type=int, default=None, help="default 4 x hidden")
    ap.add_argument("--seq-length", type=int, default=512)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--micro-batch-size", type=int, default=1)
    ap.add_argument("--global-batch-size", type=int, default=None, help="default micro-batch x dp")
    ap.add_argument("--train-iters", type=int, default=3)
    ap.add_argument("--tensor-model-parallel-size", type=int, default=1)
    ap.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    ap.add_argument("--context-parallel-size", type=int, default=1)
    ap.add_argument("--expert-model-parallel-size", type=int, default=1)
    ap.add_argument("--num-experts", type=int, default=None)
    ap.add_argument("--moe-router-topk", type=int, default=2)
    ap.add_argument("--moe-expert-capacity-factor", type=float, default=None)
    ap.add_argument("--moe-pad-expert-input-to-capacity", action="store_true")
    ap.add_argument("--sequence-parallel", action="store_true")
    ap.add_argument("--use-distributed-optimizer", action="store_true")
    ap.add_argument("--overlap-grad-reduce", action="store_true")
    ap.add_argument("--overlap-param-gather", action="store_true")
    ap.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    ap.add_argument("--hidden-dropout", type=float, default=0.0)
    ap.add_argument("--attention-dropout", type=float, default=0.0)
    ap.add_argument("--bf16", action="store_true")
    # Megatron-LM's fusions, on by default as there (fused CUDA kernels and torch.compile).
    ap.add_argument("--no-masked-softmax-fusion", action="store_true")
    ap.add_argument("--no-bias-gelu-fusion", action="store_true")
    ap.add_argument("--no-bias-dropout-fusion", action="store_true")
    ap.add_argument("--no-gradient-accumulation-fusion", action="store_true")
    return ap.parse_args()


class SequenceParallelLayerNorm(torch.nn.LayerNorm):
    """``torch.nn.LayerNorm`` whose parameters are tagged ``sequence_parallel``, as apex's
    ``FusedLayerNorm`` (the local spec's norm where apex is installed) tags them: megatron-core's
    ``finalize_model_grads`` then all-reduces their gradients over the tensor-parallel group.
    Without apex the local spec falls back to ``WrappedTorchNorm``, which refuses sequence
    parallelism because it does not tag them."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **_: object) -> None:
        super().__init__(hidden_size, eps=eps)
        for p in self.parameters():
            p.sequence_parallel = config.sequence_parallel


def layer_spec(a: argparse.Namespace, config: TransformerConfig):
    """The local (non-Transformer-Engine) spec; with sequence parallelism, its norms tagged."""
    spec = get_gpt_layer_local_spec(num_experts=a.num_experts)
    if not a.sequence_parallel:
        return spec
    spec.submodules.input_layernorm = spec.submodules.pre_mlp_layernorm = SequenceParallelLayerNorm
    return TransformerBlockSubmodules(layer_specs=[spec] * get_num_layers_to_build(config),
                                      layer_norm=SequenceParallelLayerNorm)


def build_model(a: argparse.Namespace) -> tuple[DistributedDataParallel, TransformerConfig]:
    dtype = torch.bfloat16 if a.bf16 else torch.float32
    config = TransformerConfig(
        num_layers=a.num_layers, hidden_size=a.hidden_size, num_attention_heads=a.num_attention_heads,
        ffn_hidden_size=a.ffn_hidden_size, hidden_dropout=a.hidden_dropout, attention_dropout=a.attention_dropout,
        tensor_model_parallel_size=a.tensor_model_parallel_size,
        pipeline_model_parallel_size=a.pipeline_model_parallel_size,
        context_parallel_size=a.context_parallel_size, expert_model_parallel_size=a.expert_model_parallel_size,
        num_moe_experts=a.num_experts, moe_router_topk=a.moe_router_topk,
        moe_expert_capacity_factor=a.moe_expert_capacity_factor,
        moe_pad_expert_input_to_capacity=a.moe_pad_expert_input_to_capacity,
        moe_token_dispatcher_type="alltoall" if a.num_experts else "allgather",
        sequence_parallel=a.sequence_parallel, bf16=a.bf16, params_dtype=dtype, pipeline_dtype=dtype,
        masked_softmax_fusion=not a.no_masked_softmax_fusion, bias_activation_fusion=not a.no_bias_gelu_fusion,
        bias_dropout_fusion=not a.no_bias_dropout_fusion,
        gradient_accumulation_fusion=not a.no_gradient_accumulation_fusion,
    )
    model = GPTModel(
        config=config, transformer_layer_spec=layer_spec(a, config),
        vocab_size=a.vocab_size, max_sequence_length=a.seq_length,
        share_embeddings_and_output_weights=not a.untie_embeddings_and_output_weights,
        pre_process=parallel_state.is_pipeline_first_stage(), post_process=parallel_state.is_pipeline_last_stage(),
    )
    model.cuda(torch.cuda.current_device())
    if a.bf16:  # as Megatron-LM's get_model: the rest of the model (position embeddings) in bf16 too
        model = Float16Module(config, model)
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=a.bf16, overlap_grad_reduce=a.overlap_grad_reduce,
        overlap_param_gather=a.overlap_param_gather, use_distributed_optimizer=a.use_distributed_optimizer)
    return DistributedDataParallel(config=config, ddp_config=ddp_config, module=model), config


def forward_step(a: argparse.Namespace, data_iterator, model):
    """One micro-batch: random token ids and next-token labels, the model's per-token loss."""
    b, s = a.micro_batch_size, a.seq_length
    tokens = torch.randint(0, a.vocab_size, (b, s), device="cuda")
    labels = torch.randint(0, a.vocab_size, (b, s), device="cuda")
    position_ids = torch.arange(s, device="cuda").unsqueeze(0).expand(b, s)
    loss_mask = torch.ones(b, s, device="cuda")
    output = model(tokens, position_ids, None, labels=labels)

    def loss_func(output_tensor: torch.Tensor):
        losses = output_tensor.float().view(-1)
        loss = torch.sum(losses * loss_mask.view(-1)) / loss_mask.sum()
        return loss, {"lm loss": loss}

    return output, loss_func


def main() -> None:
    a = parse_args()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.distributed.init_process_group(backend="nccl")
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=a.tensor_model_parallel_size,
        pipeline_model_parallel_size=a.pipeline_model_parallel_size,
        context_parallel_size=a.context_parallel_size, expert_model_parallel_size=a.expert_model_parallel_size)
    model_parallel_cuda_manual_seed(123)

    model, config = build_model(a)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=3e-4, weight_decay=0.1, bf16=a.bf16, params_dtype=config.params_dtype,
                        use_distributed_optimizer=a.use_distributed_optimizer, clip_grad=1.0),
        [model])
    # As Megatron-LM's training.py wires them: the schedule calls these hooks.
    config.finalize_model_grads_func = finalize_model_grads
    if a.overlap_grad_reduce:
        config.no_sync_func = model.no_sync
        config.grad_sync_func = model.start_grad_sync
    if a.overlap_param_gather:
        config.param_sync_func = model.start_param_sync

    dp = parallel_state.get_data_parallel_world_size()
    gbs = a.global_batch_size or a.micro_batch_size * dp
    num_microbatches = gbs // (a.micro_batch_size * dp)
    forward_backward = get_forward_backward_func()
    for _ in range(a.train_iters):
        model.zero_grad_buffer()
        optimizer.zero_grad()
        forward_backward(
            forward_step_func=partial(forward_step, a), data_iterator=None, model=model,
            num_microbatches=num_microbatches, seq_length=a.seq_length, micro_batch_size=a.micro_batch_size,
            forward_only=False)
        optimizer.step()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
