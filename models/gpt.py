"""Megatron-style GPT / LLaMA for one pipeline chunk (Megatron-core ``models/gpt/gpt_model.py``).

``GPTModel(..., layers=range(a, b), pre_process, post_process)`` holds the embedding (first
stage), decoder layers ``a..b-1`` and the output layer + loss (last stage). Activations between
stages are ``[s/cp (/tp with sequence parallelism), b, h]`` (:meth:`GPTModel.hidden_shape`).

- Token ids ``[b, s]`` arrive whole; the model keeps this CP rank's two load-balanced chunks
  (and the matching positions, RoPE angles and labels).
- Tied embeddings (the default): with pp == 1 the output layer reuses the word-embedding weight;
  with pp > 1 the last stage holds a copy that starts zeroed and is all-reduced over the
  embedding group at construction (Megatron's ``setup_embeddings_and_output_layer``); the
  schedules all-reduce its gradient through :meth:`GPTModel.shared_embedding_params`.
- With ``labels`` the last stage returns the mean per-token loss of this rank's tokens (the loss
  is computed in fp32 from the vocab-split logits, never gathering them; with
  ``cross_entropy_loss_fusion`` in Megatron-core's fused kernels, :mod:`models.layers.cross_entropy`);
  without, the logits.

Example::

    pstate = parallel_state.initialize(pcfg, rank)
    chunks = pstate.stage_layers(mcfg.num_layers)[pstate.pp_rank]
    model = GPTModel(mcfg, pcfg, tcfg, pstate, layers=chunks[0],
                     pre_process=pstate.is_first_stage, post_process=pstate.is_last_stage)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from heterosim.errors import ConfigError
from models.config import ModelConfig, ParallelConfig, TrainConfig
from models.layers.context_chunks import cp_chunk_select
from models.layers.cross_entropy import fused_vocab_parallel_cross_entropy, vocab_parallel_cross_entropy
from models.layers.embedding import VocabParallelEmbedding
from models.layers.linear import ColumnParallelLinear, init_replicated
from models.layers.mappings import scatter_to_sp
from models.layers.mtp import MTPLayer
from models.layers.rope import rotary_freqs
from models.transformer import TransformerBlock, dropout, torch_dtype

__all__ = ["GPTModel"]


class GPTModel(nn.Module):
    """One pipeline chunk of a decoder-only transformer language model."""

    def __init__(self, mcfg: ModelConfig, pcfg: ParallelConfig, tcfg: TrainConfig, pstate: Any, *,
                 layers: range, pre_process: bool, post_process: bool, chunk: int = 0,
                 replicated_seed: int | None = None) -> None:
        super().__init__()
        self.mcfg, self.pcfg, self.tcfg, self.pstate = mcfg, pcfg, tcfg, pstate
        self.pre_process, self.post_process, self.chunk = pre_process, post_process, chunk
        self.layer_range = layers
        dtype = torch_dtype(tcfg.params_dtype)
        self.dtype = dtype
        s, cp, tp = mcfg.seq_length, pstate.cp_size, pstate.tp_size
        if s % (2 * cp if cp > 1 else 1):
            raise ConfigError(f"seq length {s} must be divisible by 2*context-parallel size {2 * cp}")
        if pstate.sequence_parallel and (s // cp) % tp:
            raise ConfigError(f"with sequence parallelism seq length / cp = {s // cp} must be "
                              f"divisible by tensor-parallel size {tp}")
        std = mcfg.init_method_std
        learned = mcfg.position_embedding_type == "learned_absolute"
        self.sp = pstate.sequence_parallel
        if pre_process:
            self.word_embeddings = VocabParallelEmbedding(
                mcfg.vocab_size, mcfg.hidden_size, tp_group=pstate.tp_group, dtype=dtype,
                init_std=std, reduce_scatter=self.sp and not learned)
            if learned:
                max_pos = mcfg.max_position_embeddings or s
                self.position_embeddings = nn.Parameter(torch.empty(max_pos, mcfg.hidden_size, dtype=dtype))
                # Replicated over TP: the same values on every TP rank.
                init_replicated(std, replicated_seed)(self.position_embeddings)
            else:
                self.position_embeddings = None
        self.decoder = TransformerBlock(mcfg, tcfg, pstate, layers=layers, post_process=post_process,
                                        replicated_seed=replicated_seed)
        self.mtp_layers = None
        if post_process and mcfg.mtp_num_layers:
            self._build_mtp(mcfg, tcfg, pstate, replicated_seed)
        if post_process:
            tied = not mcfg.untie_embeddings_and_output_weights
            same = self.word_embeddings.weight if (tied and pre_process) else None
            self.output_layer = ColumnParallelLinear(
                mcfg.hidden_size, mcfg.vocab_size, tp_group=pstate.tp_group,
                sequence_parallel=self.sp, bias=False, dtype=dtype, init_std=std, weight=same,
                async_allreduce=pstate.async_tp_allreduce)
            if tied and not pre_process:
                # Megatron zeroes the last stage's copy; the sum below copies the first stage's.
                with torch.no_grad():
                    self.output_layer.weight.zero_()
        for w in self.shared_embedding_params():
            w.shared_embedding = True
            # First and last stage both join (setup_embeddings_and_output_layer).
            if pstate.embedding_group is not None:
                dist.all_reduce(w.data, group=pstate.embedding_group)

    def _build_mtp(self, mcfg: ModelConfig, tcfg: TrainConfig, pstate: Any, seed: int | None) -> None:
        if not mcfg.untie_embeddings_and_output_weights or pstate.cp_size > 1 or \
                mcfg.position_embedding_type == "learned_absolute":
            raise ConfigError("--mtp-num-layers needs --untie-embeddings-and-output-weights, no learned position "
                              "embeddings and --context-parallel-size 1 (models/layers/mtp.py)")
        if not self.pre_process:  # the last stage's own copy of the word embedding
            self.mtp_embedding = VocabParallelEmbedding(
                mcfg.vocab_size, mcfg.hidden_size, tp_group=pstate.tp_group, dtype=self.dtype,
                init_std=mcfg.init_method_std, reduce_scatter=self.sp)
            with torch.no_grad():  # the all-reduce at the end of __init__ copies the first stage's
                self.mtp_embedding.weight.zero_()
        self.mtp_layers = nn.ModuleList(MTPLayer(mcfg, tcfg, pstate, dtype=self.dtype, replicated_seed=seed)
                                        for _ in range(mcfg.mtp_num_layers))
        self.decoder.keep_prenorm = True

    # ---- shapes and shared parameters -------------------------------------------------------
    def hidden_shape(self, micro_batch_size: int) -> tuple[int, int, int]:
        """Shape of the activation sent between pipeline stages: ``(s/cp[/tp], b, h)``."""
        s = self.mcfg.seq_length // self.pstate.cp_size
        if self.sp:
            s //= self.pstate.tp_size
        return (s, micro_batch_size, self.mcfg.hidden_size)

    def shared_embedding_params(self) -> list[nn.Parameter]:
        """Params whose grads the embedding group all-reduces (pp > 1: tied embeddings, or the first
        stage's word embedding and the last stage's MTP copy)."""
        untied = self.mcfg.untie_embeddings_and_output_weights
        if (untied and not self.mcfg.mtp_num_layers) or self.pstate.pp_size == 1:
            return []
        out = []
        if self.pre_process:
            out.append(self.word_embeddings.weight)
        if self.post_process and not self.mcfg.untie_embeddings_and_output_weights:
            out.append(self.output_layer.weight)
        if self.post_process and self.mtp_layers is not None and not self.pre_process:
            out.append(self.mtp_embedding.weight)  # synced with the first stage's (Megatron-core's MTP)
        return out

    # ---- forward ----------------------------------------------------------------------------
    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        pstate = self.pstate
        ids = cp_chunk_select(ids, 1, pstate.cp_size, pstate.cp_rank)  # [b, s/cp]
        x = self.word_embeddings(ids)  # [s/cp (/tp), b, h]
        if self.position_embeddings is not None:
            pos = torch.arange(self.mcfg.seq_length, device=ids.device)
            pos = cp_chunk_select(pos, 0, pstate.cp_size, pstate.cp_rank)
            x = x + F.embedding(pos, self.position_embeddings).unsqueeze(1)
            if self.sp:
                x = scatter_to_sp(x, pstate.tp_group)
        return dropout(x, self.mcfg.hidden_dropout, self.training)

    def rotary(self, device: torch.device) -> torch.Tensor | None:
        if self.mcfg.position_embedding_type != "rope":
            return None
        return rotary_freqs(self.mcfg.seq_length, self.mcfg.rotary_dim, base=self.mcfg.rotary_base,
                            cp_size=self.pstate.cp_size, cp_rank=self.pstate.cp_rank).to(device)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids ``[b, s]`` (first stage) or hidden states -> hidden states, logits or loss."""
        x = self.embed_input(x)
        return self.head(self.decoder(x, self.rotary(x.device)), labels)

    def embed_input(self, x: torch.Tensor) -> torch.Tensor:
        """The chunk's input as the decoder takes it: token ids embedded on the first stage."""
        if not self.pre_process:
            return x
        if x.dtype not in (torch.int64, torch.int32):
            raise ConfigError(f"the first pipeline stage takes token ids [b, s] (int64), got "
                              f"{tuple(x.shape)} {x.dtype}")
        return self._embed(x)

    def head(self, h: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
        """The decoder's output -> itself (not the last stage), logits, or the loss."""
        if not self.post_process:
            return h
        logits = self.output_layer(h)  # [s/cp, b, V/tp]
        if labels is None:
            return logits.transpose(0, 1).contiguous()
        labels = cp_chunk_select(labels, 1, self.pstate.cp_size, self.pstate.cp_rank)
        loss = self._loss(logits, labels)
        if self.mtp_layers is None:
            return loss
        # Multi-token prediction (models/layers/mtp.py): depth k reads the tokens k ahead of the
        # input (the labels rolled by k - 1) and predicts the labels rolled by k.
        embed = self.word_embeddings if self.pre_process else self.mtp_embedding
        hidden, rotary, ids, extra = self.decoder.prenorm_output, self.rotary(labels.device), labels, []
        self.decoder.prenorm_output = None
        for layer in self.mtp_layers:
            hidden = layer(hidden, embed(ids), rotary)
            ids = torch.roll(ids, -1, dims=1)
            extra.append(self._loss(self.output_layer(hidden), ids))
        return loss + self.mcfg.mtp_loss_scaling_factor * torch.stack(extra).mean()

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of ``logits [s/cp, b, V/tp]`` against ``labels [b, s/cp]``."""
        tp_group = self.pstate.tp_group
        if self.mcfg.cross_entropy_loss_fusion:  # casts the logits to fp32 inside its first kernel
            loss = fused_vocab_parallel_cross_entropy(logits, labels.transpose(0, 1).contiguous(), tp_group)
        else:
            loss = vocab_parallel_cross_entropy(logits.float(), labels.transpose(0, 1).contiguous(), tp_group)
        return loss.mean()  # of the per-token losses [s/cp, b]
