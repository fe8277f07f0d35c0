"""Megatron-style building blocks in plain PyTorch.

==========================  ===========================================================
module                      what
==========================  ===========================================================
``mappings``                TP / SP communication as autograd functions
``linear``                  column / row parallel linears with async overlapped comm
``embedding``               vocab-parallel embedding
``cross_entropy``           vocab-parallel cross-entropy, unfused and Megatron-core's fused
``norms``                   fused LayerNorm / RMSNorm
``rope``                    rotary position embedding
``context_chunks``          load-balanced CP sequence chunks
``attention``               self-attention (TP heads, GQA, RoPE, CP dispatch)
``unfused_attention``       Megatron 2020-21 core attention: baddbmm, softmax, dropout, bmm
``megatron_ops``            heterosim:: custom ops for Megatron fused kernels (causal softmax)
``fusions``                 Megatron's jit_fuser regions: fused SwiGLU, TE's fused RoPE
``context_parallel``        CP core attention: p2p ring, all-gather, all-to-all
``mlp``                     dense MLP (gelu, squared ReLU, SwiGLU)
``moe``                     mixture of experts over the EP group
``mla``                     DeepSeek's multi-head latent attention
``mamba``                   Mamba-2 mixers of hybrid models (fused conv + SSD scan custom op)
``fp8``                     Transformer Engine's fp8 casts, transposes and amax bookkeeping
``block_scaling``           NVFP4 / MXFP8 quantize custom ops (both copies in one kernel)
``tp_overlap``              TE userbuffer overlap of TP communication with the GEMMs
``recompute``               activation checkpointing tagged "recompute"
==========================  ===========================================================
"""

__all__: list[str] = []
