"""Neighbour assembly (chunk + continuation), query augmentation and neighbour gating (§3.1).

Dimension letters: B batch, Q query chunks, K neighbours per query chunk, M chunk length, D width, P cached items.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from rpt.model.layers import Attention, RMSNorm, rotary_cos_sin


def gather_neighbors(states: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """states [B, N, M, D] chunk token states; ids [B, Q, K] (-1 = empty) -> [B, Q, K, 2M, D].

    A neighbour is chunk j followed by its continuation j + 1 (§3.1); empty slots gather chunk 0 and are masked later.
    """
    B, N, M, D = states.shape
    flat = states.reshape(B * N, M, D)
    base = (torch.arange(B, device=ids.device) * N).view(B, 1, 1)
    j = ids.clamp(min=0)
    first = flat[base + j]  # [B, Q, K, M, D]
    cont = flat[base + (j + 1).clamp(max=N - 1)]
    return torch.cat([first, cont], dim=3)


class QueryAugmentation(nn.Module):
    """Neighbour tokens attend bidirectionally to each other, then cross-attend to the query chunk's
    lower-decoder states (the paper's footnote to §3.1; RETRO conditions its encoder on the query chunk likewise)."""

    def __init__(self, dim: int, n_heads: int, rope_base: float, eps: float, dropout: float) -> None:
        super().__init__()
        self.self_norm, self.cross_norm, self.ctx_norm = RMSNorm(dim, eps), RMSNorm(dim, eps), RMSNorm(dim, eps)
        self.self_attn = Attention(dim, n_heads, dropout)
        self.cross_attn = Attention(dim, n_heads, dropout)
        self.rope_base = rope_base

    def forward(self, nb: torch.Tensor, query_states: torch.Tensor) -> torch.Tensor:
        """nb [B, Q, K, 2M, D]; query_states [B, Q, M, D] -> [B, Q, K, 2M, D]."""
        B, Q, K, L, D = nb.shape
        M = query_states.shape[2]
        x = nb.reshape(B * Q * K, L, D)
        rot = rotary_cos_sin(torch.arange(L, device=nb.device), self.self_attn.head_dim, self.rope_base)
        x = x + self.self_attn(self.self_norm(x), rotary=rot)
        ctx = self.ctx_norm(query_states).unsqueeze(2).expand(B, Q, K, M, D).reshape(B * Q * K, M, D)
        x = x + self.cross_attn(self.cross_norm(x), context=ctx)
        return x.view(B, Q, K, L, D)


@dataclass
class GateCache:
    """Pooled neighbour vectors of the chunks still inside the gating window (current and previous segment)."""

    pooled: torch.Tensor | None = None  # [B, P, D]
    chunk: torch.Tensor | None = None  # [P] query-chunk index of each item
    rank: torch.Tensor | None = None  # [P]
    valid: torch.Tensor | None = None  # [B, P]
    host_chunk: list[int] = field(default_factory=list)  # `chunk` on the host: the window is cut without a device sync


class NeighborGate(nn.Module):
    """Neighbour gating (§3.1): mean-pool each neighbour, causal attention over neighbours ordered by (chunk, rank),
    then a gate per neighbour.

    gate = "paper":    g = max(eta, sigmoid(w . c / D))        (default; eta = 0.1), with the gradient of the sigmoid
                       passed through the clamp: a gate under eta still learns, so it can come back
           "clamp":    the same forward, the clamp's own gradient (zero below eta: a gate that falls under eta never
                       returns; kept to measure against)
           "official": g = 0.1 + 0.9 sigmoid(w . c / D)       (the authors' code)
           "bias":     no scaling; w . c / D is added to the CCA attention logits of that neighbour's keys
           "none":     no gating (ablation)
    Our decision (the paper leaves it open; docs/design.md#neighbour-gating): the causal attention is windowed like
    the trunk — neighbours of a chunk in segment s see neighbours of chunks in segments s-1 and s — so that
    segment-by-segment inference needs only a bounded cache and computes the same function as training.
    """

    def __init__(self, dim: int, n_heads: int, kind: str, eta: float, chunks_per_segment: int, eps: float,
                 dropout: float) -> None:
        super().__init__()
        self.kind, self.eta, self.cps, self.dim = kind, eta, chunks_per_segment, dim
        self.norm = RMSNorm(dim, eps)
        self.attn = Attention(dim, n_heads, dropout)
        self.w = nn.Parameter(torch.zeros(dim))

    def forward(self, nb: torch.Tensor, valid: torch.Tensor, chunk_idx: torch.Tensor,
                cache: GateCache | None = None, chunk_ids: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """nb [B, Q, K, 2M, D]; valid [B, Q, K]; chunk_idx [Q] (absolute). Returns (gate [B, Q, K], logit [B, Q, K]).

        With `cache`, earlier items take part as keys and the cache is updated in place; chunk_ids: chunk_idx as
        Python ints, ascending (read from chunk_idx when not given), to cut the cache's window on the host.
        """
        B, Q, K = valid.shape
        pooled = nb.mean(dim=3).reshape(B, Q * K, -1)  # [B, QK, D]
        q_chunk = chunk_idx.repeat_interleave(K)  # [QK]
        q_rank = torch.arange(K, device=nb.device).repeat(Q)
        q_valid = valid.reshape(B, Q * K)
        if cache is not None and cache.pooled is not None:
            k_pooled = torch.cat([cache.pooled, pooled], 1)
            k_chunk, k_rank = torch.cat([cache.chunk, q_chunk]), torch.cat([cache.rank, q_rank])
            k_valid = torch.cat([cache.valid, q_valid], 1)
        else:
            k_pooled, k_chunk, k_rank, k_valid = pooled, q_chunk, q_rank, q_valid
        same_chunk = k_chunk[None, :] == q_chunk[:, None]
        before = (k_chunk[None, :] < q_chunk[:, None]) | (same_chunk & (k_rank[None, :] <= q_rank[:, None]))
        in_window = (k_chunk[None, :] // self.cps) >= (q_chunk[:, None] // self.cps - 1)
        is_self = same_chunk & (k_rank[None, :] == q_rank[:, None])
        mask = before & in_window & (k_valid[:, None, :] | is_self[None])  # [B, QK, P+QK]; self keeps rows non-empty
        x = pooled + self.attn(self.norm(pooled), context=self.norm(k_pooled), mask=mask[:, None])
        logit = (x.float() @ self.w.float()) / self.dim  # [B, QK]
        if cache is not None:  # items are in chunk order: the window's items are a suffix
            ids = chunk_idx.tolist() if chunk_ids is None else list(chunk_ids)
            host = cache.host_chunk + [c for c in ids for _ in range(K)]
            first = max(ids) // self.cps - 1
            cut = next((i for i, c in enumerate(host) if c // self.cps >= first), len(host))
            cache.pooled, cache.chunk, cache.rank, cache.valid = k_pooled[:, cut:], k_chunk[cut:], k_rank[cut:], k_valid[:, cut:]
            cache.host_chunk = host[cut:]
        gate = gate_value(logit, self.kind, self.eta)
        return gate.view(B, Q, K), logit.view(B, Q, K)


def gate_value(logit: torch.Tensor, kind: str, eta: float) -> torch.Tensor:
    """The gate of each neighbour from its logit w.c/D, for the kinds of `NeighborGate` ("bias"/"none": 1)."""
    if kind == "paper":
        sig = torch.sigmoid(logit)
        return sig + (sig.clamp(min=eta) - sig).detach()  # forward max(eta, sig); backward the sigmoid's gradient
    if kind == "clamp":
        return torch.clamp(torch.sigmoid(logit), min=eta)
    if kind == "official":
        return 0.1 + 0.9 * torch.sigmoid(logit)
    return torch.ones_like(logit)
