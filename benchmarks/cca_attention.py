"""CCA's attention in training on a CPU: through scaled_dot_product_attention with a full [N, H, M, 1 + L] mask (before)
or directly, the biases added in place into the scores (after, `ChunkedCrossAttention.direct_attention`), side by side.

Overhead in a tiny-preset update of the retrieving variants: the profile (docs/results/speed.md#step-profile) put
about 33 ms of a 300 ms rpt-sem update into building CCA's mask (`where`, `cat`): the learned relative bias makes the
mask require grad, so SDPA takes its unfused math path anyway, after the mask has been materialised at the scores'
size three times. Both paths compute one function; this script checks that (loss and every gradient) and times a
training step (synthetic tokens, the chunked LM loss, LambdaRank for rpt-sem, backward) of each variant with each
path, in one process, from the same weights, the paths alternating within every round. Run it alone on the machine.

    python benchmarks/cca_attention.py preset=tiny seq=1024 batch=2 segment=128 rounds=5 steps=5 \
        out=docs/data/cca_attention_cpu.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab/ and rpt/ from a checkout


def main(argv: list[str]) -> None:
    import numpy as np
    import torch

    from lab.bench import machine, scale_config
    from rpt.chunks import retrievable_mask
    from rpt.model.cca import ChunkedCrossAttention
    from rpt.model.registry import build_model
    from rpt.training.losses import forward_lm, lambdarank_loss, relevance_from_candidates

    opts = dict(a.split("=", 1) for a in argv)
    preset, seq, batch = opts.get("preset", "tiny"), int(opts.get("seq", 1024)), int(opts.get("batch", 2))
    rounds, steps = int(opts.get("rounds", 5)), int(opts.get("steps", 5))
    variants = opts.get("variants", "xl,retro,rpt-sem").split(",")
    overrides = {"model.segment_len": int(opts["segment"])} if "segment" in opts else {}
    g = torch.Generator().manual_seed(0)

    def step(model, cfg, ids, nb, cand, rel_scores) -> float:
        m = cfg.model
        C = seq // m.chunk_size
        out, lm = forward_lm(model, ids, {"neighbor_ids": nb}, None, cfg.train.loss_chunk)
        loss = lm.total / lm.count
        if out.retrieval_scores is not None:
            rel, pos = relevance_from_candidates(cand, rel_scores, C)
            r = lambdarank_loss(out.retrieval_scores, rel, pos, 1.0, retrievable_mask(C, m.chunk_size, m.segment_len))
            loss = loss + r.total / r.count.clamp_min(1)
        loss.backward()
        return float(loss.detach())

    models = {}
    for v in variants:
        cfg = scale_config(v, preset, seq, batch, overrides=overrides)
        m = cfg.model
        C = seq // m.chunk_size
        models[v] = dict(cfg=cfg, model=build_model(m, seed=0).train(),
                         ids=torch.randint(0, m.vocab_size, (batch, seq), generator=g),
                         nb=torch.randint(0, C, (batch, C, m.n_neighbors), generator=g) if v == "retro" else None,
                         cand=torch.randint(0, C, (batch, C, 4), generator=g), rel=torch.rand(batch, C, 4, generator=g))

    # the same function: loss and gradients of both paths from the same weights and the same seed
    agreement = {}
    for v, r in models.items():
        if v == "xl":
            continue
        got = {}
        for direct in (False, True):
            ChunkedCrossAttention.direct_attention = direct
            r["model"].zero_grad(set_to_none=True)
            torch.manual_seed(0)
            loss = step(r["model"], r["cfg"], r["ids"], r["nb"], r["cand"], r["rel"])
            got[direct] = (loss, {n: p.grad.clone() for n, p in r["model"].named_parameters() if p.grad is not None})
        worst = max(float((got[True][1][n] - gr).abs().max() / gr.abs().max().clamp_min(1e-12))
                    for n, gr in got[False][1].items())
        agreement[v] = {"loss_diff": abs(got[True][0] - got[False][0]), "max_relative_grad_diff": worst}
        print(f"{v}: loss differs by {agreement[v]['loss_diff']:.2e}, gradients by at most {worst:.2e} (relative)")

    times: dict[str, list[float]] = {}
    modes = [("sdpa", False), ("direct", True)]
    for rnd in range(rounds + 1):  # round 0 is warm-up
        for name, direct in modes if rnd % 2 else modes[::-1]:
            ChunkedCrossAttention.direct_attention = direct
            for v, r in models.items():
                dts = []
                for _ in range(steps):
                    t = time.perf_counter()
                    step(r["model"], r["cfg"], r["ids"], r["nb"], r["cand"], r["rel"])
                    r["model"].zero_grad(set_to_none=True)
                    dts.append(time.perf_counter() - t)
                if rnd:
                    times.setdefault(f"{v} | {name}", []).append(float(np.median(dts)))
    ChunkedCrossAttention.direct_attention = True
    rows = {}
    print(f"\n{'variant | CCA path':22} {'s/step':>8} {'vs xl':>7} {'direct / sdpa':>14}")
    for v in variants:
        for name, _ in modes:
            sec = times[f"{v} | {name}"]
            vs_xl = [a / b for a, b in zip(sec, times[f"xl | {name}"], strict=True)] if "xl" in models else []
            own = [a / b for a, b in zip(sec, times[f"{v} | sdpa"], strict=True)]
            rows[f"{v} | {name}"] = {"seconds": sec, "median_s": float(np.median(sec)),
                                     "vs_xl": float(np.median(vs_xl)) if vs_xl else None,
                                     "vs_sdpa": float(np.median(own)), "vs_sdpa_range": [min(own), max(own)]}
            x = rows[f"{v} | {name}"]
            print(f"{v + ' | ' + name:22} {x['median_s']:8.3f} {x['vs_xl'] or 0:6.2f}x {x['vs_sdpa']:9.2f}x "
                  f"({min(own):.2f}-{max(own):.2f})")
    if "out" in opts:
        with open(opts["out"], "w") as f:
            json.dump({"machine": machine(), "preset": preset, "seq_len": seq, "batch_size": batch, "overrides": overrides,
                       "rounds": rounds, "steps_per_round": steps, "agreement": agreement, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1:])
