"""Neighbour gate with and without a dead zone: `gate=paper` (max(eta, sigmoid) with the
sigmoid's gradient passed through the clamp, the default) against `gate=clamp` (as printed: no gradient below eta),
paired seeds, on code (the demo's store) and on the copy corpus (a `python -m lab copytest` folder).

    python benchmarks/gate_compare.py code runs/demo            # trains rpt-sem gate=clamp beside the demo's runs
    python benchmarks/gate_compare.py copy runs/copytest-demo    # reads python -m lab copytest's runs (paper and clamp)

Code: for each seed of the demo, trains rpt-sem with gate=clamp exactly as the demo trained rpt-sem (same command,
`--set model.gate.kind=clamp`), evaluates both over the demo's test documents with their own neighbours and with none, and
reports perplexity, the retrieval gain and the share of gates sitting at eta (at the floor) on those documents.
Copy: the same figures for the `far-rpt-sem-seed*` runs of a copytest folder run with and without `--set model.gate.kind=clamp`.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np
import torch


def gate_stats(run: Path, store: Path, n_docs: int, max_tokens: int = 4096) -> dict[str, float]:
    """Share of gates at eta and their mean over the first `n_docs` test documents (the model's own neighbours)."""
    from rpt.checkpoint import load_model
    from rpt.eval.perplexity import open_split

    model, cfg = load_model(run)
    docs = open_split(store, "test")
    gates = []
    with torch.no_grad():
        for d in range(min(n_docs, len(docs))):
            toks = np.asarray(docs.document(d), dtype=np.int64)[:max_tokens]
            toks = toks[: len(toks) // cfg.model.segment_len * cfg.model.segment_len]
            if len(toks) < 2 * cfg.model.segment_len:
                continue
            out = model(torch.from_numpy(toks)[None])
            ids = out.neighbor_ids[0]
            gates.append(out.gates[0, : ids.shape[0]][ids >= 0].flatten())
    g = torch.cat(gates)
    eta = cfg.model.gate.eta
    return {"at_eta": float((g <= eta + 1e-6).float().mean()), "mean": float(g.mean()), "n": int(g.numel())}


def _ms(xs: list[float]) -> str:
    return f"{statistics.fmean(xs):.3f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.3f}"


def code(demo: Path) -> None:
    from rpt.cli import main

    summary = json.loads((demo / "results" / "demo.json").read_text())
    commands = summary["commands"]
    rows: dict[str, dict[str, list[float]]] = {}
    for seed in summary["seeds"]:
        base = f"rpt-sem-seed{seed}"
        train = next(c for c in commands if c.startswith("rpt train") and f"/runs/{base} " in c + " ")
        ev = next(c for c in commands if c.startswith("rpt eval") and f"/runs/{base} " in c + " " and "--source none" in c)
        for gate in ("paper", "clamp"):
            run = demo / "runs" / (base if gate == "paper" else f"{base}-gate=clamp")
            if gate == "clamp":
                argv = train.split()[1:]
                argv[argv.index("--out") + 1] = str(run)
                main(argv + ["--set", "model.gate.kind=clamp"])
            ppl = {}
            for src in ("model", "none"):
                argv = ev.split()[1:]
                argv[argv.index("--checkpoint") + 1] = str(run)
                argv[argv.index("--out") + 1] = str(demo / "results" / f"gate-{gate}-seed{seed}-{src}.json")
                argv[argv.index("--source") + 1] = src
                main(argv)
                ppl[src] = json.loads(Path(argv[argv.index("--out") + 1]).read_text())["total"]["perplexity"]
            n_docs = int(argv[argv.index("--max-documents") + 1])
            st = gate_stats(run, demo / "store", n_docs)
            r = rows.setdefault(gate, {"ppl": [], "gain": [], "at_eta": [], "mean": []})
            r["ppl"].append(ppl["model"])
            r["gain"].append(ppl["none"] / ppl["model"])
            r["at_eta"].append(st["at_eta"])
            r["mean"].append(st["mean"])
    print(f"\ncode ({demo}), rpt-sem, mean ± sd over seeds {summary['seeds']}")
    print(f"{'gate':<8}{'test ppl':>20}{'gain none/own':>18}{'gates at eta':>16}{'mean gate':>16}")
    for gate, r in rows.items():
        print(f"{gate:<8}{_ms(r['ppl']):>20}{_ms(r['gain']):>18}{_ms(r['at_eta']):>16}{_ms(r['mean']):>16}")


def copy(folder: Path) -> None:
    summaries = [json.loads(p.read_text()) for p in sorted(folder.glob("copytest*.json"))]
    print(f"\ncopy corpus ({folder}), rpt-sem far, mean ± sd over seeds")
    print(f"{'gate':<8}{'copy advantage':>20}{'ppl gain none/own':>20}{'source@1':>16}{'gates at eta':>16}")
    for summ in summaries:
        overrides = summ["settings"]["model_overrides"]
        gate = overrides.get("gate.kind", overrides.get("gate", "paper"))  # "gate": written by an earlier version
        runs = [r for r in summ["runs"] if r["setting"] == "far" and r["variant"] == "rpt-sem"]
        if not runs:
            continue
        adv = [r["eval"]["model"]["advantage"] for r in runs]
        gain = [math.exp(r["eval"]["none"]["all"] - r["eval"]["model"]["all"]) for r in runs]
        hit = [r["eval"]["model"]["hit@1"] for r in runs]
        at_eta = [gate_stats(Path(r["run"]), Path(r["store"]), summ["settings"]["eval_docs"])["at_eta"] for r in runs]
        print(f"{gate:<8}{_ms(adv):>20}{_ms(gain):>20}{_ms(hit):>16}{_ms(at_eta):>16}")


if __name__ == "__main__":
    what, where = sys.argv[1], Path(sys.argv[2])
    {"code": code, "copy": copy}[what](where)
