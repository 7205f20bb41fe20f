"""Which attention kernel each `scaled_dot_product_attention` call of a model actually runs (checked, not assumed).

PyTorch picks a fused kernel (flash, memory-efficient, cuDNN; on a CPU its own flash kernel) only when the inputs
allow it — a mask, attention dropout, a head size, a dtype or a stride can send a call to the unfused "math" path,
which materialises the [Tq, Tk] score matrix and is slower and bigger at long lengths. Nothing warns. On a CPU build
attention dropout > 0 (every preset but tiny trains with 0.05) and a mask that requires grad (CCA's learned relative
bias) both take the math path (docs/results/speed.md#attention-kernels).

`probe_sdpa` runs a forward pass under the profiler with every SDPA call wrapped in a label naming its call site
(file and function), then reads which aten kernel ran beneath each label. The result is one row per call site: the
calls, the query/key shape, dtype, the kind of mask and the kernel(s) taken.

    python -m lab bench --kernels --preset 250m --seq-len 16384 --precision bf16 --device cuda
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

# aten op run beneath scaled_dot_product_attention -> kernel name
KERNELS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_flash_attention_forward": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash-cpu",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_efficient_attention_forward": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_fused_attention_overrideable": "fused-other",
    "aten::_scaled_dot_product_attention_math": "math",
}
FUSED = {"flash", "flash-cpu", "efficient", "cudnn", "fused-other"}
# CCA's direct attention (rpt.model.cca.attend_with_bias: one matmul, biases added in place, softmax), which CCA takes
# in CPU training instead of SDPA's math path: unfused too, and reported as the kernel "direct"
DIRECT = "direct"
_LABEL = "sdpa@"
_INDEX = re.compile(r"(^|[.])[0-9]+(?=[.]|$)")  # a layer index in a module name


def _mask_kind(kwargs: dict[str, Any], args: tuple) -> str:
    mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
    causal = kwargs.get("is_causal", args[5] if len(args) > 5 else False)
    if mask is None:
        return "causal" if causal else "none"
    if isinstance(mask, torch.Tensor):  # a mask that requires grad (a learned bias) rules out every fused CPU kernel
        grad = " grad" if mask.requires_grad else ""  # (the tensor's flag decides, even under no_grad)
        return f"{'bool' if mask.dtype == torch.bool else 'float'}{grad} {list(mask.shape)}"
    return type(mask).__name__ + (f" ({mask.variant.name.lower()})" if hasattr(mask, "variant") else "")


def _site(frame: Any, modules: dict[int, str]) -> str:
    """'layers.py:SelfAttention.forward [blocks.*.attn]': the calling function and, when it is a method of one of
    `modules` (id -> name in the model, layer indices as *), the submodule; a module-level helper also names its caller
    ('layers.py:attend_after_cache < SelfAttention.step')."""
    def name(f: Any) -> str:
        return getattr(f.f_code, "co_qualname", f.f_code.co_name)

    site = f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{name(frame)}"
    owner = frame
    if "." not in name(frame) and frame.f_back is not None:
        owner = frame.f_back
        site += f" < {name(owner)}"
    module = modules.get(id(owner.f_locals.get("self")))
    if module:
        site += " [" + _INDEX.sub(r"\1*", module) + "]"
    return site


@contextlib.contextmanager
def labelled_sdpa(model: torch.nn.Module | None = None) -> Iterator[list[dict[str, Any]]]:
    """Inside: every F.scaled_dot_product_attention call, and every call of CCA's direct attention
    (`rpt.model.cca.attend_with_bias`), runs under a profiler label `sdpa@<index>`; yields the list of calls (site,
    shapes, dtype, mask), index = position in it; with `model`, sites name its submodules. Nested calls (a CausalBias
    re-dispatching) count as their outer call."""
    from rpt.model import cca

    modules = {id(m): n for n, m in model.named_modules()} if model is not None else {}
    real: Callable[..., torch.Tensor] = F.scaled_dot_product_attention
    real_direct: Callable[..., torch.Tensor] = cca.attend_with_bias
    calls: list[dict[str, Any]] = []
    depth = threading.local()

    def wrap(fn: Callable[..., torch.Tensor], direct: bool) -> Callable[..., torch.Tensor]:
        def wrapped(*args: Any, **kwargs: Any) -> torch.Tensor:
            if getattr(depth, "n", 0):
                return fn(*args, **kwargs)
            q, k = args[0], args[1]
            if direct:  # (q, k, v, key_bias, rel, dropout_p)
                dropout, bias = args[5], args[4]
                mask = f"float{' grad' if bias.requires_grad else ''} (bias added in place) {list(bias.shape)}"
            else:
                dropout, mask = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0), _mask_kind(kwargs, args)
            calls.append({"site": _site(sys._getframe(1), modules), "q": list(q.shape), "k": list(k.shape),
                          "dtype": str(q.dtype).replace("torch.", ""), "mask": mask, "dropout": float(dropout),
                          "device": q.device.type, "direct": direct})
            depth.n = 1
            try:
                with torch.profiler.record_function(f"{_LABEL}{len(calls) - 1}"):
                    return fn(*args, **kwargs)
            finally:
                depth.n = 0

        return wrapped

    # modules look both up at call time: `F.scaled_dot_product_attention(...)`, cca's module-level `attend_with_bias`
    F.scaled_dot_product_attention = wrap(real, False)
    cca.attend_with_bias = wrap(real_direct, True)
    try:
        yield calls
    finally:
        F.scaled_dot_product_attention = real
        cca.attend_with_bias = real_direct


def _kernels_below(event: Any) -> list[str]:
    found: list[str] = []
    stack = list(event.cpu_children)
    while stack:
        e = stack.pop()
        if e.name in KERNELS:
            found.append(KERNELS[e.name])
        else:
            stack.extend(e.cpu_children)
    return found


def probe_sdpa(run: Callable[[], Any], model: torch.nn.Module | None = None) -> list[dict[str, Any]]:
    """Run `run()` (e.g. a model's forward) and return one row per SDPA call site (named after `model`'s submodules
    when given): site, calls, q/k shape of its first call, dtype, mask kind and `kernels` ({kernel: calls}); `fused`
    is False when any call took "math" or CCA's "direct" attention (or no kernel was seen)."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "99")  # read when the profiler starts: no "USDT ... profiler_start" lines
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]  # the aten ops are dispatched on the host on a GPU too
    with labelled_sdpa(model) as calls, profile(activities=activities) as prof:
        run()
    taken: dict[int, list[str]] = {}
    for e in prof.events():
        if e.name.startswith(_LABEL):
            taken[int(e.name[len(_LABEL):])] = _kernels_below(e)
    rows: dict[tuple, dict[str, Any]] = {}
    for i, c in enumerate(calls):
        key = (c["site"], c["mask"].split(" [")[0], c["dtype"], c["dropout"])
        row = rows.setdefault(key, {**c, "calls": 0, "kernels": {}})
        row["calls"] += 1
        for kname in taken.get(i, []) or [DIRECT if c["direct"] else "unknown"]:
            row["kernels"][kname] = row["kernels"].get(kname, 0) + 1
    out = list(rows.values())
    for r in out:
        r["fused"] = not ({"math", "unknown", DIRECT} & set(r["kernels"]))
    return out


def format_sdpa(rows: list[dict[str, Any]]) -> str:
    table = [("call site", "calls", "q shape", "dtype", "mask", "dropout", "kernel")]
    for r in rows:
        kern = ", ".join(f"{k} x{n}" if len(r["kernels"]) > 1 else k for k, n in r["kernels"].items())
        table.append((r["site"], str(r["calls"]), str(r["q"]), r["dtype"], r["mask"], f"{r['dropout']:g}",
                      kern + ("" if r["fused"] else "   <- unfused")))
    widths = [max(len(row[i]) for row in table) for i in range(6)]
    return "\n".join("  ".join(row[i].rjust(w) if i in (1, 5) else row[i].ljust(w) for i, w in enumerate(widths))
                     + "  " + row[6] for row in table)


def probe_kernels(variant: str, preset: str = "tiny", seq_len: int = 1024, batch_size: int = 1,
                  vocab_size: int | None = None, device: str = "cpu", precision: str | None = None,
                  segment_len: int | None = None, eval_tokens: int | None = None, seed: int = 0,
                  overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The SDPA kernels one variant's model takes, at a preset and length: in the training forward (model in train
    mode, the chunked LM loss, retro fed random neighbours) and in cached evaluation of an `eval_tokens`-token document
    (default: seq_len; 0 skips it), under bf16 autocast when `precision` is bf16 on a GPU."""
    from lab.bench import scale_config
    from rpt.eval.perplexity import evaluate_document
    from rpt.model.registry import build_model
    from rpt.training.losses import forward_lm

    cfg = scale_config(variant, preset, seq_len, batch_size, vocab_size, precision, segment_len=segment_len,
                       overrides=overrides)
    m, dev = cfg.model, torch.device(device)
    model = build_model(m, seed=seed).to(dev)
    bf16 = cfg.train.precision == "bf16" and dev.type == "cuda"
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, m.vocab_size, (batch_size, seq_len), generator=g).to(dev)
    C = seq_len // m.chunk_size
    nb = torch.randint(0, C, (batch_size, C, m.n_neighbors), generator=g).to(dev) if variant == "retro" else None

    def train_forward() -> None:
        model.train()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            forward_lm(model, ids, {"neighbor_ids": nb}, None, cfg.train.loss_chunk)

    out = {"variant": variant, "preset": preset, "seq_len": seq_len, "segment_len": m.segment_len, "device": str(dev),
           "precision": "bf16" if bf16 else "fp32", "train": probe_sdpa(train_forward, model)}
    n_eval = seq_len if eval_tokens is None else eval_tokens
    if n_eval:
        toks = ids[0, :n_eval].cpu().numpy()
        eval_nb = nb[0, : n_eval // m.chunk_size].cpu().numpy() if nb is not None else None

        def evaluate() -> None:
            model.eval()
            with torch.no_grad():
                evaluate_document(model, toks, neighbor_ids=eval_nb, autocast_dtype=torch.bfloat16 if bf16 else None)

        out["eval"] = probe_sdpa(evaluate, model)
    out["fused"] = all(r["fused"] for phase in ("train", "eval") for r in out.get(phase, []))
    return out


def format_kernels(r: dict[str, Any]) -> str:
    head = f"{r['variant']} ({r['preset']}, {r['seq_len']} tokens, segment {r['segment_len']}, {r['device']}, {r['precision']})"
    parts = [head]
    for phase in ("train", "eval"):
        if phase in r:
            parts += [f"  {'training forward' if phase == 'train' else 'cached evaluation'}:",
                      *("    " + line for line in format_sdpa(r[phase]).splitlines())]
    return "\n".join(parts)
