"""Retrieval metrics against the scoring LM's gold (§5.2 "Retrieval metrics", Table 3): Precision@2, Recall@10, nDCG@20.

Gold, per query chunk c_q (label store row q, kind ``sem``, span ``doc``): the label store's candidates and their
target scores s_t (§3.2). A chunk is a *positive* iff it is a scored candidate with s_t > 0. Which chunks are
candidates decides what the metrics can say:

- ``rpt label --candidates all`` (exhaustive gold, as the paper's "over all previous chunks"): every retrievable chunk
  is scored, so every ranking is judged against the same, complete gold.
- BM25's top-k (the training labels): chunks outside BM25's top-k are never positives, so BM25's own ranking finds
  the gold by construction and any other ranking is capped; such results say ``"gold": "bm25 top-k"``.

Chance levels stand beside every ranking: ``random`` is the EXPECTED value of a uniformly random order of the query's
retrievable chunks (computed exactly, no draw), ``recency`` the most recent retrievable chunks first. Every metric is
also given per pool-size bucket (`pool_buckets`): the number of retrievable chunks of the query, which decides how
hard the ranking is (the chance level falls as 1 / pool).

    Precision@k  fraction of the retriever's top-k that are positives (denominator k, as usual for P@k)
    Recall@k     fraction of the query's positives found in the retriever's top-k
    nDCG@k       DCG@k / IDCG@k with gain(j) = s_t(j) for positives and 0 for every other chunk, discount
                 1 / log2(rank + 1) (rank from 1); IDCG@k is the DCG@k of the gold ranking, i.e. the positives
                 sorted by s_t. Linear gains, as in the LambdaRank loss (rpt/training/losses.py).

Only query chunks with at least one positive count; each such query chunk counts once, pooled over all documents
("micro" over query chunks: a long document weighs more than a short one). Every function returns per-query values
or (sum, count) pairs so that shards and ranks add up before the one division in `finalize`.

Everything here is a pure function on arrays: rankings [Q, R] of chunk ids (-1 = empty slot, best first), candidates
[Q, k] chunk ids (-1 = none), target [Q, k] s_t (NaN = unscored).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

GAIN = ("gain = s_t for positives (scored candidates with s_t > 0), 0 otherwise; discount 1/log2(rank+1); "
        "IDCG from the positives sorted by s_t")
DEFAULT_KS = {"precision": 2, "recall": 10, "ndcg": 20}
CHANCE = ("random: the expected value of a uniformly random order of each query's retrievable chunks (exact); "
          "recency: the most recent retrievable chunks first; oracle: the gold itself (the ceiling)")


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
    valid = n_positives(candidates, target) > 0
    out = {name: float(v[valid].sum()) for name, v in ranking_values(ranked, candidates, target, ks).items()}
    out["n_queries"] = float(valid.sum())
    return out


def query_stats(candidates: np.ndarray, target: np.ndarray, pool: np.ndarray) -> dict[str, np.ndarray]:
    """Per-query counts beside the metrics: scored (any finite s_t), positives and pool size (all [Q])."""
    t = np.asarray(target, dtype=np.float64)
    scored = (np.isfinite(t) & (np.asarray(candidates) >= 0)).any(-1)
    return {"scored": scored, "positives": n_positives(candidates, target), "pool": np.asarray(pool, dtype=np.int64)}


def expected_random(candidates: np.ndarray, target: np.ndarray, pool: np.ndarray,
                    ks: Mapping[str, int] = DEFAULT_KS) -> dict[str, np.ndarray]:
    """[Q] per-query EXPECTED metrics of a uniformly random order of the query's `pool` retrievable chunks.

    A random order puts each chunk at each rank with probability 1 / pool: E[P@k] = min(k, pool) * n_pos / pool / k,
    E[R@k] = min(k, pool) / pool, E[DCG@k] = (sum of gains / pool) * sum of the first min(k, pool) discounts. Positives
    must lie in the pool (exhaustive gold or BM25's candidates, which are retrievable chunks)."""
    pool = np.maximum(np.asarray(pool, dtype=np.float64), 1.0)
    gains = positive_gains(candidates, target)
    n_pos = (gains > 0).sum(-1)
    out = {}
    kp, kr, kn = ks["precision"], ks["recall"], ks["ndcg"]
    out[f"precision@{kp}"] = np.minimum(kp, pool) * n_pos / pool / kp
    with np.errstate(invalid="ignore", divide="ignore"):
        out[f"recall@{kr}"] = np.where(n_pos > 0, np.minimum(kr, pool) / pool, np.nan)
        disc = np.concatenate([[0.0], np.cumsum(_discount(kn))])  # disc[n] = sum of the first n discounts
        edcg = gains.sum(-1) / pool * disc[np.minimum(kn, pool).astype(np.int64)]
        idcg = dcg_at_k(-np.sort(-gains, axis=-1), kn)
        out[f"ndcg@{kn}"] = np.where(idcg > 0, edcg / np.where(idcg > 0, idcg, 1.0), np.nan)
    return out


def recency_ranking(pool: np.ndarray, depth: int) -> np.ndarray:
    """[Q, depth] the most recent retrievable chunks first: pool - 1, pool - 2, ... (document-absolute ids when the
    retrievable chunks of a query are 0 .. pool - 1, as with whole-document spans); -1 beyond the pool."""
    pool = np.asarray(pool, dtype=np.int64)[:, None]
    ids = pool - 1 - np.arange(depth)[None, :]
    return np.where(ids >= 0, ids, -1)


def pool_buckets(train_pool: int) -> list[tuple[str, int, int]]:
    """(name, lo, hi) pool-size buckets, hi inclusive: up to the largest pool a training span gives, up to 128, beyond
    (the buckets that are empty or repeat a bound are dropped)."""
    edges = [(1, train_pool), (train_pool + 1, 128), (max(train_pool, 128) + 1, 1 << 62)]
    return [(f"pool {lo}-{hi}" if hi < 1 << 62 else f"pool {lo}+", lo, hi) for lo, hi in edges if lo <= hi]


def bucketed_sums(values: Mapping[str, np.ndarray], stats: Mapping[str, np.ndarray],
                  buckets: list[tuple[str, int, int]]) -> dict[str, float]:
    """Sums of per-query values over the queries with a positive, overall and per bucket ("<bucket>|<name>" keys),
    with their counts (n_queries), scored queries, positives and pools (for the means of `finalize`)."""
    valid = stats["positives"] > 0
    scored = stats["scored"]
    out: dict[str, float] = {}
    for prefix, inside in [("", np.ones_like(valid))] + [(f"{n}|", (stats["pool"] >= lo) & (stats["pool"] <= hi))
                                                          for n, lo, hi in buckets]:
        sel = valid & inside
        for name, v in values.items():
            out[prefix + name] = float(np.asarray(v, dtype=np.float64)[sel].sum())
        out[prefix + "n_queries"] = float(sel.sum())
        out[prefix + "n_scored"] = float((scored & inside).sum())
        out[prefix + "positives_sum"] = float(stats["positives"][scored & inside].sum())
        out[prefix + "pool_sum"] = float(stats["pool"][scored & inside].sum())
    return out


def ranking_values(ranked: np.ndarray, candidates: np.ndarray, target: np.ndarray,
                   ks: Mapping[str, int] = DEFAULT_KS) -> dict[str, np.ndarray]:
    """[Q] per-query metrics of one ranking (NaN recall / nDCG where a query has no positive)."""
    ranked = np.asarray(ranked).reshape(len(ranked), -1)
    gains = ranked_gains(ranked, candidates, target)
    n_pos = n_positives(candidates, target)
    return {f"precision@{ks['precision']}": precision_at_k(gains, ks["precision"]),
            f"recall@{ks['recall']}": recall_at_k(gains, n_pos, ks["recall"]),
            f"ndcg@{ks['ndcg']}": ndcg_at_k(gains, candidates, target, ks["ndcg"])}


def add_sums(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
    """Elementwise sum of two `metric_sums` results (either may be empty)."""
    return {k: float(a.get(k, 0.0)) + float(b.get(k, 0.0)) for k in set(a) | set(b)}


COUNTS = ("n_queries", "n_scored", "positives_sum", "pool_sum")


def finalize(sums: Mapping[str, float]) -> dict[str, Any]:
    """Divide once: {"precision@2": mean, ..., "n_queries": n}; means are None when no query chunk has a positive.
    With `bucketed_sums`' keys also "positives" and "pool" (means over scored queries, positives or not), "n_scored",
    and "buckets": {bucket: the same, for its queries}."""
    flat = {k: v for k, v in sums.items() if "|" not in k}
    n = float(flat.get("n_queries", 0.0))
    order = {"precision": 0, "recall": 1, "ndcg": 2}  # Table 3's order
    names = sorted((k for k in flat if k not in COUNTS), key=lambda k: (order.get(k.split("@")[0], 3), k))
    out: dict[str, Any] = {k: (flat[k] / n if n else None) for k in names}
    out["n_queries"] = int(n)
    if "n_scored" in flat:
        m = float(flat["n_scored"])
        out["n_scored"] = int(m)
        out["positives"] = flat["positives_sum"] / m if m else None
        out["pool"] = flat["pool_sum"] / m if m else None
    buckets: dict[str, dict[str, float]] = {}
    for k, v in sums.items():
        if "|" in k:
            b, name = k.split("|", 1)
            buckets.setdefault(b, {})[name] = v
    if buckets:
        out["buckets"] = {b: finalize(buckets[b]) for b in sorted(buckets, key=bucket_lo)}
    return out


def bucket_lo(name: str) -> int:
    """The lower bound of a `pool_buckets` name ("pool 28-128" -> 28), to sort buckets by."""
    return int(name.split()[1].split("-")[0].rstrip("+"))
