"""The retrievable rule (§3, docs/design.md#the-retrievable-rule): which earlier chunks a query chunk may retrieve.

One function serves the model's retriever mask, the BM25 candidate generator and the evaluation memory, so the
three can never disagree.

Chunk i lives in segment s = i // cps (cps = segment_len / chunk_size chunks per segment, segments counted from the
start of the retrieval span). Through sliding-window self-attention the tokens of segment s already see segment
s - 1 and segment s. A neighbour is chunk j *and its continuation* j + 1, so j is retrievable for i iff chunk j + 1
ends before segment s - 1 begins:  j + 1 < (s - 1) * cps,  i.e.  j <= (s - 1) * cps - 2.

Nothing from chunk i or later can then reach the representations used to predict chunk i's tokens.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import torch

A = TypeVar("A", np.ndarray, torch.Tensor, int)


def chunks_per_segment(chunk_size: int, segment_len: int) -> int:
    if segment_len % chunk_size:
        raise ValueError(f"segment_len={segment_len} is not a multiple of chunk_size={chunk_size}")
    return segment_len // chunk_size


def last_retrievable(query_chunk: A, chunk_size: int, segment_len: int) -> A:
    """Largest retrievable chunk index for each query chunk index (negative: nothing is retrievable)."""
    cps = chunks_per_segment(chunk_size, segment_len)
    return (query_chunk // cps - 1) * cps - 2


def pool_size(query_chunk: A, chunk_size: int, segment_len: int) -> A:
    """How many chunks each query chunk may retrieve (0 .. last_retrievable), 0 where none."""
    n = last_retrievable(query_chunk, chunk_size, segment_len) + 1
    return n.clip(min=0) if isinstance(n, (np.ndarray, torch.Tensor)) else max(n, 0)


def retrievable_mask(n_chunks: int, chunk_size: int, segment_len: int, device: torch.device | None = None,
                     n_before: int = 0) -> torch.Tensor:
    """Bool [C, C]: mask[i, j] is True iff chunk j (with continuation j+1) is retrievable for query chunk i.

    n_before > 0: [C, n_before + C], the first n_before columns being the chunks just before chunk 0 (chunks
    -n_before .. -1 of the same document; the rule holds across the boundary because it counts whole segments)."""
    idx = torch.arange(n_chunks, device=device)
    keys = torch.arange(-n_before, n_chunks, device=device)
    return keys[None, :] <= last_retrievable(idx, chunk_size, segment_len)[:, None]


def retrievable_mask_np(n_chunks: int, chunk_size: int, segment_len: int) -> np.ndarray:
    """NumPy twin of `retrievable_mask` (same rule, for the label pipeline)."""
    idx = np.arange(n_chunks)
    return idx[None, :] <= last_retrievable(idx, chunk_size, segment_len)[:, None]
