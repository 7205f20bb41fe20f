"""python -m lab bench: step time per variant relative to xl, eval cost versus document length, labelling throughput."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = ("benchmark side by side: training step time of each variant vs xl, eval time/memory vs length, labelling "
        "speed; --scale: step time, peak memory and the largest batch at a big preset (synthetic data)")
ORDER = 90


def add_arguments(p: argparse.ArgumentParser) -> None:
    from rpt.commands.options import add_device, add_set

    p.add_argument("--store", type=Path, help="the training benchmark's store: a `rpt prepare` root with train labels "
                   "of both kinds at --seq-len's span (`rpt label --kind lex` and `--kind sem`)")
    p.add_argument("--labels-root", type=Path,
                   help="folder holding train-lex-<seq_len>/ and train-sem-<seq_len>/ (default <store>/labels)")
    p.add_argument("--preset", default="tiny", help="model preset of every benchmarked model (default tiny)")
    p.add_argument("--seq-len", type=int, default=1024,
                   help="training sequence length; the labels must have this span (default 1024)")
    p.add_argument("--segment-len", type=int,
                   help="model.segment_len (0: the preset's; default 128, with --kernels the preset's)")
    p.add_argument("--batch-size", type=int, default=2, help="sequences per training step (default 2)")
    p.add_argument("--steps", type=int,
                   help="updates per variant (default 12, the first 3 warm-up; with --scale 3, the first warm-up)")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds over all variants, in alternating order (default 3): the ratio to xl is taken within "
                        "each round, so a drift in the machine's speed moves both; the median and range are reported")
    p.add_argument("--eval-lengths", help="comma-separated document lengths in tokens (default 2048..32768)")
    p.add_argument("--label-sizes", default="100000,1000000", help="token counts for the BM25 comparison")
    p.add_argument("--skip-labels", action="store_true", help="skip the labelling benchmark")
    add_device(p, "benchmark")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("--out", type=Path, default=Path("runs/bench.json"), help="results JSON")
    s = p.add_argument_group("at scale (--scale: synthetic tokens and labels, no store needed)")
    s.add_argument("--scale", action="store_true",
                   help="each variant's training step in a fresh process: time vs xl, peak memory beside the "
                        "pre-flight estimate, largest batch in --memory-budget, MFU on GPU; e.g. --preset 250m "
                        "--seq-len 16384")
    s.add_argument("--variants", default="xl,retro,rpt-sem",
                   help="variants to measure, with --scale or --kernels (default xl,retro,rpt-sem)")
    s.add_argument("--vocab-size", type=int, help="model.vocab_size (default: the preset's)")
    s.add_argument("--memory-budget", type=float, metavar="GIB",
                   help="memory budget in GiB for the largest batch (default: the memory available now)")
    s.add_argument("--loss-chunks", default="0",
                   help="extra xl rows with train.loss_chunk set to each of these (0 = full logits; default 0)")
    s.add_argument("--precision", choices=["fp32", "bf16"], help="train.precision (bf16: autocast on GPUs; default the preset's)")
    s.add_argument("--compile", choices=["off", "on", "both"], default="off",
                   help="torch.compile the model (as train.compile does): off, on, or both (every variant eager and "
                        "compiled, side by side; default off)")
    add_set(s, example="model.attn_dropout=0")
    s.add_argument("--estimate-only", action="store_true",
                   help="estimates and largest batch only, nothing run (a config too big for this machine)")
    k = p.add_argument_group("attention kernels (--kernels: no store needed)")
    k.add_argument("--kernels", action="store_true",
                   help="which SDPA kernel (flash, efficient, cudnn, flash-cpu, the unfused math path, or CCA's unfused "
                        "direct attention in CPU training) each attention "
                        "call site of --variants takes, in the training forward and in cached evaluation, at --preset, "
                        "--seq-len, --precision and --device; read from the profiler, not assumed")


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


def _overrides(args: argparse.Namespace) -> dict:
    """--set SECTION.KEY=VALUE pairs -> {dotted key: value}; checked when the configs are built."""
    from rpt.commands.options import parse_sets

    return parse_sets(args.set)


def _scale(args: argparse.Namespace) -> int:
    from lab.bench import bench_scale, format_scale
    from rpt.utils import UserError, write_json_atomic

    variants = _variants(args)
    try:
        chunks = tuple(int(x) for x in args.loss_chunks.split(",") if x.strip())
    except ValueError:
        chunks = (-1,)
    if any(c < 0 for c in chunks):
        raise UserError(f"--loss-chunks {args.loss_chunks!r}: expected comma-separated token counts >= 0 (0 = full logits)")
    if args.memory_budget is not None and args.memory_budget <= 0:
        raise UserError(f"--memory-budget {args.memory_budget}: expected a positive number of GiB")
    device, info = _device_and_machine(args)
    r = bench_scale(args.preset, args.seq_len, variants, batch_size=args.batch_size, vocab_size=args.vocab_size,
                    device=device, steps=args.steps or 3, loss_chunks=chunks, budget_gib=args.memory_budget,
                    threads=args.threads, measure=not args.estimate_only, precision=args.precision,
                    compile_modes={"off": (False,), "on": (True,), "both": (False, True)}[args.compile],
                    overrides=_overrides(args))
    print(format_scale(r))
    write_json_atomic(args.out, {"machine": info, "scale": r}, "bench")
    print(f"\nresults: {args.out}")
    return 0


def _variants(args: argparse.Namespace) -> tuple[str, ...]:
    """--variants, and --preset checked with them (--scale and --kernels take both)."""
    from rpt.config import PRESETS, VARIANTS
    from rpt.utils import UserError

    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        raise UserError(f"--variants {args.variants!r}: choose from {', '.join(VARIANTS)}")
    if args.preset not in PRESETS:
        raise UserError(f"--preset {args.preset!r}: choose from {', '.join(PRESETS)}")
    return variants


def _device_and_machine(args: argparse.Namespace) -> tuple[str, dict]:
    """--device (resolved) and the machine's description, printed."""
    from lab.bench import machine

    device = args.device
    info = machine()
    print(f"machine: {info}", flush=True)
    return device, info


def _kernels(args: argparse.Namespace) -> int:

    from lab.kernels import format_kernels, probe_kernels
    from rpt.utils import write_json_atomic

    variants = _variants(args)
    device, info = _device_and_machine(args)
    rows = []
    for v in variants:
        r = probe_kernels(v, args.preset, args.seq_len, args.batch_size, args.vocab_size, device, args.precision,
                          segment_len=args.segment_len or None, overrides=_overrides(args))  # unset or 0: the preset's
        rows.append(r)
        print(format_kernels(r), flush=True)
    unfused = sorted({f"{r['variant']}: {row['site']} ({phase})" for r in rows for phase in ("train", "eval")
                      for row in r.get(phase, []) if not row["fused"]})
    print("\nunfused (math path or direct): " + ("; ".join(unfused) if unfused else "none"))
    write_json_atomic(args.out, {"machine": info, "kernels": rows}, "bench")
    print(f"\nresults: {args.out}")
    return 0


def run(args: argparse.Namespace) -> int:
    import torch

    from rpt.utils import resolve_device

    if args.threads:
        torch.set_num_threads(args.threads)
    args.device = str(resolve_device(args.device))
    from rpt.outputs import claim_file

    claim_file(args.out, "bench")  # before any work: never over a file of the user's
    if args.kernels:
        return _kernels(args)
    if args.scale:
        return _scale(args)
    if args.rounds < 1:
        from rpt.utils import UserError

        raise UserError(f"--rounds {args.rounds}: expected 1 or more")
    from lab.bench import run_bench

    if args.store is None:
        from rpt.utils import UserError

        raise UserError("--store is required for the training benchmark (or --scale / --kernels, which need none): a "
                        "`rpt prepare` root with train labels of both kinds (docs/cli.md#python--m-lab-demo-and-rpt-bench)")

    run_bench(args.store, labels_root=args.labels_root, preset=args.preset, seq_len=args.seq_len,
              segment_len=128 if args.segment_len is None else (args.segment_len or None), batch_size=args.batch_size,
              steps=args.steps or 12, rounds=args.rounds,
              eval_lengths=_sizes(args.eval_lengths, "--eval-lengths") if args.eval_lengths else None,
              label_sizes=tuple(_sizes(args.label_sizes, "--label-sizes")), skip_labels=args.skip_labels,
              device=args.device, out=args.out)
    print(f"\nresults: {args.out}")
    return 0
