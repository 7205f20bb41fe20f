"""Scoring with a shared prefix (§3.2 made affordable): each candidate neighbour's (c_j, c_j+1) is run through the
scoring LM once, and every query that scores that candidate continues from its cached keys and values.

A target score needs log P(c_t | c_j, c_j+1, c_q) for every BM25 candidate j of every query chunk; a chunk is a
candidate of many queries (about k of them on average), and the query's baseline context (c_i-2, c_i-1, c_q) starts
with a pair too. `HFScorer` runs every context from its first token; `SharedPrefixScorer` runs BOS + the pair once per
distinct pair and only (c_q, c_t) per query, so a scored pair costs about half the tokens.

The token ids are exactly `HFScorer`'s (context and target encoded as one string, `encode_text_pairs`): the shared
prefix of a pair is the run of its context's tokens that end inside the text of its first two chunks, so a token that
straddles the pair's end stays in the part computed per query, and the log-probabilities equal `HFScorer`'s to float
rounding (tests/retrofit/test_prefix_scorer.py). Llama-family scorers only (`rpt.model.backbone`).

Dimension letters: B rows, G groups (distinct prefixes), P prefix tokens, L suffix tokens, H heads, E head dim, D width.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from rpt.labels.scorer import DecodeBatch, HFScorer, _decode_used, encode_text_pairs
from rpt.model.backbone import BackboneAttention, check_supported, describe


class SharedPrefixScorer(HFScorer):
    """`HFScorer` with each context's leading chunk pair computed once and shared (module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        check_supported(self.model)
        shape = describe(self.model)
        self._attn = [BackboneAttention(layer.self_attn, shape["n_heads"], shape["n_kv_heads"], shape["head_dim"])
                      for layer in self.model.model.layers]
        self._prefix_len: dict[tuple[int, ...], int] = {}  # context ids -> tokens of its shared prefix
        self.prefix_tokens = 0  # prefix tokens run (each distinct prefix once), for benchmarks

    def encode_pairs(self, chunks: np.ndarray, contexts: Sequence[Sequence[int]], targets: Sequence[int],
                     decode: DecodeBatch | None) -> tuple[list[list[int]], list[list[int]]]:
        texts = _decode_used(chunks, contexts, targets, decode, self.name)
        ctx_ids, tgt_ids = encode_text_pairs(self.tokenizer, texts, contexts, targets)
        joined = ["".join(texts[c] for c in ctx) + texts[t] for ctx, t in zip(contexts, targets, strict=True)]
        lead = [len("".join(texts[c] for c in ctx[:2])) if len(ctx) > 2 else 0 for ctx in contexts]
        offsets = self.tokenizer(joined, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        for ids, offs, n in zip(ctx_ids, offsets, lead, strict=True):
            p = 0
            while p < len(ids) and offs[p][1] <= n:
                p += 1
            self._prefix_len[tuple(ids)] = p
        return ctx_ids, tgt_ids

    @torch.no_grad()
    def target_logprobs(self, contexts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]) -> list[np.ndarray]:
        out: list[np.ndarray] = [np.zeros(0, np.float32)] * len(contexts)
        groups: dict[tuple[int, ...], list[int]] = {}
        for n, ctx in enumerate(contexts):
            if len(targets[n]):
                p = self._prefix_len.get(tuple(ctx), 0)
                groups.setdefault(tuple(ctx[:p]), []).append(n)
        batch: list[tuple[tuple[int, ...], list[int]]] = []
        rows = 0
        for key, members in sorted(groups.items(), key=lambda kv: len(kv[0])):
            batch.append((key, members))
            rows += len(members)
            if rows >= self.batch_size:
                self._score(batch, contexts, targets, out)
                batch, rows = [], 0
        if batch:
            self._score(batch, contexts, targets, out)
        return out

    def _layers(self, x: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor,
                prefix: list[tuple[torch.Tensor, torch.Tensor]] | None) -> tuple[torch.Tensor, list]:
        """Run every backbone layer over x [B, L, D] at positions [B, L] after the cached prefix keys/values (one
        (k, v) [B, H, P, E] per layer, or None), key mask keep [B, P + L]. Returns (states, this call's (k, v))."""
        m = self.model.model
        cos, sin = m.rotary_emb(x, positions)
        cos, sin = cos[:, None].float(), sin[:, None].float()  # [B, 1, L, E]
        kv = []
        for i, layer in enumerate(m.layers):
            h = layer.input_layernorm(x)
            B, H, E = x.shape[0], self._attn[i].H, self._attn[i].E
            past = prefix[i] if prefix is not None else (x.new_zeros(B, H, 0, E), x.new_zeros(B, H, 0, E))
            y, new = self._attn[i].with_prefix(h, cos, sin, past, keep)
            x = x + y
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            kv.append(new)
        return x, kv

    def _score(self, batch: list[tuple[tuple[int, ...], list[int]]], contexts: Sequence[Sequence[int]],
               targets: Sequence[Sequence[int]], out: list[np.ndarray]) -> None:
        dev, emb = self.device, self.model.model.embed_tokens
        # the distinct prefixes of this batch (BOS + pair), right-padded: [G, P]
        prefixes = [list(self.prefix) + list(key) for key, _ in batch]
        P = max(len(p) for p in prefixes)
        pid = torch.full((len(batch), P), self.pad_id, dtype=torch.long)
        pkeep = torch.zeros(len(batch), P, dtype=torch.bool)
        for g, p in enumerate(prefixes):
            pid[g, : len(p)], pkeep[g, : len(p)] = torch.tensor(p, dtype=torch.long), True
        pid, pkeep = pid.to(dev), pkeep.to(dev)
        pos = torch.arange(P, device=dev).expand(len(batch), P)
        if P:
            _, pkv = self._layers(emb(pid).to(self.dtype), pos, pkeep, None)
            self.prefix_tokens += int(pkeep.sum())
        # each pair's rest: context after the prefix + target, right-padded [B, L]
        members = [(g, n) for g, (_, ns) in enumerate(batch) for n in ns]
        rests = [list(contexts[n][len(batch[g][0]) :]) + list(targets[n]) for g, n in members]
        L = max(len(r) for r in rests)
        rid = torch.full((len(members), L), self.pad_id, dtype=torch.long)
        rkeep = torch.zeros(len(members), L, dtype=torch.bool)
        for r, rest in enumerate(rests):
            rid[r, : len(rest)], rkeep[r, : len(rest)] = torch.tensor(rest, dtype=torch.long), True
        rid, rkeep = rid.to(dev), rkeep.to(dev)
        gidx = torch.tensor([g for g, _ in members], device=dev)
        plen = pkeep.sum(1)[gidx]  # [B] real prefix tokens of each row
        rpos = plen[:, None] + torch.arange(L, device=dev)[None]
        prefix = [(k[gidx], v[gidx]) for k, v in pkv] if P else None
        keep = torch.cat([pkeep[gidx], rkeep], 1) if P else rkeep
        x, _ = self._layers(emb(rid).to(self.dtype), rpos, keep, prefix)
        n_tgt = max(len(targets[n]) for _, n in members)
        where = torch.zeros(len(members), n_tgt, dtype=torch.long)  # position predicting each target token
        for r, (_, n) in enumerate(members):
            t, end = len(targets[n]), len(rests[r])
            where[r, n_tgt - t :] = torch.arange(end - t - 1, end - 1)  # the context's rest is never empty (c_q)
        where = where.to(dev)
        states = x.gather(1, where[..., None].expand(-1, -1, x.shape[-1]))  # [B, n_tgt, D]
        logits = F.linear(self.model.model.norm(states), self.model.lm_head.weight).float()
        tgt = rid.gather(1, (where + 1).clamp(max=L - 1))
        lp = (logits.gather(-1, tgt[..., None])[..., 0] - torch.logsumexp(logits, -1)).cpu().numpy()
        self.tokens_processed += int(rkeep.sum())
        for r, (_, n) in enumerate(members):
            t = len(targets[n])
            out[n] = lp[r, n_tgt - t :]


def share_prefixes(scorer: HFScorer, enabled: bool = True) -> HFScorer:
    """`scorer` as a SharedPrefixScorer (the same model, tokenizer and settings) when its model is of the Llama family
    and its tokenizer gives offsets (a fast one); otherwise, or when not `enabled`, `scorer` itself."""
    if not enabled or type(scorer) is not HFScorer or not getattr(scorer.tokenizer, "is_fast", False):
        return scorer
    try:
        check_supported(scorer.model)
    except ValueError:
        return scorer
    return SharedPrefixScorer(scorer.model, scorer.tokenizer, scorer.name, device=scorer.device,
                              batch_size=scorer.batch_size, dtype=scorer.dtype)
