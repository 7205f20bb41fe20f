"""Document memory for inference (§3.4 "Retrieval at inference time"): every finished chunk's token states and
retrieval key, searchable by later query chunks under the retrievable rule.

A key enters the searchable index only once it becomes retrievable (the rule's limit only grows), so a search never
needs a mask. `TorchMemory` uses one batched matmul (fast on GPU and for moderate documents on CPU); a Faiss
inner-product index with the same interface lives in `rpt.eval.memory`.

Dimension letters: B batch, N chunks so far, M chunk length, D width, Q query chunks, K results.
"""

from __future__ import annotations

import torch

from rpt.model.layers import autocast_off
from rpt.model.retriever import top_k


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
