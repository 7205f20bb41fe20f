"""How much memory one training step needs, estimated before the first step, and a refusal when it cannot fit.

A config such as ``data.seq_len=100000000`` would grow until the OOM killer ended it (22 GB on a 24 GB machine); training
refuses it at once with the estimate and its parts. The estimate counts what one micro-batch keeps alive at the peak of
its backward pass, in bytes:

- **states**: fp32 weights, gradients and two optimiser moments, 16 bytes per parameter (AdamW and AdaBelief alike);
- **logits**: with the chunked loss (`train.loss_chunk` targets at a time, the default) one [chunk, V] fp32 block (the
  logits, made their softmax in place; under bf16 also the matmul's bf16 output) and the [V, D] fp32 gradient of
  the output embedding it accumulates; with the plain loss (`train.loss_chunk=0`) [B, T, V] three times (the
  logits, the log-softmax saved by cross-entropy, their gradient), in fp32 whatever the precision, since the loss
  casts them;
- **layers**: per token and layer, the tensors autograd saves in a SwiGLU block (12 D for norms, q/k/v, the
  attention output and residuals, 4 F for the MLP, D per residual dropout) and the attention's own: on a fused kernel
  the window mask made float (2S); on the unfused math path, which a CPU takes whenever attention probabilities take
  dropout, three [H, 2S] rows (probabilities, dropout mask, dropped probabilities). Each model class counts its own
  layers (`layer_activation_elements`): the baselines add the kNN layer's retrieved keys and values (memorizing),
  the state cell (block-recurrent), and count Griffin's recurrent blocks as such, plus the largest working set a
  layer allocates and frees inside itself (`temporary_bytes`: Griffin's scan transients, the kNN search's scores);
- under activation checkpointing (`train.activation_checkpointing`) the **layers** term is each layer's input (D per
  token at each of the n_layers boundaries) plus one layer's activations, the largest layer's, which that layer holds
  again while its backward runs (`checkpointed_layer_elements`); of the retrieval term only one CCA layer's part;
- **retrieval** (retrieving variants, `retrieval_elements`): the 2K neighbour tokens per query token through query
  augmentation and every CCA layer, CCA's attention rows (math path on a CPU: its mask carries the learned relative
  bias), the chunk encoder, and the [B, C, C] retrieval scores (C chunks) with the LambdaRank terms over them,
  counted as four [B, C, C] fp32 tensors;
- the runtime itself (torch, the process, allocator slack: about 0.35 GB on the CPU);
- on a CPU under glibc's default malloc, heap fragmentation: 30% of the above (measured 7-43%), none when
  MALLOC_MMAP_THRESHOLD_ is set.

The layer and retrieval terms are checked against what autograd really saves (`saved_tensor_bytes`, saved-tensor
hooks) for every variant, on the fused and the math path (tests/train/test_memory_estimate.py: within 15%);
`benchmarks/memory_estimate.py` sets the whole estimate against the measured peak RSS (docs/results/speed.md#step-memory). The
refusal allows a 10% margin on top: a config whose estimate exceeds the memory available by more than that would not
have fitted either. The GPU branch (bf16 activations, fused kernels keeping no score rows) is 12-16% under the
measured peak at the 250m preset on an H200 (docs/results/gpu.md).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import torch

from rpt.config import ModelConfig, RPTConfig
from rpt.model.registry import build_model, model_class
from rpt.utils import UserError

RUNTIME_BYTES = 350 * 2**20  # the torch runtime, the Python process and allocator slack (benchmarks/memory_estimate.py)
# glibc's default malloc on a CPU: a training step's peak resident set exceeded what the estimate counts by 1.07-1.43x
# (heap fragmentation under its dynamic mmap threshold); with MALLOC_MMAP_THRESHOLD_ set it matched within 3%, at a
# 9-17% slower step (docs/results/speed.md#step-memory, benchmarks/malloc_threshold.py)
CPU_HEAP_FRAGMENTATION = 1.3
MARGIN = 1.1  # refuse only when the estimate exceeds what is available by more than the estimate's measured error


@dataclass
class MemoryEstimate:
    parameters: int
    states: int  # weights, gradients, optimiser moments
    logits: int
    layers: int
    retrieval: int
    runtime: int
    device: str
    fragmentation: int = 0  # the CPU heap's fragments under glibc's default malloc (CPU_HEAP_FRAGMENTATION)

    @property
    def total(self) -> int:
        return self.states + self.logits + self.layers + self.retrieval + self.runtime + self.fragmentation

    def describe(self) -> str:
        parts = [("weights+gradients+optimiser", self.states), ("logits", self.logits), ("layer activations", self.layers),
                 ("retrieval", self.retrieval), ("heap fragmentation", self.fragmentation)]
        return f"about {gib(self.total)} (" + ", ".join(f"{n} {gib(b)}" for n, b in parts if b) + ")"


def gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 / 10 else f"{n / 2**20:,.0f} MiB"


def count_parameters(cfg: RPTConfig) -> int:
    """Parameters of the model `cfg` builds, counted on the meta device (no memory; torch imports torch._dynamo for
    initialisers on meta tensors, about 2 s once per process, as every optimiser does)."""
    with torch.device("meta"):
        return build_model(cfg.model).num_parameters()


def estimate_step_memory(cfg: RPTConfig, device: str = "cpu") -> MemoryEstimate:
    """The estimate described in the module docstring, for one micro-batch of `cfg` on `device` ("cpu" or "cuda")."""
    m, t = cfg.model, cfg.train
    B = t.batch_size
    T = -(-cfg.data.seq_len // m.segment_len) * m.segment_len  # the model pads to whole segments
    act = 2 if t.precision == "bf16" and device != "cpu" else 4
    n_params = count_parameters(cfg)

    states = 16 * n_params
    if t.loss_chunk > 0:
        blocks = 1.0 if act == 4 else 1.5  # the fp32 logits made their softmax in place (+ the bf16 matmul output)
        logits = int(blocks * 4 * min(t.loss_chunk, B * cfg.data.seq_len) * m.vocab_size) + 4 * m.vocab_size * m.d_model
    else:
        logits = 3 * 4 * B * T * m.vocab_size
    cls = model_class(m.variant)
    ckpt = t.activation_checkpointing
    per_layer = cls.checkpointed_layer_elements if ckpt else cls.layer_activation_elements
    layers = act * B * per_layer(m, T, math_attention(m, device)) + cls.temporary_bytes(m, B, T)
    retrieval = 0
    if m.uses_retrieval:
        retrieval = (int(act * B * T * retrieval_elements(m, device, checkpointed=ckpt))
                     + 4 * 4 * B * (T // m.chunk_size) ** 2)
    counted = states + logits + layers + retrieval
    fragmentation = (int((CPU_HEAP_FRAGMENTATION - 1) * counted)
                     if device == "cpu" and "MALLOC_MMAP_THRESHOLD_" not in os.environ else 0)
    return MemoryEstimate(parameters=n_params, states=states, logits=logits, layers=layers, retrieval=retrieval,
                          runtime=RUNTIME_BYTES if device == "cpu" else 0, device=device, fragmentation=fragmentation)


def math_attention(m: ModelConfig, device: str) -> bool:
    """Whether attention takes the unfused math path in training: a CPU's whenever the attention probabilities take
    dropout, which no fused CPU kernel does (python -m lab bench --kernels)."""
    return device == "cpu" and m.attention_dropout > 0


def retrieval_elements(m: ModelConfig, device: str = "cpu", checkpointed: bool = False) -> float:
    """Elements the retrieval path keeps for backward per query token (retro, rpt-lex, rpt-sem), as counted with
    saved-tensor hooks (tests/train/test_memory_estimate.py). Each M-token chunk reads K neighbours of 2M tokens: 2K
    neighbour tokens per query token.

    - the gathered neighbour states, once (D per neighbour token);
    - each CCA layer: per neighbour token its normalised copy, keys, values and gated values, and the key/value
      projection's input (5 D); per query token the sublayer's norm, the query's projections and output (6 D); and
      on a CPU its attention's own rows over the 2KM + 1 keys (with the learned null key): CCA's mask carries the
      learned relative bias, which no fused CPU kernel differentiates, so it takes the math path, one [H, 2KM + 1]
      row per token (the probabilities), three with attention dropout;
    - query augmentation (per neighbour token, its two attentions and their norms): 16 D, plus 4 D per query token;
      on the math path (attention dropout on a CPU) three [H, 2M] and three [H, M] score rows per neighbour token,
      less the D a fused kernel keeps;
    - the chunk encoder of rpt-lex / rpt-sem: 9 D per token, and two [H, M] rows on the math path;
    - the rest (retrieval scores per chunk, pooled states, top-k): about 2 D.

    `checkpointed` (activation checkpointing): CCA runs inside its decoder layer, so only the layer running its
    backward holds its CCA part: one CCA layer's instead of every one's.
    """
    D, H, K, M = m.d_model, m.n_heads, m.n_neighbors, m.chunk_size
    math = math_attention(m, device)
    nb = 2 * K
    cca_rows = 0 if device != "cpu" else (3 if m.attention_dropout > 0 else 1) * H * (2 * K * M + 1)
    per_cca = 5 * nb * D + 6 * D + cca_rows
    augment = nb * (16 * D + (9 * H * M - D if math else 0)) + 4 * D if m.query_augmentation else 0
    encoder = 9 * D + (2 * H * M if math else 0) if m.has_retriever else 0
    n_cca = min(1, len(m.cca_layers)) if checkpointed else len(m.cca_layers)
    return nb * D + n_cca * per_cca + augment + encoder + 2 * D


def saved_tensor_bytes(cfg: RPTConfig, seed: int = 0) -> dict[str, int]:
    """What autograd keeps for backward in one training forward of `cfg` on the CPU (synthetic tokens; retro reads
    random neighbours), counted with saved-tensor hooks: bytes per module, each storage once, parameters left out.
    The measurement the estimate's layer and retrieval terms are checked against (it runs the model: small configs)."""
    import re

    from rpt.training.losses import forward_lm

    m, B, T = cfg.model, cfg.train.batch_size, cfg.data.seq_len
    torch.manual_seed(seed)
    model = build_model(m).train()
    if cfg.train.activation_checkpointing:  # the hooks then see what stays saved outside the checkpointed layers
        from rpt.model.decoder import set_activation_checkpointing

        set_activation_checkpointing(model)
    where = ["(top)"]  # the module whose forward is running now, innermost last

    def enter(module: torch.nn.Module, args: Any, name: str) -> None:
        where.append(name or "(top)")

    def leave(module: torch.nn.Module, args: Any, output: Any) -> None:
        where.pop()

    hooks = []
    for name, module in model.named_modules():
        hooks.append(module.register_forward_pre_hook(functools.partial(enter, name=name)))
        hooks.append(module.register_forward_hook(leave))
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, tuple[str, int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip and ptr not in seen:
            seen[ptr] = (re.sub(r"layers\.\d+", "layers.*", where[-1]), t.untyped_storage().nbytes())
        return t

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, m.vocab_size, (B, T), generator=g)
    C = T // m.chunk_size
    nb = torch.randint(0, C, (B, C, m.n_neighbors), generator=g) if m.variant == "retro" else None
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, lm = forward_lm(model, ids, {"neighbor_ids": nb}, None, cfg.train.loss_chunk)
    for h in hooks:
        h.remove()
    per: dict[str, int] = {}
    for name, n in seen.values():
        per[name] = per.get(name, 0) + n
    return per


def available_bytes(device: torch.device | str) -> int | None:
    """Memory a training step may use: free GPU memory on CUDA, MemAvailable (or the cgroup limit) on the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    found = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    for cg in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = open(cg).read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:
            found.append(int(text))
    if not found and hasattr(os, "sysconf"):
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (OSError, ValueError):
            pass
    return min(found) if found else None


def check_fits(cfg: RPTConfig, device: torch.device | str, available: int | None = None) -> MemoryEstimate:
    """Refuse (UserError) a config whose step cannot fit in the memory available; returns the estimate otherwise."""
    device = torch.device(device)
    est = estimate_step_memory(cfg, device.type)
    available = available_bytes(device) if available is None else available
    if available is not None and est.total > MARGIN * available:
        checkpointing = ("" if cfg.train.activation_checkpointing
                         else ", turn on train.activation_checkpointing (rpt train --activation-checkpointing)")
        raise UserError(
            f"a training step of this config needs {est.describe()} with data.seq_len={cfg.data.seq_len:,}, "
            f"train.batch_size={cfg.train.batch_size}, model.vocab_size={cfg.model.vocab_size:,} on {device.type}, but "
            f"{gib(available)} is available: lower data.seq_len or train.batch_size (train.grad_accum keeps the "
            f"update size){checkpointing}, or pass memory_check=False (rpt train --no-memory-check) to try anyway")
    return est
