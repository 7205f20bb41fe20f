"""The copy test's ablation table (docs/results/copy-test.md#the-papers-model-and-each-addition): one `rpt copytest`
summary per model setting (each run with its own --out and --set model.KEY=VALUE) -> one row per setting, every seed
kept, for one retrieving variant.

    python benchmarks/copy_ablation.py runs/copy-ablation/*/copytest-*.json [--variant rpt-sem] [--json out.json]

Per seed, from the same checkpoint evaluated with each neighbour source (whole-document losses, nats):
retrieval gain ppl(none) / ppl(own), random-chunk gain ppl(none) / ppl(random chunks of the document), own vs random
ppl(random) / ppl(own), oracle gain, source@1 (the retriever's first neighbour holds the repeat's source, repeat-tail
chunks) and the copy advantage (loss of fresh chunks minus repeat-tail chunks, own neighbours). Rows are printed
as a Markdown table, mean ± sd over seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
from pathlib import Path

FIELDS = ("gain", "random_gain", "own_vs_random", "oracle_gain", "source_at_1", "advantage")
HEADER = ("retrieval gain", "random-chunk gain", "own vs random", "oracle gain", "source@1", "copy advantage (nats)")


def seed_figures(ev: dict) -> dict[str, float]:
    own, none = ev["model"], ev["none"]
    out = {"gain": math.exp(none["all"] - own["all"]), "source_at_1": own.get("hit@1", float("nan")),
           "advantage": own["advantage"]}
    out["random_gain"] = math.exp(none["all"] - ev["random"]["all"]) if "random" in ev else float("nan")
    out["own_vs_random"] = math.exp(ev["random"]["all"] - own["all"]) if "random" in ev else float("nan")
    out["oracle_gain"] = math.exp(none["all"] - ev["oracle"]["all"]) if "oracle" in ev else float("nan")
    return out


def row(summary: dict, variant: str) -> dict:
    runs = [r for r in summary["runs"] if r["setting"] == "far" and r["variant"] == variant]
    if not runs:
        raise SystemExit(f"{summary.get('path', '?')}: no far {variant} runs")
    seeds = [{"seed": r["seed"], **seed_figures(r["eval"])} for r in sorted(runs, key=lambda r: r["seed"])]
    mean, sd = {}, {}
    for f in FIELDS:
        xs = [s[f] for s in seeds]
        missing = any(math.isnan(x) for x in xs)  # a source the summary was not evaluated with
        mean[f] = float("nan") if missing else statistics.fmean(xs)
        sd[f] = float("nan") if missing else statistics.stdev(xs) if len(xs) > 1 else 0.0
    return {"overrides": summary["settings"].get("model_overrides", {}), "seeds": seeds, "mean": mean, "sd": sd,
            "summary": summary.get("path", "")}


def name(overrides: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in overrides.items()) or "default"


def fmt(field: str, m: float, s: float) -> str:
    if math.isnan(m):
        return "not run"
    if field == "source_at_1":
        return f"{100 * m:.0f}% ± {100 * s:.0f}"
    if field == "advantage":
        return f"{m:+.2f} ± {s:.2f}"
    return f"{m:.2f} ± {s:.2f}"


def table(rows: list[dict]) -> str:
    lines = ["| model | " + " | ".join(HEADER) + " |", "|---" * (len(HEADER) + 1) + "|"]
    for r in rows:
        lines.append(f"| {name(r['overrides'])} | " + " | ".join(fmt(f, r["mean"][f], r["sd"][f]) for f in FIELDS) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("summaries", nargs="+", help="copytest summaries (copytest-*.json), one per model setting")
    ap.add_argument("--variant", default="rpt-sem", help="the retrieving variant of the rows (default rpt-sem)")
    ap.add_argument("--json", help="write the rows (every seed) here")
    args = ap.parse_args(argv)
    rows = []
    for p in args.summaries:
        try:
            rows.append(row(json.loads(Path(p).read_text()), args.variant))
        except (OSError, json.JSONDecodeError, KeyError) as e:
            print(f"copy_ablation: {p}: not a copytest summary ({e})", file=sys.stderr)
            return 2
    print(table(rows))
    if args.json:
        settings = json.loads(Path(args.summaries[0]).read_text())["settings"]
        shared = {k: v for k, v in settings.items() if k not in ("out", "model_overrides")}
        import torch

        threads = shared.get("threads") or "torch's default"
        machine = f"{os.cpu_count()} CPU cores ({platform.machine()}), torch {torch.__version__}, threads per run: {threads}"
        doc = {"settings": shared, "variant": args.variant, "machine": machine, "rows": rows}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
