"""The retriever (§3.1 "Retriever"): chunk encoding, query/key projections, scores over retrievable chunks, top-K.

Dimension letters: B batch, C chunks, M chunk length, K neighbours, D width.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from rpt.chunks import retrievable_mask
from rpt.model.layers import Attention, RMSNorm, autocast_off, rotary_cos_sin


class ChunkEncoder(nn.Module):
    """One bidirectional attention layer over the M lower-decoder states of each chunk (pre-norm, residual).

    Its output is both the input to the retrieval projections (mean-pooled) and the token states a chunk contributes
    when it is retrieved as a neighbour. It only ever sees its own chunk, so it is causal at chunk granularity.
    """

    def __init__(self, dim: int, n_heads: int, chunk_size: int, rope_base: float, eps: float, dropout: float) -> None:
        super().__init__()
        self.norm = RMSNorm(dim, eps)
        self.attn = Attention(dim, n_heads, dropout)
        self.register_buffer("_pos", torch.arange(chunk_size), persistent=False)
        self.rope_base = rope_base

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h [..., M, D] -> [..., M, D]."""
        lead, (M, D) = h.shape[:-2], h.shape[-2:]
        x = h.reshape(-1, M, D)
        rot = rotary_cos_sin(self._pos[:M], self.attn.head_dim, self.rope_base)
        x = x + self.attn(self.norm(x), rotary=rot)
        return x.reshape(*lead, M, D)


class Retriever(nn.Module):
    """Query-based score s_q(c) = <W_Q c_q, W_K c> / sqrt(D) over mean-pooled chunk encodings (§3.1).

    Each projection is RMSNorm + Linear, as in the authors' code, with one change: the key projection has no bias.
    A key bias adds the same q.b to every key of a query, so it can change no ranking and no loss term; its gradient
    is exactly zero, and Adam turns the float noise in that zero into learning-rate-sized random steps.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.q_norm, self.k_norm = RMSNorm(dim, eps), RMSNorm(dim, eps)
        self.q_proj, self.k_proj = nn.Linear(dim, dim), nn.Linear(dim, dim, bias=False)
        self.scale = 1.0 / math.sqrt(dim)

    def queries(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.q_proj(self.q_norm(pooled)) * self.scale  # the 1/sqrt(D) lives on the query side

    def keys(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.k_proj(self.k_norm(pooled))

    def scores(self, pooled: torch.Tensor, chunk_size: int, segment_len: int) -> torch.Tensor:
        """pooled [B, C, D] -> scores [B, C, C] (fp32), -inf where chunk j is not retrievable for query chunk i."""
        q, k = self.queries(pooled).float(), self.keys(pooled).float()
        with autocast_off(q.device.type):  # under autocast the matmul would round q and k back to bf16
            s = q @ k.transpose(1, 2)  # [B, C, C]
        mask = retrievable_mask(pooled.shape[1], chunk_size, segment_len, device=pooled.device)
        return s.masked_fill(~mask, float("-inf"))


def top_k(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """scores [..., N] with -inf for excluded entries -> ids, values [..., k]; id -1 where fewer than k are allowed."""
    k_eff = min(k, scores.shape[-1])
    vals, ids = scores.topk(k_eff, dim=-1)
    ids = ids.masked_fill(torch.isinf(vals) & (vals < 0), -1)
    if k_eff < k:
        pad = (0, k - k_eff)
        ids = torch.nn.functional.pad(ids, pad, value=-1)
        vals = torch.nn.functional.pad(vals, pad, value=float("-inf"))
    return ids, vals
