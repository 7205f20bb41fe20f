"""When in training does one setting's LM loss part from another's? Paired seeds, read from the runs' own logs.

    python benchmarks/paired_loss_gap.py runs/code-long/rpt-sem runs/code-long/rpt-sem-nogate
    python benchmarks/paired_loss_gap.py runs/code-long/rpt-sem runs/code-long/gate-probe/nogate-halfov block=100 upto=400

Each argument is a sweep folder holding `<name>-seed<N>/log.jsonl` (python -m lab sweep's layout), or a prefix of such run
folders (`.../nogate-halfov` matches `nogate-halfov-seed0`, ...). The first is the reference. For every seed present
in both, the training LM loss (the log's rows: each the mean over its window of `log_every` updates, all windows of
equal size) is averaged over blocks of `block` updates, and the gap other - reference is printed per block: per
seed, then mean ± sd over seeds. Positive = the other setting's loss is higher. Nothing is trained or evaluated: it
reads log.jsonl.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path


def runs(arg: str) -> dict[int, Path]:
    """seed -> log.jsonl of the runs under a sweep folder, or of the run folders starting with a prefix."""
    p = Path(arg)
    found = {}
    candidates = list(p.glob("*seed*/log.jsonl")) if p.is_dir() else list(p.parent.glob(p.name + "*seed*/log.jsonl"))
    for log in candidates:
        m = re.search(r"seed(\d+)$", log.parent.name)
        if m:
            found[int(m.group(1))] = log
    if not found:
        raise SystemExit(f"{arg}: no <name>-seed<N>/log.jsonl found")
    return found


def block_means(log: Path, block: int, upto: int | None) -> dict[int, float]:
    """End step of each block (the last may be partial) -> mean logged lm_loss over the log rows in it."""
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    out: dict[int, list[float]] = {}
    for r in rows:
        if upto is not None and r["step"] > upto:
            continue
        out.setdefault(-(-r["step"] // block) * block, []).append(r["lm_loss"])
    return {end: statistics.fmean(v) for end, v in sorted(out.items())}


def main(argv: list[str]) -> dict:
    opts, paths = {}, []
    for a in argv:  # key=value options; everything else (an existing path with "=" too) is a run folder
        if "=" in a and not Path(a).exists():
            key, value = a.split("=", 1)
            opts[key] = value
        else:
            paths.append(a)
    if len(paths) < 2:
        raise SystemExit(__doc__)
    block, upto = int(opts.get("block", 100)), int(opts["upto"]) if "upto" in opts else None
    ref = runs(paths[0])
    result = {"reference": paths[0], "block": block, "others": {}}
    for other in paths[1:]:
        oth = runs(other)
        seeds = sorted(set(ref) & set(oth))
        gaps = {}
        for s in seeds:
            a, b = block_means(ref[s], block, upto), block_means(oth[s], block, upto)
            gaps[s] = {end: b[end] - a[end] for end in a if end in b}
        ends = sorted(set.intersection(*(set(g) for g in gaps.values()))) if gaps else []
        print(f"{other} - {paths[0]}: training LM loss gap (nats) per {block} updates, ending at update")
        print("seed  " + " ".join(f"{e:>7}" for e in ends))
        for s in seeds:
            print(f"{s:<5} " + " ".join(f"{gaps[s][e]:+7.3f}" for e in ends))
        mean = {e: statistics.fmean(gaps[s][e] for s in seeds) for e in ends}
        sd = {e: statistics.stdev([gaps[s][e] for s in seeds]) if len(seeds) > 1 else 0.0 for e in ends}
        print("mean  " + " ".join(f"{mean[e]:+7.3f}" for e in ends))
        if len(seeds) > 1:
            print("sd    " + " ".join(f"{sd[e]:7.3f}" for e in ends))
        print()
        result["others"][other] = {"seeds": seeds, "gap": {str(s): gaps[s] for s in seeds}, "mean": mean, "sd": sd}
    if "out" in opts:
        Path(opts["out"]).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
