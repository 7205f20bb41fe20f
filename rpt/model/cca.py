"""Chunked cross-attention (RETRO; §3.1) with RETRO's alignment and a learned null key/value.

Token p attends to the neighbours of chunk g = (p + 1) // M - 1: tokens 64g+63 ... 64g+126 (the last token of chunk g
and the first 63 of chunk g+1) see chunk g's K neighbours (K * 2M keys) plus a learned null key/value; tokens
0 ... M-2 see only the null.

Positions (rotary, as RETRO's relative positions and the authors' code): a neighbour's 2M tokens (c_j, c_j+1) take
positions 0 ... 2M-1, and the query token at offset u of its block (token p = gM + M - 1 + u) takes position M - 1 + u,
i.e. where its own copy would stand if the neighbour's first chunk c_j matched the query chunk c_g. "Read the key one
position ahead" is then "read the token after my copy": a fixed relative offset that one head can learn, where
content-only attention would have to discover an induction circuit first (position-free CCA learns no copying at all on
the copy corpus). Positions depend only on the offset inside the block, so training and generation
agree by construction (the authors' code is off by 63 at generation).

Neighbour gates scale the VALUES of a neighbour's keys (`NeighborKV.scale`), not its states: scaling the states
(C^g = g * C, §3.1) also scales the attention logits, so a gate of 0.1 flattens CCA's attention to near uniform and the
neighbour can no longer be read even where it is the right one.

Dimension letters: B batch, R blocks of M query tokens, K neighbours, M chunk length, D width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from rpt.model.layers import Attention, RMSNorm, apply_rotary, rotary_cos_sin


@dataclass
class NeighborKV:
    """Neighbour states for consecutive blocks. Block r (tokens (r*M - 1) ... (r*M + M - 2)) uses row r - first.

    states [B, R, K*2M, D]; mask [B, R, K*2M] (True = real neighbour token); bias [B, R, K*2M] additive logits or
    None (gate "bias"); scale [B, R, K*2M] value scale or None (the multiplicative gates).
    """

    states: torch.Tensor
    mask: torch.Tensor
    bias: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    first_block: int = 0

    def rows(self, sl: slice) -> NeighborKV:
        """The rows `sl` (first_block is the caller's to set)."""
        return NeighborKV(*(None if t is None else t[:, sl] for t in (self.states, self.mask, self.bias, self.scale)))

    def shifted(self) -> NeighborKV:
        """An empty row prepended (block 0's tokens see only the null key): row r now serves block r."""
        def pad(t: torch.Tensor | None, value: float | bool) -> torch.Tensor | None:
            return None if t is None else F.pad(t, (0, 0) * (t.dim() - 2) + (1, 0), value=value)

        return NeighborKV(pad(self.states, 0.0), pad(self.mask, False), pad(self.bias, 0.0), pad(self.scale, 0.0))

    @staticmethod
    def cat(rows: list[NeighborKV], first_block: int) -> NeighborKV:
        def cat(name: str) -> torch.Tensor | None:
            parts = [getattr(r, name) for r in rows]
            return None if parts[-1] is None else torch.cat(parts, 1)

        return NeighborKV(cat("states"), cat("mask"), cat("bias"), cat("scale"), first_block)


def rel_bias_prior(n_heads: int, M: int, kind: str, scale: float = 1.0) -> torch.Tensor:
    """Starting values of CCA's relative-offset bias [H, 3M - 1]; index i is the offset d = i - (2M - 2) of a key from
    the query's aligned position (d = 0: the neighbour token at the query's own position, whose shifted value is the
    token that followed it). "zero": no preference. "alibi": -slope_h * |d| with ALiBi's geometric slopes
    2^(-8 (h+1) / H) (Press et al., 2022), so each head starts out reading near the aligned position, from sharply
    (slope 2^(-8/H)) to almost uniformly (2^-8). `scale` multiplies every slope: with 16 (the default,
    `model.cca.rel_bias_scale`) and H = 4 the slopes are 4, 1, 1/4, 1/16 — head 0 starts out reading the aligned token
    alone, so CCA copies from the first updates where its neighbour holds the source (on the copy corpus the ln(V)
    plateau lasts <= 50 updates at scale 16 against 100-150 at scale 1; docs/results/copy-test.md).

    Why a prior: with a flat start, CCA's attention spreads over all K * 2M neighbour tokens, the right one carries
    1/(2KM) of the output, and the value/output path that would have to learn to carry a token's identity gets no
    usable signal, and on the copy corpus the model sits on the ln(V) plateau for hundreds of updates.
    """
    if kind == "zero":
        return torch.zeros(n_heads, 3 * M - 1)
    if kind != "alibi":
        raise ValueError(f"rel_bias_init must be 'zero' or 'alibi', got {kind!r}")
    slopes = scale * 2.0 ** (-8.0 * torch.arange(1, n_heads + 1) / n_heads)
    d = torch.arange(3 * M - 1) - (2 * M - 2)
    return -slopes[:, None] * d.abs()[None, :].float()


class ChunkedCrossAttention(nn.Module):
    """RETRO's chunked cross-attention with positions, normalised neighbour states and value-scaling gates.

    Options (ModelConfig): `positions` rotary positions (module docstring); `rel_bias` a learned bias per head and
    relative offset (neighbour index k - query offset u, one scalar each: a position preference that needs no
    token-independent direction in the states, which rotary attention does); `shift_values` key k of a neighbour reads
    the VALUE of its next token k + 1 ("find my token, read what followed it": copying in one attention step, where a
    causal neighbour state at k knows nothing of token k + 1).
    """

    # Training on a CPU with the learned relative bias: attend directly (one matmul, the biases added in place, softmax)
    # instead of through scaled_dot_product_attention, which takes its unfused math path there anyway (no fused CPU
    # kernel differentiates a mask) after the [N, H, M, 1 + L] mask has been built, masked and concatenated in full.
    # Same function; benchmarks/cca_attention.py measures both. GPUs keep SDPA (its kernels take a bias gradient).
    direct_attention: bool = True

    def __init__(self, dim: int, n_heads: int, chunk_size: int, dropout: float, rope_base: float = 10000.0,
                 positions: bool = True, eps: float = 1e-6, ctx_norm: bool = True, rel_bias: bool = False,
                 shift_values: bool = False, rel_bias_init: str = "alibi", rel_bias_scale: float = 1.0) -> None:
        super().__init__()
        self.M, self.H = chunk_size, n_heads
        self.attn = Attention(dim, n_heads, dropout)  # its q / kv / out projections; the attention itself is below
        self.null_k = nn.Parameter(torch.randn(dim) * 0.02)
        self.null_v = nn.Parameter(torch.randn(dim) * 0.02)
        self.rope_base, self.positions, self.shift_values = rope_base, positions, shift_values
        # Neighbour states are residual-stream states (magnitude ~ init_std at the start of training), not normalised:
        # projected as they are, CCA's keys and values start ~100x smaller than self-attention's and its gradients
        # vanish with them. Pre-norm them like every other attention input.
        self.ctx_norm = RMSNorm(dim, eps) if ctx_norm else None
        self.rel_bias = nn.Parameter(rel_bias_prior(n_heads, chunk_size, rel_bias_init, rel_bias_scale)) if rel_bias else None

    def forward(self, x: torch.Tensor, nkv: NeighborKV, start: int) -> torch.Tensor:
        """x [B, n, D] holds tokens start ... start+n-1 -> [B, n, D]."""
        B, n, D = x.shape
        M, H = self.M, self.H
        E = D // H
        front = (start + 1) % M  # rows before `start` inside its block
        r0 = (start + 1) // M
        R = (front + n + M - 1) // M
        xb = F.pad(x, (0, 0, front, R * M - front - n)).view(B * R, M, D)  # [N=B*R, M, D]
        lo = r0 - nkv.first_block
        ctx = nkv.states[:, lo : lo + R]
        assert ctx.shape[1] == R, f"neighbour rows for blocks {r0}..{r0 + R - 1} missing"
        ctx = ctx.reshape(B * R, -1, D)  # [N, L = K*2M, D]
        if self.ctx_norm is not None:
            ctx = self.ctx_norm(ctx)
        N, L = ctx.shape[:2]
        a = self.attn
        q = a.q(xb).view(N, M, H, E).transpose(1, 2)  # [N, H, M, E]
        k, v = a.kv(ctx).view(N, L, 2, H, E).permute(2, 0, 3, 1, 4)  # 2 x [N, H, L, E]
        keep = nkv.mask[:, lo : lo + R].reshape(N, L)  # [N, L]
        if self.shift_values:  # value of key k = value of token k + 1 of the same neighbour; the last key has none
            v = F.pad(v.reshape(N, H, L // (2 * M), 2 * M, E)[:, :, :, 1:], (0, 0, 0, 1)).reshape(N, H, L, E)
            keep = keep & (torch.arange(L, device=x.device) % (2 * M) != 2 * M - 1)
        if self.positions:
            cq, sq = rotary_cos_sin(torch.arange(M - 1, 2 * M - 1, device=x.device), E, self.rope_base)  # [M, E]
            ck, sk = rotary_cos_sin(torch.arange(L, device=x.device) % (2 * M), E, self.rope_base)  # [L, E]
            q, k = apply_rotary(q, cq, sq), apply_rotary(k, ck, sk)
        if nkv.scale is not None:
            v = v * nkv.scale[:, lo : lo + R].reshape(N, 1, L, 1).to(v.dtype)
        # additive logits per key: -inf for a missing neighbour token (or a shifted-out last key), the gate's bias
        key_bias = torch.zeros(N, 1, 1, L, dtype=q.dtype, device=x.device).masked_fill(~keep[:, None, None, :],
                                                                                      float("-inf"))
        if nkv.bias is not None:
            key_bias = key_bias + nkv.bias[:, lo : lo + R].reshape(N, 1, 1, L).to(q.dtype)
        rel = None
        if self.rel_bias is not None:  # offset k - u in [-(M-1), 2M-1] -> index k - u + M - 1: [1, H, M, L]
            u = torch.arange(M, device=x.device)
            kk = torch.arange(L, device=x.device) % (2 * M)
            rel = self.rel_bias[:, kk[None, :] - u[:, None] + M - 1].to(q.dtype)[None]
        # the learned null key/value first: always visible, no position, no gate, no bias
        k = torch.cat([self.null_k.view(1, H, 1, E).expand(N, -1, -1, -1).to(k.dtype), k], dim=2)
        v = torch.cat([self.null_v.view(1, H, 1, E).expand(N, -1, -1, -1).to(v.dtype), v], dim=2)
        key_bias = F.pad(key_bias, (1, 0))  # [N, 1, 1, 1 + L]
        rel = None if rel is None else F.pad(rel, (1, 0))  # [1, H, M, 1 + L]
        p_drop = a.attn_dropout if self.training else 0.0
        if self.direct_attention and x.device.type == "cpu" and rel is not None and torch.is_grad_enabled():
            y = attend_with_bias(q, k, v, key_bias, rel, p_drop)
        else:
            mask = key_bias if rel is None else key_bias + rel  # [N, 1 or H, 1 or M, 1 + L]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p_drop)
        y = a.dropout(a.out(y.transpose(1, 2).reshape(N, M, D)))
        return y.view(B, R * M, D)[:, front : front + n]


def attend_with_bias(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_bias: torch.Tensor, rel: torch.Tensor,
                      dropout_p: float) -> torch.Tensor:
    """softmax(q k^T / sqrt(E) + key_bias + rel) v, with dropout on the probabilities: q [N, H, M, E], k / v
    [N, H, L', E], key_bias [N, 1, 1, L'], rel [1, H, M, L'] -> [N, H, M, E]. The biases are added in place into the
    one score tensor the matmul makes (its backward needs q and k, not its output), so no mask of the scores' size is
    ever built."""
    scores = torch.matmul(q * q.shape[-1] ** -0.5, k.transpose(-1, -2))
    scores.add_(rel).add_(key_bias)
    probs = torch.softmax(scores, dim=-1)
    if dropout_p > 0:
        probs = F.dropout(probs, dropout_p)
    return torch.matmul(probs, v)
