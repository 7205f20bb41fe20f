"""Training sequences and their retrieval labels (§3.3-3.4, docs/design.md#batches).

Each document is cut into consecutive spans of seq_len tokens from its start (the same spans the label pipeline
used, span = seq_len). The last, shorter span is kept when it holds at least two segments (before that nothing is
retrievable) and right-padded; its loss mask is False on the padding. Padding after the real tokens is causally
harmless: no real token can see it.

Labels (rpt.labels.store) come per chunk (a document of n tokens has n // M labelled chunks) with document-absolute
candidate ids; a training sequence sees them sequence-relative, and candidates outside the sequence (or not
retrievable under `rpt.chunks`) are dropped (-1).

The order of sequences is a deterministic stream: epoch e is a permutation of all sequences seeded by (seed, e),
epochs follow each other, and step s takes the next global batch from it. The data position is a single number
(sequences consumed), so a resumed run continues with exactly the next batch, on any number of ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rpt.chunks import last_retrievable
from rpt.config import RPTConfig
from rpt.data.store import TokenStore
from rpt.labels.store import LabelError, LabelStore
from rpt.model.registry import spec

PAD_ID = 0


class LabelMismatch(ValueError):
    """Labels built for another tokenizer, chunk size, segment length, span, kind or store."""


# --------------------------------------------------------------------------------------------------------------
# stores


def open_store(store_root: str | Path, split: str = "train") -> TokenStore:
    """The token store of `split` under a `rpt prepare` root (``<root>/<split>/``), or `store_root` itself if it is one."""
    root = Path(store_root)
    return TokenStore.open(root if (root / "manifest.json").exists() else root / split)


def open_labels(path: str | Path) -> LabelStore:
    """The label store (rpt.labels.store) of the training split."""
    return LabelStore.open(path)


def check_labels(labels: LabelStore, store: TokenStore, cfg: RPTConfig) -> None:
    """Refuse labels that do not belong to this store and config, naming the mismatch (before any training step):
    another tokenizer, chunk size, segment length, span (training labels have span = data.seq_len), kind (rpt-sem
    needs scorer labels), or other documents. rpt-lex and retro use the BM25 columns of either kind."""
    try:
        labels.check_compatible(store, cfg.model.segment_len, cfg.data.seq_len,
                                kind="sem" if spec(cfg.model.variant).labels == "sem" else None)
    except LabelError as e:
        raise LabelMismatch(f"{e}; build training labels with `rpt label` for this store and config") from e
    lo, hi = (int(x) for x in labels.manifest["doc_range"])
    if (lo, hi) != (0, len(store)):
        raise LabelMismatch(f"labels {labels.path} cover documents {lo}..{hi - 1}, training needs all {len(store)} documents "
                            f"of {store.path}: merge the shards first")


# --------------------------------------------------------------------------------------------------------------
# sequences


def sequence_index(doc_lengths: np.ndarray, seq_len: int, min_len: int) -> np.ndarray:
    """All training sequences as int64 [n, 3] rows (document, first token, real length).

    Consecutive seq_len spans from each document's start; a last shorter span is kept iff it has >= min_len tokens.
    """
    rows = []
    for d, n in enumerate(np.asarray(doc_lengths, dtype=np.int64)):
        starts = np.arange(0, n, seq_len, dtype=np.int64)
        lens = np.minimum(seq_len, n - starts)
        keep = (lens == seq_len) | (lens >= min_len)
        rows.append(np.stack([np.full(keep.sum(), d), starts[keep], lens[keep]], axis=1))
    return np.concatenate(rows) if rows else np.zeros((0, 3), np.int64)


@dataclass
class Batch:
    """One micro-batch. B sequences, T = seq_len tokens, C = T / M chunks, k label candidates per chunk."""

    input_ids: torch.Tensor  # [B, T] long, PAD_ID after the real tokens
    loss_mask: torch.Tensor  # [B, T] bool, True on real tokens
    candidates: torch.Tensor | None = None  # [B, C, k] long, sequence-relative chunk ids, -1 = none
    bm25: torch.Tensor | None = None  # [B, C, k] float32
    target: torch.Tensor | None = None  # [B, C, k] float32 (NaN for lexical labels)
    index: torch.Tensor | None = None  # [B] long, the sequences' positions in the sequence index
    position: torch.Tensor | None = None  # [B] long, the sequences' positions in the data stream (unique per run)
    prefix_ids: torch.Tensor | None = None  # [B, P] long, the document's tokens before each sequence, right-aligned
    prefix_mask: torch.Tensor | None = None  # [B, P] bool, True on real prefix tokens (PAD before a document's start)

    def to(self, device: torch.device | str) -> Batch:
        def mv(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x.to(device, non_blocking=True)

        return Batch(*(mv(getattr(self, f)) for f in ("input_ids", "loss_mask", "candidates", "bm25", "target", "index",
                                                 "position", "prefix_ids", "prefix_mask")))

    @property
    def n_tokens(self) -> int:
        return int(self.loss_mask.sum())


class SequenceDataset:
    """Training sequences of a token store, with their labels made sequence-relative.

    prefix_len > 0 (a multiple of segment_len): each batch also carries the prefix_len tokens of the document before
    each sequence (`Batch.prefix_ids`, right-aligned, PAD where the document starts later): the negatives from
    beyond the span of `train.prefix_negatives`. Sequences start on multiples of seq_len, so a prefix is always whole
    segments."""

    def __init__(self, store: TokenStore, seq_len: int, chunk_size: int, segment_len: int,
                 labels: LabelStore | None = None, prefix_len: int = 0) -> None:
        if seq_len % segment_len or segment_len % chunk_size:
            raise ValueError(f"seq_len {seq_len} must be a multiple of segment_len {segment_len}, "
                             f"itself a multiple of chunk_size {chunk_size}")
        if prefix_len < 0 or prefix_len % segment_len:
            raise ValueError(f"prefix_len {prefix_len} must be a non-negative multiple of segment_len {segment_len}")
        self.store, self.labels, self.prefix_len = store, labels, prefix_len
        self.T, self.M, self.S = seq_len, chunk_size, segment_len
        self.C = seq_len // chunk_size
        self.index = sequence_index(store.doc_lengths(), seq_len, min_len=2 * segment_len)
        if labels is not None:
            self.k = int(np.asarray(labels.candidates).shape[1])
            self._offsets = np.asarray(labels.chunk_offsets, dtype=np.int64)
            self._last = last_retrievable(np.arange(self.C), chunk_size, segment_len)  # [C]

    def __len__(self) -> int:
        return len(self.index)

    def tokens(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        d, start, n = (int(x) for x in self.index[i])
        ids = np.full(self.T, PAD_ID, dtype=np.int64)
        ids[:n] = self.store.document(d)[start : start + n]
        mask = np.zeros(self.T, dtype=bool)
        mask[:n] = True
        return ids, mask

    def prefix(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """The prefix_len tokens of the document before sequence i, right-aligned (ids [P], real-token mask [P])."""
        d, start, _ = (int(x) for x in self.index[i])
        P = self.prefix_len
        n = min(P, start)
        ids = np.full(P, PAD_ID, dtype=np.int64)
        mask = np.zeros(P, dtype=bool)
        if n:
            ids[P - n :] = self.store.document(d)[start - n : start]
            mask[P - n :] = True
        return ids, mask

    def labels_of(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sequence-relative (candidates [C, k] int64, bm25 [C, k], target [C, k]) of sequence i."""
        d, start, n = (int(x) for x in self.index[i])
        s0 = start // self.M  # first chunk of the sequence, document-relative
        n_doc_chunks = int(self._offsets[d + 1] - self._offsets[d])
        q = np.arange(self.C)
        has_row = (s0 + q < n_doc_chunks) & (q * self.M < n)
        rows = self._offsets[d] + s0 + q[has_row]
        cand = np.full((self.C, self.k), -1, dtype=np.int64)
        bm25 = np.full((self.C, self.k), np.nan, dtype=np.float32)
        target = np.full((self.C, self.k), np.nan, dtype=np.float32)
        if len(rows):
            absolute = np.asarray(self.labels.candidates[rows], dtype=np.int64)
            rel = absolute - s0
            ok = (absolute >= 0) & (rel >= 0) & (rel <= self._last[has_row][:, None])
            cand[has_row] = np.where(ok, rel, -1)
            bm25[has_row] = np.asarray(self.labels.bm25[rows], dtype=np.float32)
            target[has_row] = np.asarray(self.labels.target[rows], dtype=np.float32)
        return cand, bm25, target

    def collate(self, indices: list[int] | np.ndarray) -> Batch:
        ids, mask = zip(*(self.tokens(int(i)) for i in indices), strict=True)
        batch = Batch(torch.from_numpy(np.stack(ids)), torch.from_numpy(np.stack(mask)),
                      index=torch.as_tensor(np.asarray(indices, dtype=np.int64)))
        if self.prefix_len:
            pids, pmask = zip(*(self.prefix(int(i)) for i in indices), strict=True)
            batch.prefix_ids, batch.prefix_mask = torch.from_numpy(np.stack(pids)), torch.from_numpy(np.stack(pmask))
        if self.labels is not None:
            cand, bm25, target = zip(*(self.labels_of(int(i)) for i in indices), strict=True)
            batch.candidates = torch.from_numpy(np.stack(cand))
            batch.bm25 = torch.from_numpy(np.stack(bm25))
            batch.target = torch.from_numpy(np.stack(target))
        return batch


class BatchStream:
    """This rank's micro-batches, step after step, from a deterministic stream of shuffled epochs.

    A step consumes one global batch of batch_size * grad_accum * world_size sequences; rank r's micro-batch m is the
    slice [(m * world_size + r) * batch_size, ... + batch_size) of it. The global batch of a step is thus the same
    for any split into ranks and micro-batches, which is what makes their losses equal.
    """

    def __init__(self, dataset: SequenceDataset, batch_size: int, grad_accum: int = 1, rank: int = 0,
                 world_size: int = 1, seed: int = 0) -> None:
        if len(dataset) == 0:
            raise ValueError(f"no training sequences in {dataset.store.path}: every document is shorter than two "
                             f"segments ({2 * dataset.S} tokens)")
        self.dataset, self.B, self.accum = dataset, batch_size, grad_accum
        self.rank, self.world, self.seed = rank, world_size, seed
        self.consumed = 0  # sequences of the stream consumed so far (all ranks together)
        self._perm_epoch, self._perm = -1, np.zeros(0, np.int64)

    @property
    def global_batch(self) -> int:
        return self.B * self.accum * self.world

    @property
    def epoch(self) -> int:
        return self.consumed // len(self.dataset)

    def _at(self, positions: np.ndarray) -> np.ndarray:
        n = len(self.dataset)
        out = np.empty(len(positions), dtype=np.int64)
        for j, p in enumerate(positions):
            e = int(p) // n
            if e != self._perm_epoch:
                self._perm_epoch, self._perm = e, np.random.default_rng([self.seed, e]).permutation(n)
            out[j] = self._perm[int(p) % n]
        return out

    def next_step(self) -> list[Batch]:
        """The grad_accum micro-batches of this rank for the next step; advances the position."""
        base = self.consumed
        micro = []
        for m in range(self.accum):
            first = base + (m * self.world + self.rank) * self.B
            positions = np.arange(first, first + self.B)
            batch = self.dataset.collate(self._at(positions))
            batch.position = torch.from_numpy(positions)
            micro.append(batch)
        self.consumed += self.global_batch
        return micro

    def state_dict(self) -> dict[str, Any]:
        return {"consumed": self.consumed, "seed": self.seed, "n_sequences": len(self.dataset)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state.get("n_sequences", len(self.dataset))) != len(self.dataset):
            raise ValueError(f"the checkpoint's data stream had {state['n_sequences']} sequences, this store gives "
                             f"{len(self.dataset)}: resume with the same store and data.seq_len")
        self.consumed = int(state["consumed"])
        self.seed = int(state.get("seed", self.seed))
