"""The Block-Recurrent Transformer baseline of Table 2 (Hutchins, Schlag, Wu, Dyer and Neyshabur 2022,
"Block-Recurrent Transformers", NeurIPS; https://arxiv.org/abs/2203.07852), built on the xl trunk of rpt.model.rpt.

The model is xl (a stack of pre-norm layers: sliding-window self-attention over the segment window, then SwiGLU) in
which one layer, `cfg.recurrent_layer_index` (default n_layers - 3: Hutchins' 10th of 12; never below the middle
layer), is the recurrent cell. The cell carries a state of N = `cfg.block_recurrent.state` vectors of width D from block
to block; blocks are segments (width S, Hutchins' W; their window = block = 512, ours = `cfg.segment_len`; the tiny
preset keeps N = S = 128, as Hutchins' state = block width).

    vertical direction (tokens of block b, in the recurrent layer):
        h   = attn_norm(x)
        x  += attn(h)  [sliding-window self-attention, xl's]  +  read(h, c_b)  [cross-attention to the state]
        x  += mlp(mlp_norm(x))
    horizontal direction (the state, after block b):
        s   = state_norm(c_b) + state_ids
        a   = [self-attention among the N state vectors | cross-attention from the state to block b's tokens h]
        c'  = gate(c_b, out(a))
        c_{b+1} = gate(c', mlp(mlp_norm(c')))

What the state sees and when: c_0 is a learned initial state; c_{b+1} is computed from c_b and the normed inputs h of
block b's S tokens to the recurrent layer. Every token of block b reads c_b, which summarises blocks 0..b-1 only, so
nothing leaks from a block into itself; through the chain c_b -> c_{b+1} a token reaches arbitrarily far back, beyond
the n_layers segments that the stacked sliding windows reach.

Hutchins' choices kept:
  - the recurrent layer is a transformer layer run in two directions; the horizontal one is the same layer turned
    90 degrees (self-attention, cross-attention, projection, MLP) with its residual connections replaced by gates
  - keys and values are shared between directions: the state's K/V serve both the tokens' read of the state and the
    state's self-attention; block b's token K/V for the state's cross-attention come from the layer's own `attn.qkv`
    (its key and value rows), with separate queries for each of the four attentions (token self, token -> state,
    state self, state -> tokens)
  - the self- and cross-attention outputs are concatenated and projected, in both directions. In the vertical
    direction the projection is written as the sum attn.out(self) + read_out(cross), which is the same linear map
    ([a, b] W = a W_a + b W_b) and keeps `layers.{r}.attn` named and shaped as xl's
  - learned state IDs (a position embedding per state vector, drawn N(0, 1) as in their code) added to the normed
    state before its projections; a learned initial state; no dropout in the horizontal direction (their code runs it
    without); the MLP of the horizontal direction ("dual" gating: one gate after the projection, one after the MLP)
  - gates (`cfg.block_recurrent.gate`): "fixed" c * g + z * (1 - g), g = sigmoid(a learned per-dimension logit), their
    fixed gate and default; "learned" their LSTM gate c * f + z * i with f = sigmoid(W_f . + 1), i = sigmoid(W_i . - 1)
Ours:
  - positions: xl's rotary positions in the token self-attention; no positions in the cross-attentions (Hutchins use
    T5 relative biases in self-attention, none in cross-attention); the state's cross-attention reads the token keys
    unrotated (the shared projection without the rotary)
  - the fixed gate's logit starts at +1 (g = 0.73: the state starts mostly kept, and the fixed and LSTM gates start as
    the same update); Hutchins draw it around 0 (g = 0.5)
  - the LSTM gate's input/forget gates are computed from [z, c] (the candidate and the old state); Hutchins compute
    them from the hidden activation that z is projected from
  - blocks are segments (S = 1024 at 250m, 128 at tiny) and the cell's MLP is the trunk's SwiGLU (hidden
    `cfg.mlp_hidden`); N is `cfg.block_recurrent.state` at every preset (512, Hutchins' value, unless a preset sets it: at
    the tiny preset N = 512 state vectors exceed the 128-token block)
  - training: every training sequence starts from the learned initial state and back-propagates through all of its
    T / S blocks; Hutchins also carry the state (without gradient) across successive training windows of one
    document, which our training loop (independent sequences) does not do

Parameter budget (the 250m preset): the trunk is exactly xl's (202.5M, same width, depth and names, so paired
initialisation gives both the same starting trunk); the cell adds 8 D^2 (token -> state query and projection; the
state's two queries, K/V and 2D -> D projection) + one SwiGLU (3 D F) + N D state IDs + N D initial state + norms and
gate logits: 17.8M, 220.3M in all, 4% above the paper's 212M for its Block-Recurrent row. We keep xl's width and depth
rather than shrinking the trunk, so that the comparison with xl isolates the recurrence.

Dimension letters (used in every shape comment):
    B batch, T tokens, S segment (= block) length, nB blocks, N state vectors, D width, H heads, E head dim,
    V vocabulary.

Training and evaluation compute one function. `forward` runs every layer but the recurrent one on the whole sequence
at once; in the recurrent layer the self-attention and MLP also run on the whole sequence, and only the state is
computed by a loop over the T / S blocks (a handful), after which every block reads its state in one batched
attention. `step` continues a `BlockRecurrentCache` by any number of tokens: the cache holds each layer's sliding
window K/V, the current state (and its K/V) and the recurrent layer's normed inputs of the unfinished block; the state
is updated only when a block's last token is in, exactly as `forward` does. A new cache starts a new document from the
learned initial state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from rpt.config import ModelConfig
from rpt.model.decoder import SegmentDecoder
from rpt.model.layers import KVCache, RMSNorm, SelfAttention, SwiGLU, keyed_generator
from rpt.model.rpt import DecoderLayer

VARIANT = "block-recurrent"
KEEP_LOGIT = 1.0  # the fixed gate's starting logit and the LSTM forget gate's offset (sigmoid(1) = 0.73 of c kept)
STATE_ID_STD = 1.0  # state IDs are drawn N(0, 1): comparable to the normed state they are added to (Hutchins' code)


def _heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[B, L, D] -> [B, H, L, E]."""
    B, L, D = x.shape
    return x.view(B, L, n_heads, D // n_heads).transpose(1, 2)


def _merge(y: torch.Tensor) -> torch.Tensor:
    """[B, H, L, E] -> [B, L, D]."""
    B, H, L, E = y.shape
    return y.transpose(1, 2).reshape(B, L, H * E)


@dataclass
class BlockRecurrentCache:
    """Everything needed to continue a document: position, per-layer K/V of the sliding window, the recurrent state
    c_b of the current block b with its keys/values, and the recurrent layer's normed inputs of block b so far."""

    layers: list[KVCache]
    pos: int = 0
    state: torch.Tensor | None = None  # [B, N, D] c_b, the state every token of the current block reads
    state_k: torch.Tensor | None = None  # [B, H, N, E] its keys and values (kept: a step reads them, never re-projects)
    state_v: torch.Tensor | None = None
    partial: torch.Tensor | None = None  # [B, <S, D] the recurrent layer's normed inputs h of the unfinished block

    def memory_bytes(self) -> int:
        """The recurrent state and its keys/values: 3 N D numbers per document, whatever the document's length."""
        return sum(t.numel() * t.element_size() for t in (self.state, self.state_k, self.state_v) if t is not None)

    def window_bytes(self) -> int:
        """The sliding-window K/V of every layer (two segments per layer at most) and the unfinished block's inputs to
        the recurrent layer (less than one segment), which the state update at the block's end reads."""
        part = self.partial.numel() * self.partial.element_size() if self.partial is not None else 0
        return sum(c.nbytes() for c in self.layers) + part


class StateCell(nn.Module):
    """The horizontal direction: the update c_b -> c_{b+1} of the N state vectors from one block of token states."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        D, N = cfg.d_model, cfg.block_recurrent.state
        self.n_heads = cfg.n_heads
        self.gate_kind = cfg.block_recurrent.gate
        self.initial_state = nn.Parameter(torch.zeros(N, D))  # c_0 (drawn by init_weights)
        self.state_ids = nn.Parameter(torch.zeros(N, D))  # learned state IDs (drawn in `init_state_ids`)
        self.state_norm = RMSNorm(D, cfg.norm_eps)
        self.kv = nn.Linear(D, 2 * D, bias=False)  # the state's keys/values: read by the tokens and by the state itself
        self.q = nn.Linear(D, 2 * D, bias=False)  # the state's queries: [self-attention | cross-attention to tokens]
        self.out = nn.Linear(2 * D, D, bias=False)  # projection of the concatenated attention outputs
        self.mlp_norm = RMSNorm(D, cfg.norm_eps)
        self.mlp = SwiGLU(D, cfg.mlp_hidden)  # no dropout in the horizontal direction (Hutchins)
        if self.gate_kind == "fixed":
            self.attn_keep = nn.Parameter(torch.full((D,), KEEP_LOGIT))  # g = sigmoid(keep) per dimension
            self.mlp_keep = nn.Parameter(torch.full((D,), KEEP_LOGIT))
        else:  # "learned": LSTM-style input and forget gates from [z, c]
            self.attn_gate = nn.Linear(2 * D, 2 * D)
            self.mlp_gate = nn.Linear(2 * D, 2 * D)

    def init_state_ids(self, seed: int, name: str) -> None:
        if self.state_ids.is_meta:
            return
        with torch.no_grad():
            g = keyed_generator(seed, name)
            self.state_ids.copy_(torch.randn(self.state_ids.shape, generator=g) * STATE_ID_STD)

    def initial(self, batch: int) -> torch.Tensor:
        return self.initial_state[None].expand(batch, -1, -1)  # [B, N, D]

    def project(self, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """c [B, N, D] -> s [B, N, D] (normed state + IDs), keys and values [B, H, N, E]."""
        s = self.state_norm(c) + self.state_ids.to(c.dtype)
        k, v = self.kv(s).chunk(2, dim=-1)
        return s, _heads(k, self.n_heads), _heads(v, self.n_heads)

    def _gate(self, which: str, c: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        if self.gate_kind == "fixed":
            g = torch.sigmoid(getattr(self, f"{which}_keep").float())
            return c * g + z * (1 - g)
        logits = getattr(self, f"{which}_gate")(torch.cat([z.to(c.dtype), c], dim=-1))  # [B, N, 2D]
        i, f = logits.float().chunk(2, dim=-1)
        return c * torch.sigmoid(f + KEEP_LOGIT) + z * torch.sigmoid(i - KEEP_LOGIT)

    def forward(self, c: torch.Tensor, s: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tk: torch.Tensor,
                tv: torch.Tensor) -> torch.Tensor:
        """c [B, N, D] the state c_b, (s, k, v) = project(c); tk, tv [B, H, S, E] block b's token keys/values
        -> c_{b+1} [B, N, D]."""
        q_self, q_cross = (_heads(q, self.n_heads) for q in self.q(s).chunk(2, dim=-1))  # [B, H, N, E]
        a = torch.cat([_merge(F.scaled_dot_product_attention(q_self, k, v)),  # the state vectors among themselves
                       _merge(F.scaled_dot_product_attention(q_cross, tk, tv))], dim=-1)  # the state reads the block
        c = self._gate("attn", c, self.out(a))
        return self._gate("mlp", c, self.mlp(self.mlp_norm(c)))


class RecurrentLayer(nn.Module):
    """The recurrent layer: xl's layer (same `attn_norm`, `attn`, `mlp_norm`, `mlp`) whose tokens also read the
    state (`read_q`, `read_out`), and the state cell (`cell`) that turns each finished block into the next state."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        D = cfg.d_model
        self.attn_norm = RMSNorm(D, cfg.norm_eps)
        self.attn = SelfAttention(D, cfg.n_heads, cfg.dropout)
        self.read_q = nn.Linear(D, D, bias=False)  # token queries to the state
        self.read_out = nn.Linear(D, D, bias=False)  # the cross-attention half of the concatenated projection
        self.read_drop = nn.Dropout(cfg.dropout)
        self.mlp_norm = RMSNorm(D, cfg.norm_eps)
        self.mlp = SwiGLU(D, cfg.mlp_hidden, cfg.dropout)
        self.cell = StateCell(cfg)
        self.segment_len = cfg.segment_len
        self.n_heads = cfg.n_heads

    def _token_kv(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h [B, L, D] -> block keys/values [B, H, L, E] for the state's cross-attention: the key and value rows of
        `attn.qkv` (shared with the token self-attention, as Hutchins share K/V), without the rotary."""
        D = h.shape[-1]
        k, v = F.linear(h, self.attn.qkv.weight[D:]).chunk(2, dim=-1)
        return _heads(k, self.n_heads), _heads(v, self.n_heads)

    def _read(self, h: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Tokens h [B', L, D] read the state's keys/values [B', H, N, E] (all of it: it holds only the past)."""
        q = _heads(self.read_q(h), self.n_heads)
        y = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype),
                                           dropout_p=self.attn.attn_dropout if self.training else 0.0)
        return self.read_drop(self.read_out(_merge(y)))

    def forward(self, x: torch.Tensor, rot: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x [B, T, D] with T a multiple of S (the whole sequence from its start)."""
        B, T, D = x.shape
        S = self.segment_len
        nB = T // S
        h = self.attn_norm(x)  # [B, T, D]
        y = self.attn(h, *rot, S)
        tk, tv = self._token_kv(h[:, : T - S])  # [B, H, T - S, E]: the blocks whose successor state is read
        c = self.cell.initial(B)
        ks, vs = [], []
        for b in range(nB):  # the recurrence: c_b -> c_{b+1}; the last block's successor is never read here
            s, k, v = self.cell.project(c)
            ks.append(k)
            vs.append(v)
            if b < nB - 1:
                blk = slice(b * S, (b + 1) * S)
                c = self.cell(c, s, k, v, tk[:, :, blk], tv[:, :, blk])
        H, N, E = ks[0].shape[1:]
        k = torch.stack(ks, 1).reshape(B * nB, H, N, E)  # block b's state keys, one attention problem per block
        v = torch.stack(vs, 1).reshape(B * nB, H, N, E)
        y = y + self._read(h.reshape(B * nB, S, D), k, v).view(B, T, D)
        x = x + y
        return x + self.mlp(self.mlp_norm(x))

    def step(self, x: torch.Tensor, rot: tuple[torch.Tensor, torch.Tensor], lc: KVCache,
             cache: BlockRecurrentCache) -> torch.Tensor:
        """x [B, n, D]: new tokens inside one block, continuing `cache` (updated in place; the state only when the
        block's last token is in)."""
        B = x.shape[0]
        S = self.segment_len
        if cache.state is None:
            cache.state = self.cell.initial(B).clone()
            _, cache.state_k, cache.state_v = self.cell.project(cache.state)
        h = self.attn_norm(x)
        y = self.attn.step(h, *rot, lc, S) + self._read(h, cache.state_k, cache.state_v)
        x = x + y
        x = x + self.mlp(self.mlp_norm(x))
        cache.partial = h if cache.partial is None else torch.cat([cache.partial, h], dim=1)
        if cache.partial.shape[1] == S:  # block finished: c_b -> c_{b+1}
            tk, tv = self._token_kv(cache.partial)
            s, k, v = self.cell.project(cache.state)
            cache.state = self.cell(cache.state, s, k, v, tk, tv)
            _, cache.state_k, cache.state_v = self.cell.project(cache.state)
            cache.partial = None
        return x


class BlockRecurrentTransformer(SegmentDecoder):
    """xl with one recurrent layer (`cfg.recurrent_layer_index`); forward is `SegmentDecoder`'s, and step differs only
    in handing the recurrent layer the whole cache (its state and the unfinished block)."""

    def build_layers(self, cfg: ModelConfig) -> list[nn.Module]:
        if cfg.variant != VARIANT:
            raise ValueError(f"BlockRecurrentTransformer is the {VARIANT!r} variant, not {cfg.variant!r}")
        self.recurrent_index = r = cfg.recurrent_layer_index
        return [RecurrentLayer(cfg) if i == r else DecoderLayer(cfg, with_cca=False) for i in range(cfg.n_layers)]

    @classmethod
    def layer_activation_elements(cls, cfg: ModelConfig, T: int, math_attention: bool) -> int:
        """xl's layers plus the recurrent layer's: per token, its queries to the state, their output and projection,
        the block keys/values it hands the cell (5 D); per state vector and block, the cell's norms, projections,
        attention outputs, gates and MLP (about 12 D + 4 F). The state's attentions have no mask, so even the CPU
        takes a fused kernel for them and keeps no score matrix (measured: docs/results/speed.md#step-memory)."""
        D, F, S, N = cfg.d_model, cfg.mlp_hidden, cfg.segment_len, cfg.block_recurrent.state
        per_token = 5 * D
        per_state = 12 * D + 4 * F
        return (super().layer_activation_elements(cfg, T, math_attention) + T * per_token
                + max(0, -(-T // S) - 1) * N * per_state)

    def init_extra(self, seed: int) -> None:
        self.recurrent.cell.init_state_ids(seed, f"layers.{self.recurrent_index}.cell.state_ids")

    @property
    def recurrent(self) -> RecurrentLayer:
        return self.layers[self.recurrent_index]  # type: ignore[return-value]

    def new_cache(self, memory: object = None) -> BlockRecurrentCache:
        """A fresh cache for one batch of documents: the state restarts from the learned initial state (start every
        document with a new cache). `memory` (a chunk memory for the retrieval variants) is ignored."""
        return BlockRecurrentCache(layers=[KVCache() for _ in self.layers])

    def _step_piece(self, input_ids: torch.Tensor, cache: BlockRecurrentCache) -> torch.Tensor:
        rot = self._rot(cache.pos, input_ids.shape[1], input_ids.device)
        x = self.embed(input_ids)
        for i, (layer, lc) in enumerate(zip(self.layers, cache.layers, strict=True)):
            x = layer.step(x, rot, lc, cache) if i == self.recurrent_index else layer(x, rot, cache=lc)
        return self._logits(x)


__all__ = ["BlockRecurrentCache", "BlockRecurrentTransformer", "RecurrentLayer", "StateCell"]
