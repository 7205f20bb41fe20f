"""The copy test's ablation table (docs/results/copy-test.md#the-papers-model-and-each-addition): one `python -m lab copytest`
summary per setting (each run with its own --out, and its own --set model.KEY=VALUE, --steps or --lr) -> one row per
setting, every seed kept, for one retrieving variant. A row is named by its model overrides and by the copytest
settings that differ between the summaries given (e.g. `steps=200, lr=0.003`).

    python benchmarks/copy_ablation.py runs/copy-ablation/*/copytest-*.json [--variant rpt-sem] [--json out.json]

Per seed, from the same checkpoint evaluated with each neighbour source (whole-document losses, nats):
retrieval gain ppl(none) / ppl(own), random-chunk gain ppl(none) / ppl(random chunks of the document), own vs random
ppl(random) / ppl(own) (own: the variant's own retriever; retro's are BM25's), oracle gain, source@1 (the
retriever's first neighbour holds the repeat's source, repeat-tail chunks) and the copy advantage (loss of fresh
chunks minus repeat-tail chunks, own neighbours). Rows are printed as a Markdown table, mean ± sd over seeds.
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
    own, none = ev["model"] if "model" in ev else ev["bm25"], ev["none"]  # retro's own neighbours are BM25's
    out = {"gain": math.exp(none["all"] - own["all"]), "source_at_1": own.get("hit@1", float("nan")),
           "advantage": own["advantage"]}
    out["random_gain"] = math.exp(none["all"] - ev["random"]["all"]) if "random" in ev else float("nan")
    out["own_vs_random"] = math.exp(ev["random"]["all"] - own["all"]) if "random" in ev else float("nan")
    out["oracle_gain"] = math.exp(none["all"] - ev["oracle"]["all"]) if "oracle" in ev else float("nan")
    return out


def row(summary: dict, variant: str, varying: tuple[str, ...] = ()) -> dict:
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
    settings = summary["settings"]
    return {"overrides": settings.get("model_overrides", {}), "varying": {k: settings.get(k) for k in varying},
            "seeds": seeds, "mean": mean, "sd": sd, "summary": summary.get("path", "")}


def varying_settings(summaries: list[dict]) -> tuple[str, ...]:
    """The copytest settings (other than the output folder and the model overrides) that differ between summaries."""
    keys = sorted({k for s in summaries for k in s["settings"]} - {"out", "model_overrides"})
    return tuple(k for k in keys if len({json.dumps(s["settings"].get(k)) for s in summaries}) > 1)


def name(overrides: dict, varying: dict | None = None) -> str:
    items = {**(varying or {}), **overrides}
    return ", ".join(f"{k}={v}" for k, v in items.items()) or "default"


def fmt(field: str, m: float, s: float) -> str:
    if math.isnan(m):
        return "not measured"
    if field == "source_at_1":
        return f"{100 * m:.0f}% ± {100 * s:.0f}"
    if field == "advantage":
        return f"{m:+.2f} ± {s:.2f}"
    return f"{m:.2f} ± {s:.2f}"


def table(rows: list[dict]) -> str:
    lines = ["| model | " + " | ".join(HEADER) + " |", "|---" * (len(HEADER) + 1) + "|"]
    for r in rows:
        cells = " | ".join(fmt(f, r["mean"][f], r["sd"][f]) for f in FIELDS)
        lines.append(f"| {name(r['overrides'], r.get('varying'))} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("summaries", nargs="+", help="copytest summaries (copytest-*.json), one per model setting")
    ap.add_argument("--variant", default="rpt-sem", help="the retrieving variant of the rows (default rpt-sem)")
    ap.add_argument("--json", help="write the rows (every seed) here")
    args = ap.parse_args(argv)
    summaries = []
    for p in args.summaries:
        try:
            summary = json.loads(Path(p).read_text())
        except (OSError, json.JSONDecodeError) as e:
            print(f"copy_ablation: {p}: not a copytest summary ({e})", file=sys.stderr)
            return 2
        if not isinstance(summary, dict) or "settings" not in summary or "runs" not in summary:
            print(f"copy_ablation: {p}: not a copytest summary (no settings or runs)", file=sys.stderr)
            return 2
        summaries.append(summary)
    varying = varying_settings(summaries)
    rows = []
    for p, summary in zip(args.summaries, summaries, strict=True):
        try:
            rows.append(row(summary, args.variant, varying))
        except KeyError as e:
            print(f"copy_ablation: {p}: not a copytest summary ({e})", file=sys.stderr)
            return 2
    print(table(rows))
    if args.json:
        settings = json.loads(Path(args.summaries[0]).read_text())["settings"]
        shared = {k: v for k, v in settings.items() if k not in ("out", "model_overrides", *varying)}
        import torch

        threads = shared.get("threads") or "torch's default"
        machine = f"{os.cpu_count()} CPU cores ({platform.machine()}), torch {torch.__version__}, threads per run: {threads}"
        doc = {"settings": shared, "variant": args.variant, "machine": machine, "rows": rows}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
