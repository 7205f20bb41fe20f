"""The Retrieval-Pretrained Transformer (§3.1): lower decoder -> retriever -> upper decoder with chunked
cross-attention. One class serves all variants:

    xl       no retriever, no CCA: the Transformer-XL baseline (sliding-window attention only)
    retro    CCA fed with neighbour ids from outside (BM25); neighbours are raw lower-decoder states
    rpt-lex  the full model, retriever trained from BM25 labels
    rpt-sem  the full model, retriever trained from scoring-LM labels

Dimension letters (used in every shape comment):
    B batch, T tokens, S segment length, C chunks, M chunk length, K neighbours, D width, V vocabulary.

Two entry points compute the same function: `forward` over a whole sequence (training, short documents) and `step`
over any number of new tokens continuing an `RPTCache` (long-document evaluation, generation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from rpt.chunks import chunks_per_segment, last_retrievable, retrievable_mask
from rpt.config import RPT_VARIANTS, ModelConfig, RPTConfig
from rpt.model.cca import ChunkedCrossAttention, NeighborKV
from rpt.model.decoder import RPTOutput, TiedLM, draw_seed, mean_loss
from rpt.model.layers import (
    KVCache,
    RMSNorm,
    SelfAttention,
    SwiGLU,
    autocast_off,
    init_weights,
    keyed_generator,
    set_attention_dropout,
)
from rpt.model.memory import ChunkMemory, TorchMemory
from rpt.model.neighbors import GateCache, NeighborGate, QueryAugmentation, gather_neighbors
from rpt.model.retriever import ChunkEncoder, Retriever, top_k


@dataclass
class RPTCache:
    """Everything needed to continue a document: position, per-layer K/V of the sliding window, the lower-decoder
    states of the unfinished chunk, the document memory, the gating window and the last finished chunk's neighbours."""

    layers: list[KVCache]
    memory: ChunkMemory | None
    pos: int = 0
    partial: torch.Tensor | None = None  # [B, <M, D] lower states of the unfinished chunk
    gate: GateCache = field(default_factory=GateCache)
    last_row: NeighborKV | None = None  # neighbours of the most recently finished chunk (one block row)

    def memory_bytes(self) -> int:
        """The document memory's size (its peak: it only grows)."""
        return self.memory.nbytes() if self.memory is not None else 0

    def window_bytes(self) -> int:
        """The sliding-window K/V of every layer (bounded by two segments per layer)."""
        return sum(c.nbytes() for c in self.layers)


class DecoderLayer(nn.Module):
    """Pre-norm block: sliding-window self-attention -> (optional) chunked cross-attention -> SwiGLU."""

    def __init__(self, cfg: ModelConfig, with_cca: bool) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = SelfAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.cca_norm = RMSNorm(cfg.d_model, cfg.norm_eps) if with_cca else None
        self.cca = (ChunkedCrossAttention(cfg.d_model, cfg.n_heads, cfg.chunk_size, cfg.dropout, cfg.rope_base, cfg.cca.positions,
                                          cfg.norm_eps, cfg.cca.context_norm, cfg.cca.rel_bias, cfg.cca.shift_values,
                                          cfg.cca.rel_bias_init, cfg.cca.rel_bias_scale)
                    if with_cca else None)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.mlp_hidden, cfg.dropout)
        self.segment_len = cfg.segment_len

    def forward(self, x: torch.Tensor, rot: tuple[torch.Tensor, torch.Tensor], nkv: NeighborKV | None = None,
                start: int = 0, cache: KVCache | None = None, query: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, D] (tokens start .. start + T - 1) -> [B, T, D]. query [B, T, D]: the states CCA's queries are
        made from (model.cca.query = lower: the same tokens' lower-decoder states); None: x."""
        h = self.attn_norm(x)
        if cache is None:
            x = x + self.attn(h, *rot, self.segment_len)
        else:
            x = x + self.attn.step(h, *rot, cache, self.segment_len)
        if self.cca is not None and nkv is not None:
            x = x + self.cca(self.cca_norm(x if query is None else query), nkv, start)
        return x + self.mlp(self.mlp_norm(x))


def _orthogonal(d: int, generator: torch.Generator) -> torch.Tensor:
    """A d x d orthogonal matrix: the Q of a Gaussian draw's QR, computed on one thread. LAPACK's QR splits its work
    by the thread count and its last bits follow the split, so the same seed would start models at 1 and at 2 threads
    from different weights (and every later update with them); on one thread it is the same draw everywhere."""
    x = torch.randn(d, d, generator=generator)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        q, _ = torch.linalg.qr(x)
    finally:
        torch.set_num_threads(threads)
    return q


class RPT(TiedLM, nn.Module):
    def __init__(self, cfg: ModelConfig | RPTConfig, seed: int | None = None) -> None:
        """seed: the initialisation seed (`init_weights`: every variant built with one seed shares its trunk's starting
        weights); None draws it from torch's global generator, so `torch.manual_seed(s)` before building does the same."""
        super().__init__()
        cfg = cfg.model if isinstance(cfg, RPTConfig) else cfg
        if cfg.variant not in RPT_VARIANTS:
            raise ValueError(f"variant {cfg.variant!r}: the RPT class builds {', '.join(RPT_VARIANTS)}; build the "
                             f"{cfg.variant} baseline with rpt.build_model(config) (rpt.model.registry), which picks the "
                             "class of every variant")
        cfg.validate()
        seed = draw_seed(seed)
        self.cfg = cfg
        D = cfg.d_model
        self.embed = nn.Embedding(cfg.vocab_size, D)
        self.drop = nn.Dropout(cfg.dropout)
        retrieval = cfg.uses_retrieval
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, with_cca=retrieval and i in cfg.cca_layers) for i in range(cfg.n_layers)
        )
        self.norm = RMSNorm(D, cfg.norm_eps)
        self._build_retrieval(cfg)
        init_weights(self, cfg.init_std, cfg.n_layers, seed)
        set_attention_dropout(self, cfg.attn_dropout)
        if retrieval and (cfg.cca.qk_init == "match" or cfg.cca.ov_init == "identity"):
            self._cca_copy_prior(seed)

    def _build_retrieval(self, cfg: ModelConfig) -> None:
        """The retrieval parts (§3.1): the chunk encoder and retriever (rpt-lex, rpt-sem), the query augmentation and
        the neighbour gate (every retrieving variant); None where the variant has none."""
        D, M, retrieval = cfg.d_model, cfg.chunk_size, cfg.uses_retrieval
        self.encoder = ChunkEncoder(D, cfg.n_heads, M, cfg.rope_base, cfg.norm_eps, cfg.dropout) if cfg.has_retriever else None
        self.retriever = Retriever(D, cfg.norm_eps) if cfg.has_retriever else None
        self.query_aug = (QueryAugmentation(D, cfg.n_heads, cfg.rope_base, cfg.norm_eps, cfg.dropout)
                          if retrieval and cfg.query_augmentation else None)
        self.gate = (NeighborGate(D, cfg.n_heads, cfg.gate.kind, cfg.gate.eta, chunks_per_segment(M, cfg.segment_len),
                                  cfg.norm_eps, cfg.dropout) if retrieval and cfg.gate.kind != "none" else None)

    def _cca_copy_prior(self, seed: int) -> None:
        """The copy prior on CCA's projections (docs/results/code.md#the-copy-prior), each half an option:

        cca.qk_init="match": the query and key projections start as one draw W of std cfg.qk_match_std, so a logit
        is x^T W^T W y / sqrt(E) ~ sqrt(E) std^2 <x, y>: a query attends most to the neighbour tokens whose
        normalised states are most like its own (with the shifted values, it reads what followed its own token
        there). With std 0.1 and D = 64 an identical state scores ~2.6 nats above an orthogonal one. The
        content-matching counterpart of the positional prior `rel_bias_prior`: on code, BM25's neighbours are not
        aligned with the query chunk, so copying needs matching by content.

        cca.ov_init="identity": the value projection starts as an orthogonal draw Q and the output projection as
        cca.ov_scale * Q^T, so out(value(y)) = cca.ov_scale * y: a neighbour token's (normalised) state is written
        into the reading token's residual as it is. With the shifted values and the tied output embedding, reading
        the token after a match raises that token's logit from the first update: the copy circuit is there from the
        start, and training has to learn when to use it."""
        cfg, D = self.cfg, self.cfg.d_model
        for i, layer in enumerate(self.layers):
            cca = getattr(layer, "cca", None)
            if cca is None or cca.attn.q.weight.is_meta:  # meta: built for parameter counts, nothing to draw
                continue
            a = cca.attn
            with torch.no_grad():
                if cfg.cca.qk_init == "match":
                    w = torch.randn(D, D, generator=keyed_generator(seed, f"layers.{i}.cca.qk_match")) * cfg.qk_match_std
                    a.q.weight.copy_(w)
                    a.kv.weight[:D].copy_(w)
                if cfg.cca.ov_init == "identity":
                    q = _orthogonal(D, keyed_generator(seed, f"layers.{i}.cca.ov_identity"))
                    a.kv.weight[D:].copy_(q)
                    a.out.weight.copy_(q.t() * cfg.cca.ov_scale)

    # ------------------------------------------------------------------------------------------------------------
    @property
    def lower(self) -> nn.ModuleList:
        return self.layers[: self.cfg.n_lower]

    @property
    def upper(self) -> nn.ModuleList:
        return self.layers[self.cfg.n_lower :]

    def _neighbor_kv(self, chunk_states: torch.Tensor, query_states: torch.Tensor, ids: torch.Tensor,
                      chunk_idx: torch.Tensor, gate_cache: GateCache | None,
                      chunk_ids: list[int] | None = None) -> tuple[NeighborKV, torch.Tensor | None]:
        """Assemble, augment and gate neighbours. chunk_states [B, N, M, D] (all chunks so far), query_states
        [B, Q, M, D] lower states of the query chunks, ids [B, Q, K] -> one block row per query chunk."""
        nb = gather_neighbors(chunk_states, ids)  # [B, Q, K, 2M, D]
        valid = ids >= 0  # [B, Q, K]
        if self.query_aug is not None:
            nb = self.query_aug(nb, query_states)
        gates, bias, scale = None, None, None
        B, Q, K, L, D = nb.shape
        if self.gate is not None:
            gates, logit = self.gate(nb, valid, chunk_idx, gate_cache, chunk_ids)
            if self.cfg.gate.kind == "bias":
                bias = logit[..., None].expand(B, Q, K, L).reshape(B, Q, K * L)
            elif self.cfg.gate.on == "states":  # the paper's C^g = g * C: the gate also scales CCA's logits
                nb = nb * gates[..., None, None].to(nb.dtype)
            else:
                scale = gates[..., None].expand(B, Q, K, L).reshape(B, Q, K * L)
        mask = valid[..., None].expand(B, Q, K, L)
        nkv = NeighborKV(nb.reshape(B, Q, K * L, D), mask.reshape(B, Q, K * L), bias, scale)
        return nkv, gates

    def _prefix_scores(self, pooled: torch.Tensor, prefix_ids: torch.Tensor, prefix_mask: torch.Tensor | None
                       ) -> torch.Tensor:
        """Scores [B, C, Cp] of the query chunks (pooled [B, C, D]) against the chunks of the tokens before the
        sequence, -inf where the retrievable rule or the padding excludes them. The prefix's lower-decoder and
        chunk-encoder states are computed without gradient, each sequence's real prefix on its own (no padding
        enters its windows); the retriever's key projection learns from them as from any key."""
        assert self.retriever is not None
        B, P = prefix_ids.shape
        M, S = self.cfg.chunk_size, self.cfg.segment_len
        if P % S:
            raise ValueError(f"prefix_ids holds {P} tokens, not a multiple of the segment ({S})")
        Cp = P // M
        real = torch.ones_like(prefix_ids, dtype=torch.bool) if prefix_mask is None else prefix_mask.bool()
        prefix_pooled = pooled.new_zeros(B, Cp, pooled.shape[-1])
        with torch.no_grad():
            for b in range(B):
                n = int(real[b].sum())
                if n % S or not bool(real[b, P - n :].all()):
                    raise ValueError(f"prefix_mask of sequence {b}: the real prefix must be whole segments ({S} tokens) "
                                     "at the end (right-aligned)")
                if n == 0:
                    continue
                x, rot = self._embed_segments(prefix_ids[b : b + 1, P - n :])
                for layer in self.lower:
                    x = layer(x, rot)
                states = x.view(1, -1, M, x.shape[-1])
                if self.encoder is not None:
                    states = self.encoder(states)
                prefix_pooled[b, Cp - states.shape[1] :] = states[0].mean(1).to(prefix_pooled.dtype)
        q = self.retriever.queries(pooled).float()
        k = self.retriever.keys(prefix_pooled).float()
        with autocast_off(q.device.type):
            s = q @ k.transpose(1, 2)  # [B, C, Cp]
        allowed = retrievable_mask(pooled.shape[1], M, S, pooled.device, n_before=Cp)[:, :Cp]  # [C, Cp]
        whole = real.view(B, Cp, M).all(-1)  # [B, Cp]
        return s.masked_fill(~(allowed[None] & whole[:, None, :]), float("-inf"))

    @staticmethod
    def _choose(own: torch.Tensor | None, supplied: torch.Tensor | None, use_supplied: torch.Tensor | None) -> torch.Tensor:
        if supplied is None:
            assert own is not None, "this variant needs neighbor_ids (e.g. BM25 neighbours for retro)"
            return own
        if own is None or use_supplied is None:
            return supplied
        return torch.where(use_supplied[..., None], supplied, own)

    # ------------------------------------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, neighbor_ids: torch.Tensor | None = None,
                use_supplied: torch.Tensor | None = None, n_neighbors: int | None = None,
                retrieve_k: int | None = None, loss_chunk: int = 0, loss_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, prefix_ids: torch.Tensor | None = None,
                prefix_mask: torch.Tensor | None = None) -> RPTOutput:
        """input_ids [B, T]. neighbor_ids [B, C, K'] supplied neighbour chunk ids (sequence-relative, -1 = empty):
        BM25 for retro, gold for scheduled sampling, oracle at evaluation. use_supplied [B, C] picks supplied over
        the retriever's own top-K per query chunk (None: supplied everywhere when given). Supplied ids that break the
        retrievable rule are dropped, so no caller can leak the future.

        loss_chunk > 0: return the LM loss over input_ids (real tokens marked by loss_mask [B, T]) in `out.lm`,
        computed `loss_chunk` targets at a time (`lm_loss_chunked`), and no logits: the [B, T, V] logits are never
        materialised (training at large T and V). The loss is computed here rather than by the caller so that it
        reads the output embedding inside forward, where FSDP has gathered it.

        labels [B, T] (usually input_ids itself): `out.loss` is the mean next-token cross-entropy, position t scored
        on labels[t + 1] (the training loss's shift), labels of -100 not scored; the logits are still returned unless
        loss_chunk > 0.

        prefix_ids [B, P] (P a multiple of the segment), prefix_mask [B, P]: the document's tokens just before
        input_ids, right-aligned (`train.prefix_negatives`). Their chunks are scored by every query chunk into
        `out.prefix_scores` (the ranking loss's negatives from beyond the span); nothing else reads them."""
        cfg = self.cfg
        B, T = input_ids.shape
        S, M = cfg.segment_len, cfg.chunk_size
        K = n_neighbors or cfg.n_neighbors
        x, rot = self._embed_segments(input_ids)  # [B, Tp, D], padded to whole segments
        Tp = x.shape[1]
        for layer in self.lower:
            x = self._run_layer(layer, x, rot)
        out = RPTOutput(logits=x)
        nkv = None
        if cfg.uses_retrieval:
            C = Tp // M
            lower_states = x.view(B, C, M, -1)  # [B, C, M, D]
            chunk_states = self.encoder(lower_states) if self.encoder is not None else lower_states
            own = None
            if self.retriever is not None:
                scores = self.retriever.scores(chunk_states.mean(2), M, S)  # [B, C, C]
                top_ids, top_scores = top_k(scores, max(K, retrieve_k or K))
                own = top_ids[..., :K]
                out.retrieval_scores, out.top_ids, out.top_scores = scores[:, : T // M, : T // M], top_ids, top_scores
                if prefix_ids is not None:
                    out.prefix_scores = self._prefix_scores(chunk_states.mean(2)[:, : T // M], prefix_ids, prefix_mask)
            supplied = None
            if neighbor_ids is not None:
                supplied = F.pad(neighbor_ids[..., :K], (0, max(0, K - neighbor_ids.shape[-1]), 0, C - neighbor_ids.shape[1]),
                                 value=-1)
                allowed = retrievable_mask(C, M, S, x.device)  # [C, C]
                ok = allowed[torch.arange(C, device=x.device)[:, None], supplied.clamp(min=0)] & (supplied >= 0)
                supplied = supplied.masked_fill(~ok, -1)
                if use_supplied is not None:
                    use_supplied = F.pad(use_supplied, (0, C - use_supplied.shape[1]), value=False)
            chosen = self._choose(own, supplied, use_supplied)  # [B, C, K]
            row, out.gates = self._neighbor_kv(chunk_states, lower_states, chosen, torch.arange(C, device=x.device), None)
            # block r uses chunk r-1's neighbours: prepend an empty row for block 0 (tokens 0..M-2 see only the null)
            nkv = row.shifted()
            out.neighbor_ids = chosen[:, : T // M]
        query = x if nkv is not None and cfg.cca.query == "lower" else None
        for layer in self.upper:
            x = self._run_layer(layer, x, rot, nkv, 0, None, query)
        out.logits, out.lm = self._lm_head(x, input_ids, loss_chunk, loss_mask, labels)
        if labels is not None:
            out.loss = mean_loss(out.lm)
        return out

    # ------------------------------------------------------------------------------------------------------------
    def new_cache(self, memory: ChunkMemory | Callable[[], ChunkMemory] | None = None) -> RPTCache:
        """A fresh cache for one batch of documents (start every document with a new cache)."""
        mem = None
        if self.cfg.uses_retrieval:
            mem = memory() if callable(memory) else (memory or TorchMemory())
        return RPTCache(layers=[KVCache() for _ in self.layers], memory=mem)

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor, cache: RPTCache, neighbor_ids: torch.Tensor | None = None,
             use_supplied: torch.Tensor | None = None, n_neighbors: int | None = None,
             retrieve_k: int | None = None) -> RPTOutput:
        """Continue the documents in `cache` with input_ids [B, n] (any n >= 1); returns logits [B, n, V] and the
        retrieval results of the chunks that finished in this call. neighbor_ids/use_supplied are indexed by
        document-absolute chunk id ([B, C_doc, K'], [B, C_doc]) and must cover every chunk finished by this call."""
        S = self.cfg.segment_len
        outs: list[RPTOutput] = []
        i = 0
        n = input_ids.shape[1]
        while i < n:  # pieces never cross a segment boundary (a bounded loop: n / S pieces)
            take = min(n - i, S - cache.pos % S)
            outs.append(self._step_piece(input_ids[:, i : i + take], cache, neighbor_ids, use_supplied,
                                         n_neighbors or self.cfg.n_neighbors, retrieve_k))
            i += take
        return _concat_outputs(outs)

    def _step_piece(self, input_ids: torch.Tensor, cache: RPTCache, neighbor_ids: torch.Tensor | None,
                    use_supplied: torch.Tensor | None, K: int, retrieve_k: int | None) -> RPTOutput:
        cfg = self.cfg
        M, S = cfg.chunk_size, cfg.segment_len
        B, n = input_ids.shape
        p0 = cache.pos
        rot = self._rot(p0, n, input_ids.device)
        x = self.embed(input_ids)
        for layer, lc in zip(self.lower, cache.layers[: cfg.n_lower], strict=True):
            x = layer(x, rot, cache=lc)
        out = RPTOutput(logits=x)
        nkv = None
        if cfg.uses_retrieval:
            mem = cache.memory
            assert mem is not None
            c0 = mem.n_chunks
            buf = x if cache.partial is None else torch.cat([cache.partial, x], dim=1)
            nc = buf.shape[1] // M
            cache.partial = buf[:, nc * M :]
            rows = [cache.last_row] if cache.last_row is not None else [self._empty_row(B, K, x)]
            if nc:
                lower_states = buf[:, : nc * M].reshape(B, nc, M, -1)  # [B, nc, M, D]
                chunk_states = self.encoder(lower_states) if self.encoder is not None else lower_states
                mem.add_states(chunk_states)
                chunk_idx = torch.arange(c0, c0 + nc, device=x.device)
                limit = int(last_retrievable(c0, M, S))  # same for every chunk of this piece: one segment
                own = None
                if self.retriever is not None:
                    pooled = chunk_states.mean(2)
                    mem.add_keys(self.retriever.keys(pooled))
                    top_ids, top_scores = mem.search(self.retriever.queries(pooled), limit, max(K, retrieve_k or K))
                    own = top_ids[..., :K]
                    out.top_ids, out.top_scores = top_ids, top_scores
                supplied, use = None, None
                if neighbor_ids is not None:
                    sup = neighbor_ids[:, c0 : c0 + nc, :K]
                    assert sup.shape[1] == nc, f"neighbor_ids must cover chunks up to {c0 + nc - 1}"
                    sup = F.pad(sup, (0, K - sup.shape[-1]), value=-1)
                    supplied = sup.masked_fill(sup > limit, -1)
                    use = None if use_supplied is None else use_supplied[:, c0 : c0 + nc]
                chosen = self._choose(own, supplied, use)
                row, out.gates = self._neighbor_kv(mem.states, lower_states, chosen, chunk_idx, cache.gate,
                                                    list(range(c0, c0 + nc)))
                out.neighbor_ids, out.chunk_start = chosen, c0
                rows.append(row)
                cache.last_row = row.rows(slice(-1, None))
            # rows cover chunks c0-1 .. c0+nc-1, i.e. blocks c0 .. c0+nc
            nkv = NeighborKV.cat(rows, first_block=c0)
        query = x if nkv is not None and cfg.cca.query == "lower" else None
        for layer, lc in zip(self.upper, cache.layers[cfg.n_lower :], strict=True):
            x = layer(x, rot, nkv, p0, cache=lc, query=query)
        out.logits = self._logits(x)
        cache.pos += n
        return out

    def _empty_row(self, B: int, K: int, x: torch.Tensor) -> NeighborKV:
        L = K * 2 * self.cfg.chunk_size
        gated = self.gate is not None
        bias = x.new_zeros(B, 1, L) if gated and self.cfg.gate.kind == "bias" else None
        scale = x.new_zeros(B, 1, L) if gated and self.cfg.gate.kind != "bias" and self.cfg.gate.on == "values" else None
        return NeighborKV(x.new_zeros(B, 1, L, x.shape[-1]), torch.zeros(B, 1, L, dtype=torch.bool, device=x.device),
                           bias, scale)


def _concat_outputs(outs: list[RPTOutput]) -> RPTOutput:
    if len(outs) == 1:
        return outs[0]

    def cat(name: str) -> torch.Tensor | None:
        parts = [getattr(o, name) for o in outs if getattr(o, name) is not None]
        return torch.cat(parts, 1) if parts else None

    with_chunks = [o for o in outs if o.neighbor_ids is not None]
    return RPTOutput(logits=cat("logits"), neighbor_ids=cat("neighbor_ids"), top_ids=cat("top_ids"),
                     top_scores=cat("top_scores"), gates=cat("gates"),
                     chunk_start=with_chunks[0].chunk_start if with_chunks else 0)
