"""Document memory for inference (§3.4 "Retrieval at inference time"): every finished chunk's token states and
retrieval key, searchable by later query chunks under the retrievable rule.

A key enters the searchable index only once it becomes retrievable (the rule's limit only grows), so a search never
needs a mask. `TorchMemory` uses one batched matmul (fast on GPU and for moderate documents on CPU); `FaissMemory` keeps
the keys in Faiss inner-product indexes on the CPU, as the paper did ("we store the key and lower-decoder
representations in a Faiss index on the CPU"), and returns the same neighbours (tested). `make_memory("auto", device)`
picks torch on a GPU and Faiss on CPU (torch when faiss is not installed; asking for "faiss" explicitly fails loudly).

Dimension letters: B batch, N chunks so far, M chunk length, D width, Q query chunks, K results.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np
import torch

from rpt.model.layers import autocast_off
from rpt.model.retriever import top_k
from rpt.utils import MissingDependency, require


class ChunkMemory:
    """Chunk token states [B, N, M, D] (needed to assemble neighbours) plus pending/searchable keys."""

    def __init__(self) -> None:
        self._states: torch.Tensor | None = None
        self.n_chunks = 0
        self._pending: list[torch.Tensor] = []  # keys [B, D] of chunks not yet retrievable, in chunk order
        self.n_searchable = 0

    # --- states -------------------------------------------------------------------------------------------------
    def add_states(self, states: torch.Tensor) -> None:
        """states [B, n, M, D] of the next n chunks. Amortised O(1) growth (capacity doubling)."""
        B, n, M, D = states.shape
        if self._states is None:
            self._states = states.new_empty(B, max(16, n), M, D)
        if self.n_chunks + n > self._states.shape[1]:
            cap = max(2 * self._states.shape[1], self.n_chunks + n)
            grown = states.new_empty(B, cap, M, D)
            grown[:, : self.n_chunks] = self._states[:, : self.n_chunks]
            self._states = grown
        self._states[:, self.n_chunks : self.n_chunks + n] = states
        self.n_chunks += n

    @property
    def states(self) -> torch.Tensor:
        assert self._states is not None
        return self._states[:, : self.n_chunks]

    def nbytes(self) -> int:
        return 0 if self._states is None else self._states[:, : self.n_chunks].numel() * self._states.element_size()

    # --- keys ---------------------------------------------------------------------------------------------------
    def add_keys(self, keys: torch.Tensor) -> None:
        """keys [B, n, D] for the same n chunks as the last add_states (pending until retrievable)."""
        self._pending.extend(keys.unbind(1))

    def _make_searchable(self, keys: torch.Tensor) -> None:  # keys [B, n, D]
        raise NotImplementedError

    def _search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def search(self, queries: torch.Tensor, limit: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k ids/scores [B, Q, k] among chunks 0..limit (ids -1 / scores -inf where fewer exist)."""
        target = max(0, limit + 1)
        grow = target - self.n_searchable
        if grow > 0:
            self._make_searchable(torch.stack(self._pending[:grow], dim=1))
            del self._pending[:grow]
            self.n_searchable = target
        B, Q, _ = queries.shape
        if self.n_searchable == 0:
            return (torch.full((B, Q, k), -1, dtype=torch.long, device=queries.device),
                    torch.full((B, Q, k), float("-inf"), device=queries.device))
        return self._search(queries, k)


class TorchMemory(ChunkMemory):
    """Exact inner-product search with a matmul over the searchable keys."""

    def __init__(self) -> None:
        super().__init__()
        self._keys: torch.Tensor | None = None

    def _make_searchable(self, keys: torch.Tensor) -> None:
        keys = keys.float()
        self._keys = keys if self._keys is None else torch.cat([self._keys, keys], dim=1)

    def _search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        assert self._keys is not None
        with autocast_off(queries.device.type):  # fp32 scores, as the forward pass's (autocast would round to bf16)
            scores = queries.float() @ self._keys.transpose(1, 2)  # [B, Q, N]
        return top_k(scores, k)

    def nbytes(self) -> int:
        keys = 0 if self._keys is None else self._keys.numel() * self._keys.element_size()
        return super().nbytes() + keys


MemoryKind = Literal["auto", "faiss", "torch"]


class FaissMemory(ChunkMemory):
    """Exact inner-product search with one Faiss `IndexFlatIP` per batch row (on CPU, whatever the model's device)."""

    def __init__(self) -> None:
        super().__init__()
        self._faiss = require("faiss", "the Faiss document memory (--memory faiss)")
        self._indexes: list = []

    def _make_searchable(self, keys: torch.Tensor) -> None:  # keys [B, n, D]
        B, _, D = keys.shape
        if not self._indexes:
            self._indexes = [self._faiss.IndexFlatIP(D) for _ in range(B)]
        host = keys.detach().float().cpu().numpy()
        for b, index in enumerate(self._indexes):
            index.add(np.ascontiguousarray(host[b]))

    def _search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """queries [B, Q, D] -> ids [B, Q, k] (long, -1 where fewer than k keys), scores [B, Q, k] (-inf there)."""
        host = queries.detach().float().cpu().numpy()
        ids = np.empty((*host.shape[:2], k), np.int64)
        scores = np.empty((*host.shape[:2], k), np.float32)
        for b, index in enumerate(self._indexes):
            scores[b], ids[b] = index.search(np.ascontiguousarray(host[b]), k)
        scores[ids < 0] = -np.inf  # Faiss pads missing results with id -1 and -FLT_MAX
        dev = queries.device
        return torch.from_numpy(ids).to(dev), torch.from_numpy(scores).to(dev)

    def nbytes(self) -> int:
        keys = sum(index.ntotal * index.d * 4 for index in self._indexes)  # IndexFlat stores float32 vectors
        return super().nbytes() + keys


def make_memory(kind: MemoryKind = "auto", device: torch.device | str = "cpu") -> Callable[[], ChunkMemory]:
    """A factory of empty document memories (pass it to `model.new_cache(memory=...)`; one memory per document).

    kind: "torch" (batched matmul), "faiss" (Faiss IndexFlatIP on CPU), or "auto": torch on a GPU, Faiss on CPU
    (torch when faiss is not installed: both are exact, so only speed differs).
    """
    if kind not in ("auto", "faiss", "torch"):
        raise ValueError(f"memory must be auto, faiss or torch, not {kind!r}")
    if kind == "auto":
        on_gpu = torch.device(device).type != "cpu"
        if on_gpu:
            return TorchMemory
        try:
            require("faiss")
        except MissingDependency:
            return TorchMemory
        return FaissMemory
    if kind == "faiss":
        require("faiss", "the Faiss document memory (--memory faiss)")  # fail now, not at the first document
        return FaissMemory
    return TorchMemory


def memory_name(factory: Callable[[], ChunkMemory]) -> str:
    """"faiss" or "torch": what a factory from `make_memory` builds (for result files)."""
    return "faiss" if factory is FaissMemory else "torch"
