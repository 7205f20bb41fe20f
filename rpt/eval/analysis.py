"""The analyses of §5.4: token overlap of the best neighbour, and relative improvement over Transformer-XL split by
whether a gold chunk was retrieved. (The supervision-quality curve lives in rpt/labels/quality.py.)

Indexing: query chunk i (tokens i*M .. i*M+M-1) retrieves with query c_i; its neighbours serve to predict the target
chunk c_{i+1} (CCA, §3.1). A neighbour is the retrieved chunk j together with its continuation j+1 (2M tokens), which is
what CCA reads.

Token overlap (Fig. "overlap_w_curr"): for each query chunk with a retrieved neighbour and a target chunk, the number of
*unique* token ids shared by the best (rank-1) neighbour and the query chunk, and by it and the target chunk; averaged
over those query chunks, pooled over documents.

Relative improvement (Fig. "imp_w_wo_corr_pred"): per target chunk,

    improvement = 1 - NLL_model / NLL_xl = (NLL_xl - NLL_model) / NLL_xl

with NLL the summed negative log-likelihood of the target chunk's tokens (both models score the same tokens, so sums
and means give the same ratio). Averaged over query chunks that have at least one retrievable chunk, in two groups:
"gold" when at least one neighbour the model fed to CCA is a positive of the label store (s_t > 0), "no_gold" otherwise.
Positive = better than Transformer-XL.

All functions return per-chunk arrays or (sum, count) pairs; `finalize_*` divides once.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from rpt.chunks import last_retrievable

IMPROVEMENT = "per target chunk: 1 - NLL_model / NLL_xl (summed NLL of the target chunk's tokens); mean over query chunks"
OVERLAP = "unique token ids shared by the rank-1 neighbour (chunk j + continuation j+1) and the query / target chunk"


# --------------------------------------------------------------------------------------------------------------
# token overlap


def unique_overlap(a: np.ndarray, b: np.ndarray) -> int:
    """Number of distinct token ids occurring in both a and b."""
    return int(len(np.intersect1d(np.asarray(a), np.asarray(b))))


def neighbor_overlap(tokens: np.ndarray, chunk_size: int, best: np.ndarray,
                      continuation: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Overlap of each query chunk's best neighbour with the query chunk and with the target chunk.

    tokens [T] one document; best [C] the rank-1 neighbour of query chunk i (-1 = none), C = finished chunks.
    Returns (query_overlap [C], target_overlap [C], valid [C] bool): valid where a neighbour exists and chunk i+1 is a
    full chunk of the document.
    """
    M = chunk_size
    n_full = len(tokens) // M
    C = len(best)
    q_ov, t_ov = np.zeros(C), np.zeros(C)
    valid = np.zeros(C, dtype=bool)
    for i, j in enumerate(np.asarray(best)):
        if j < 0 or i + 1 >= n_full:
            continue
        nb = tokens[j * M : (j + 2 if continuation else j + 1) * M]
        q_ov[i] = unique_overlap(nb, tokens[i * M : (i + 1) * M])
        t_ov[i] = unique_overlap(nb, tokens[(i + 1) * M : (i + 2) * M])
        valid[i] = True
    return q_ov, t_ov, valid


def overlap_sums(tokens: np.ndarray, chunk_size: int, best: np.ndarray, continuation: bool = True) -> dict[str, float]:
    """{"query": sum, "target": sum, "n": count} over the valid query chunks of one document."""
    q, t, v = neighbor_overlap(tokens, chunk_size, best, continuation)
    return {"query": float(q[v].sum()), "target": float(t[v].sum()), "n": float(v.sum())}


def finalize_overlap(sums: Mapping[str, float]) -> dict[str, float | int | None]:
    n = float(sums.get("n", 0.0))
    return {"query": sums.get("query", 0.0) / n if n else None, "target": sums.get("target", 0.0) / n if n else None,
            "n": int(n)}


# --------------------------------------------------------------------------------------------------------------
# relative improvement over Transformer-XL, with / without a gold chunk retrieved


def relative_improvement(nll: np.ndarray, base_nll: np.ndarray) -> np.ndarray:
    """1 - nll / base_nll elementwise (NaN where base_nll is 0)."""
    nll, base = np.asarray(nll, dtype=np.float64), np.asarray(base_nll, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(base > 0, 1.0 - nll / np.where(base > 0, base, 1.0), np.nan)


def gold_retrieved(neighbors: np.ndarray, candidates: np.ndarray, target: np.ndarray) -> np.ndarray:
    """[C] True where at least one of the K neighbours of query chunk i is a positive of label row i (s_t > 0)."""
    neighbors, candidates = np.asarray(neighbors), np.asarray(candidates)
    t = np.asarray(target, dtype=np.float64)
    pos = (candidates >= 0) & np.isfinite(t) & (t > 0)  # [C, k]
    hit = (neighbors[:, :, None] == candidates[:, None, :]) & pos[:, None, :] & (neighbors[:, :, None] >= 0)
    return hit.any(axis=(1, 2))


def subgroup_sums(chunk_nll: np.ndarray, base_chunk_nll: np.ndarray, chunk_tokens: np.ndarray, neighbors: np.ndarray,
                  candidates: np.ndarray, target: np.ndarray, chunk_size: int, segment_len: int) -> dict[str, float]:
    """Sums of the relative improvement of one document, per group.

    chunk_nll / base_chunk_nll / chunk_tokens [C_all]: summed NLL (model, Transformer-XL) and token count of every
    chunk's tokens; neighbors [C, K] the ids the model fed to CCA for query chunk i; candidates/target [C, k] the
    document's labels. Returns {"gold": sum, "gold_n": count, "no_gold": sum, "no_gold_n": count}.
    """
    C = len(neighbors)
    i = np.arange(C)
    has_target = (i + 1 < len(chunk_tokens)) & (np.asarray(chunk_tokens)[np.minimum(i + 1, len(chunk_tokens) - 1)] > 0)
    can_retrieve = last_retrievable(i, chunk_size, segment_len) >= 0
    imp = relative_improvement(np.asarray(chunk_nll)[np.minimum(i + 1, len(chunk_nll) - 1)],
                               np.asarray(base_chunk_nll)[np.minimum(i + 1, len(base_chunk_nll) - 1)])
    valid = has_target & can_retrieve & np.isfinite(imp)
    gold = gold_retrieved(neighbors, candidates[:C], target[:C])
    out = {}
    for name, sel in (("gold", valid & gold), ("no_gold", valid & ~gold)):
        out[name], out[f"{name}_n"] = float(imp[sel].sum()), float(sel.sum())
    return out


def finalize_subgroups(sums: Mapping[str, float]) -> dict[str, dict[str, float | int | None]]:
    """{"gold": {"improvement", "n"}, "no_gold": {...}, "all": {...}} from summed `subgroup_sums`."""
    out: dict[str, dict[str, float | int | None]] = {}
    for name in ("gold", "no_gold"):
        n = float(sums.get(f"{name}_n", 0.0))
        out[name] = {"improvement": sums.get(name, 0.0) / n if n else None, "n": int(n)}
    n_all = float(sums.get("gold_n", 0.0) + sums.get("no_gold_n", 0.0))
    total = sums.get("gold", 0.0) + sums.get("no_gold", 0.0)
    out["all"] = {"improvement": total / n_all if n_all else None, "n": int(n_all)}
    return out
