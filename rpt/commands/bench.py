"""rpt bench: step time per variant relative to xl, eval cost versus document length, labelling throughput."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "benchmark side by side: training step time of each variant vs xl, eval time/memory vs length, labelling speed"
ORDER = 90


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", type=Path, default=Path("runs/demo/store"),
                   help="a `rpt prepare` root with train labels (default: the demo's, runs/demo/store)")
    p.add_argument("--labels-root", type=Path,
                   help="folder holding train-lex-<seq_len>/ and train-sem-<seq_len>/ (default <store>/labels)")
    p.add_argument("--preset", default="tiny", help="model preset of every benchmarked model (default tiny)")
    p.add_argument("--seq-len", type=int, default=1024,
                   help="training sequence length; the labels must have this span (default 1024)")
    p.add_argument("--segment-len", type=int, default=128, help="model.segment_len (0: the preset's)")
    p.add_argument("--batch-size", type=int, default=2, help="sequences per training step (default 2)")
    p.add_argument("--steps", type=int, default=12, help="updates per variant (the first 3 are warm-up)")
    p.add_argument("--eval-lengths", help="comma-separated document lengths in tokens (default 2048..32768)")
    p.add_argument("--label-sizes", default="100000,1000000", help="token counts for the BM25 comparison")
    p.add_argument("--skip-labels", action="store_true", help="skip the labelling benchmark")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("--out", type=Path, default=Path("runs/bench.json"), help="results JSON")


def _sizes(text: str, flag: str) -> list[int]:
    """Comma-separated positive token counts, or a UserError naming the flag."""
    from rpt.utils import UserError

    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise UserError(f"{flag} {text!r}: expected comma-separated positive token counts, e.g. 2048,4096")
    return sizes


def run(args: argparse.Namespace) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from rpt.bench import run_bench

    run_bench(args.store, labels_root=args.labels_root, preset=args.preset, seq_len=args.seq_len,
              segment_len=args.segment_len or None, batch_size=args.batch_size, steps=args.steps,
              eval_lengths=_sizes(args.eval_lengths, "--eval-lengths") if args.eval_lengths else None,
              label_sizes=tuple(_sizes(args.label_sizes, "--label-sizes")), skip_labels=args.skip_labels,
              device=args.device, out=args.out)
    print(f"\nresults: {args.out}")
    return 0
