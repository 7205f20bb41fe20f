"""`python -m lab sweep`: train every variant for every seed on one store, evaluate each with its neighbour sources, tabulate
(lab/sweep.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = ("train variants x paired seeds on one store, evaluate each with its own, no, BM25 and oracle neighbours, and "
        "print the comparison table; resumable")
ORDER = 44


def add_arguments(p: argparse.ArgumentParser) -> None:
    from lab.compare import DOMAINS
    from rpt.config import VARIANTS

    p.add_argument("--out", type=Path, required=True,
                   help="sweep folder: one run per variant and seed (V-seedS), eval/, compare.md, commands.txt")
    p.add_argument("--variants", required=True, help=f"comma-separated, from {', '.join(VARIANTS)}")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated paired seeds (default 0,1,2)")
    p.add_argument("--labels-lex", type=Path, help="lex label store of the train split (span = data.seq_len): retro, "
                   "rpt-lex (default: <store>/labels/train-lex-<seq_len>, else the sem one)")
    p.add_argument("--labels-sem", type=Path, help="sem label store of the train split: rpt-sem (and retro / rpt-lex "
                   "without lex labels; default <store>/labels/train-sem-<seq_len>)")
    p.add_argument("--test-labels", type=Path, help="sem labels of the test split, span doc: the oracle and retrieval "
                   "metrics (default <store>/labels/test-sem-doc when it exists; without: neither)")
    p.add_argument("--max-documents", type=int, default=0, help="test documents evaluated (default 0: all)")
    p.add_argument("--memory", choices=("auto", "faiss", "torch"), default="auto", help="evaluation memory (default auto)")
    p.add_argument("--paper", choices=DOMAINS, help="the paper's figures for this dataset beside the rows")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads for every run (default: torch's choice)")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs trained and evaluated at the same time, each in processes of its own with its output in "
                        "OUT/logs/V-seedS.log (default 1: one after another, in this process); e.g. --jobs 2 --threads "
                        "1 on two cores, or the seeds side by side on one GPU")
    p.add_argument("--dry-run", action="store_true", help="print every command (done ones marked) and stop")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("train_args", nargs="*", metavar="-- TRAIN ARGS",
                   help="after --, the arguments of `rpt train` every run shares: --preset or --config, --store, "
                        "--steps, --seq-len, --lr, --set KEY=VALUE ...")


def run(args: argparse.Namespace) -> int:
    from lab.sweep import SweepSettings, run_sweep
    from rpt.config import VARIANTS
    from rpt.utils import UserError, parse_seeds

    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants or len(set(variants)) != len(variants):
        raise UserError(f"--variants {args.variants!r}: give distinct variants from {', '.join(VARIANTS)}")
    if args.max_documents < 0:
        raise UserError(f"--max-documents {args.max_documents}: must be >= 0")
    if args.jobs < 1:
        raise UserError(f"--jobs {args.jobs}: must be at least 1")
    labels = {k: p for k, p in (("lex", args.labels_lex), ("sem", args.labels_sem)) if p is not None}
    s = SweepSettings(out=args.out, variants=variants, seeds=parse_seeds(args.seeds), train_args=list(args.train_args),
                      labels=labels, test_labels=args.test_labels, max_documents=args.max_documents,
                      memory=args.memory, paper=args.paper, threads=args.threads, progress=not args.no_progress,
                      jobs=args.jobs)
    from lab.folders import SWEEP
    from rpt.outputs import claim_folder

    # before any work: never into a folder of the user's, nor over the labels it reads
    claim_folder(args.out, SWEEP, inputs={"labels_lex": args.labels_lex, "labels_sem": args.labels_sem,
                                          "test_labels": args.test_labels})
    run_sweep(s, dry_run=args.dry_run)
    if not args.dry_run:
        from rpt.outputs import mark_folder

        mark_folder(args.out, SWEEP)  # its own from now on, whatever it holds
    return 0
