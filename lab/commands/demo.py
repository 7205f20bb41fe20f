"""`python -m lab demo`: retrieval shown working on the copy corpus in about 4 minutes on 2 CPU cores, printing every
command it runs."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = ("show retrieval working in about 4 minutes on 2 CPU cores: xl and rpt-sem on documents whose repeats lie beyond "
        "any local window (the copy test at a small size), paired seeds, a table, a figure and an explorer page")
ORDER = 80


def add_arguments(p: argparse.ArgumentParser) -> None:
    from lab.demo import DemoSettings

    d = DemoSettings()
    p.add_argument("--out", type=Path, default=d.out, help=f"folder for the stores, runs and results (default {d.out})")
    p.add_argument("--seeds", default=",".join(map(str, d.seeds)),
                   help="comma-separated paired seeds: the table gives mean ± sd (default 0,1,2)")
    p.add_argument("--steps", type=int, default=d.steps, help=f"updates per run on the far corpus (default {d.steps})")
    p.add_argument("--near-steps", type=int, default=d.near_steps,
                   help=f"updates of the near control, the scoring LM of rpt-sem's labels (default {d.near_steps})")
    p.add_argument("--variants", default=",".join(d.variants),
                   help="retrieving variants beside xl: any of retro, rpt-lex, rpt-sem (default rpt-sem)")
    p.add_argument("--threads", type=int, default=d.threads, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    from lab.demo import DemoSettings, run_demo
    from rpt.config import RETRIEVING
    from rpt.utils import UserError, parse_seeds

    seeds = parse_seeds(args.seeds)
    for flag, value in (("--steps", args.steps), ("--near-steps", args.near_steps)):
        if value < 1:
            raise UserError(f"{flag} {value}: 1 or more")
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    if not variants or any(v not in RETRIEVING for v in variants):
        raise UserError(f"--variants {args.variants!r}: one or more of {', '.join(RETRIEVING)}")
    from lab.folders import DEMO
    from rpt.outputs import claim_folder

    claim_folder(args.out, DEMO)  # before any work: never into a folder of the user's
    summary = run_demo(DemoSettings(out=args.out, seeds=seeds, steps=args.steps, near_steps=args.near_steps,
                                    variants=variants, threads=args.threads, progress=not args.no_progress))
    from rpt.outputs import mark_folder

    mark_folder(args.out, DEMO)
    return 0 if summary["passed"] else 1  # 1: a check expected at this size is not met (the table says which)
