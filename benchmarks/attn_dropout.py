"""What attention dropout costs on a CPU: the same training step with the paper's dropout everywhere (0.05, also on the
attention probabilities: every attention call takes the unfused math path on a CPU), with model.attn_dropout=0
(residual dropout kept, attention on the fused CPU kernel) and with no dropout at all. One process, the three models
built from one seed, timed in alternating order per round; the ratio to attn_dropout=0 is taken within each round.

    python benchmarks/attn_dropout.py preset=small seq=2048 variants=xl,rpt-sem rounds=3 steps=3 \
        out=docs/data/attn_dropout_cpu.json

Run it alone on the machine. Synthetic tokens; rpt-sem retrieves with its own retriever (no labels: LM loss only).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab/ and rpt/ from a checkout

SETTINGS = {"paper (0.05 everywhere)": (0.05, -1.0), "attn_dropout=0": (0.05, 0.0), "no dropout": (0.0, -1.0)}


def main(argv: list[str]) -> None:
    from lab.bench import machine
    from rpt.config import RPTConfig
    from rpt.model.registry import build_model
    from rpt.training.losses import forward_lm

    opts = dict(a.split("=", 1) for a in argv)
    preset, seq = opts.get("preset", "small"), int(opts.get("seq", 2048))
    rounds, steps = int(opts.get("rounds", 3)), int(opts.get("steps", 3))
    result = {"machine": machine(), "preset": preset, "seq_len": seq, "rounds": rounds, "steps": steps, "variants": {}}
    for variant in opts.get("variants", "xl,rpt-sem").split(","):
        models = {}
        for name, (drop, attn) in SETTINGS.items():
            cfg = RPTConfig.from_preset(preset, variant=variant)
            cfg.model.dropout, cfg.model.attn_dropout = drop, attn
            model = build_model(cfg.model, seed=0).train()
            models[name] = (model, torch.optim.AdamW(model.parameters(), 1e-4))
        ids = torch.randint(0, cfg.model.vocab_size, (1, seq), generator=torch.Generator().manual_seed(0))

        def step(model: torch.nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor = ids,
                 chunk: int = cfg.train.loss_chunk) -> None:
            _, lm = forward_lm(model, ids, {}, None, chunk)
            (lm.total / lm.count).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        for pair in models.values():  # warm-up
            step(*pair)
        secs: dict[str, list[float]] = {name: [] for name in models}
        for r in range(rounds):
            for name in (list(models) if r % 2 == 0 else list(models)[::-1]):
                t = time.perf_counter()
                for _ in range(steps):
                    step(*models[name])
                secs[name].append((time.perf_counter() - t) / steps)
        ref = secs["attn_dropout=0"]
        rows = {name: {"seconds_per_update": s, "ratio_to_attn_dropout_0": [a / b for a, b in zip(s, ref, strict=True)]}
                for name, s in secs.items()}
        result["variants"][variant] = rows
        for name, row in rows.items():
            ratio = row["ratio_to_attn_dropout_0"]
            print(f"{variant:<8} {name:<24} {np.median(row['seconds_per_update']):7.3f} s/update   "
                  f"{np.median(ratio):.2f}x of attn_dropout=0 (rounds {min(ratio):.2f}-{max(ratio):.2f})", flush=True)
    if "out" in opts:
        Path(opts["out"]).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
