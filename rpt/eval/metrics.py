"""Retrieval metrics against the scoring LM's gold (§5.2 "Retrieval metrics", Table 3): Precision@2, Recall@10, nDCG@20.

Gold, per query chunk c_q (label store row q, kind ``sem``, span ``doc``): the BM25 candidates and their target scores
s_t (§3.2). A chunk is a *positive* iff it is a scored candidate with s_t > 0. Chunks that are not candidates (or are
unscored) are not positives, whatever a retriever thinks of them.

    Precision@k  fraction of the retriever's top-k that are positives (denominator k, as usual for P@k)
    Recall@k     fraction of the query's positives found in the retriever's top-k
    nDCG@k       DCG@k / IDCG@k with gain(j) = s_t(j) for positives and 0 for every other chunk, discount
                 1 / log2(rank + 1) (rank from 1); IDCG@k is the DCG@k of the gold ranking, i.e. the positives
                 sorted by s_t. Linear gains, as in the LambdaRank loss (rpt/train/losses.py).

Only query chunks with at least one positive count; each such query chunk counts once, pooled over all documents
("micro" over query chunks: a long document weighs more than a short one). Every function returns per-query values
or (sum, count) pairs so that shards and ranks add up before the one division in `finalize`.

Everything here is a pure function on arrays: rankings [Q, R] of chunk ids (-1 = empty slot, best first), candidates
[Q, k] chunk ids (-1 = none), target [Q, k] s_t (NaN = unscored).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

GAIN = ("gain = s_t for positives (scored candidates with s_t > 0), 0 otherwise; discount 1/log2(rank+1); "
        "IDCG from the positives sorted by s_t")
DEFAULT_KS = {"precision": 2, "recall": 10, "ndcg": 20}


def positive_gains(candidates: np.ndarray, target: np.ndarray) -> np.ndarray:
    """[Q, k] gain of each candidate: s_t where it is a positive (present, scored, s_t > 0), else 0."""
    t = np.asarray(target, dtype=np.float64)
    ok = (np.asarray(candidates) >= 0) & np.isfinite(t) & (t > 0)
    return np.where(ok, t, 0.0)


def ranked_gains(ranked: np.ndarray, candidates: np.ndarray, target: np.ndarray) -> np.ndarray:
    """[Q, R] gain of each ranked chunk: its candidate's positive gain, 0 for non-positives and empty slots."""
    ranked, candidates = np.asarray(ranked), np.asarray(candidates)
    gains = positive_gains(candidates, target)  # [Q, k]
    match = (ranked[:, :, None] == candidates[:, None, :]) & (ranked[:, :, None] >= 0)  # [Q, R, k]
    return (match * gains[:, None, :]).sum(-1)


def n_positives(candidates: np.ndarray, target: np.ndarray) -> np.ndarray:
    """[Q] number of positives of each query chunk."""
    return (positive_gains(candidates, target) > 0).sum(-1)


def precision_at_k(gains: np.ndarray, k: int) -> np.ndarray:
    """[Q] fraction of the top-k slots that hold a positive (gains [Q, R] from `ranked_gains`)."""
    return (gains[:, :k] > 0).sum(-1) / k


def recall_at_k(gains: np.ndarray, n_pos: np.ndarray, k: int) -> np.ndarray:
    """[Q] fraction of the positives within the top k (NaN where a query has no positive)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n_pos > 0, (gains[:, :k] > 0).sum(-1) / np.maximum(n_pos, 1), np.nan)


def _discount(k: int) -> np.ndarray:
    return 1.0 / np.log2(np.arange(k) + 2.0)  # rank r (from 1) -> 1 / log2(r + 1)


def dcg_at_k(gains: np.ndarray, k: int) -> np.ndarray:
    """[Q] DCG of the first k gains of each row."""
    g = gains[:, :k]
    return (g * _discount(g.shape[1])).sum(-1)


def ndcg_at_k(gains: np.ndarray, candidates: np.ndarray, target: np.ndarray, k: int) -> np.ndarray:
    """[Q] nDCG@k of a ranking; the ideal ranking is the positives sorted by s_t (NaN where a query has no positive)."""
    ideal = -np.sort(-positive_gains(candidates, target), axis=-1)  # [Q, k'] best first
    idcg = dcg_at_k(ideal, k)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(idcg > 0, dcg_at_k(gains, k) / np.where(idcg > 0, idcg, 1.0), np.nan)


def metric_sums(ranked: np.ndarray, candidates: np.ndarray, target: np.ndarray,
                ks: Mapping[str, int] = DEFAULT_KS) -> dict[str, float]:
    """Sums of the per-query metrics over the query chunks with at least one positive, plus their count.

    Returns {"precision@2": sum, "recall@10": sum, "ndcg@20": sum, "n_queries": count} (names follow `ks`).
    """
    ranked = np.asarray(ranked).reshape(len(ranked), -1)
    gains = ranked_gains(ranked, candidates, target)
    n_pos = n_positives(candidates, target)
    valid = n_pos > 0
    values = {
        f"precision@{ks['precision']}": precision_at_k(gains, ks["precision"]),
        f"recall@{ks['recall']}": recall_at_k(gains, n_pos, ks["recall"]),
        f"ndcg@{ks['ndcg']}": ndcg_at_k(gains, candidates, target, ks["ndcg"]),
    }
    out = {name: float(v[valid].sum()) for name, v in values.items()}
    out["n_queries"] = float(valid.sum())
    return out


def add_sums(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
    """Elementwise sum of two `metric_sums` results (either may be empty)."""
    return {k: float(a.get(k, 0.0)) + float(b.get(k, 0.0)) for k in set(a) | set(b)}


def finalize(sums: Mapping[str, float]) -> dict[str, float | int | None]:
    """Divide once: {"precision@2": mean, ..., "n_queries": n}; means are None when no query chunk has a positive."""
    n = float(sums.get("n_queries", 0.0))
    order = {"precision": 0, "recall": 1, "ndcg": 2}  # Table 3's order
    names = sorted((k for k in sums if k != "n_queries"), key=lambda k: (order.get(k.split("@")[0], 3), k))
    out: dict[str, float | int | None] = {k: (sums[k] / n if n else None) for k in names}
    out["n_queries"] = int(n)
    return out
