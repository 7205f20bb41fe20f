"""The training-step memory estimate (rpt.train.memory) next to the measured peak, for a grid of configs.

Each config runs in a fresh process (peak RSS is per process and never goes down): one training step of the model
(forward with the variant's own retrieval, the LM loss, for rpt-lex / rpt-sem the LambdaRank loss over k = 4 candidate
chunks per query, backward, AdamW step), then a second one; the peak RSS (CPU) or max_memory_allocated (CUDA) is set
against `estimate_step_memory`. Run it alone on the machine.

    python benchmarks/memory_estimate.py                         # tiny preset, xl / retro / rpt-sem, 2K-16K tokens
    python benchmarks/memory_estimate.py preset=small seq=4096,8192 variants=xl,rpt-sem out=docs/memory_estimate.json
"""

from __future__ import annotations

import json
import subprocess
import sys

STEP = r"""
import json, resource, sys, torch
from rpt.config import RPTConfig
from rpt.model.rpt import RPT
from rpt.train.losses import lambdarank_loss, lm_loss, relevance_from_candidates
from rpt.chunks import retrievable_mask
torch.set_num_threads(1)
variant, preset, T, B, V, dev = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
cfg = RPTConfig.from_preset(preset, variant=variant, vocab_size=V)
m = RPT(cfg.model).to(dev)
opt = torch.optim.AdamW(m.parameters())
g = torch.Generator().manual_seed(0)
ids = torch.randint(0, V, (B, T), generator=g).to(dev)
M, S = cfg.model.chunk_size, cfg.model.segment_len
C = T // M
for _ in range(2):
    nb = torch.randint(0, C, (B, C, cfg.model.n_neighbors), generator=g).to(dev) if variant == "retro" else None
    out = m(ids, nb)  # retro: random BM25-like neighbours (the model drops those that are not retrievable)
    l = lm_loss(out.logits, ids)
    loss = l.total / l.count
    if out.retrieval_scores is not None:
        cand = torch.randint(0, C, (B, C, 4), generator=g).to(dev)
        rel, pos = relevance_from_candidates(cand, torch.rand(B, C, 4, generator=g).to(dev), C)
        r = lambdarank_loss(out.retrieval_scores, rel, pos, 1.0, retrievable_mask(C, M, S, dev))
        loss = loss + r.total / r.count.clamp_min(1)
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
peak = torch.cuda.max_memory_allocated() if dev == "cuda" else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"peak_bytes": peak}))
"""


def main(argv: list[str]) -> None:
    import torch

    from rpt.config import RPTConfig
    from rpt.train.memory import estimate_step_memory, gib

    opts = dict(a.split("=", 1) for a in argv)
    preset = opts.get("preset", "tiny")
    seqs = [int(x) for x in opts.get("seq", "2048,8192,16384").split(",")]
    variants = opts.get("variants", "xl,retro,rpt-sem").split(",")
    batch, vocab = int(opts.get("batch", 2)), int(opts.get("vocab", 2048))
    dev = opts.get("device", "cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    print(f"{'variant':8} {'tokens':>7} {'estimate':>10} {'measured':>10} {'est/meas':>8}")
    for v in variants:
        for T in seqs:
            res = subprocess.run([sys.executable, "-c", STEP, v, preset, str(T), str(batch), str(vocab), dev],
                                 capture_output=True, text=True)
            if res.returncode:
                print(f"{v} {T}: failed: {res.stderr.strip().splitlines()[-1:]}")
                continue
            peak = json.loads(res.stdout.strip().splitlines()[-1])["peak_bytes"]
            cfg = RPTConfig.from_preset(preset, variant=v, vocab_size=vocab)
            cfg.data.seq_len, cfg.train.batch_size = T, batch
            est = estimate_step_memory(cfg, dev)
            rows.append({"variant": v, "preset": preset, "seq_len": T, "batch_size": batch, "vocab_size": vocab,
                         "device": dev, "estimate_bytes": est.total, "measured_peak_bytes": peak,
                         "ratio": est.total / peak})
            print(f"{v:8} {T:7d} {gib(est.total):>10} {gib(peak):>10} {est.total / peak:8.2f}")
    if "out" in opts:
        from rpt.bench import machine

        with open(opts["out"], "w") as f:
            json.dump({"machine": machine(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1:])
