"""Optimisers of App. A: AdaBelief (the paper's) or AdamW, weight decay 1e-8 on matrices only, global-norm clipping.

AdaBelief (Zhuang et al., 2020) is Adam with the second moment of the gradient's *surprise* (g - m) instead of g:

    m_t = b1 m + (1 - b1) g
    s_t = b2 s + (1 - b2) (g - m_t)^2 + eps_root
    p  -= lr * (m_t / (1 - b1^t)) / (sqrt(s_t / (1 - b2^t)) + eps)   after   p *= 1 - lr * wd   (decoupled decay)

Defaults eps = eps_root = 1e-16 follow optax.adabelief, which the paper's JAX code used; no rectification.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from rpt.config import TrainConfig


class AdaBelief(torch.optim.Optimizer):
    """AdaBelief with decoupled weight decay and bias correction (see module docstring for the update)."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-16, eps_root: float = 1e-16, weight_decay: float = 0.0) -> None:
        if lr < 0 or eps < 0 or eps_root < 0 or weight_decay < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid AdaBelief hyper-parameters lr={lr} betas={betas} eps={eps} wd={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, eps_root=eps_root, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (b1, b2), eps, eps_root, wd = group["lr"], group["betas"], group["eps"], group["eps_root"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.float() if p.grad.dtype != torch.float32 else p.grad
                state = self.state[p]
                if not state:
                    # a tensor step, like torch's own optimisers, so the state dict round-trips exactly
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
                    state["exp_avg_var"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
                state["step"] += 1
                t = float(state["step"])
                m, s = state["exp_avg"], state["exp_avg_var"]
                m.lerp_(g, 1 - b1)
                surprise = g - m
                s.mul_(b2).addcmul_(surprise, surprise, value=1 - b2).add_(eps_root)
                if wd:
                    p.mul_(1 - lr * wd)
                denom = (s / (1 - b2**t)).sqrt_().add_(eps)
                p.addcdiv_(m, denom, value=-lr / (1 - b1**t))
        return loss


def no_decay(name: str, p: nn.Parameter) -> bool:
    """Norm gains, biases and any vector (gate weights, null keys) are not decayed; matrices and embeddings are."""
    return p.ndim < 2 or name.endswith(".bias") or "norm" in name.lower()


def bare_name(name: str) -> list[str]:
    """A parameter's name as parts, without the prefixes DDP, FSDP and torch.compile add."""
    return [p for p in name.split(".") if p not in ("module", "_fsdp_wrapped_module", "_orig_mod")]


def neighbor_path(name: str) -> bool:
    """Parameters that read neighbours: CCA (and its pre-norm), the neighbour gate, the query augmentation."""
    parts = bare_name(name)
    return "cca" in parts or "cca_norm" in parts or parts[:1] in (["gate"], ["query_aug"])


def parameter_groups(model: nn.Module, weight_decay: float, neighbor_lr_scale: float = 1.0) -> list[dict]:
    """Decayed / not decayed parameters; with neighbor_lr_scale != 1 the neighbour path (`neighbor_path`) gets
    groups of its own whose learning rate is scaled (`set_lr` reads "lr_scale")."""
    decay, plain, decay_scaled, plain_scaled = [], [], [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            scaled = neighbor_lr_scale != 1.0 and neighbor_path(name)
            lists = (plain_scaled, decay_scaled) if scaled else (plain, decay)
            lists[0 if no_decay(name, p) else 1].append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]
    for params, wd in ((decay_scaled, weight_decay), (plain_scaled, 0.0)):
        if params:
            groups.append({"params": params, "weight_decay": wd, "lr_scale": neighbor_lr_scale})
    return groups


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The optimiser named by cfg.optimizer over `model`'s trainable parameters (lr is set every step by the loop)."""
    groups = parameter_groups(model, cfg.weight_decay, cfg.neighbor_lr_scale)
    betas = (float(cfg.betas[0]), float(cfg.betas[1]))
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adabelief":
        return AdaBelief(groups, lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay)
    raise ValueError(f"train.optimizer={cfg.optimizer!r} is not adamw or adabelief")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def clip_gradients(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Global-norm clipping (App. A: 1.0; <= 0 = off); returns the norm before clipping. Under FSDP the gradients are
    sharded DTensors and the norm is reduced across shards."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm
