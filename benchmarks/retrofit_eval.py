"""Is a trained retrofit worth it? One checkpoint per seed, every control, one JSON and one table.

    python benchmarks/retrofit_eval.py --checkpoint RUN_SEED0 RUN_SEED1 --store STORE --split test --documents 4 \
        --tokens 1536 --first 1024 --work WORK --out RESULT.json

The first `--tokens` tokens of the split's first `--documents` documents that have that many are the evaluation
documents (written as a token store under WORK/store). On them:

- exhaustive gold from the backbone itself: `rpt label --kind sem --span doc --candidates all --scorer BACKBONE`
  (WORK/labels; `--query-fraction` scores a fixed share of the query chunks), for the oracle and the metrics;
- each checkpoint through `rpt eval` (`rpt.eval.perplexity.run_eval`) with its own neighbours (with the retrieval
  metrics), none, random chunks of the same document, BM25's (query c_q) and the oracle's (the backbone's best of
  the exhaustive gold);
- the backbone without training (`rpt.retrofit.context_rows`): over its full context, over the window W (the
  retrofitted model at initialisation), and with BM25's or random chunks placed in its window (in-context).

Perplexities are over the target tokens: the chunks from token `--first` to `--tokens` of every document (the same
tokens for every row); the checkpoint rows also give the whole documents'. Retrieval metrics (P@2, R@10, nDCG@20)
of the learned retriever beside BM25, recency, random (the expected value of a uniform draw: chance) and the oracle,
under the exhaustive gold. The checkpoints must share one backbone, chunk size and segment length (the seeds of one
setting); rows give each seed, the mean and the standard deviation over seeds.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SOURCES = {"model": "retrofit, its own neighbours", "none": "retrofit, no neighbours",
           "random": "retrofit, random chunks of the document", "bm25": "retrofit, BM25's neighbours (query c_q)",
           "oracle": "retrofit, the oracle's neighbours (backbone's gold)"}
CONTEXT = {"full": "backbone, full context (no training)", "window": "backbone, window W (no training)",
           "in-context bm25": "backbone, BM25's chunks in its window",
           "in-context random": "backbone, random chunks in its window"}
RANKINGS = ("model", "bm25", "recency", "random", "oracle")
METRICS = ("precision@2", "recall@10", "ndcg@20")


def build_store(store: str, split: str, documents: int, tokens: int, out: Path) -> list[str]:
    """The first `tokens` tokens of the first `documents` documents of `split` holding that many, as a token store
    out/<split> with the source's tokenizer.json beside it; returns their ids."""
    import shutil

    from rpt.data.store import StoreWriter, open_split

    src = open_split(store, split)
    lengths = src.doc_lengths()
    docs = [d for d in range(len(src)) if lengths[d] >= tokens][:documents]
    if not docs:
        raise SystemExit(f"no document of {store} {split} has {tokens} tokens")
    tok = Path(store) / "tokenizer.json"
    if tok.is_file():
        out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tok, out / "tokenizer.json")
    with StoreWriter(out / split, src.tokenizer_id, src.chunk_size) as w:
        for d in docs:
            w.add(src.doc_ids[d], src.document(d)[:tokens])
        w.close()
    return [src.doc_ids[d] for d in docs]


def target_sums(record: dict[str, Any], first_chunk: int) -> tuple[float, int]:
    """Summed NLL and tokens of chunks first_chunk .. of one document record of `run_eval` (per_chunk)."""
    ch = record["chunks"]
    return float(sum(ch["nll"][first_chunk:])), int(sum(ch["tokens"][first_chunk:]))


def spread(values: list[float]) -> dict[str, Any]:
    return {"seeds": values, "mean": statistics.fmean(values),
            "sd": statistics.stdev(values) if len(values) > 1 else None}


def evaluate_checkpoint(path: str, work: Path, split: str, k: int, first_chunk: int, labels: Path,
                        device: str, oracle: str = "top-k") -> dict[str, Any]:
    """Every source of one checkpoint: per source, the target tokens' and whole documents' perplexity; the metrics."""
    from rpt.api import load
    from rpt.config import EvalConfig
    from rpt.eval.perplexity import run_eval

    loaded = load(path, device=device)
    out: dict[str, Any] = {"checkpoint": str(loaded.path), "sources": {}}
    for source in SOURCES:
        settings = EvalConfig(split=split, n_neighbors=k, source=source, labels=str(labels), per_chunk=True,
                              with_metrics=source == "model", oracle=oracle)
        r = run_eval(None, work / "store", settings, loaded=loaded)
        nll = [target_sums(doc, first_chunk) for doc in r["documents"]]
        s, n = sum(x for x, _ in nll), sum(y for _, y in nll)
        out["sources"][source] = {"targets": {"nll_sum": s, "n": n, "perplexity": math.exp(s / n),
                                              "documents": [[x, y] for x, y in nll]},  # for intervals over documents
                                  "documents_perplexity": r["total"]["perplexity"],
                                  "scored_perplexity": (r["total"].get("scored") or {}).get("perplexity"),
                                  "seconds": r["total"]["seconds"]}
        if source == "model":
            out["retrieval"] = {name: r["retrieval"][name] for name in RANKINGS if name in r["retrieval"]}
            out["retrieval_gold"] = r["retrieval"].get("gold")
        print(f"  {path} {source}: target perplexity {math.exp(s / n):.3f}", flush=True)
    return out


def backbone_rows(backbone: str, work: Path, split: str, cfg: Any, k: int, first: int, device: str) -> dict[str, Any]:
    """`rpt.retrofit.context_rows` over the evaluation documents: the backbone without training, on `device`."""
    import torch

    from rpt.config import ModelConfig
    from rpt.data.store import open_split
    from rpt.model.backbone import describe, load_backbone
    from rpt.model.retrofit import RetrofitRPT
    from rpt.retrofit import context_rows, target_chunks

    hf = load_backbone(backbone).to(device)
    shape = describe(hf)
    xl = ModelConfig(variant="xl", backbone=backbone, vocab_size=shape["vocab_size"], d_model=shape["d_model"],
                     n_layers=shape["n_layers"], n_heads=shape["n_heads"], mlp_hidden=shape["mlp_hidden"],
                     chunk_size=cfg.chunk_size, segment_len=cfg.segment_len, dropout=0.0)
    window = RetrofitRPT(xl, seed=0, backbone=hf).to(device).eval()
    store = open_split(work / "store", split)
    totals = {row: [0.0, 0] for row in CONTEXT}
    with torch.no_grad():
        for d in range(len(store)):
            tokens = store.document(d)
            targets = target_chunks(len(tokens), cfg.chunk_size, first, len(tokens) - first)
            got = context_rows(hf, tokens, cfg.segment_len, cfg.chunk_size, k, targets, rows=tuple(CONTEXT), doc=d,
                               retrofit=window)
            for row, (nll, n) in got.items():
                totals[row][0] += nll
                totals[row][1] += n
    return {row: {"nll_sum": s, "n": n, "perplexity": math.exp(s / n)} for row, (s, n) in totals.items()}


def table(result: dict[str, Any]) -> str:
    """The result as markdown: perplexity rows (each seed, mean, sd), then the retrieval metrics."""
    seeds = len(result["checkpoints"])
    head = "| row | " + " | ".join(f"seed {i}" for i in range(seeds)) + " | mean | sd |"
    lines = [f"Target tokens: {result['target_tokens']:,} ({result['documents']} documents, tokens "
             f"{result['first']:,}-{result['tokens']:,} of each); window W = {result['window']}; K = {result['k']}.",
             "", head, "|---|" + "---|" * (seeds + 2)]

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    for source, name in SOURCES.items():
        v = result["rows"][source]
        lines.append(f"| {name} | " + " | ".join(fmt(x) for x in v["seeds"]) + f" | {fmt(v['mean'])} | {fmt(v['sd'])} |")
    for row, name in CONTEXT.items():
        value = fmt(result["backbone_rows"][row]["perplexity"])
        lines.append(f"| {name} | " + " | ".join("" for _ in range(seeds)) + f" | {value} | |")
    lines += ["", f"Retrieval under {result['retrieval_gold'] or 'the exhaustive gold'} (the model row: mean over seeds):",
              "", "| ranking | " + " | ".join(METRICS) + " | queries |", "|---|" + "---|" * (len(METRICS) + 1)]
    for name, m in result["retrieval"].items():
        lines.append(f"| {name} | " + " | ".join("-" if m.get(k) is None else f"{100 * m[k]:.1f}%" for k in METRICS)
                     + f" | {m.get('n_queries', '-')} |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", nargs="+", required=True, help="run or checkpoint folders of retrofits: one per seed")
    p.add_argument("--store", required=True, help="token store root tokenized with the backbone's tokenizer")
    p.add_argument("--split", default="test")
    p.add_argument("--documents", type=int, default=4)
    p.add_argument("--tokens", type=int, default=1536, help="tokens kept of each document (and the least it needs)")
    p.add_argument("--first", type=int, default=1024, help="first target token")
    p.add_argument("--neighbors", type=int, default=2)
    p.add_argument("--query-fraction", type=float, default=1.0, help="share of query chunks the gold scores")
    p.add_argument("--work", required=True, help="folder for the evaluation store and its labels")
    p.add_argument("--out", required=True, help="result JSON")
    p.add_argument("--device", default="cpu")
    p.add_argument("--oracle", choices=("top-k", "positives"), default="top-k",
                   help="the oracle row's neighbours: the scorer's K best scored candidates, or only its positives "
                   "(fewer than K where fewer exist), as `rpt eval --oracle`")
    p.add_argument("--threads", type=int)
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parser().parse_args(argv)
    import torch

    from rpt.checkpoint import checkpoint_config, resolve_checkpoint
    from rpt.cli import main as rpt
    from rpt.outputs import Owner, claim_file, claim_folder, mark_folder
    from rpt.utils import environment, write_json_atomic

    if a.threads:
        torch.set_num_threads(a.threads)
    inputs = {"checkpoint": list(a.checkpoint), "store": a.store}
    out = claim_file(a.out, "eval", inputs=inputs)
    owner = Owner("eval", ("store", "labels", ".*.tmp", ".*.partial"))
    work = Path(a.work)
    claim_folder(work, owner, arg="work", inputs=inputs)
    mark_folder(work, owner)
    cfgs = [checkpoint_config(resolve_checkpoint(c)).model for c in a.checkpoint]
    cfg = cfgs[0]
    def same(c: Any) -> tuple[Any, ...]:  # the backbone by its file, however the path was written
        return Path(c.backbone).resolve() if c.backbone else None, c.chunk_size, c.segment_len

    if any(same(c) != same(cfg) for c in cfgs):
        raise SystemExit("the checkpoints differ in backbone, chunk size or segment length: evaluate each apart")
    if not cfg.backbone:
        raise SystemExit(f"{a.checkpoint[0]} is not a retrofit (no model.backbone)")
    if a.first % cfg.chunk_size or not 0 < a.first < a.tokens:
        raise SystemExit(f"--first must be a multiple of the chunk size {cfg.chunk_size} and below --tokens")
    t0 = time.perf_counter()
    ids = build_store(a.store, a.split, a.documents, a.tokens, work / "store")
    labels = work / "labels"
    code = rpt(["label", "--store", str(work / "store"), "--split", a.split, "--kind", "sem", "--span", "doc",
                "--candidates", "all", "--query-fraction", str(a.query_fraction), "--segment-len",
                str(cfg.segment_len), "--scorer", cfg.backbone, "--device", a.device, "--out", str(labels),
                "--overwrite", "--no-progress"])
    if code:
        raise SystemExit(code)
    label_s = time.perf_counter() - t0
    first_chunk = a.first // cfg.chunk_size
    runs = [evaluate_checkpoint(c, work, a.split, a.neighbors, first_chunk, labels, a.device, a.oracle)
            for c in a.checkpoint]
    back = backbone_rows(cfg.backbone, work, a.split, cfg, a.neighbors, a.first, a.device)
    rows = {s: spread([r["sources"][s]["targets"]["perplexity"] for r in runs]) for s in SOURCES}
    retrieval = {}
    for name in RANKINGS:
        got = [r["retrieval"][name] for r in runs if name in r.get("retrieval", {})]
        if got:
            retrieval[name] = {k: (statistics.fmean(g[k] for g in got) if got[0].get(k) is not None else None)
                               for k in METRICS} | {"n_queries": got[0].get("n_queries")}
    result = {"command": " ".join(["python", "benchmarks/retrofit_eval.py", *(argv if argv is not None else sys.argv[1:])]),
              "machine": f"{platform.machine()}, {a.device}, {torch.get_num_threads()} torch thread(s)",
              "environment": environment(), "backbone": cfg.backbone, "store": a.store, "split": a.split,
              "document_ids": ids, "documents": len(ids), "tokens": a.tokens, "first": a.first,
              "target_tokens": runs[0]["sources"]["none"]["targets"]["n"],
              "window": f"{cfg.segment_len + 1}-{2 * cfg.segment_len} tokens (S = {cfg.segment_len})",
              "k": a.neighbors, "oracle": a.oracle, "query_fraction": a.query_fraction, "label_seconds": label_s,
              "seconds": time.perf_counter() - t0, "rows": rows, "backbone_rows": back,
              "retrieval": retrieval, "retrieval_gold": runs[0].get("retrieval_gold"), "checkpoints": runs}
    write_json_atomic(out, result, verb="eval")
    print(table(result))
    print(f"result: {out}")
    return result


if __name__ == "__main__":
    main()
