"""How much memory one training step needs, estimated before the first step, and a refusal when it cannot fit.

A config such as ``data.seq_len=100000000`` used to grow until the OOM killer ended it (22 GB here); training now
refuses it at once with the estimate and its parts. The estimate counts what one micro-batch keeps alive at the peak of
its backward pass, in bytes:

- **states**: fp32 weights, gradients and two optimiser moments, 16 bytes per parameter (AdamW and AdaBelief alike);
- **logits**: with the chunked loss (`train.loss_chunk` targets at a time, the default) one [chunk, V] fp32 block (the
  logits, made their softmax in place; under bf16 also the matmul's bf16 output) and the [V, D] fp32 gradient of
  the output embedding it accumulates; with the plain loss (`train.loss_chunk=0`) [B, T, V] three times (the
  logits, the log-softmax saved by cross-entropy, their gradient), in fp32 whatever the precision, since the loss
  casts them;
- **layers**: per token and layer, the tensors autograd saves in a SwiGLU block (about 8 D for norms, q/k/v, the
  attention output and residuals, 4 F for the MLP), plus on the CPU's math attention path two [H, 2S] score matrices
  per token (scores and probabilities; the window is 2S); GPU kernels (flash / memory-efficient) keep none. Each
  model class counts its own layers (`layer_activation_elements`): the baselines add the kNN layer's retrieved
  keys and values (memorizing), the state cell (block-recurrent), and count Griffin's recurrent blocks as such,
  plus the largest working set a layer allocates and frees inside itself (`temporary_bytes`: Griffin's scan transients,
  the kNN search's scores);
- **retrieval** (retrieving variants): per token its 2K neighbour tokens (K neighbours of 2M tokens per M-token
  chunk) with their query-augmentation block (about 8 D and two [H, M] score rows each), per CCA layer their keys and
  values and two [H, K * 2M] score matrices, the chunk encoder's and retriever's states, and the [B, C, C] retrieval
  scores (C chunks) with the LambdaRank terms over them, counted as four [B, C, C] fp32 tensors;
- the runtime itself (torch, the process, allocator slack: about 0.35 GB on the CPU).

`benchmarks/memory_estimate.py` prints this estimate next to the measured peak for a grid of configs; on the 2-core CPU
it is within 15% of the measured peak RSS (docs/results.md §6). The refusal allows a 25% margin on top: a config
whose estimate exceeds the memory available by more than that margin would not have fitted either.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from rpt.config import RPTConfig
from rpt.model.registry import build_model, model_class
from rpt.utils import UserError

RUNTIME_BYTES = 350 * 2**20  # the torch runtime, the Python process and allocator slack (benchmarks/memory_estimate.py)
MARGIN = 1.25  # refuse only when the estimate exceeds what is available by more than the estimate's measured error


@dataclass
class MemoryEstimate:
    parameters: int
    states: int  # weights, gradients, optimiser moments
    logits: int
    layers: int
    retrieval: int
    runtime: int
    device: str

    @property
    def total(self) -> int:
        return self.states + self.logits + self.layers + self.retrieval + self.runtime

    def describe(self) -> str:
        parts = [("weights+gradients+optimiser", self.states), ("logits", self.logits), ("layer activations", self.layers),
                 ("retrieval", self.retrieval)]
        return f"about {gib(self.total)} (" + ", ".join(f"{n} {gib(b)}" for n, b in parts if b) + ")"


def gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 / 10 else f"{n / 2**20:,.0f} MiB"


def count_parameters(cfg: RPTConfig) -> int:
    """Parameters of the model `cfg` builds, counted on the meta device (no memory, no time)."""
    with torch.device("meta"):
        return build_model(cfg.model).num_parameters()


def estimate_step_memory(cfg: RPTConfig, device: str = "cpu") -> MemoryEstimate:
    """The estimate described in the module docstring, for one micro-batch of `cfg` on `device` ("cpu" or "cuda")."""
    m, t = cfg.model, cfg.train
    B = t.batch_size
    T = -(-cfg.data.seq_len // m.segment_len) * m.segment_len  # the model pads to whole segments
    act = 2 if t.precision == "bf16" and device != "cpu" else 4
    math_attention = device == "cpu"
    n_params = count_parameters(cfg)

    states = 16 * n_params
    if t.loss_chunk > 0:
        blocks = 1.0 if act == 4 else 1.5  # the fp32 logits made their softmax in place (+ the bf16 matmul output)
        logits = int(blocks * 4 * min(t.loss_chunk, B * cfg.data.seq_len) * m.vocab_size) + 4 * m.vocab_size * m.d_model
    else:
        logits = 3 * 4 * B * T * m.vocab_size
    cls = model_class(m.variant)
    layers = act * B * cls.layer_activation_elements(m, T, math_attention) + cls.temporary_bytes(m, B, T)
    retrieval = 0
    if m.uses_retrieval:
        K, M = m.n_neighbors, m.chunk_size
        C = T // M
        # per query token: K neighbours of 2M tokens per M-token chunk, i.e. 2K neighbour tokens
        gathered = 2 * K * (2 * m.d_model + (8 * m.d_model + 2 * m.n_heads * M if m.query_augmentation else 0))
        per_cca = 2 * K * 2 * m.d_model + (2 * m.n_heads * K * 2 * M if math_attention else 0)
        encoder = 8 * m.d_model if m.has_retriever else 0  # chunk states, their encoding, the retriever's projections
        retrieval = act * B * T * (gathered + len(m.cca_layers) * per_cca + encoder) + 4 * 4 * B * C * C
    return MemoryEstimate(parameters=n_params, states=states, logits=logits, layers=layers, retrieval=retrieval,
                          runtime=RUNTIME_BYTES if device == "cpu" else 0, device=device)


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
        raise UserError(
            f"a training step of this config needs {est.describe()} with data.seq_len={cfg.data.seq_len:,}, "
            f"train.batch_size={cfg.train.batch_size}, model.vocab_size={cfg.model.vocab_size:,} on {device.type}, but "
            f"{gib(available)} is available: lower data.seq_len or train.batch_size (train.grad_accum keeps the "
            f"update size), or pass --no-memory-check to try anyway")
    return est
