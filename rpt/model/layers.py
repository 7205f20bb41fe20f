"""Transformer building blocks with nothing RPT-specific: RMSNorm, rotary positions, SwiGLU, attention with the
sliding segment window of §3.4, and a cache for segment-by-segment inference.

Dimension letters: B batch, T tokens, S segment length, H heads, E head dim, D width.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """A region computed in the tensors' own dtypes: `torch.autocast(device_type, enabled=False)` on a device type with
    autocast (cpu, cuda, ...); on one without (meta, used to check that a model builds every tensor on its inputs'
    device) there is nothing to turn off, and torch.autocast would refuse the device type."""
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 for bf16 safety, return in the input dtype.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def rotary_cos_sin(positions: torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [T, E] for integer `positions` [T] (fp32 always: absolute positions reach 1e5+)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.float()[:, None] * inv_freq[None, :]  # [T, E/2]
    angles = torch.cat([angles, angles], dim=-1)  # [T, E]
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., T, E]; cos/sin [T, E]."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.w_gate = nn.Linear(dim, hidden, bias=False)
        self.w_up = nn.Linear(dim, hidden, bias=False)
        self.w_down = nn.Linear(hidden, dim, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.w_down(F.silu(self.w_gate(x)) * self.w_up(x)))


@dataclass
class KVCache:
    """Keys/values one attention layer needs to continue a document: the previous full segment and the current one.

    prev_k/prev_v: [B, H, <=S, E] keys of the previous segment; cur_k/cur_v: [B, H, <S, E] of the current segment.
    """

    prev_k: torch.Tensor | None = None
    prev_v: torch.Tensor | None = None
    cur_k: torch.Tensor | None = None
    cur_v: torch.Tensor | None = None

    def context(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        ks = [t for t in (self.prev_k, self.cur_k) if t is not None]
        vs = [t for t in (self.prev_v, self.cur_v) if t is not None]
        if not ks:
            return None, None
        return torch.cat(ks, dim=2), torch.cat(vs, dim=2)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.prev_k, self.prev_v, self.cur_k, self.cur_v) if t is not None)

    def append(self, k: torch.Tensor, v: torch.Tensor, segment_len: int) -> None:
        """Add the keys of new tokens (never crossing a segment boundary); roll the window when a segment fills."""
        self.cur_k = k if self.cur_k is None else torch.cat([self.cur_k, k], dim=2)
        self.cur_v = v if self.cur_v is None else torch.cat([self.cur_v, v], dim=2)
        if self.cur_k.shape[2] == segment_len:
            self.prev_k, self.prev_v, self.cur_k, self.cur_v = self.cur_k, self.cur_v, None, None


def segment_window_mask(n_segments: int, segment_len: int, device: torch.device) -> torch.Tensor:
    """Bool [nS, S, 2S]: query t of segment s sees all of segment s-1 (if s > 0) and keys <= t of segment s."""
    t = torch.arange(segment_len, device=device)
    causal = t[None, :] <= t[:, None]  # [S, S]
    prev = torch.ones(n_segments, segment_len, segment_len, dtype=torch.bool, device=device)
    prev[0] = False  # the first segment has no predecessor
    return torch.cat([prev, causal.expand(n_segments, -1, -1)], dim=-1)


def attend_after_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Attention of n new tokens (q, k, v [B, H, n, E]) to the cached window and, causally, to each other -> [B, H, n, E]
    (the cache is not changed: the caller appends k, v)."""
    n = q.shape[2]
    ck, cv = cache.context()
    L = 0 if ck is None else ck.shape[2]
    keys = k if ck is None else torch.cat([ck, k], dim=2)
    values = v if cv is None else torch.cat([cv, v], dim=2)
    i = torch.arange(n, device=q.device)
    j = torch.arange(L + n, device=q.device)
    mask = j[None, :] <= (i[:, None] + L)  # cached context fully visible, new tokens causal
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)


class SelfAttention(nn.Module):
    """Causal self-attention over a sliding window of segments (window 2S, stride S; §3.4).

    Training: the whole sequence at once, reshaped into segments — segment s attends causally to itself and fully to
    segment s-1. Inference: the same function through a `KVCache`, any number of tokens at a time.
    """

    def __init__(self, dim: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = dim // n_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.attn_dropout = dropout  # on the attention probabilities (set_attention_dropout: model.attn_dropout)

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # 3 x [B, H, T, E]
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segment_len: int) -> torch.Tensor:
        """x [B, T, D] with T a multiple of S; cos/sin [T, E] for absolute positions."""
        B, T, D = x.shape
        nS, S, H, E = T // segment_len, segment_len, self.n_heads, self.head_dim
        q, k, v = self._qkv(x, cos, sin)  # [B, H, T, E]
        # one attention problem per (batch, segment): [B*nS, H, S, E]; 4-D inputs take the fused CPU/GPU kernels
        q, k, v = (t.view(B, H, nS, S, E).transpose(1, 2) for t in (q, k, v))  # [B, nS, H, S, E]
        # keys of each window = previous segment ++ own segment: [B, nS, H, 2S, E]
        k = torch.cat([F.pad(k, (0, 0, 0, 0, 0, 0, 1, 0))[:, :-1], k], dim=3)
        v = torch.cat([F.pad(v, (0, 0, 0, 0, 0, 0, 1, 0))[:, :-1], v], dim=3)
        mask = segment_window_mask(nS, S, x.device)[:, None].repeat(B, 1, 1, 1)  # [B*nS, 1, S, 2S]
        y = F.scaled_dot_product_attention(q.reshape(B * nS, H, S, E), k.reshape(B * nS, H, 2 * S, E),
                                           v.reshape(B * nS, H, 2 * S, E), attn_mask=mask,
                                           dropout_p=self.attn_dropout if self.training else 0.0)
        y = y.view(B, nS, H, S, E).permute(0, 1, 3, 2, 4).reshape(B, T, D)  # [B, nS, S, H, E] -> [B, T, D]
        return self.dropout(self.out(y))

    def step(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache, segment_len: int) -> torch.Tensor:
        """x [B, n, D]: new tokens inside one segment, continuing `cache` (updated in place)."""
        B, n, D = x.shape
        q, k, v = self._qkv(x, cos, sin)
        y = attend_after_cache(q, k, v, cache)
        cache.append(k, v, segment_len)
        return self.out(y.transpose(1, 2).reshape(B, n, D))


class Attention(nn.Module):
    """Plain multi-head attention (no cache): bidirectional or cross, optional rotary, optional key mask.

    Used by the retriever's chunk encoder, query augmentation and neighbour gating; CCA uses its projections.
    """

    def __init__(self, dim: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = dim // n_heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.attn_dropout = dropout  # on the attention probabilities (set_attention_dropout: model.attn_dropout)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
                kv_extra: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x [N, Tq, D] attends to context [N, Tk, D] (default x). mask: bool broadcastable to [N, 1, Tq, Tk'].

        kv_extra: a learned key/value pair [D], [D] prepended to every key sequence (always visible).
        """
        ctx = x if context is None else context
        N, Tq, D = x.shape
        Tk = ctx.shape[1]
        q = self.q(x).view(N, Tq, self.n_heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(ctx).view(N, Tk, 2, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if rotary is not None:
            cos, sin = rotary
            q, k = apply_rotary(q, cos[:Tq], sin[:Tq]), apply_rotary(k, cos[:Tk], sin[:Tk])
        if kv_extra is not None:
            nk = kv_extra[0].view(1, self.n_heads, 1, self.head_dim).expand(N, -1, -1, -1).to(k.dtype)
            nv = kv_extra[1].view(1, self.n_heads, 1, self.head_dim).expand(N, -1, -1, -1).to(v.dtype)
            k, v = torch.cat([nk, k], dim=2), torch.cat([nv, v], dim=2)
            if mask is not None:  # the extra key is always visible (bool True / additive 0)
                first = torch.ones_like(mask[..., :1]) if mask.dtype == torch.bool else torch.zeros_like(mask[..., :1])
                mask = torch.cat([first, mask], dim=-1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.attn_dropout if self.training else 0.0)
        return self.dropout(self.out(y.transpose(1, 2).reshape(N, Tq, D)))


def set_attention_dropout(model: nn.Module, p: float) -> None:
    """model.attn_dropout: the dropout rate on the attention probabilities of every attention module in `model`
    (-1 leaves each at its module's dropout). The residual and MLP dropouts keep `model.dropout`."""
    if p < 0:
        return
    for m in model.modules():
        if hasattr(m, "attn_dropout"):
            m.attn_dropout = p


def init_weights(module: nn.Module, std: float, n_layers: int, seed: int) -> None:
    """GPT-2 style: normal(0, std), output projections scaled by 1/sqrt(2 * n_layers), biases 0; other vectors keep
    their constructed constant values (norm weights 1, gate weights 0) except learned null keys/values, normal(0, std);
    CCA's relative-offset bias keeps its constructed prior (`rel_bias_prior`).

    Paired initialisation: each random tensor is drawn from its own generator keyed by (seed, parameter name), so two
    models built with one seed hold identical values in every parameter they share, whatever other modules either has
    (xl and rpt-sem start from the same trunk). Drawing in order from one global stream would shift every draw after
    the first module one variant has and the other lacks.
    """
    for name, p in module.named_parameters():
        if p.is_meta:  # built on the meta device (parameter counts): nothing to draw
            continue
        if name.endswith(".bias"):  # nn.Linear draws its bias from the global generator: zero it
            with torch.no_grad():
                p.zero_()
            continue
        if name.endswith("rel_bias") or (p.dim() < 2 and not name.endswith(("null_k", "null_v"))):
            continue
        scale = 1.0 / math.sqrt(2 * n_layers) if name.endswith(("out.weight", "w_down.weight")) else 1.0
        with torch.no_grad():
            p.copy_(torch.randn(p.shape, generator=keyed_generator(seed, name), device="cpu") * (std * scale))


def keyed_generator(seed: int, name: str) -> torch.Generator:
    """A CPU generator seeded by sha256(seed, name): independent streams per name, stable across runs and machines."""
    digest = hashlib.sha256(f"{seed}|{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") & ((1 << 63) - 1))
