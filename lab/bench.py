"""`python -m lab bench`: side-by-side measurements in one process, on one machine, at one config.

1. Training step time of each variant relative to xl (the paper's Time/update column; it reports 1.51x for RPT),
   tokens/s, peak memory (on Linux the peak resident set is reset between variants: each peak is its own, over what
   the process still holds), and MFU on a GPU — through the real training loop (`rpt.training.loop.train`) on a real
   token store with real labels.
2. Evaluation time and memory versus document length: the cost must grow linearly (constant time per token, a
   document memory that grows by a fixed amount per chunk, a bounded K/V cache).
3. Labelling throughput: BM25 candidates (ours vs bm25s vs rank_bm25) and the scorer (benchmarks/bench_labels.py).
4. At scale (`python -m lab bench --scale`, e.g. the 250m preset at 16K tokens): each variant's training step on synthetic tokens
   and labels, each in a fresh process (peak RSS never goes down within one): time per update and its ratio to xl,
   peak memory next to the pre-flight estimate (rpt.training.footprint), the largest batch whose estimate fits a memory
   budget (and whose estimate scaled to the measured peak does), and MFU on a GPU; the LM loss with full logits and
   chunked, side by side.

Numbers from a shared machine are meaningless: run it alone.
"""

from __future__ import annotations

import copy
import os
import platform
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rpt.config import VARIANTS, RPTConfig
from rpt.model.decoder import set_activation_checkpointing
from rpt.model.registry import build_model, spec
from rpt.training.footprint import count_parameters
from rpt.utils import UserError, cpu_name, write_json_atomic

# dense bf16 peak FLOP/s used for MFU (vendor datasheets)
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


def machine() -> dict[str, Any]:
    info = {"platform": platform.platform(), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "device": "cpu"}
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
    return info


def reset_peak_rss() -> bool:
    """Reset this process's peak resident set (Linux: writing 5 to /proc/self/clear_refs resets VmHWM) to what it holds
    now, after a garbage collection, so that the next `peak_rss_mb` is the peak since now. What the previous variant
    left resident (memory the allocator keeps) is still counted in it. False where the kernel offers no reset: the
    peak is then the process's running maximum, which after the first variant of a bench is not that variant's own."""
    import gc

    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """Peak resident set in MiB: VmHWM of /proc/self/status (what `reset_peak_rss` resets), else getrusage's
    ru_maxrss (never reset)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _flops_per_token(n: int, cfg: RPTConfig) -> float:
    """6 N per token for the N weights plus the attention score/value products (window 2S, causal half on average)."""
    attn = 6 * cfg.model.n_layers * cfg.model.d_model * (1.5 * cfg.model.segment_len)
    return 6 * n + attn


def bench_training(store: Path, labels: dict[str, Path | None], *, preset: str = "tiny", seq_len: int = 1024,
                   segment_len: int | None = None, batch_size: int = 2, steps: int = 12, warmup: int = 3,
                   rounds: int = 1, device: str | None = None,
                   overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Time `steps` updates of each variant through the training loop; the first `warmup` are not counted.

    With `rounds` > 1 every variant is timed once per round, in the listed order, then reversed, and so on: a machine
    whose speed drifts (a shared host, a CPU clock) moves xl's time and a variant's within one round alike, so each
    round gives its own ratio to xl, and the row reports the median ratio and its range over the rounds. Each peak RSS
    is taken over what the process already holds when the variant starts (memory the allocator kept from the variants
    before it), so the row keeps the lowest of its rounds: the tightest bound on the variant's own peak.
    """
    from rpt.data.tokenizer import Tokenizer

    vocab = Tokenizer.from_file(store / "tokenizer.json").vocab_size
    cfgs: dict[str, RPTConfig] = {}
    for variant in VARIANTS:
        if spec(variant).labels is not None and labels.get(variant) is None:
            continue
        cfg = cfgs[variant] = RPTConfig.from_preset(preset, variant=variant, vocab_size=vocab)
        cfg.data.seq_len = seq_len
        if segment_len:
            cfg.model.segment_len = segment_len
        for key, value in (overrides or {}).items():
            section, field = key.split(".")
            setattr(getattr(cfg, section), field, value)
        cfg.train.steps, cfg.train.batch_size, cfg.train.grad_accum = steps, batch_size, 1
        cfg.train.checkpoint_every, cfg.train.log_every, cfg.train.keep_last = steps, steps, 1
    variants = list(cfgs)
    timed: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in range(rounds):
        for variant in variants if r % 2 == 0 else variants[::-1]:
            timed[variant].append(_time_training(copy.deepcopy(cfgs[variant]), store, labels.get(variant), warmup, device))
    rows: dict[str, Any] = {}
    tokens = batch_size * seq_len
    for variant, per_round in timed.items():
        cfg = cfgs[variant]
        ratios = [x["sec"] / xl["sec"] for x, xl in zip(per_round, timed["xl"], strict=True)]
        sec = float(np.median([x["sec"] for x in per_round]))
        n_params = count_parameters(cfg)
        row = {"seconds_per_update": sec, "tokens_per_s": tokens / sec, "parameters": n_params,
               "time_vs_xl": float(np.median(ratios)), "peak_rss_mb": min(x["peak_rss_mb"] for x in per_round),
               "peak_rss_scope": "variant" if all(x["own_peak"] for x in per_round) else "process"}
        if rounds > 1:
            row["rounds"] = {"seconds_per_update": [x["sec"] for x in per_round], "time_vs_xl": ratios}
            row["time_vs_xl_range"] = [min(ratios), max(ratios)]
        if "peak_gpu_mb" in per_round[0]:
            row["peak_gpu_mb"] = max(x["peak_gpu_mb"] for x in per_round)
            name = torch.cuda.get_device_name(0)
            peak = next((v for k, v in PEAK_FLOPS.items() if k in name), None)
            if peak:
                row["mfu"] = tokens / sec * _flops_per_token(n_params, cfg) / peak
        rows[variant] = row
    return {"preset": preset, "seq_len": seq_len, "batch_size": batch_size, "steps_timed": steps - warmup,
            "rounds": rounds, "variants": rows}


def _time_training(cfg: RPTConfig, store: Path, labels: Path | None, warmup: int, device: str | None) -> dict[str, Any]:
    """One training run of `cfg.train.steps` updates: the median update time after `warmup`, and the peak memory."""
    from rpt.training.loop import train

    tmp = Path(tempfile.mkdtemp(prefix=f"rpt-bench-{cfg.model.variant}-"))
    cfg.train.out_dir = str(tmp)
    stamps: list[float] = []
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    own_peak = reset_peak_rss()

    def on_step(step: int, metrics: dict[str, float]) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())

    try:
        # stop before the final checkpoint write would be timed: the last stamp comes before it
        train(cfg, store, labels, resume=False, device=device, progress=False, on_step=on_step)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    dts = np.diff(stamps[warmup - 1 :]) if len(stamps) > warmup else np.diff(stamps)
    out = {"sec": float(np.median(dts)), "peak_rss_mb": peak_rss_mb(), "own_peak": own_peak}
    if torch.cuda.is_available():
        out["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def scale_config(variant: str, preset: str, seq_len: int, batch_size: int = 1, vocab_size: int | None = None,
                 precision: str | None = None, loss_chunk: int | None = None,
                 segment_len: int | None = None, overrides: dict[str, Any] | None = None) -> RPTConfig:
    """The config of a synthetic-data measurement (`python -m lab bench --scale`, `--kernels`): a preset's, with the overrides
    given (None keeps the preset's); `overrides` maps dotted fields to values, e.g. {"model.attn_dropout": 0}."""
    cfg = RPTConfig.from_preset(preset, variant=variant, **({"vocab_size": vocab_size} if vocab_size else {}))
    cfg.data.seq_len, cfg.train.batch_size = seq_len, batch_size
    if loss_chunk is not None:
        cfg.train.loss_chunk = loss_chunk
    if precision:
        cfg.train.precision = precision
    if segment_len:
        cfg.model.segment_len = segment_len
    if overrides:  # through the config's own typed path: an unknown key or a wrong type names its dotted key
        from rpt.config import _merge, from_dict

        nested: dict[str, dict[str, Any]] = {}
        for key, value in overrides.items():
            section, dot, name = key.partition(".")
            if not dot or not name:
                raise UserError(f"--set {key}: expected a dotted key, e.g. model.attn_dropout=0")
            nested.setdefault(section, {})[name] = value
        cfg = from_dict(RPTConfig, _merge(cfg.to_dict(), nested))
    cfg.model.validate()
    return cfg


def probe_step(variant: str, preset: str, seq_len: int, batch_size: int = 1, vocab_size: int | None = None,
               device: str = "cpu", steps: int = 2, loss_chunk: int | None = None, threads: int | None = None,
               seed: int = 0, precision: str | None = None, compile: bool = False,
               overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """`steps` training updates of one variant on synthetic tokens and labels, in THIS process; returns seconds per
    update (the median after the first), the first update's seconds (with compile=True: the compilation) and the peak
    memory (max RSS on the CPU, max_memory_allocated on CUDA).

    The step is the training loop's own (`rpt.training.loop.prepare`, `step_denominators`, `micro_loss`): the model's
    forward with the chunked LM loss (or full logits, loss_chunk=0), on synthetic labels of 4 random candidates per
    query chunk (retro reads their BM25 top K; rpt-lex / rpt-sem rank them with LambdaRank, half the chunks fed the
    gold neighbours), backward, global-norm clipping and the configured optimiser. Meant to run in a fresh process
    (`measure_step`)."""
    from rpt.training.data import Batch
    from rpt.training.loop import micro_loss, prepare, step_denominators
    from rpt.training.optim import build_optimizer, clip_gradients

    if threads:
        torch.set_num_threads(threads)
    cfg = scale_config(variant, preset, seq_len, batch_size, vocab_size, precision, loss_chunk, overrides=overrides)
    m, dev = cfg.model, torch.device(device)
    torch.manual_seed(seed)
    model = build_model(m).to(dev).train()
    if cfg.train.activation_checkpointing:  # as the training loop does
        set_activation_checkpointing(model)
    if compile:
        model.compile()  # as the training loop does with train.compile
    opt = build_optimizer(model, cfg.train)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, m.vocab_size, (batch_size, seq_len), generator=g)
    C = seq_len // m.chunk_size
    use_bf16 = cfg.train.precision == "bf16" and dev.type == "cuda"
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    stamps = [time.perf_counter()]
    for _ in range(steps):
        batch = Batch(ids, torch.ones_like(ids, dtype=torch.bool),
                      candidates=torch.randint(0, C, (batch_size, C, 4), generator=g),
                      bm25=torch.rand(batch_size, C, 4, generator=g), target=torch.randn(batch_size, C, 4, generator=g))
        x = prepare(batch, m, 0.5, seed, dev)
        denom = step_denominators([x], m.has_retriever)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_bf16):
            loss, _ = micro_loss(model, x, m, cfg.train, denom, cfg.train.alpha_ret, 1.0)
        loss.backward()
        clip_gradients(model, cfg.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss
        if dev.type == "cuda":
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())
    peak = (torch.cuda.max_memory_allocated() if dev.type == "cuda"
            else peak_rss_mb() * 2**20)
    dts = np.diff(stamps[1:])
    n_params = model.num_parameters()
    row = {"variant": variant, "preset": preset, "seq_len": seq_len, "batch_size": batch_size,
           "vocab_size": m.vocab_size, "loss_chunk": cfg.train.loss_chunk, "device": str(dev), "parameters": n_params,
           "precision": "bf16" if use_bf16 else "fp32", "compile": compile,
           "seconds_per_update": float(np.median(dts)) if len(dts) else None, "updates_timed": len(dts),
           "first_update_s": stamps[1] - stamps[0], "peak_bytes": int(peak), "overrides": overrides or {}}
    if row["seconds_per_update"]:
        row["tokens_per_s"] = batch_size * seq_len / row["seconds_per_update"]
        if dev.type == "cuda":
            peak_flops = next((v for k, v in PEAK_FLOPS.items() if k in torch.cuda.get_device_name(0)), None)
            if peak_flops:
                row["mfu"] = row["tokens_per_s"] * _flops_per_token(n_params, cfg) / peak_flops
    return row


def measure_step(**spec: Any) -> dict[str, Any]:
    """`probe_step(**spec)` in a fresh Python process (its peak memory is its own); UserError naming the config if it
    fails (e.g. killed for memory)."""
    import json
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "lab.bench", "probe", json.dumps(spec)], capture_output=True,
                         text=True)
    if res.returncode:
        why = (res.stderr.strip().splitlines() or [f"exit status {res.returncode}"])[-1]
        if res.returncode < 0:
            why = f"killed by signal {-res.returncode} (out of memory?)"
        raise UserError(f"bench probe {spec} failed: {why}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def largest_batch(cfg: RPTConfig, budget_bytes: float, device: str, limit: int = 4096) -> int:
    """The largest batch size whose step estimate (rpt.training.footprint) fits in `budget_bytes` (0 if none does)."""
    from rpt.training.footprint import estimate_step_memory

    best, b = 0, 1
    while b <= limit:
        cfg.train.batch_size = b
        if estimate_step_memory(cfg, device).total > budget_bytes:
            break
        best, b = b, b * 2
    lo, hi = best, min(b, limit + 1)  # the answer lies in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        cfg.train.batch_size = mid
        lo, hi = (mid, hi) if estimate_step_memory(cfg, device).total <= budget_bytes else (lo, mid)
    return lo


def bench_scale(preset: str = "250m", seq_len: int = 16384, variants: tuple[str, ...] = ("xl", "retro", "rpt-sem"),
                batch_size: int = 1, vocab_size: int | None = None, device: str = "cpu", steps: int = 3,
                loss_chunks: tuple[int, ...] = (0,), budget_gib: float | None = None, threads: int | None = None,
                measure: bool = True, precision: str | None = None,
                compile_modes: tuple[bool, ...] = (False,), overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Each variant's step at this scale, measured in its own process (`measure_step`), beside the estimate.

    loss_chunks: extra xl rows with train.loss_chunk set to these values (0 = full logits), to set the chunked loss
    (the default) against the full logits. budget_gib: report the largest batch whose estimate fits (default: the
    memory available now) and, for a measured row, the largest whose estimate scaled by peak / estimate at this batch
    fits (the estimate omits the allocator's slack, which grows with the batch: read the scaled figure).
    measure=False: estimates only (a config too big for this machine). compile_modes: (False, True) measures every
    variant eager and under torch.compile; time_vs_xl compares rows of one mode, and a compiled row's compile_speedup
    is the eager row's time over its own."""
    from rpt.training.footprint import available_bytes, estimate_step_memory

    gpu_missing = device.startswith("cuda") and not torch.cuda.is_available()
    if gpu_missing and measure:
        raise UserError(f"--device {device}: no GPU here; add --estimate-only for the estimates alone")
    budget = budget_gib * 2**30 if budget_gib else (None if gpu_missing else available_bytes(device))
    runs = [(v, None, c) for c in compile_modes for v in variants] + [("xl", n, compile_modes[0]) for n in loss_chunks]
    rows = []
    for v, chunk, comp in runs:
        cfg = scale_config(v, preset, seq_len, batch_size, vocab_size, precision, chunk, overrides=overrides)
        est = estimate_step_memory(cfg, device)
        row = {"variant": v, "loss_chunk": cfg.train.loss_chunk, "compile": comp, "estimate_bytes": est.total,
               "estimate": est.describe(), "parameters": est.parameters,
               "largest_batch": largest_batch(cfg, budget, device) if budget else None}
        if measure:
            try:
                row.update(measure_step(variant=v, preset=preset, seq_len=seq_len, batch_size=batch_size,
                                        vocab_size=vocab_size, device=device, steps=steps,
                                        loss_chunk=cfg.train.loss_chunk, threads=threads, precision=precision,
                                        compile=comp, overrides=overrides))
                row["estimate_vs_peak"] = est.total / row["peak_bytes"]
                if budget:  # the estimate runs under the peak (more so at larger batches): scale it by this row's
                    row["largest_batch_measured"] = largest_batch(cfg, budget * row["estimate_vs_peak"], device)
            except UserError as e:  # e.g. killed for memory: a finding to report, and the other rows still run
                row["error"] = str(e)
        rows.append(row)
        print(format_scale_row(row), flush=True)
    first = {(r["variant"], r["compile"]): r for r in reversed(rows)}  # each variant's first row of each mode
    for r in rows:
        sec = r.get("seconds_per_update")
        base = first.get(("xl", r["compile"]), {}).get("seconds_per_update")
        if base and sec:
            r["time_vs_xl"] = sec / base
        eager = first.get((r["variant"], False), {}).get("seconds_per_update")
        if r["compile"] and eager and sec and r["loss_chunk"] == first[(r["variant"], False)]["loss_chunk"]:
            r["compile_speedup"] = eager / sec
    return {"preset": preset, "seq_len": seq_len, "batch_size": batch_size, "device": device,
            "precision": precision or "the preset's", "budget_bytes": budget, "overrides": overrides or {}, "rows": rows}


def format_scale_row(r: dict[str, Any]) -> str:
    from rpt.training.footprint import gib

    loss = "full logits" if r["loss_chunk"] <= 0 else f"chunked {r['loss_chunk']}"
    name = r["variant"] + (" compiled" if r.get("compile") else "")
    text = f"{name:<24} {r['parameters'] / 1e6:7.1f}M  {loss:<13} estimate {gib(r['estimate_bytes']):>9}"
    if "error" in r:
        text += f"  FAILED: {r['error'].rsplit(': ', 1)[-1]}"
    if "peak_bytes" in r:
        text += f"  measured peak {gib(r['peak_bytes']):>9}"
        if r.get("seconds_per_update"):
            text += f"  {r['seconds_per_update']:8.3f} s/update {r['tokens_per_s']:9.0f} tokens/s"
            if r.get("compile"):
                text += f" (first update {r['first_update_s']:.0f} s)"
        if "mfu" in r:
            text += f"  MFU {100 * r['mfu']:.1f}%"
    if r.get("largest_batch") is not None:
        text += f"  largest batch in budget {r['largest_batch']}"
        if r.get("largest_batch_measured") is not None:
            text += f" by the estimate, {r['largest_batch_measured']} by the estimate scaled to the measured peak"
    return text


def format_scale(r: dict[str, Any]) -> str:
    from rpt.training.footprint import gib

    budget = f", budget {gib(r['budget_bytes'])}" if r.get("budget_bytes") else ""
    lines = [f"training step at scale: preset {r['preset']}, {r['batch_size']} x {r['seq_len']} tokens, "
             f"{r['device']}{budget}"]
    for x in r["rows"]:
        lines.append(format_scale_row(x) + (f"  {x['time_vs_xl']:.2f}x xl" if "time_vs_xl" in x else "")
                     + (f"  {x['compile_speedup']:.2f}x faster than eager" if "compile_speedup" in x else ""))
    return "\n".join(lines)


def bench_eval_scaling(tokens: np.ndarray, lengths: list[int], *, preset: str = "tiny", variant: str = "rpt-sem",
                       vocab_size: int = 2048, segment_len: int | None = None, memory: str = "auto",
                       device: str = "cpu") -> dict[str, Any]:
    """Evaluate prefixes of one long token stream with a fresh model-sized cache; time and memory per length."""
    from rpt.eval.perplexity import evaluate_document
    from rpt.model.memory import make_memory
    cfg = RPTConfig.from_preset(preset, variant=variant, vocab_size=vocab_size)
    if segment_len:
        cfg.model.segment_len = segment_len
    model = build_model(cfg.model).to(device).eval()
    mem = make_memory(memory, device)
    evaluate_document(model, tokens[: 2 * cfg.model.segment_len], memory=mem)  # warm-up
    rows = []
    for n in lengths:
        if n > len(tokens):
            break
        t = time.perf_counter()
        r = evaluate_document(model, tokens[:n], memory=mem)
        sec = time.perf_counter() - t
        rows.append({"tokens": n, "seconds": sec, "us_per_token": 1e6 * sec / n, "memory_bytes": r.memory_bytes,
                     "kv_cache_bytes": r.kv_cache_bytes, "memory_bytes_per_token": r.memory_bytes / n})
    growth = rows[-1]["us_per_token"] / rows[0]["us_per_token"] if len(rows) > 1 else 1.0
    return {"variant": variant, "preset": preset, "memory": mem.__name__, "rows": rows,
            "time_per_token_growth": growth, "length_growth": rows[-1]["tokens"] / rows[0]["tokens"]}


def run_bench(store: Path, *, labels_root: Path | None = None, preset: str = "tiny", seq_len: int = 1024,
              segment_len: int | None = 128, batch_size: int = 2, steps: int = 12, rounds: int = 3,
              eval_lengths: list[int] | None = None,
              label_sizes: tuple[int, ...] = (100_000, 1_000_000), skip_labels: bool = False, device: str | None = None,
              out: Path | None = None) -> dict[str, Any]:
    from rpt.data.store import TokenStore
    from rpt.data.tokenizer import Tokenizer

    if not (store / "tokenizer.json").exists():
        raise UserError(f"--store {store}: not a `rpt prepare` store root; make one with `rpt prepare`, then "
                        "`rpt label --kind lex` and `--kind sem` (docs/cli.md#python--m-lab-demo-and-rpt-bench)")
    lab = labels_root or store / "labels"
    lex, sem = lab / f"train-lex-{seq_len}", lab / f"train-sem-{seq_len}"
    labels = {"retro": lex, "rpt-lex": lex, "rpt-sem": sem}
    missing = [str(p) for p in {lex, sem} if not (p / "manifest.json").exists()]
    if missing:
        raise UserError(f"labels missing: {', '.join(missing)} (`rpt label --kind lex|sem --span {seq_len}`)")
    results: dict[str, Any] = {"machine": machine()}
    print(f"machine: {results['machine']}", flush=True)
    results["training"] = bench_training(store, labels, preset=preset, seq_len=seq_len, segment_len=segment_len,
                                         batch_size=batch_size, steps=steps, rounds=rounds, device=device)
    print(format_training(results["training"]), flush=True)

    train_store = TokenStore.open(store / "train")
    longest = int(np.argmax(train_store.doc_lengths()))
    toks = np.asarray(train_store.document(longest), dtype=np.int64)
    lengths = eval_lengths or [n for n in (2048, 4096, 8192, 16384, 32768) if n <= len(toks)]
    vocab = Tokenizer.from_file(store / "tokenizer.json").vocab_size
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    results["eval_scaling"] = bench_eval_scaling(toks, lengths, preset=preset, vocab_size=vocab, segment_len=segment_len,
                                                 device=dev)
    print(format_eval(results["eval_scaling"]), flush=True)

    if not skip_labels:
        from lab.bench_labels import format_report, run_benchmark

        results["labels"] = run_benchmark(sizes=label_sizes, device=dev)
        print(format_report(results["labels"]), flush=True)
    if out is not None:
        write_json_atomic(out, results, "bench")
    return results


def format_training(r: dict[str, Any]) -> str:
    rounds = r.get("rounds", 1)
    over = f"; medians over {rounds} rounds in alternating order, ratio to xl per round" if rounds > 1 else ""
    lines = [f"training step, preset {r['preset']}, {r['batch_size']} x {r['seq_len']} tokens, median of "
             f"{r['steps_timed']} updates{over}",
             f"{'variant':<16}{'params':>10}{'s/update':>10}{'vs xl':>8}{'range':>12}{'tokens/s':>10}{'peak RSS MB':>13}"]
    running = False
    for v, x in r["variants"].items():
        extra = f"{x['mfu'] * 100:6.1f}% MFU" if "mfu" in x else ""
        mark = "*" if x.get("peak_rss_scope", "process") == "process" else " "
        running |= mark == "*"
        lo_hi = x.get("time_vs_xl_range")
        span = f"{lo_hi[0]:.2f}-{lo_hi[1]:.2f}" if lo_hi and v != "xl" else ""
        lines.append(f"{v:<16}{x['parameters'] / 1e6:9.2f}M{x['seconds_per_update']:10.3f}{x['time_vs_xl']:7.2f}x"
                     f"{span:>12}{x['tokens_per_s']:10.0f}{x['peak_rss_mb']:12.0f}{mark} {extra}")
    if running:
        lines.append("* the process's running maximum (no peak reset on this system): not that variant's own peak")
    if rounds == 1:
        lines.append("one round: a machine whose speed drifts between variants moves these ratios (--rounds 3 "
                     "repeats them in alternating order and gives their range)")
    return "\n".join(lines)


def format_eval(r: dict[str, Any]) -> str:
    lines = [f"evaluation vs document length ({r['variant']}, {r['preset']}, {r['memory']} memory)",
             f"{'tokens':>8}{'seconds':>9}{'us/token':>10}{'memory MB':>11}{'KV cache MB':>13}"]
    for x in r["rows"]:
        lines.append(f"{x['tokens']:8d}{x['seconds']:9.2f}{x['us_per_token']:10.1f}{x['memory_bytes'] / 2**20:11.2f}"
                     f"{x['kv_cache_bytes'] / 2**20:13.2f}")
    lines.append(f"time per token grew {r['time_per_token_growth']:.2f}x while the length grew {r['length_growth']:.0f}x "
                 "(linear cost = about 1x)")
    return "\n".join(lines)



# `python -m lab.bench probe '<json>'`: one measured step in a fresh process (measure_step)
if __name__ == "__main__":
    import json
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "probe":
        print(json.dumps(probe_step(**json.loads(sys.argv[2]))))
    else:
        raise SystemExit("usage: python -m lab.bench probe '<json spec>' (used by python -m lab bench --scale)")
