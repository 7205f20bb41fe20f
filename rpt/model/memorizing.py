"""The Memorizing Transformer baseline (Wu, Rabe, Hutchins & Szegedy 2022, "Memorizing Transformers", ICLR; the
"Memorizing Transformer (32K / 65K)" rows of the RPT paper's Table 2, §4.2): xl's sliding-window decoder in which one
upper layer also attends, through an exact k-nearest-neighbour lookup, to the (key, value) pairs of the document's
earlier tokens held in an external, non-differentiable memory.

The kNN-augmented layer (`KNNAttention`, layer `cfg.memory_layer_index`), per head h and query token t:

    local  = softmax(q_t K_win^T / sqrt(E)) V_win                 the sliding window of every layer (segments s-1, s)
    ids    = top-k_j  q_t . k_j  over the memory                    exact inner-product search, k = cfg.memorizing.topk
    mem    = softmax(q_t K_ids^T / sqrt(E)) V_ids                   a softmax of its own over the k retrieved entries
    out    = g_h mem + (1 - g_h) local,   g_h = sigmoid(b_h)         before the output projection (Wu et al. §3)

The memory of segment s holds this layer's own keys and values of the tokens that have left its window: segments
0 .. s-2 of the document, at most `cfg.memorizing.tokens` of them, the oldest dropped first. The first two segments of a
document therefore read no memory (the layer is plain local attention there).

Choices, Wu et al.'s and ours:
  - one kNN layer near the top, as Wu et al. and as the RPT paper ran their official code: `cfg.memory_layer_index`
    (default n_layers - 4, index 8 of 0..11 at 250m as the official code's 4th from the top, never below the middle layer);
    every other layer is xl's `DecoderLayer`.
  - k = cfg.memorizing.topk = 32 retrieved entries per query and head (Wu et al.'s k), in every preset.
  - memory size cfg.memorizing.tokens = 65,536 tokens in every preset (the paper's 65K row; 32,768 gives the 32K row).
    Training sequences (1,024 tokens at tiny, 16,384 at 250m) are shorter, so the cap binds only at evaluation.
  - the gate is one learned scalar b_h per head, started at 0 (g = 0.5), as in Wu et al.'s code.
  - no positions on memory entries: memory keys are the layer's keys before rotary, matched with the queries before
    rotary; the window rotates both as every layer does (as Wu et al.'s code does with rotary positions).
  - ours: no normalisation of keys and queries. Wu et al. normalise them (in every layer) against the staleness of
    memories written by older parameters at earlier training steps; here the memory is written by the same parameters
    in the same forward pass (training) or by frozen ones (evaluation), so nothing is stale, and the trunk stays xl's
    (the same function and the same parameters). Memory logits are q . k / sqrt(E), as the window's.
  - ours: the lookup is exact (a matmul, or a Faiss `IndexFlatIP` per (batch row, head)), not approximate. It is
    non-differentiable, as theirs: memory keys and values are detached; the query still receives gradients through
    the retrieved entries' logits, and the gate through the mix.
  - ours: the memory starts empty at every document and, in training, is built from the training sequence itself
    (Wu et al. carried it across the training steps of one long document). Segment s-1 is not in the memory: it is
    in the window already.

Parameter budget: the trunk is xl's exactly (12 layers, D = 1024, 8 heads, SwiGLU 2730, tied embedding) plus one gate
scalar per head: 202.5M at the 250m preset against the 212M the paper reports for its baselines. We match xl's width
and depth rather than pad to 212M, so that the comparison with xl isolates the memory.

Training vs evaluation: `forward` computes the whole sequence at once; segment s's exact top-k over its memory (the
tokens of segments 0 .. s-2, the last memory_tokens of them) is one batched [B, H, S, L] matmul and top-k per segment
(a loop over segments, never over tokens). `new_cache` + `step` compute the same function token by token or segment
by segment: a segment's unrotated keys and values enter the `TokenMemory` when it leaves the window. The two agree up
to float rounding, except that an exact top-k may swap two entries whose scores tie to rounding (about one query in
1e5 in the tests' random models). Evaluation passes `new_cache` the chunk-memory factory of `rpt.model.memory`; it is
read as the token memory of the same kind (torch on GPU, Faiss on CPU).

Dimension letters: B batch, T tokens, S segment length, H heads, E head dim, D width, V vocabulary, L tokens in the
memory, Q query tokens, k retrieved entries per query and head.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rpt.config import ModelConfig
from rpt.model.decoder import SegmentDecoder
from rpt.model.layers import KVCache, SelfAttention, apply_rotary, attend_after_cache, autocast_off, segment_window_mask
from rpt.model.retriever import top_k
from rpt.model.rpt import DecoderLayer
from rpt.utils import MissingDependency, require

TokenMemoryKind = Literal["auto", "torch", "faiss"]

_SEARCH_BLOCK = 1 << 26  # scores per torch search block (256 MB of fp32): queries are searched in blocks of this size


# ---------------------------------------------------------------------------------------------------------------
# The kNN memory (evaluation): one interface, a torch matmul and a Faiss flat inner-product index behind it.


class TokenMemory:
    """The kNN memory of one attention layer for one batch of documents: per (batch row, head) the keys and values of
    the tokens that have left the sliding window, oldest first, at most `capacity` of them (FIFO).

    `add(keys, values)` [B, H, n, E]; `search(queries [B, H, Q, E], k)` -> ids, scores [B, H, Q, k]: the k keys of
    largest inner product per query and head, ids are positions in the memory as it is now (0 = the oldest held),
    -1 / -inf where it holds fewer than k; `values_at(ids)` -> [B, H, Q, k, E]. Values live here (torch, on the
    model's device); the keys live in the subclass's index."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a token memory needs capacity >= 1, not {capacity}")
        self.capacity = capacity
        self._values: torch.Tensor | None = None  # [B, H, L, E]

    @property
    def n_tokens(self) -> int:
        return 0 if self._values is None else self._values.shape[2]

    def add(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """keys/values [B, H, n, E] of the next n tokens; the oldest are dropped beyond `capacity`."""
        n = keys.shape[2]
        keep = min(n, self.capacity)
        keys, values = keys[:, :, n - keep :].detach().float(), values[:, :, n - keep :].detach()
        drop = max(0, self.n_tokens + keep - self.capacity)
        if drop:
            self._drop_keys(drop)
        self._add_keys(keys)
        old = self._values
        self._values = values.clone() if old is None else torch.cat([old[:, :, drop:], values], dim=2)

    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        B, H, Q, _ = queries.shape
        if self.n_tokens == 0:
            return (torch.full((B, H, Q, k), -1, dtype=torch.long, device=queries.device),
                    torch.full((B, H, Q, k), float("-inf"), device=queries.device))
        return self._search(queries.detach().float(), k)

    def values_at(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, H, Q, k] (-1 allowed: zeros there) -> values [B, H, Q, k, E]."""
        assert self._values is not None
        B, H, Q, k = ids.shape
        E = self._values.shape[-1]
        flat = ids.clamp(min=0).reshape(B, H, Q * k, 1).expand(-1, -1, -1, E)
        got = torch.gather(self._values, 2, flat).view(B, H, Q, k, E)
        return got.masked_fill((ids < 0)[..., None], 0)

    def nbytes(self) -> int:
        values = 0 if self._values is None else self._values.numel() * self._values.element_size()
        return values + self._key_bytes()

    # --- the key index ------------------------------------------------------------------------------------------
    def _add_keys(self, keys: torch.Tensor) -> None:  # keys [B, H, n, E] fp32
        raise NotImplementedError

    def _drop_keys(self, n: int) -> None:  # drop the n oldest keys of every (batch row, head)
        raise NotImplementedError

    def _search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _key_bytes(self) -> int:
        raise NotImplementedError


class TorchTokenMemory(TokenMemory):
    """Exact inner-product search with a matmul over the keys (fp32, on the model's device)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._keys: torch.Tensor | None = None  # [B, H, L, E]

    def _add_keys(self, keys: torch.Tensor) -> None:
        self._keys = keys.clone() if self._keys is None else torch.cat([self._keys, keys], dim=2)

    def _drop_keys(self, n: int) -> None:
        assert self._keys is not None
        self._keys = self._keys[:, :, n:]

    def _search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        assert self._keys is not None
        B, H, Q, _ = queries.shape
        block = max(1, _SEARCH_BLOCK // (B * H * self._keys.shape[2]))  # bound the [B, H, Q, L] scores
        parts = [top_k(queries[:, :, i : i + block] @ self._keys.transpose(-1, -2), k) for i in range(0, Q, block)]
        return torch.cat([p[0] for p in parts], 2), torch.cat([p[1] for p in parts], 2)

    def _key_bytes(self) -> int:
        return 0 if self._keys is None else self._keys.numel() * self._keys.element_size()


class FaissTokenMemory(TokenMemory):
    """Exact inner-product search with one Faiss `IndexFlatIP` per (batch row, head), on the CPU whatever the model's
    device; the same ids as `TorchTokenMemory` (tested), scores up to float rounding. Dropping the oldest n keys
    removes ids 0..n-1 and renumbers the rest, so ids stay positions in the memory as in the torch memory."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._faiss = require("faiss", "the Faiss token memory of the memorizing baseline (--memory faiss)")
        self._indexes: list = []  # B * H indexes, row-major over (batch row, head)
        self._shape: tuple[int, int] = (0, 0)

    def _add_keys(self, keys: torch.Tensor) -> None:
        B, H, _, E = keys.shape
        if not self._indexes:
            self._indexes = [self._faiss.IndexFlatIP(E) for _ in range(B * H)]
            self._shape = (B, H)
        host = keys.cpu().numpy().reshape(B * H, -1, E)
        for index, rows in zip(self._indexes, host, strict=True):
            index.add(np.ascontiguousarray(rows))

    def _drop_keys(self, n: int) -> None:
        for index in self._indexes:
            index.remove_ids(self._faiss.IDSelectorRange(0, n))

    def _search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        B, H, Q, E = queries.shape
        host = queries.cpu().numpy().reshape(B * H, Q, E)
        ids = np.empty((B * H, Q, k), np.int64)
        scores = np.empty((B * H, Q, k), np.float32)
        for i, index in enumerate(self._indexes):
            scores[i], ids[i] = index.search(np.ascontiguousarray(host[i]), k)
        scores[ids < 0] = -np.inf  # Faiss pads missing results with id -1 and -FLT_MAX
        dev = queries.device
        return (torch.from_numpy(ids).view(B, H, Q, k).to(dev), torch.from_numpy(scores).view(B, H, Q, k).to(dev))

    def _key_bytes(self) -> int:
        return sum(index.ntotal * index.d * 4 for index in self._indexes)  # IndexFlat stores float32 vectors


TokenMemoryFactory = Callable[[int], TokenMemory]  # capacity -> an empty memory


def token_memory_factory(kind: TokenMemoryKind = "auto", device: torch.device | str = "cpu") -> TokenMemoryFactory:
    """A factory of empty token memories: "torch" (matmul), "faiss" (IndexFlatIP on CPU; fails now when faiss is not
    installed), "auto": torch on a GPU, Faiss on CPU (torch when faiss is missing: both are exact)."""
    if kind == "torch":
        return TorchTokenMemory
    if kind == "faiss":
        require("faiss", "the Faiss token memory of the memorizing baseline (--memory faiss)")
        return FaissTokenMemory
    if kind != "auto":
        raise ValueError(f"memory must be auto, faiss or torch, not {kind!r}")
    if torch.device(device).type != "cpu":
        return TorchTokenMemory
    try:
        require("faiss")
    except MissingDependency:
        return TorchTokenMemory
    return FaissTokenMemory


# ---------------------------------------------------------------------------------------------------------------
# The kNN-augmented attention layer.


@dataclass
class KNNLayerCache(KVCache):
    """The kNN layer's cache: its window K/V (rotated keys, as every layer), the same keys before rotary (what enters
    the memory when a segment leaves the window: raw_prev_k [B, H, S, E], raw_cur_k [B, H, <S, E]) and the memory."""

    memory: TokenMemory | None = None
    raw_prev_k: torch.Tensor | None = None
    raw_cur_k: torch.Tensor | None = None

    def nbytes(self) -> int:  # the window only; the memory is counted apart (MemorizingCache.memory_bytes)
        raw = sum(t.numel() * t.element_size() for t in (self.raw_prev_k, self.raw_cur_k) if t is not None)
        return super().nbytes() + raw

    def roll(self, k: torch.Tensor, v: torch.Tensor, k_raw: torch.Tensor, segment_len: int) -> None:
        """Append new tokens' keys [B, H, n, E] (rotated and not) and values; when they complete a segment, the
        previous segment leaves the window and enters the memory."""
        assert self.memory is not None
        done = (0 if self.cur_k is None else self.cur_k.shape[2]) + k.shape[2] == segment_len
        if done and self.prev_k is not None:
            assert self.raw_prev_k is not None and self.prev_v is not None
            self.memory.add(self.raw_prev_k, self.prev_v)
        self.raw_cur_k = k_raw if self.raw_cur_k is None else torch.cat([self.raw_cur_k, k_raw], dim=2)
        self.append(k, v, segment_len)
        if done:
            self.raw_prev_k, self.raw_cur_k = self.raw_cur_k, None


class KNNAttention(SelfAttention):
    """Sliding-window self-attention plus attention over the top-k entries of a kNN memory, mixed per head by a
    learned gate g = sigmoid(mem_gate) before the output projection (Wu et al. §3, "kNN-augmented attention").

    The same parameters as `SelfAttention` (qkv, out), so paired initialisation shares them with xl, plus mem_gate [H].
    """

    def __init__(self, dim: int, n_heads: int, topk: int, memory_tokens: int, dropout: float = 0.0) -> None:
        super().__init__(dim, n_heads, dropout)
        self.topk = topk
        self.memory_tokens = memory_tokens
        self.mem_gate = nn.Parameter(torch.zeros(n_heads))  # b_h: g = 0.5 at the start (init_weights keeps vectors)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, D] -> q, k, v [B, H, T, E] before rotary."""
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return q, k, v

    def _read(self, scores: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """The memory attention: scores [B, H, Q, k] (q . k of the retrieved keys, -inf for empty slots), values
        [B, H, Q, k, E] -> [B, H, Q, E] fp32."""
        p = torch.softmax(scores.float() / math.sqrt(self.head_dim), dim=-1)
        p = F.dropout(p, self.attn_dropout, self.training)
        return torch.einsum("bhqk,bhqke->bhqe", p, values.float())

    def _mix(self, local: torch.Tensor, mem: torch.Tensor) -> torch.Tensor:
        """out = g mem + (1 - g) local per head; local [B, H, Q, E] (its dtype is kept), mem [B, H, Q, E] fp32."""
        g = torch.sigmoid(self.mem_gate.float()).view(1, -1, 1, 1)
        return (g * mem + (1 - g) * local.float()).to(local.dtype)

    def _memory_of_sequence(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, S: int) -> torch.Tensor:
        """Training: the memory read of every segment s >= 2 of a whole sequence. q, k, v [B, H, T, E] before rotary;
        segment s reads the tokens [max(0, (s-1)S - memory_tokens), (s-1)S) -> [B, H, T - 2S, E] fp32."""
        B, H, T, E = q.shape
        # the lookup is non-differentiable. k is a strided view of the qkv projection: without .contiguous() every
        # segment's matmul copied its [B, H, L, E] slice of the keys and autograd kept the copy, memory quadratic in T
        kd, vd = k.detach().float().contiguous(), v.detach()
        out = []
        for s in range(2, T // S):
            hi = (s - 1) * S
            lo = max(0, hi - self.memory_tokens)
            scores = q[:, :, s * S : (s + 1) * S].float() @ kd[:, :, lo:hi].transpose(-1, -2)  # [B, H, S, L]
            top, ids = scores.topk(min(self.topk, hi - lo), dim=-1)  # [B, H, S, k]; top keeps the query's gradient
            kk = ids.shape[-1]
            sel = torch.gather(vd[:, :, lo:hi], 2, ids.reshape(B, H, S * kk, 1).expand(-1, -1, -1, E))
            out.append(self._read(top, sel.view(B, H, S, kk, E)))
        return torch.cat(out, dim=2)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segment_len: int) -> torch.Tensor:
        """x [B, T, D] with T a multiple of S; cos/sin [T, E] for absolute positions."""
        B, T, D = x.shape
        nS, S, H, E = T // segment_len, segment_len, self.n_heads, self.head_dim
        q0, k0, v = self._project(x)  # [B, H, T, E], no positions: what the memory stores and is searched with
        q, k = apply_rotary(q0, cos, sin), apply_rotary(k0, cos, sin)
        # the local window, as SelfAttention: one problem per (batch, segment), keys = previous ++ own segment
        qs, ks, vs = (t.view(B, H, nS, S, E).transpose(1, 2) for t in (q, k, v))  # [B, nS, H, S, E]
        ks = torch.cat([F.pad(ks, (0, 0, 0, 0, 0, 0, 1, 0))[:, :-1], ks], dim=3)  # [B, nS, H, 2S, E]
        vs = torch.cat([F.pad(vs, (0, 0, 0, 0, 0, 0, 1, 0))[:, :-1], vs], dim=3)
        mask = segment_window_mask(nS, S, x.device)[:, None].repeat(B, 1, 1, 1)  # [B*nS, 1, S, 2S]
        y = F.scaled_dot_product_attention(qs.reshape(B * nS, H, S, E), ks.reshape(B * nS, H, 2 * S, E),
                                           vs.reshape(B * nS, H, 2 * S, E), attn_mask=mask,
                                           dropout_p=self.attn_dropout if self.training else 0.0)
        y = y.view(B, nS, H, S, E).transpose(1, 2).reshape(B, H, T, E)
        if nS > 2:  # segments 0 and 1 have an empty memory: local attention only
            with autocast_off(x.device.type):  # search and memory attention in fp32
                mem = self._memory_of_sequence(q0, k0, v, S)
                y = torch.cat([y[:, :, : 2 * S], self._mix(y[:, :, 2 * S :], mem)], dim=2)
        return self.dropout(self.out(y.transpose(1, 2).reshape(B, T, D)))

    def step(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KNNLayerCache,  # type: ignore[override]
             segment_len: int) -> torch.Tensor:
        """x [B, n, D]: new tokens inside one segment, continuing `cache` (window and memory, updated in place)."""
        B, n, D = x.shape
        q0, k0, v = self._project(x)
        q, k = apply_rotary(q0, cos, sin), apply_rotary(k0, cos, sin)
        y = attend_after_cache(q, k, v, cache)  # [B, H, n, E]
        memory = cache.memory
        assert memory is not None
        if memory.n_tokens:  # empty exactly in the document's first two segments, as in forward
            with autocast_off(x.device.type):
                ids, scores = memory.search(q0.float(), self.topk)  # [B, H, n, k]
                y = self._mix(y, self._read(scores, memory.values_at(ids)))
        cache.roll(k, v, k0, segment_len)
        return self.out(y.transpose(1, 2).reshape(B, n, D))


class MemorizingLayer(DecoderLayer):
    """xl's pre-norm block (`DecoderLayer` without CCA) with kNN-augmented self-attention."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg, with_cca=False)
        self.attn = KNNAttention(cfg.d_model, cfg.n_heads, cfg.memorizing.topk, cfg.memorizing.tokens, cfg.dropout)


# ---------------------------------------------------------------------------------------------------------------
# The model.


@dataclass
class MemorizingCache:
    """Everything needed to continue a batch of documents: position and each layer's cache (the kNN layer's holds the
    token memory). A new document needs a new cache: that is what empties the memory."""

    layers: list[KVCache]
    memory_layer: int
    pos: int = 0

    @property
    def memory(self) -> TokenMemory:
        mem = self.layers[self.memory_layer].memory  # type: ignore[attr-defined]
        assert mem is not None
        return mem

    def memory_bytes(self) -> int:
        """The kNN memory: grows with the document up to memory_tokens (keys fp32 + values) per head and row."""
        return self.memory.nbytes()

    def window_bytes(self) -> int:
        """The sliding-window K/V of every layer (the kNN layer's unrotated window keys included): at most 2S each."""
        return sum(c.nbytes() for c in self.layers)


class MemorizingTransformer(SegmentDecoder):
    """xl with one kNN-augmented layer (`cfg.memory_layer_index`); forward and step are `SegmentDecoder`'s."""

    def build_layers(self, cfg: ModelConfig) -> list[nn.Module]:
        mi = cfg.memory_layer_index
        return [MemorizingLayer(cfg) if i == mi else DecoderLayer(cfg, with_cca=False) for i in range(cfg.n_layers)]

    @classmethod
    def layer_activation_elements(cls, cfg: ModelConfig, T: int, math_attention: bool) -> int:
        """xl's layers plus, in the kNN layer, per token of segments 2.. (those that read the memory): the k retrieved
        values (k D over the heads), the k probabilities and the k int64 indices per head (3 k H in fp32 units; the
        scores before the softmax are not kept), the memory output and the mix (3 D); and the detached fp32 keys
        searched (D per token). Measured with saved-tensor hooks at 2 x 8,192 tokens (tiny): the model keeps 159 MiB
        more for backward than xl, 163 MiB counted here."""
        S, k = cfg.segment_len, cfg.memorizing.topk
        reading = max(0, T - 2 * S)
        extra = reading * (k * cfg.d_model + 3 * cfg.n_heads * k + 3 * cfg.d_model) + T * cfg.d_model
        return super().layer_activation_elements(cfg, T, math_attention) + extra

    @classmethod
    def temporary_bytes(cls, cfg: ModelConfig, batch: int, T: int) -> int:
        """The exact search of the last segment: its [B, H, S, L] fp32 scores over the memory (L up to
        memory_tokens), and as much again for the top-k and, in backward, the scores' gradient."""
        S = cfg.segment_len
        L = min(max(0, T - 2 * S), cfg.memorizing.tokens)
        return 2 * 4 * batch * cfg.n_heads * S * L

    # ------------------------------------------------------------------------------------------------------------
    def new_cache(self, memory: TokenMemoryKind | TokenMemoryFactory | TokenMemory | type | None = None) -> MemorizingCache:
        """A fresh cache, with an empty token memory, for one batch of documents (start every document with a new one).

        memory: None or "torch" (matmul), "faiss", "auto" (torch on GPU, Faiss on CPU); a factory capacity -> an empty
        `TokenMemory`; an empty `TokenMemory`; or the chunk-memory factory of `rpt.model.memory.make_memory` that the
        evaluation passes every variant (`TorchMemory` / `FaissMemory`), read as the token memory of the same kind."""
        cap = self.cfg.memorizing.tokens
        mem: TokenMemory
        if isinstance(memory, TokenMemory):
            if memory.n_tokens:
                raise ValueError("new_cache needs an empty token memory: a memory holding tokens would carry one "
                                 "document into the next")
            mem = memory
        elif memory is None or isinstance(memory, str):
            device = next(self.parameters()).device
            mem = token_memory_factory(memory or "torch", device)(cap)  # type: ignore[arg-type]
        elif _is_chunk_memory_factory(memory):
            from rpt.model.memory import memory_name

            mem = token_memory_factory(memory_name(memory))(cap)  # type: ignore[arg-type]
        else:
            mem = memory(cap)  # type: ignore[operator]
            if not isinstance(mem, TokenMemory) or mem.n_tokens:
                raise TypeError(f"memory factory {memory!r} must return an empty TokenMemory")
        mi = self.cfg.memory_layer_index
        layers = [KNNLayerCache(memory=mem) if i == mi else KVCache() for i in range(self.cfg.n_layers)]
        return MemorizingCache(layers=layers, memory_layer=mi)


def _is_chunk_memory_factory(memory: object) -> bool:
    from rpt.model.memory import ChunkMemory

    return isinstance(memory, type) and issubclass(memory, ChunkMemory)
