"""The Griffin baseline of Table 2: gated linear recurrences mixed with local attention.

Reproduces De et al. 2024, "Griffin: Mixing Gated Linear Recurrences with Local Attention Models for Efficient
Language Models" (arXiv:2402.19427), inside our trunk, so that it differs from Transformer-XL (`xl`) only in the
temporal mixing.

Layers. Every layer is two pre-norm residual blocks: a temporal-mixing block, then the MLP block. `griffin.pattern`
(default "RRA", Griffin's two recurrent blocks per local-attention block) repeated over the `n_layers` layers gives
each layer's temporal block:

    A  local attention: the trunk's `SelfAttention` (named `layers.{i}.attn`, as in xl), whose window is the sliding
       segment window (segment s sees itself causally and all of segment s-1: 2S tokens, §3.4) rather than Griffin's
       fixed 1,024 tokens; and multi-head attention as the trunk has it, where Griffin uses multi-query attention.
    R  the recurrent block (Griffin Fig. 2): from the normed input x [B, T, D] two branches,
           gelu(Linear_D->R(x))                                                (the gate branch)
           Linear_D->R(x) -> causal depthwise Conv1D of width W -> RG-LRU        (the recurrent branch)
       multiplied together and projected back, Linear_R->D.
    MLP  the trunk's SwiGLU (`layers.{i}.mlp`, as xl). Griffin uses a gated GeLU MLP of expansion 3; we keep SwiGLU so
       that the comparison with xl varies only the temporal mixing.

The RG-LRU (Real-Gated Linear Recurrent Unit), per channel of the R-wide input x_t:

    r_t = sigmoid(W_a x_t + b_a)                  recurrence gate
    i_t = sigmoid(W_x x_t + b_x)                  input gate
    log a_t = -c softplus(-Lambda) r_t            i.e. a_t = sigmoid(Lambda)^(c r_t), c = 8
    h_t = a_t h_{t-1} + sqrt(1 - a_t^2) (i_t x_t)

W_a and W_x are block-diagonal with H blocks (H = n_heads), as in Griffin. Lambda is initialised so that
sigmoid(Lambda)^c is uniform in [0.9, 0.999], drawn from `keyed_generator(seed, name)` after `init_weights` (which
keeps 1-D parameters as constructed), so it is deterministic per seed like every other parameter. sqrt(1 - a^2) is
computed as sqrt(-expm1(2 log a)), with its derivative bounded (as Griffin does) so that a -> 1 cannot produce an
infinite gradient; the gates' logits may be bf16 under autocast, the recurrence itself is always fp32.

The recurrence h_t = a_t h_{t-1} + b_t is computed by a two-level scan (`linear_scan`), not a loop over the T tokens:
the sequence is cut into N chunks of L ~ sqrt(T) tokens; one loop over the L positions steps every chunk at once from a
zero state (the chunk's own contribution), and one loop over the N chunks carries the state between them:

    h_t = intra_t + (a_{t0} ... a_t) h_{t0-1}

Every factor is a product of a's <= 1, so nothing overflows however close a is to 0 or 1; the work is O(B T R) in
about 2 sqrt(T) vectorised steps (a closed form per chunk, with an [L, L] matrix of decays: 9-34x slower on a CPU,
benchmarks/griffin_scan.py). Its backward pass is the same scan run backwards in time (the adjoint of a linear
recurrence is a linear recurrence), so nothing is kept for autograd but the inputs and the output: O(B T R).

Which choices are ours (the rest is Griffin):
    - the local attention window is the trunk's sliding segment window (2 segments), and it keeps MHA and rotary;
    - the MLP is the trunk's SwiGLU (mlp_hidden), not a gated GeLU;
    - no biases on the D <-> R projections (the trunk has none); the conv and the gates keep theirs;
    - every matrix (conv taps and block-diagonal gates included) starts from the trunk's normal(0, init_std), the
      output projection scaled by 1/sqrt(2 n_layers) like xl's (`init_weights`), rather than Griffin's own scheme;
    - R = griffin.rnn_width, or 4/3 D rounded to a multiple of H when 0 (Griffin's RNN width).

Parameter budget. The width D, depth, heads and MLP width are xl's (the preset's), so the only difference in size is
that a recurrent block (3 D R + 2 R^2 / H + small) replaces attention (4 D^2) in 2 layers of 3. At the `250m` preset
(D = 1024, 12 layers, R = 1368, H = 8) that is 206.4M parameters against xl's 202.5M and the ~212M of the paper's
other recurrent/memory baselines. (The paper's own Griffin row, 240M, was xl plus 5 extra recurrent layers with a
state of 2,048; we instead hold depth and width fixed and swap the temporal block, as Griffin's architecture does.)

Dimension letters: B batch, T tokens, S segment length, D width, R RNN width, H heads (= gate blocks), W conv width,
L scan chunk length, N scan chunks, V vocabulary.

Training and evaluation compute the same function. `forward` runs the whole sequence at once (padded to whole
segments, as RPT does: padding comes after every real token, so it is inert); `step` continues a `GriffinCache`
any number of tokens at a time (split at segment boundaries for the attention layers): each R layer carries its
state h [B, R] (fp32) and the conv's last W-1 inputs, each A layer a `KVCache` of at most two segments. The state is
constant in size whatever the document's length (`memory_bytes`); it is what carries a document past the window.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from rpt.config import ModelConfig
from rpt.model.decoder import SegmentDecoder
from rpt.model.layers import KVCache, RMSNorm, SelfAttention, SwiGLU, autocast_off, keyed_generator

LRU_C = 8.0  # c: a_t = sigmoid(Lambda)^(c r_t)
LAMBDA_RANGE = (0.9, 0.999)  # sigmoid(Lambda)^c starts uniform in this range
SCAN_CHUNK = 0  # L: tokens per chunk of the scan (0: ceil(sqrt T), the fewest sequential steps)
SQRT_MAX_GRAD = 1000.0  # the derivative of sqrt(1 - a^2) is clipped here (a -> 1)


# ---------------------------------------------------------------------------------------------------------------
# The linear recurrence h_t = exp(log_a_t) h_{t-1} + b_t


def _scan(log_a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor | None, chunk: int) -> torch.Tensor:
    """h [B, T, R] of h_t = exp(log_a_t) h_{t-1} + b_t, h_{-1} = h0 (zeros if None); log_a <= 0, all [B, T, R].

    Two levels over chunks of L tokens (L = ceil(sqrt T) when chunk is 0): each chunk's states from a zero state,
    stepped over its L positions for all N chunks at once; then the state entering each chunk, carried over the N
    chunks. O(B T R) work in L + N sequential steps, every factor a product of a's <= 1. No autograd."""
    B, T, R = b.shape
    L = max(1, min(chunk if chunk > 0 else math.isqrt(T - 1) + 1, T))
    N = -(-T // L)
    pad = N * L - T  # log a = 0, b = 0 after the end: h stays put, and is cut off below
    la = F.pad(log_a, (0, 0, 0, pad)).view(B, N, L, R).transpose(0, 2)  # [L, N, B, R]: a step is one contiguous slab
    bb = F.pad(b, (0, 0, 0, pad)).view(B, N, L, R).transpose(0, 2).contiguous()
    a = la.exp().contiguous()
    intra = torch.empty_like(bb)  # [L, N, B, R] the chunk's own contribution (h entering the chunk = 0)
    intra[0] = bb[0]
    for t in range(1, L):
        torch.addcmul(bb[t], a[t], intra[t - 1], out=intra[t])
    decay = la.cumsum(0).exp()  # [L, N, B, R] prod of a over the chunk up to t: what survives of the entering state
    carry = torch.empty_like(bb[0])  # [N, B, R] the state entering each chunk
    h = h0 if h0 is not None else b.new_zeros(B, R)
    for n in range(N):
        carry[n] = h
        h = intra[-1, n] + decay[-1, n] * h
    hs = torch.addcmul(intra, decay, carry)  # [L, N, B, R]
    return hs.transpose(0, 2).reshape(B, N * L, R)[:, :T]


class _LinearScan(torch.autograd.Function):
    """`_scan` with a backward pass that is itself a (reversed) `_scan`: nothing but inputs and output is saved.

    Adjoint: with g_t = dLoss/dh_t (direct), the total gradient lam_t = g_t + a_{t+1} lam_{t+1} is a linear recurrence
    backwards in time; then dLoss/db_t = lam_t, dLoss/dlog_a_t = lam_t a_t h_{t-1}, dLoss/dh0 = lam_0 a_0."""

    @staticmethod
    def forward(ctx, log_a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor | None, chunk: int) -> torch.Tensor:  # type: ignore[override]
        with autocast_off(b.device.type):
            h = _scan(log_a, b, h0, chunk)
        ctx.chunk = chunk
        ctx.has_h0 = h0 is not None
        ctx.save_for_backward(log_a, h, *((h0,) if h0 is not None else ()))
        return h

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_h: torch.Tensor):  # type: ignore[override]
        log_a, h, *rest = ctx.saved_tensors
        h0 = rest[0] if rest else None
        with autocast_off(grad_h.device.type):
            # reversed time u = T-1-t: lam'_u = a_{t+1} lam'_{u-1} + g'_u; the decay of u = 0 meets lam'_{-1} = 0
            la_next = F.pad(log_a[:, 1:], (0, 0, 0, 1))  # [B, T, R] log a_{t+1} (0 at the end: unused)
            lam = _scan(la_next.flip(1), grad_h.flip(1), None, ctx.chunk).flip(1)  # [B, T, R]
            h_prev = torch.cat([(h0 if h0 is not None else h.new_zeros(h[:, 0].shape))[:, None], h[:, :-1]], 1)
            a = log_a.exp()
            grad_log_a = lam * a * h_prev
            grad_h0 = lam[:, 0] * a[:, 0] if ctx.has_h0 else None
        return grad_log_a, lam, grad_h0, None


def linear_scan(log_a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor | None = None,
                chunk: int = SCAN_CHUNK) -> torch.Tensor:
    """h [B, T, R] with h_t = exp(log_a_t) h_{t-1} + b_t from h_{-1} = h0 [B, R] (None: zeros); log_a, b [B, T, R],
    log_a <= 0. Computed in the inputs' dtype (callers pass fp32) by the chunked scan, differentiable in all three."""
    return _LinearScan.apply(log_a, b, h0, chunk)


class _SqrtBoundedGrad(torch.autograd.Function):
    """sqrt(x) whose derivative is clipped at SQRT_MAX_GRAD (x -> 0 when a -> 1), as Griffin's RG-LRU."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        y = x.sqrt()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        (y,) = ctx.saved_tensors
        return grad / (2 * y).clamp_min(1.0 / SQRT_MAX_GRAD)


# ---------------------------------------------------------------------------------------------------------------
# The recurrent block


def rnn_width(cfg: ModelConfig) -> int:
    """R: griffin.rnn_width, or 4/3 D rounded to a multiple of H (the gates are block-diagonal with H blocks)."""
    H = cfg.n_heads
    if cfg.griffin.rnn_width:
        if cfg.griffin.rnn_width % H:
            raise ValueError(f"model.griffin.rnn_width={cfg.griffin.rnn_width} must be a multiple of model.n_heads={H} "
                             "(the RG-LRU's gates are block-diagonal with one block per head)")
        return cfg.griffin.rnn_width
    return max(H, round(4 * cfg.d_model / 3 / H) * H)


def lambda_init(width: int, generator: torch.Generator, c: float = LRU_C) -> torch.Tensor:
    """Lambda [R] with sigmoid(Lambda)^c uniform in LAMBDA_RANGE."""
    lo, hi = LAMBDA_RANGE
    ac = torch.rand(width, generator=generator, dtype=torch.float64) * (hi - lo) + lo  # a^c at r = 1
    a = ac ** (1.0 / c)
    return (a.log() - (-a).log1p()).float()  # logit(a)


@dataclass
class RecurrentState:
    """What one recurrent block carries from piece to piece: conv [B, W-1, R] the conv's last inputs, h [B, R] the
    RG-LRU state (fp32). None before the document's first token (zeros)."""

    conv: torch.Tensor | None = None
    h: torch.Tensor | None = None

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.conv, self.h) if t is not None)


class BlockDiagonalLinear(nn.Module):
    """y = x W + b with W block-diagonal: H blocks of [R/H, R/H] (weight [H, R/H, R/H], bias [R])."""

    def __init__(self, width: int, n_blocks: int) -> None:
        super().__init__()
        self.n_blocks = n_blocks
        self.weight = nn.Parameter(torch.empty(n_blocks, width // n_blocks, width // n_blocks))
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xb = x.unflatten(-1, (self.n_blocks, -1))  # [..., H, R/H]
        return torch.einsum("...hi,hij->...hj", xb, self.weight.to(xb.dtype)).flatten(-2) + self.bias


class CausalConv1d(nn.Module):
    """Depthwise causal convolution over time: y_t = sum_k weight[k] * x_{t-k} + bias (weight [W, R], bias [R])."""

    def __init__(self, width: int, taps: int) -> None:
        super().__init__()
        self.taps = taps
        self.weight = nn.Parameter(torch.empty(taps, width))
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor, prev: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, R], prev [B, W-1, R] the inputs before x (None: zeros) -> y [B, T, R], the last W-1 inputs."""
        B, T, R = x.shape
        W = self.taps
        before = x.new_zeros(B, W - 1, R) if prev is None else prev.to(x.dtype)
        xp = torch.cat([before, x], 1)  # [B, W-1+T, R]
        y = self.bias + sum(xp[:, W - 1 - k : W - 1 - k + T] * self.weight[k] for k in range(W))
        return y, xp[:, T:]


class RGLRU(nn.Module):
    """The Real-Gated Linear Recurrent Unit (module docstring): x [B, T, R] -> y [B, T, R] fp32."""

    def __init__(self, width: int, n_blocks: int) -> None:
        super().__init__()
        self.a_gate = BlockDiagonalLinear(width, n_blocks)
        self.x_gate = BlockDiagonalLinear(width, n_blocks)
        self.lam = nn.Parameter(torch.zeros(width))  # Lambda; drawn by `Griffin._init_lambda`

    def forward(self, x: torch.Tensor, h0: torch.Tensor | None = None) -> torch.Tensor:
        """h0 [B, R] the state before x (None: zeros). Returns every state h [B, T, R] (y = h)."""
        r = torch.sigmoid(self.a_gate(x).float())
        i = torch.sigmoid(self.x_gate(x).float())
        log_a = -LRU_C * F.softplus(-self.lam.float()) * r  # [B, T, R], <= 0
        mult = _SqrtBoundedGrad.apply(-torch.expm1(2 * log_a))  # sqrt(1 - a^2), stable near a = 1
        return linear_scan(log_a, mult * (i * x.float()), h0)


class RecurrentBlock(nn.Module):
    """Griffin's recurrent temporal-mixing block (Fig. 2): out(gelu(gate(x)) * RG-LRU(conv(in_x(x))))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        D, R = cfg.d_model, rnn_width(cfg)
        self.in_gate = nn.Linear(D, R, bias=False)
        self.in_x = nn.Linear(D, R, bias=False)
        self.conv = CausalConv1d(R, cfg.griffin.conv)
        self.lru = RGLRU(R, cfg.n_heads)
        self.out = nn.Linear(R, D, bias=False)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, state: RecurrentState | None = None) -> torch.Tensor:
        """x [B, T, D] (normed) -> [B, T, D]. With `state`, continue it (and update it in place)."""
        gate = F.gelu(self.in_gate(x), approximate="tanh")  # [B, T, R]
        u, conv_tail = self.conv(self.in_x(x), None if state is None else state.conv)  # [B, T, R]
        h = self.lru(u, None if state is None else state.h)  # [B, T, R] fp32
        if state is not None:
            state.conv, state.h = conv_tail, h[:, -1]
        return self.dropout(self.out((h * gate).to(x.dtype)))


# ---------------------------------------------------------------------------------------------------------------
# The model


@dataclass
class GriffinCache:
    """Everything needed to continue a document: the position and, per layer, a `RecurrentState` (R layers) or a
    `KVCache` (A layers)."""

    layers: list[RecurrentState | KVCache]
    pos: int = 0

    def memory_bytes(self) -> int:
        """The recurrent states and conv buffers: constant in the document's length."""
        return sum(c.nbytes() for c in self.layers if isinstance(c, RecurrentState))

    def window_bytes(self) -> int:
        """The local-attention layers' K/V (bounded by two segments per layer)."""
        return sum(c.nbytes() for c in self.layers if isinstance(c, KVCache))


class GriffinLayer(nn.Module):
    """Pre-norm residual blocks: temporal mixing (local attention `attn` or recurrent `rec`) -> SwiGLU.

    The temporal block's norm is `attn_norm` in both kinds, the trunk's name for it."""

    def __init__(self, cfg: ModelConfig, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = SelfAttention(cfg.d_model, cfg.n_heads, cfg.dropout) if kind == "A" else None
        self.rec = RecurrentBlock(cfg) if kind == "R" else None
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.mlp_hidden, cfg.dropout)
        self.segment_len = cfg.segment_len

    def forward(self, x: torch.Tensor, rot: tuple[torch.Tensor, torch.Tensor],
                cache: RecurrentState | KVCache | None = None) -> torch.Tensor:
        h = self.attn_norm(x)
        if self.attn is not None:
            if cache is None:
                x = x + self.attn(h, *rot, self.segment_len)
            else:
                assert isinstance(cache, KVCache)
                x = x + self.attn.step(h, *rot, cache, self.segment_len)
        else:
            assert self.rec is not None and (cache is None or isinstance(cache, RecurrentState))
            x = x + self.rec(h, cache)
        return x + self.mlp(self.mlp_norm(x))


class Griffin(SegmentDecoder):
    """`griffin.pattern` repeated over the layers: R recurrent blocks and A local attention blocks, each followed by
    the trunk's MLP; forward and step are `SegmentDecoder`'s."""

    def build_layers(self, cfg: ModelConfig) -> list[nn.Module]:
        pattern = cfg.griffin.pattern
        self.kinds = [pattern[i % len(pattern)] for i in range(cfg.n_layers)]
        return [GriffinLayer(cfg, k) for k in self.kinds]

    @classmethod
    def layer_activation_elements(cls, cfg: ModelConfig, T: int, math_attention: bool) -> int:
        """A layers as xl's; an R layer keeps, per token, its norms and residuals (4 D), the MLP's 4 F, and about 18 R
        in the recurrent block (the two branches, the conv, both gates before and after their sigmoids, log a,
        sqrt(1 - a^2), the scan's inputs and states, the gated product) and no attention scores."""
        pattern = cfg.griffin.pattern
        n_rec = sum(pattern[i % len(pattern)] == "R" for i in range(cfg.n_layers))
        attention = (cfg.n_layers - n_rec) * cls.attention_layer_elements(cfg, math_attention)
        recurrent = n_rec * (4 * cfg.d_model + 4 * cfg.mlp_hidden + 18 * rnn_width(cfg))
        return T * (attention + recurrent)

    @classmethod
    def largest_layer_elements(cls, cfg: ModelConfig, T: int, math_attention: bool) -> int:
        """The larger of an A layer's and an R layer's, among the kinds the pattern stacks."""
        kinds = {cfg.griffin.pattern[i % len(cfg.griffin.pattern)] for i in range(cfg.n_layers)}
        per_kind = {"A": cls.attention_layer_elements(cfg, math_attention),
                    "R": 4 * cfg.d_model + 4 * cfg.mlp_hidden + 18 * rnn_width(cfg)}
        return T * max(per_kind[k] for k in kinds)

    @classmethod
    def temporary_bytes(cls, cfg: ModelConfig, batch: int, T: int) -> int:
        """The scan's fp32 transients for one R layer at a time, [B, T, R] each, at their peak in backward: the shifted
        and flipped log a and gradient, their padded chunk-order copies, exp(log a), the intra-chunk states, the
        decays, the result and its reshape: ten."""
        if "R" not in cfg.griffin.pattern[: cfg.n_layers]:
            return 0
        return 10 * 4 * batch * T * rnn_width(cfg)

    def init_extra(self, seed: int) -> None:
        self._init_lambda(seed)

    def _init_lambda(self, seed: int) -> None:
        """Lambda of every RG-LRU (1-D: `init_weights` leaves it), from its own keyed generator."""
        for i, layer in enumerate(self.layers):
            if layer.rec is None or layer.rec.lru.lam.is_meta:
                continue
            lam = layer.rec.lru.lam
            with torch.no_grad():
                lam.copy_(lambda_init(lam.numel(), keyed_generator(seed, f"layers.{i}.rec.lru.lam")))

    def new_cache(self, memory: Callable | None = None) -> GriffinCache:
        """A fresh cache for one batch of documents (start every document with a new cache). `memory` is ignored."""
        return GriffinCache(layers=[RecurrentState() if k == "R" else KVCache() for k in self.kinds])
