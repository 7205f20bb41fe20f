"""Chunked cross-attention (RETRO; §3.1) with RETRO's alignment and a learned null key/value.

Token p attends to the neighbours of chunk g = (p + 1) // M - 1: tokens 64g+63 ... 64g+126 (the last token of chunk g
and the first 63 of chunk g+1) see chunk g's K neighbours (K * 2M keys) plus a learned null key/value; tokens
0 ... M-2 see only the null. No rotary positions here: neighbour states already carry positions from the lower
decoder, and position-free CCA is the same function at training and at generation by construction.

Dimension letters: B batch, R blocks of M query tokens, K neighbours, M chunk length, D width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from rpt.model.layers import Attention


@dataclass
class NeighbourKV:
    """Gated neighbour states for consecutive blocks. Block r (tokens (r*M - 1) ... (r*M + M - 2)) uses row r - first.

    states [B, R, K*2M, D]; mask [B, R, K*2M] (True = real neighbour token); bias [B, R, K*2M] additive logits or None.
    """

    states: torch.Tensor
    mask: torch.Tensor
    bias: torch.Tensor | None
    first_block: int


class ChunkedCrossAttention(nn.Module):
    def __init__(self, dim: int, n_heads: int, chunk_size: int, dropout: float) -> None:
        super().__init__()
        self.M = chunk_size
        self.attn = Attention(dim, n_heads, dropout)
        self.null_k = nn.Parameter(torch.randn(dim) * 0.02)
        self.null_v = nn.Parameter(torch.randn(dim) * 0.02)

    def forward(self, x: torch.Tensor, nkv: NeighbourKV, start: int) -> torch.Tensor:
        """x [B, n, D] holds tokens start ... start+n-1 -> [B, n, D]."""
        B, n, D = x.shape
        M = self.M
        front = (start + 1) % M  # rows before `start` inside its block
        r0 = (start + 1) // M
        R = (front + n + M - 1) // M
        xb = F.pad(x, (0, 0, front, R * M - front - n)).view(B * R, M, D)  # [B*R, M, D]
        lo = r0 - nkv.first_block
        kv = nkv.states[:, lo : lo + R]
        assert kv.shape[1] == R, f"neighbour rows for blocks {r0}..{r0 + R - 1} missing"
        kv = kv.reshape(B * R, -1, D)
        mask = nkv.mask[:, lo : lo + R].reshape(B * R, 1, 1, -1)
        if nkv.bias is not None:
            bias = nkv.bias[:, lo : lo + R].reshape(B * R, 1, 1, -1).to(x.dtype)
            mask = torch.where(mask, bias, torch.full_like(bias, float("-inf")))
        y = self.attn(xb, context=kv, mask=mask, kv_extra=(self.null_k, self.null_v))
        return y.view(B, R * M, D)[:, front : front + n]
