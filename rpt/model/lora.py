"""LoRA adapters on a retrofitted backbone (docs/retrofit.md#lora-on-the-backbone), through peft.

`add_adapters` wraps the linear layers named by model.lora_targets in every decoder layer of a Hugging Face causal LM
with peft's LoRA layers (`peft.inject_adapter_in_model`): each computes W x + (alpha / r) B A x, where W is the
backbone's weight (the same tensor, still frozen) and A [r, in], B [out, r] are new. B starts at zero, so the adapted
backbone computes what the backbone computes until the first update; A is drawn from a generator keyed by the run's
seed and the layer's name (`rpt.model.layers.keyed_generator`), with peft's bound, so one seed builds one model.

The model stays the backbone's module tree: `RetrofitRPT` reaches the projections through the attention module
(`BackboneAttention` calls `self_attn.q_proj(h)`), so it runs the adapted ones without knowing of LoRA.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from rpt.config import ModelConfig
from rpt.model.layers import keyed_generator

ADAPTER = "default"  # peft's adapter name: part of each adapter tensor's name (....q_proj.lora_A.default.weight)


def add_adapters(hf: nn.Module, cfg: ModelConfig, seed: int) -> list[nn.Module]:
    """Wrap cfg.lora_targets of every decoder layer of `hf` (a Hugging Face causal LM, its weights frozen) with LoRA of
    rank cfg.lora_rank; returns the adapted layers. Only the adapters' A and B require gradients."""
    from rpt.utils import require

    require("peft", "LoRA on the backbone (model.lora_rank > 0)")
    from peft import LoraConfig, inject_adapter_in_model

    frozen = [p for p in hf.parameters() if not p.requires_grad]
    # targets by name inside the decoder layers only (model.layers.<i>.<...>.<target>), never the head or embeddings
    pattern = rf".*\.layers\.\d+\.(self_attn|mlp)\.({'|'.join(cfg.lora_targets)})"
    config = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                        target_modules=pattern, bias="none")
    inject_adapter_in_model(config, hf, adapter_name=ADAPTER)
    for p in frozen:  # peft marks only its own tensors trainable; keep the backbone's as they were (frozen)
        p.requires_grad_(False)
    layers = [(n, m) for n, m in hf.named_modules() if is_adapted(m)]
    _draw(layers, seed)
    return [m for _, m in layers]


def is_adapted(module: nn.Module) -> bool:
    """True for a peft LoRA layer (a linear layer with adapters)."""
    return hasattr(module, "lora_A") and hasattr(module, "get_base_layer")


@torch.no_grad()
def _draw(layers: list[tuple[str, nn.Module]], seed: int) -> None:
    """A ~ U(-1/sqrt(in), 1/sqrt(in)) (peft's default: kaiming-uniform with a = sqrt(5)) from a generator keyed by
    (seed, the layer's name); B = 0."""
    for name, m in layers:
        a, b = m.lora_A[ADAPTER].weight, m.lora_B[ADAPTER].weight
        if a.is_meta:  # built on the meta device (parameter counts): nothing to draw
            continue
        bound = 1.0 / math.sqrt(a.shape[1])
        g = keyed_generator(seed, f"{name}.lora_A")
        a.copy_((torch.rand(a.shape, generator=g, dtype=torch.float32) * 2 - 1).mul_(bound))
        b.zero_()


def merged(hf: nn.Module) -> nn.Module:
    """A copy of `hf` with every adapter merged into its layer's weight (W + (alpha / r) B A) and the LoRA layers
    replaced by plain linear layers: the backbone as trained, a Hugging Face causal LM of its own class. `hf` itself is
    unchanged."""
    out = copy.deepcopy(hf)
    for name, module in list(out.named_modules()):
        if is_adapted(module):
            module.merge(safe_merge=True, adapter_names=[ADAPTER])
            parent, _, child = name.rpartition(".")
            setattr(out.get_submodule(parent) if parent else out, child, module.get_base_layer())
    return out
