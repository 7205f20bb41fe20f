"""Where one training update's time goes, per variant, at a small preset: the phases of the training loop timed
apart (data + label tensors, forward with both losses, backward, optimiser), then torch.profiler's top operators of the
forward + backward for each variant: where the retrieving variants' extra time per update goes. Run it alone on
the machine.

    python benchmarks/step_profile.py store=STORE                       # tiny, 1,024 tokens x 2
    python benchmarks/step_profile.py store=runs/demo/store steps=20 variants=xl,retro,rpt-lex,rpt-sem \
        out=docs/data/step_profile.json

Every phase calls the training loop's own functions (rpt.training.loop.prepare, step_denominators and micro_loss:
the forward with the chunked LM loss and the LambdaRank loss, normalised as in training; clip_gradients, the
optimiser), on the store's real tokens and labels, in one process, variants interleaved step by step so that a change
in the machine's speed hits every variant alike.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab/ and rpt/ from a checkout


def main(argv: list[str]) -> None:
    from lab.bench import machine
    from rpt.config import RPTConfig
    from rpt.data.tokenizer import Tokenizer
    from rpt.labels.store import LabelStore
    from rpt.model.rpt import RPT
    from rpt.training.data import BatchStream, SequenceDataset, open_store
    from rpt.training.loop import micro_loss, prepare, step_denominators
    from rpt.training.optim import build_optimizer, clip_gradients

    opts = dict(a.split("=", 1) for a in argv)
    store = Path(opts.get("store", "runs/demo/store"))
    preset, seq = opts.get("preset", "tiny"), int(opts.get("seq", 1024))
    steps, batch = int(opts.get("steps", 20)), int(opts.get("batch", 2))
    variants = opts.get("variants", "xl,retro,rpt-lex,rpt-sem").split(",")
    torch.set_num_threads(int(opts.get("threads", torch.get_num_threads())))
    vocab = Tokenizer.from_file(store / "tokenizer.json").vocab_size
    tokens = open_store(store)
    runs = {}
    for v in variants:
        cfg = RPTConfig.from_preset(preset, variant=v, vocab_size=vocab)
        cfg.data.seq_len, cfg.train.batch_size = seq, batch
        cfg.model.segment_len = int(opts.get("segment", 128))
        kind = "sem" if v == "rpt-sem" else "lex"
        labels = LabelStore.open(store / "labels" / f"train-{kind}-{seq}") if v != "xl" else None
        ds = SequenceDataset(tokens, seq, cfg.model.chunk_size, cfg.model.segment_len, labels)
        torch.manual_seed(0)
        model = RPT(cfg.model).train()
        runs[v] = dict(cfg=cfg, stream=BatchStream(ds, batch, 1, 0, 1, 0), model=model,
                       opt=build_optimizer(model, cfg.train), times=[])
    dev = torch.device("cpu")
    for step in range(steps + 2):  # the first two are warm-up
        for r in runs.values():
            cfg, model, opt = r["cfg"], r["model"], r["opt"]
            t = [time.perf_counter()]
            x = prepare(r["stream"].next_step()[0], cfg.model, 0.5, 0, dev)  # p_ss = 0.5: both neighbour paths
            t.append(time.perf_counter())
            loss, _ = micro_loss(model, x, cfg.model, cfg.train, step_denominators([x], cfg.model.has_retriever),
                                 cfg.train.alpha_ret, 1.0)
            t.append(time.perf_counter())
            loss.backward()
            t.append(time.perf_counter())
            clip_gradients(model, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            t.append(time.perf_counter())
            if step >= 2:
                r["times"].append(np.diff(t))
    phases = ["data + labels", "forward (both losses)", "backward", "optimiser"]
    result = {"machine": machine(), "preset": preset, "seq_len": seq, "batch_size": batch, "steps": steps, "variants": {}}
    base = None
    print(f"{'variant':<9}" + "".join(f"{p:>25}" for p in phases) + f"{'total':>10}{'vs xl':>7}")
    for v, r in runs.items():
        med = np.median(np.stack(r["times"]), 0)
        total = float(np.median(np.stack(r["times"]).sum(1)))
        base = base or total
        result["variants"][v] = {"phases_ms": dict(zip(phases, (1e3 * med).tolist(), strict=True)), "total_ms": 1e3 * total,
                                 "vs_xl": total / base}
        print(f"{v:<9}" + "".join(f"{1e3 * m:25.1f}" for m in med) + f"{1e3 * total:10.1f}{total / base:7.2f}")

    if opts.get("ops", "1") != "0":  # which operators take the forward + backward time
        from torch.profiler import ProfilerActivity, profile

        for v, r in runs.items():
            cfg, model = r["cfg"], r["model"]
            x = prepare(r["stream"].next_step()[0], cfg.model, 0.5, 0, dev)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                loss, _ = micro_loss(model, x, cfg.model, cfg.train, step_denominators([x], cfg.model.has_retriever),
                                     cfg.train.alpha_ret, 1.0)
                loss.backward()
            model.zero_grad(set_to_none=True)
            ev = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[: int(opts.get("top", 12))]
            total = sum(e.self_cpu_time_total for e in prof.key_averages())
            result["variants"][v]["top_ops"] = [{"op": e.key, "self_ms": e.self_cpu_time_total / 1e3, "calls": e.count}
                                                for e in ev]
            print(f"\n{v}: top operators by self time (forward + backward, {total / 1e3:.0f} ms in all)")
            for e in ev:
                print(f"  {e.key:<45}{e.self_cpu_time_total / 1e3:9.1f} ms {e.count:6d} calls")
    if "out" in opts:
        Path(opts["out"]).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
