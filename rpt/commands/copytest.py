"""`rpt copytest`: does retrieval work? xl copies near repeats; retro and rpt-lex must copy far ones (rpt/copytest.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "the copy test: xl on near repeats (control) and xl / retro / rpt-lex on repeats beyond xl's reach, per seed"
ORDER = 75


def add_arguments(p: argparse.ArgumentParser) -> None:
    from rpt.copytest import CopyTestSettings

    d = CopyTestSettings()
    p.add_argument("--out", type=Path, default=d.out, help=f"folder for stores, runs and copytest.json (default {d.out})")
    p.add_argument("--steps", type=int, default=d.steps, help=f"updates per run (default {d.steps})")
    p.add_argument("--lr", type=float, default=d.lr, help=f"peak learning rate (default {d.lr})")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help=f"sequences per update (default {d.batch_size})")
    p.add_argument("--seeds", default=",".join(map(str, d.seeds)), help="comma-separated seeds, e.g. 0,1,2 (default 0)")
    p.add_argument("--variants", default=",".join(d.variants),
                   help="retrieving variants trained on the far corpus, comma-separated (default retro,rpt-lex)")
    p.add_argument("--far-p", type=float, default=d.far_p,
                   help=f"probability that a far passage (from the 7th on) repeats an earlier one (default {d.far_p:g})")
    p.add_argument("--eval-docs", type=int, default=d.eval_docs, help=f"test documents evaluated (default {d.eval_docs})")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a model config field for every run (ablations), e.g. --set cca_positions=false")
    p.add_argument("--label-query", choices=("pair", "chunk"), default=d.label_query,
                   help="BM25 query of the training labels of retro / rpt-lex: pair (c_q, c_t), the paper's (default) | "
                   "chunk (c_q alone, as at inference)")
    p.add_argument("--threads", type=int, default=d.threads, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    import yaml

    from rpt.cli import UserError
    from rpt.config import VARIANTS
    from rpt.copytest import CopyTestSettings, run_copytest
    from rpt.utils import parse_seeds

    seeds = parse_seeds(args.seeds)
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    bad = [v for v in variants if v not in VARIANTS or v in ("xl", "rpt-sem")]
    if bad:
        raise UserError(f"--variants {args.variants!r}: choose from retro, rpt-lex (xl always runs; rpt-sem needs a scorer)")
    if not 0.0 <= args.far_p <= 1.0:
        raise UserError(f"--far-p {args.far_p:g}: a probability in [0, 1]")
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"--set {item}: expected KEY=VALUE (a model field, e.g. cca_positions=false)")
        overrides[key.strip().removeprefix("model.")] = yaml.safe_load(value)
    s = CopyTestSettings(out=args.out, steps=args.steps, lr=args.lr, batch_size=args.batch_size, seeds=seeds,
                         variants=variants, eval_docs=args.eval_docs, far_p=args.far_p, threads=args.threads,
                         progress=not args.no_progress,
                         model_overrides=overrides, label_query=args.label_query)
    summary = run_copytest(s)
    print(f"wrote {summary['path']}")
    return 0 if summary["verdict"]["passed"] else 1
