"""The neighbour gate and the retrieval gain of a run's checkpoints, one line each: do CCA's neighbours get read,
and is the gate open? (docs/results/code.md#the-copy-prior: on code, two seeds of three closed their gates to eta while CCA had
not yet learned to read, and never read their neighbours after.)

    python benchmarks/gate_trajectory.py runs/code-long/retro-seed0 runs/code-long/retro-seed2
    python benchmarks/gate_trajectory.py runs/code-long/retro-seed2/checkpoints/step_00000600 docs=3 tokens=6000

For every checkpoint (or each run folder's checkpoints): the retrieval gain exp(NLL without neighbours - NLL with
BM25's c_q neighbours) per token on the first `docs` test documents (first `tokens` tokens each; retro is evaluated
with BM25 as at test time, rpt-* with their own retriever), the mean neighbour gate and the share of gates at eta.
Run alone: it is a measurement of the checkpoints, not of speed, but it takes 2-3 s per checkpoint and document.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch


def checkpoints(arg: str) -> list[Path]:
    p = Path(arg)
    if (p / "checkpoints").is_dir():
        return sorted((p / "checkpoints").glob("step_*"))
    return [p]


def main(argv: list[str]) -> None:
    from rpt.checkpoint import load_model
    from rpt.eval.perplexity import bm25_neighbors, evaluate_document, open_split

    paths = [a for a in argv if "=" not in a]
    opts = dict(a.split("=", 1) for a in argv if "=" in a)
    n_docs, n_tok = int(opts.get("docs", 3)), int(opts.get("tokens", 6000))
    store_root = opts.get("store")
    rows = []
    for arg in paths:
        for ck in checkpoints(arg):
            model, cfg = load_model(ck)
            model.eval()
            store = open_split(store_root or cfg.data.store, "test")
            gates: list[torch.Tensor] = []
            if getattr(model, "gate", None) is not None:
                def keep(module, args, out, gates=gates) -> None:
                    gates.append(out[0].detach().flatten())

                model.gate.register_forward_hook(keep)
            gains = []
            for d in range(min(n_docs, len(store))):
                toks = np.asarray(store.document(d))[:n_tok]
                ids = bm25_neighbors(toks, cfg.model.chunk_size, cfg.model.segment_len, cfg.model.n_neighbors)
                none = np.full_like(ids, -1)
                with torch.no_grad():
                    own = evaluate_document(model, toks, neighbor_ids=ids if cfg.model.variant == "retro" else None)
                    off = evaluate_document(model, toks, neighbor_ids=none)
                gains.append(float(np.exp((off.nll_sum - own.nll_sum) / own.n_targets)))
            g = torch.cat(gates) if gates else torch.full((1,), float("nan"))
            eta = cfg.model.gate.eta
            row = {"checkpoint": str(ck), "gain_per_doc": gains, "gain": float(np.mean(gains)),
                   "gate_mean": float(g.mean()), "gates_at_eta": float((g <= eta + 1e-4).float().mean())}
            rows.append(row)
            print(f"{ck}: gain {row['gain']:.4f} (per document {', '.join(f'{x:.4f}' for x in gains)}); "
                  f"gate mean {row['gate_mean']:.3f}, at eta {100 * row['gates_at_eta']:.0f}%", flush=True)
    if "out" in opts:
        Path(opts["out"]).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
