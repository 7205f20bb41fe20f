"""Peak memory and time of a CPU training step under glibc's default malloc and with a fixed mmap threshold.

glibc serves an allocation above its mmap threshold with its own mapping, returned to the system when freed; the
threshold starts at 128 KiB and, by default, rises to the size of each large block freed (up to 32 MiB), after which
blocks of that size come from the heap and fragment it. A training step frees and re-allocates blocks of many sizes
(activations, attention scores, gradients), so its peak resident set grows with the fragments. A fixed threshold
(the environment variable `MALLOC_MMAP_THRESHOLD_`, read when a process starts) keeps every large block in its own
mapping, at the cost of a fresh mapping (and page faults) for each.

Each config runs in fresh processes (`lab.bench.measure_step`), the two allocator settings alternating, `rounds`
times; each process times `steps` updates (the first is warm-up). Run it alone on the machine.

    python benchmarks/malloc_threshold.py preset=small seq=4096 variants=xl,rpt-sem rounds=3 steps=4 \
        out=docs/data/malloc_threshold_cpu.json
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab/ and rpt/ from a checkout


def main(argv: list[str]) -> None:
    import numpy as np

    from lab.bench import machine, measure_step
    from rpt.training.footprint import gib

    opts = dict(a.split("=", 1) for a in argv)
    preset, seq = opts.get("preset", "tiny"), int(opts.get("seq", 4096))
    variants = opts.get("variants", "xl,rpt-sem").split(",")
    rounds, steps = int(opts.get("rounds", 3)), int(opts.get("steps", 4))
    threshold = opts.get("threshold", "131072")
    settings = {"default": None, f"fixed {threshold}": threshold}
    rows: dict[str, dict[str, list]] = {}
    for r in range(rounds):
        for v in variants:
            for name, value in (settings.items() if r % 2 == 0 else reversed(settings.items())):
                env = os.environ.copy()
                os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
                if value is not None:
                    os.environ["MALLOC_MMAP_THRESHOLD_"] = value
                try:
                    x = measure_step(variant=v, preset=preset, seq_len=seq, batch_size=1, steps=steps)
                finally:
                    os.environ.clear()
                    os.environ.update(env)
                row = rows.setdefault(f"{v} | {name}", {"seconds_per_update": [], "peak_bytes": []})
                row["seconds_per_update"].append(x["seconds_per_update"])
                row["peak_bytes"].append(x["peak_bytes"])
                print(f"round {r}: {v:8} {name:14} {x['seconds_per_update']:7.3f} s/update  peak {gib(x['peak_bytes'])}",
                      flush=True)
    print(f"\n{'variant | malloc':28} {'s/update (median)':>18} {'vs default':>11} {'peak (max)':>11}")
    summary = {}
    for v in variants:
        base = rows[f"{v} | default"]
        for name in settings:
            row = rows[f"{v} | {name}"]
            ratios = [a / b for a, b in zip(row["seconds_per_update"], base["seconds_per_update"], strict=True)]
            summary[f"{v} | {name}"] = {**row, "time_vs_default": float(np.median(ratios)),
                                        "time_vs_default_range": [min(ratios), max(ratios)]}
            print(f"{v + ' | ' + name:28} {np.median(row['seconds_per_update']):18.3f} {np.median(ratios):10.2f}x "
                  f"{gib(max(row['peak_bytes'])):>11}")
    if "out" in opts:
        with open(opts["out"], "w") as f:
            json.dump({"machine": machine(), "preset": preset, "seq_len": seq, "steps": steps, "rounds": rounds,
                       "rows": summary}, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1:])
