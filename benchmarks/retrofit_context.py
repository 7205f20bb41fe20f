"""What a retrofit has to beat, with no training: a backbone over its full context, over RPT's sliding window (the
retrofitted model at initialisation), and with BM25's or random earlier chunks placed in its window
(`rpt.retrofit.context_rows`). docs/results/retrofit.md reports it.

    OMP_NUM_THREADS=1 python benchmarks/retrofit_context.py --backbone FOLDER --store STORE --split test \
        --segment-len 128 --documents 4 --first 1024 --targets 512 --out docs/data/retrofit_context_cpu.json

The store must be tokenized with the backbone's own tokenizer (`rpt prepare --tokenizer FOLDER`). Documents are the
split's first `--documents` with at least first + targets tokens.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rpt.config import ModelConfig  # noqa: E402
from rpt.data.store import open_split  # noqa: E402
from rpt.model.backbone import describe, load_backbone  # noqa: E402
from rpt.model.retrofit import RetrofitRPT  # noqa: E402
from rpt.retrofit import CONTEXT_ROWS, context_rows, target_chunks  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backbone", required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--split", default="test")
    p.add_argument("--segment-len", type=int, default=128)
    p.add_argument("--chunk-size", type=int, default=64)
    p.add_argument("--neighbors", type=int, default=2)
    p.add_argument("--documents", type=int, default=4)
    p.add_argument("--first", type=int, default=1024, help="first target token")
    p.add_argument("--targets", type=int, default=512, help="target tokens per document")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    store = open_split(a.store, a.split)
    t0 = time.perf_counter()
    hf = load_backbone(a.backbone)
    shape = describe(hf)
    cfg = ModelConfig(variant="xl", backbone=a.backbone, vocab_size=shape["vocab_size"], d_model=shape["d_model"],
                      n_layers=shape["n_layers"], n_heads=shape["n_heads"], mlp_hidden=shape["mlp_hidden"],
                      chunk_size=a.chunk_size, segment_len=a.segment_len, dropout=0.0)
    window = RetrofitRPT(cfg, seed=0, backbone=hf).eval()
    load_s = time.perf_counter() - t0
    lengths = store.doc_lengths()
    docs = [d for d in range(len(store)) if lengths[d] >= a.first + a.targets][: a.documents]
    per_doc, totals = [], {r: [0.0, 0] for r in CONTEXT_ROWS}
    for d in docs:
        t1 = time.perf_counter()
        tokens = store.document(d)
        got = context_rows(hf, tokens, a.segment_len, a.chunk_size, a.neighbors,
                           target_chunks(len(tokens), a.chunk_size, a.first, a.targets), doc=d, retrofit=window)
        for r, (nll, n) in got.items():
            totals[r][0] += nll
            totals[r][1] += n
        per_doc.append({"index": d, "id": store.doc_ids[d], "n_tokens": int(lengths[d]), "seconds": time.perf_counter() - t1,
                        **{r: {"nll_sum": nll, "n": n, "perplexity": math.exp(nll / n)} for r, (nll, n) in got.items()}})
        print(f"doc {d} {store.doc_ids[d]}: " + ", ".join(f"{r} {math.exp(v[0] / v[1]):.3f}" for r, v in got.items()),
              flush=True)
    result = {"command": " ".join(sys.argv), "machine": f"{platform.machine()} CPU, {a.threads} torch thread(s), "
              f"torch {torch.__version__}", "backbone": a.backbone, "store": a.store, "split": a.split,
              "segment_len": a.segment_len, "window_tokens": [a.segment_len + 1, 2 * a.segment_len],
              "chunk_size": a.chunk_size, "neighbors": a.neighbors, "first_target": a.first, "targets_per_document": a.targets,
              "load_seconds": load_s, "seconds": time.perf_counter() - t0,
              "total": {r: {"nll_sum": v[0], "n": v[1], "perplexity": math.exp(v[0] / v[1]) if v[1] else None}
                        for r, v in totals.items()},
              "documents": per_doc}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["total"], indent=1))


if __name__ == "__main__":
    main()
