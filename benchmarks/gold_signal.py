"""How much signal an exhaustive gold carries (docs/results/retrieval.md): the target scores s_t of every scored
(query, retrievable chunk) pair of a label store made with `rpt label --candidates all`.

    python benchmarks/gold_signal.py runs/code-long/store/labels/test-sem-doc-all [--json out.json]

Prints the share of positives (s_t > 0), the quantiles of s_t, the mean s_t of BM25's top 2 against the rest, and the
mean over queries of the Spearman correlation of s_t with the BM25 score and with recency (the chunk index). A gold
whose positives are half of all chunks and barely follow any ranking cannot tell one retriever from chance.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rho (average ranks for ties), NaN when either side is constant."""
    from scipy.stats import rankdata

    ra, rb = rankdata(a), rankdata(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def gold_signal(path: str, min_pool: int = 5) -> dict[str, float]:
    from rpt.labels.store import LabelStore

    labels = LabelStore.open(path)
    if labels.manifest.get("candidates") != "all" or labels.kind != "sem":
        raise SystemExit(f"{path}: not exhaustive sem labels (make them with `rpt label --kind sem --candidates all`)")
    values, top2, rest, rho_bm25, rho_recent = [], [], [], [], []
    lo, hi = labels.doc_range
    for d in range(lo, hi):
        rows = labels.rows(d)
        t, c, b = np.asarray(rows.target), np.asarray(rows.candidates), np.asarray(rows.bm25)
        for i in np.nonzero(np.isfinite(t).any(1))[0]:
            ok = np.isfinite(t[i]) & (c[i] >= 0)
            s = t[i][ok]
            values.append(s)
            top2.append(s[:2])  # candidates are stored in BM25's order
            rest.append(s[2:])
            if ok.sum() >= min_pool:
                rho_bm25.append(rank_correlation(b[i][ok], s))
                rho_recent.append(rank_correlation(c[i][ok], s))
    v = np.concatenate(values)
    q = np.quantile(v, [0.05, 0.25, 0.5, 0.75, 0.95])
    return {"queries": len(values), "pairs": int(v.size), "positive_share": float((v > 0).mean()),
            "s_t_q05": q[0], "s_t_q25": q[1], "s_t_median": q[2], "s_t_q75": q[3], "s_t_q95": q[4],
            "mean_s_t_bm25_top2": float(np.concatenate(top2).mean()), "mean_s_t_rest": float(np.concatenate(rest).mean()),
            "spearman_bm25_mean": float(np.nanmean(rho_bm25)), "spearman_recency_mean": float(np.nanmean(rho_recent)),
            "spearman_queries": len(rho_bm25)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("labels", help="an exhaustive sem label store (rpt label --candidates all)")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)
    out = gold_signal(args.labels)
    for k, v in out.items():
        print(f"{k:<24}{v:.4f}" if isinstance(v, float) else f"{k:<24}{v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"labels": args.labels, **{k: float(v) for k, v in out.items()}}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
