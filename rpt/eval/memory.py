"""The document memory on Faiss (§3.4 "Retrieval at inference time": "we store the key and lower-decoder
representations in a Faiss index on the CPU").

`FaissMemory` is a drop-in `ChunkMemory` (rpt/model/memory.py): one exact inner-product index (`IndexFlatIP`) per batch
row holds the retrieval keys that have become retrievable; the chunk token states stay in the base class. It returns
the same neighbours as `TorchMemory` (tested); scores agree up to float rounding of the dot products.

Which to use (docs/design.md#document-memory): a batched matmul (`TorchMemory`) is the fast choice on GPU and for
moderate documents on CPU; Faiss keeps the keys in its own CPU index and is what the paper used. `make_memory("auto",
device)` picks torch on GPU and Faiss on CPU (falling back to torch when faiss is not installed; asking for "faiss"
explicitly fails loudly).

Dimension letters: B batch, n new chunks, Q query chunks, D width, k results.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np
import torch

from rpt.model.memory import ChunkMemory, TorchMemory
from rpt.utils import MissingDependency, require

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
