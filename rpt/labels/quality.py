"""Supervision quality (paper §5 Analysis, Fig. "scored_ds"): how much reranking BM25's candidates can gain.

For every rank K = 1..k: the maximal target score s_t among BM25's top-K candidates of a query chunk, averaged over
query chunks. A curve that keeps rising up to K = 20 says the scoring LM finds better neighbours deep in BM25's list,
so a retriever trained to rerank them has room to beat BM25.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from rpt.labels.store import LabelStore
from rpt.utils import require, save_figure


def max_target_curve(target: np.ndarray, max_k: int | None = None) -> np.ndarray:
    """curve[K-1] = mean over query chunks of max(s_t of BM25's top-K candidates), K = 1..max_k.

    target: float [N, k] target scores in BM25 order (NaN = no candidate / unscored). Only query chunks with a scored
    top-1 candidate count, so every K averages over the same chunks; a chunk with fewer than K candidates keeps its
    maximum over the ones it has.
    """
    target = np.asarray(target, dtype=np.float64)
    max_k = target.shape[1] if max_k is None else min(max_k, target.shape[1])
    rows = target[np.isfinite(target[:, 0])]
    if len(rows) == 0:
        return np.full(max_k, np.nan)
    running = np.fmax.accumulate(np.where(np.isfinite(rows), rows, -np.inf), axis=1)[:, :max_k]  # [n, K] max so far
    return running.mean(axis=0)


def supervision_quality(labels: LabelStore | str | Path, max_k: int = 20) -> np.ndarray:
    """`max_target_curve` of a ``sem`` label store."""
    store = labels if isinstance(labels, LabelStore) else LabelStore.open(labels)
    if store.kind != "sem":
        raise ValueError(f"{store.path} holds {store.kind} labels: supervision quality needs target scores (kind sem)")
    return max_target_curve(np.asarray(store.target), max_k)


def plot_supervision_quality(curves: Mapping[str, np.ndarray], path: str | Path, title: str = "Supervision quality") -> Path:
    """PNG of one or more curves (name -> curve), as the paper's Fig. "scored_ds"."""
    matplotlib = require("matplotlib", "plots")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, curve in curves.items():
        ks = np.arange(1, len(curve) + 1)
        ax.plot(ks, curve, marker="o", markersize=3, label=name)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("K (BM25 rank)")
    ax.set_ylabel("max target score among top-K")
    ax.set_title(title)
    ax.legend(fontsize="small", loc="lower right")
    return save_figure(fig, path)
