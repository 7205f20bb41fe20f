"""Shared pieces for the training tests: tiny token stores, random labels obeying the retrievable rule, a config,
and a small stand-in model with RPT's forward signature (used where the test is about the loop, not the model)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from torch import nn

from rpt.chunks import last_retrievable, retrievable_mask
from rpt.config import ModelConfig, RPTConfig
from rpt.data.store import StoreWriter
from rpt.labels.store import LabelStore, LabelWriter
from rpt.training.losses import Sum, lm_loss_chunked

TOKENIZER = {"name": "test-bpe", "hash": "h-test", "vocab_size": 64}


def make_store(path: Path, lengths: list[int], vocab: int = 64, chunk_size: int = 8, seed: int = 0,
               tokenizer: dict | None = None) -> Path:
    """A token store of documents with the given lengths; tokens follow a noisy repeating pattern (learnable)."""
    rng = np.random.default_rng(seed)
    with StoreWriter(path, tokenizer or TOKENIZER, chunk_size) as w:
        for d, n in enumerate(lengths):
            base = rng.integers(1, vocab, size=17)
            toks = base[np.arange(n) % len(base)]
            noise = rng.random(n) < 0.1
            toks = np.where(noise, rng.integers(1, vocab, size=n), toks)
            w.add(f"doc{d}", toks)
        w.close()
    return path


def make_labels(lengths: list[int], seq_len: int, chunk_size: int, segment_len: int, k: int = 4, kind: str = "sem",
                seed: int = 0, tokenizer: dict | None = None, span: int | str | None = None) -> LabelStore:
    """Random in-memory labels in the label store's layout: for each query chunk (n // M per document), up to k
    distinct candidates among its retrievable chunks within its training span (document-absolute ids), BM25 scores
    sorted descending, s_t ~ N(0, 1) (NaN for kind "lex")."""
    rng = np.random.default_rng(seed)
    C = seq_len // chunk_size
    n_chunks = [n // chunk_size for n in lengths]
    offsets = np.concatenate([[0], np.cumsum(n_chunks)]).astype(np.int64)
    N = int(offsets[-1])
    cands = np.full((N, k), -1, np.int32)
    bm25 = np.full((N, k), np.nan, np.float32)
    target = np.full((N, k), np.nan, np.float32)
    for d, nc in enumerate(n_chunks):
        for c in range(nc):
            s0 = (c // C) * C
            last = int(last_retrievable(c - s0, chunk_size, segment_len))
            if last < 0:
                continue
            pick = rng.permutation(last + 1)[: min(k, last + 1)] + s0
            row = offsets[d] + c
            cands[row, : len(pick)] = pick
            bm25[row, : len(pick)] = np.sort(rng.uniform(1, 10, len(pick)))[::-1]
            if kind == "sem":
                target[row, : len(pick)] = rng.normal(size=len(pick))
    manifest = {"format_version": 1, "kind": kind, "span": str(seq_len if span is None else span), "query": "pair", "k": k,
                "chunk_size": chunk_size, "segment_len": segment_len, "tokenizer": tokenizer or TOKENIZER,
                "doc_range": [0, len(lengths)], "n_rows": N}
    return LabelStore(Path("<memory>"), cands, bm25, target, offsets, manifest)


def write_label_store(path: Path, labels: LabelStore) -> Path:
    """Write in-memory labels to disk with the label pipeline's own writer."""
    m = labels.manifest
    config = {key: v for key, v in m.items() if key not in ("format_version", "doc_range", "n_rows")}
    w = LabelWriter(path, config, tuple(m["doc_range"]), np.diff(labels.chunk_offsets), int(m["k"]))
    for d in range(*m["doc_range"]):
        a, b = labels.chunk_offsets[d], labels.chunk_offsets[d + 1]
        w.write(d, labels.candidates[a:b], labels.bm25[a:b], labels.target[a:b], {})
    return w.publish({})


def tiny_config(tmp: Path, variant: str = "rpt-sem", model: dict | None = None, **train) -> RPTConfig:
    """A config small enough for CPU tests: chunks of 8, segments of 16, sequences of 64 tokens (8 chunks)."""
    doc = {
        "preset": "tiny",
        "model": {"variant": variant, "vocab_size": 64, "chunk_size": 8, "segment_len": 16, "d_model": 32, "n_heads": 2,
                  "mlp_hidden": 64, "n_neighbors": 2, "dropout": 0.0, **(model or {})},
        "data": {"seq_len": 64},
        "train": {"steps": 6, "batch_size": 2, "grad_accum": 1, "lr": 1e-2, "warmup_steps": 2, "alpha_ramp_steps": 2,
                  "checkpoint_every": 100, "log_every": 1, "out_dir": str(tmp / "run"), "keep_last": 3, **train},
    }
    return RPTConfig.from_yaml(yaml.safe_dump(doc))


@dataclass
class Out:
    logits: torch.Tensor | None
    retrieval_scores: torch.Tensor | None
    neighbor_ids: torch.Tensor | None
    lm: Sum | None = None


class StandIn(nn.Module):
    """A bigram-ish LM with a chunk retriever and RPT's forward signature; cheap, with dropout so RNG matters."""

    def __init__(self, mcfg: ModelConfig, width: int = 16, dropout: float = 0.1) -> None:
        super().__init__()
        self.cfg = mcfg
        self.emb = nn.Embedding(mcfg.vocab_size, width)
        self.mix = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.drop = nn.Dropout(dropout)
        if mcfg.has_retriever:
            self.q = nn.Linear(width, width)
            self.k = nn.Linear(width, width)
        if mcfg.uses_retrieval:
            self.nb = nn.Linear(width, width, bias=False)

    def forward(self, input_ids, neighbor_ids=None, use_supplied=None, loss_chunk=0, loss_mask=None) -> Out:
        m = self.cfg
        B, T = input_ids.shape
        M, K = m.chunk_size, m.n_neighbors
        C = T // M
        h = self.drop(torch.tanh(self.mix(self.emb(input_ids))))  # [B, T, W]
        chunks = h.view(B, C, M, -1).mean(2)  # [B, C, W]
        scores = used = None
        if m.has_retriever:
            scores = self.q(chunks) @ self.k(chunks).transpose(1, 2) / chunks.shape[-1] ** 0.5  # [B, C, C]
            scores = scores.masked_fill(~retrievable_mask(C, M, m.segment_len, device=h.device), float("-inf"))
            top = scores.topk(min(K, C), dim=-1)
            own = torch.where(torch.isfinite(top.values), top.indices, -1)
            if neighbor_ids is None:
                used = own
            elif use_supplied is None:
                used = neighbor_ids
            else:
                used = torch.where(use_supplied[..., None], neighbor_ids, own)
        elif m.uses_retrieval:
            used = neighbor_ids
        if used is not None:
            got = chunks.gather(1, used.clamp_min(0).reshape(B, -1, 1).expand(-1, -1, chunks.shape[-1]))
            got = (got.view(B, C, K, -1) * (used >= 0)[..., None]).sum(2)  # [B, C, W]
            h = h + self.nb(got).repeat_interleave(M, dim=1)
        if loss_chunk > 0:
            return Out(None, scores, used, lm_loss_chunked(self.norm(h), self.emb.weight, input_ids, loss_mask, loss_chunk))
        return Out(self.norm(h) @ self.emb.weight.T, scores, used)


def standin_factory(mcfg: ModelConfig) -> nn.Module:
    return StandIn(mcfg)


def standin_no_dropout(mcfg: ModelConfig) -> nn.Module:
    return StandIn(mcfg, dropout=0.0)
