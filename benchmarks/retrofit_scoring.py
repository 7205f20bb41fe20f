"""Scored candidate pairs per second with a backbone as the scoring LM: every context run from its first token
(`HFScorer`) against each candidate's (c_j, c_j+1) computed once and shared by the queries that score it
(`rpt.labels.scorer.SharedPrefixScorer`); both on the same queries of one document, with the largest
difference between their target scores. docs/results/retrofit.md reports it. Run it alone.

    OMP_NUM_THREADS=1 python benchmarks/retrofit_scoring.py --backbone FOLDER --store STORE --queries 32 --k 4 \
        --out docs/data/retrofit_scoring_cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rpt.data.store import open_split  # noqa: E402
from rpt.labels.bm25 import bm25_candidates  # noqa: E402
from rpt.labels.scorer import HFScorer, SharedPrefixScorer, target_scores  # noqa: E402
from rpt.model.backbone import load_backbone, load_tokenizer  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backbone", required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--split", default="test")
    p.add_argument("--document", type=int, default=-1, help="document index (default: the first of >= 2048 tokens)")
    p.add_argument("--chunk-size", type=int, default=64)
    p.add_argument("--segment-len", type=int, default=128)
    p.add_argument("--k", type=int, default=4, help="BM25 candidates per query (rpt label --k)")
    p.add_argument("--queries", type=int, default=32, help="query chunks scored (the last ones of the document span)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    store = open_split(a.store, a.split)
    lengths = store.doc_lengths()
    d = a.document if a.document >= 0 else int(np.nonzero(lengths >= 2048)[0][0])
    tokens = np.asarray(store.document(d), dtype=np.int64)[:2048]
    M = a.chunk_size
    chunks = tokens[: len(tokens) // M * M].reshape(-1, M)
    cands, _ = bm25_candidates(tokens, M, a.segment_len, a.k)
    queries = np.arange(len(chunks) - 1 - a.queries, len(chunks) - 1)
    model, tok = load_backbone(a.backbone), load_tokenizer(a.backbone)

    def decode(rows):
        return [tok.decode(r) for r in rows]

    pairs = int((cands[queries] >= 0).sum())
    rows, scores = {}, {}
    for name, cls in (("unshared", HFScorer), ("shared prefix", SharedPrefixScorer)):
        scorer = cls(model, tok, a.backbone, device="cpu", batch_size=a.batch_size)
        t0 = time.perf_counter()
        scores[name] = target_scores(scorer, chunks, queries, cands[queries], 0, decode)
        s = time.perf_counter() - t0
        run = scorer.tokens_processed + getattr(scorer, "prefix_tokens", 0)
        rows[name] = {"seconds": s, "pairs": pairs, "baselines": len(queries), "pairs_per_second": pairs / s,
                      "tokens_run": run, "tokens_per_second": run / s}
        print(f"{name}: {pairs} pairs + {len(queries)} baselines in {s:.1f} s: {pairs / s:.2f} pairs/s "
              f"({run} tokens run)", flush=True)
    ok = np.isfinite(scores["unshared"])
    diff = float(np.abs(scores["unshared"][ok] - scores["shared prefix"][ok]).max())
    result = {"command": " ".join(sys.argv), "machine": f"{platform.machine()} CPU, {a.threads} torch thread(s), "
              f"torch {torch.__version__}", "backbone": a.backbone, "document": {"index": d, "id": store.doc_ids[d]},
              "k": a.k, "queries": len(queries), "chunk_size": M, "segment_len": a.segment_len, "batch_size": a.batch_size,
              "rows": rows, "speedup": rows["unshared"]["seconds"] / rows["shared prefix"]["seconds"],
              "max_abs_score_difference": diff}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"speedup {result['speedup']:.2f}x, largest score difference {diff:.2e}")


if __name__ == "__main__":
    main()
