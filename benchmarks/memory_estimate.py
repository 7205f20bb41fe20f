"""The training-step memory estimate (rpt.training.footprint) next to the measured peak, for a grid of configs.

Each config runs in a fresh process (peak RSS is per process and never goes down) through `lab.bench.measure_step`,
the probe `python -m lab bench --scale` uses: two training updates on synthetic tokens and labels (forward with the variant's
own retrieval, the LM loss, for rpt-lex / rpt-sem the LambdaRank loss over 4 candidate chunks per query, backward,
the optimiser step); the peak RSS (CPU) or max_memory_allocated (CUDA) is set against `estimate_step_memory`. Run it
alone on the machine. `loss_chunk=0` measures the full-logit loss (the default is the chunked one).

    python benchmarks/memory_estimate.py                         # tiny preset, xl / retro / rpt-sem, 2K-16K tokens
    python benchmarks/memory_estimate.py preset=small seq=4096,8192 variants=xl,rpt-sem out=docs/data/memory_estimate.json
    python benchmarks/memory_estimate.py loss_chunk=0
    python benchmarks/memory_estimate.py variants=memorizing seq=8192 repeat=3      # the peak's run-to-run spread
    MALLOC_MMAP_THRESHOLD_=131072 python benchmarks/memory_estimate.py ...          # glibc: no heap fragmentation
    python benchmarks/memory_estimate.py preset=small set=model.attn_dropout=0      # config fields (;-separated)
    python benchmarks/memory_estimate.py saved=1 preset=small seq=2048 batch=1 attn_dropout=0.05,0

`saved=1` checks the estimate's layer and retrieval terms alone against what autograd keeps for backward, counted with
saved-tensor hooks (`rpt.training.footprint.saved_tensor_bytes`, one training forward on the CPU, no peak RSS): the
table of speed.md's step-memory section. The logits term is left out, so give the chunked loss (`loss_chunk=1024`)
where the preset's is the full-logit one (tiny): the hooks would count the [B, T, V] logits too. `attn_dropout=P,Q`
runs each value (the CPU takes the math attention path whenever P > 0, the fused one at 0); it is read only with
`saved=1`, as `repeat` and `device` only without it.

`repeat=N` measures each config N times (fresh processes) and reports the smallest and largest peak: on glibc the
peak RSS of one config varies from run to run with the allocator's dynamic mmap threshold (memorizing, 2 x 8,192
tokens: 1.4-1.8 GiB), and a fixed threshold (the environment variable above, inherited by the probes) removes it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab/ and rpt/ from a checkout


def main(argv: list[str]) -> None:
    import torch
    import yaml

    from lab.bench import measure_step, scale_config
    from rpt.training.footprint import estimate_step_memory, gib
    from rpt.utils import UserError

    opts = dict(a.split("=", 1) for a in argv)
    preset = opts.get("preset", "tiny")
    seqs = [int(x) for x in opts.get("seq", "2048,8192,16384").split(",")]
    variants = opts.get("variants", "xl,retro,rpt-sem").split(",")
    batch, vocab = int(opts.get("batch", 2)), int(opts.get("vocab", 2048))
    dev = opts.get("device", "cuda" if torch.cuda.is_available() else "cpu")
    repeat = int(opts.get("repeat", 1))
    chunk = int(opts["loss_chunk"]) if "loss_chunk" in opts else None  # None: the config's default (chunked)
    overrides = {k: yaml.safe_load(v) for k, v in (x.split("=", 1) for x in opts.get("set", "").split(";") if x)}
    if opts.get("saved") == "1":
        return saved_tensors(opts, preset, seqs, variants, batch, vocab, chunk, overrides)
    rows = []
    print(f"{'variant':8} {'tokens':>7} {'estimate':>10} {'measured':>10} {'est/meas':>8}")
    for v in variants:
        for T in seqs:
            try:
                peaks = [measure_step(variant=v, preset=preset, seq_len=T, batch_size=batch, vocab_size=vocab,
                                      device=dev, steps=2, loss_chunk=chunk, threads=1,
                                      overrides=overrides)["peak_bytes"]
                         for _ in range(repeat)]
            except UserError as e:
                print(f"{v} {T}: failed: {e}")
                continue
            peak = max(peaks)
            cfg = scale_config(v, preset, T, batch, vocab, loss_chunk=chunk, overrides=overrides)
            est = estimate_step_memory(cfg, dev)
            rows.append({"variant": v, "preset": preset, "seq_len": T, "batch_size": batch, "vocab_size": vocab,
                         "device": dev, "loss_chunk": chunk, "overrides": overrides, "estimate_bytes": est.total,
                         "measured_peak_bytes": peak,
                         "ratio": est.total / peak, "measured_peaks_bytes": peaks})
            spread = f"  (peaks {gib(min(peaks))} - {gib(max(peaks))} over {repeat} runs)" if repeat > 1 else ""
            print(f"{v:8} {T:7d} {gib(est.total):>10} {gib(peak):>10} {est.total / peak:8.2f}{spread}")
    if "out" in opts:
        import os

        from lab.bench import machine

        env = {k: os.environ[k] for k in os.environ if k.startswith("MALLOC_")}
        with open(opts["out"], "w") as f:
            json.dump({"machine": machine(), "malloc_env": env, "rows": rows}, f, indent=2)


def saved_tensors(opts: dict[str, str], preset: str, seqs: list[int], variants: list[str], batch: int, vocab: int,
                  chunk: int | None, overrides: dict) -> None:
    """The estimate's layer and retrieval terms (less the transients a layer frees inside itself, which autograd does
    not keep) against the bytes saved for backward, per variant, length and attention dropout."""
    import torch

    from lab.bench import machine, scale_config
    from rpt.model.registry import model_class
    from rpt.training.footprint import estimate_step_memory, saved_tensor_bytes

    torch.set_num_threads(1)
    drops = [float(x) for x in opts["attn_dropout"].split(",")] if "attn_dropout" in opts else [None]
    rows = []
    print(f"{'variant':8} {'tokens':>7} {'attn_dropout':>12} {'saved MiB':>10} {'estimate MiB':>12} {'est/saved':>9}")
    for v in variants:
        for p in drops:
            for T in seqs:
                over = dict(overrides, **({"model.attn_dropout": p} if p is not None else {}))
                cfg = scale_config(v, preset, T, batch, vocab, loss_chunk=chunk, overrides=over)
                saved = saved_tensor_bytes(cfg)
                est = estimate_step_memory(cfg, "cpu")
                counted = (est.layers + est.retrieval
                           - model_class(v).temporary_bytes(cfg.model, cfg.train.batch_size, cfg.data.seq_len))
                total = sum(saved.values())
                rows.append({"variant": v, "preset": preset, "seq_len": T, "batch_size": batch, "vocab_size": vocab,
                             "attn_dropout": cfg.model.attention_dropout, "loss_chunk": cfg.train.loss_chunk,
                             "overrides": over, "saved_bytes": total, "saved_by_module": saved,
                             "estimate_bytes": counted, "ratio": counted / total})
                print(f"{v:8} {T:7d} {cfg.model.attention_dropout:12g} {total / 2**20:10,.0f} {counted / 2**20:12,.0f} "
                      f"{counted / total:9.2f}")
    if "out" in opts:
        with open(opts["out"], "w") as f:
            json.dump({"machine": machine(), "what": "saved-tensor bytes against the estimate's layer and retrieval "
                       "terms (rpt.training.footprint)", "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1:])
