"""What changes as training advances (§3.3, §3.4, App. A): pure functions of the step, and scheduled sampling.

Steps count optimiser updates from 0. Every schedule reaches its end value at step == `steps` (or at the end of its
ramp) and stays there; the last update actually taken is step `steps - 1`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from rpt.config import TrainConfig


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to cfg.lr over cfg.warmup_steps, then cosine decay to cfg.min_lr_ratio * cfg.lr at cfg.steps.

    lr(0) = lr / (warmup + 1) (never 0, so the first update counts), lr(warmup) = lr, lr(steps) = min_lr_ratio * lr.
    """
    peak, low = cfg.lr, cfg.lr * cfg.min_lr_ratio
    if step < cfg.warmup_steps:
        return peak * (step + 1) / (cfg.warmup_steps + 1)
    span = max(cfg.steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    return low + (peak - low) * 0.5 * (1.0 + math.cos(math.pi * progress))


def margin(step: int, cfg: TrainConfig) -> float:
    """LambdaRank margin tau: linear from 1 at step 0 to cfg.tau_max at cfg.steps (§3.3 'we also increase tau')."""
    return 1.0 + (cfg.tau_max - 1.0) * min(step / max(cfg.steps, 1), 1.0)


def retrieval_weight(step: int, cfg: TrainConfig) -> float:
    """alpha_ret: linear from 0 at step 0 to cfg.alpha_ret at cfg.alpha_ramp_steps, then constant (§3.3)."""
    if cfg.alpha_ramp_steps <= 0:
        return cfg.alpha_ret
    return cfg.alpha_ret * min(step / cfg.alpha_ramp_steps, 1.0)


def sampling_probability(step: int, cfg: TrainConfig) -> float:
    """p_ss: cosine from 1 at step 0 to 0 at ss_fraction * steps, then 0 (§3.4 'Scheduled sampling'); 1 or 0 throughout
    for the Table 4 ablations (ss_schedule "gold" / "own")."""
    if cfg.ss_schedule != "anneal":
        return 1.0 if cfg.ss_schedule == "gold" else 0.0
    end = cfg.ss_fraction * cfg.steps
    if step >= end:
        return 0.0
    return 0.5 * (1.0 + math.cos(math.pi * step / end))


# --------------------------------------------------------------------------------------------------------------
# Scheduled sampling (§3.4): per query chunk, with probability p_ss CCA gets the gold top-K (the best positives by
# target score), otherwise the retriever's own top-K.


def gold_neighbors(relevance: torch.Tensor, positive: torch.Tensor, k: int) -> torch.Tensor:
    """The top-k positives by target relevance, best first.

    relevance [..., C] float, positive [..., C] bool -> ids [..., k] long, -1 where a query has fewer than k positives.
    """
    C = relevance.shape[-1]
    key = torch.where(positive, relevance.float(), torch.full_like(relevance, float("-inf"), dtype=torch.float32))
    kk = min(k, C)
    top = torch.sort(key, dim=-1, descending=True, stable=True).indices[..., :kk]  # stable: ties go to the earlier chunk
    ids = torch.where(positive.gather(-1, top), top, torch.full_like(top, -1))
    if kk < k:
        ids = torch.cat([ids, ids.new_full((*ids.shape[:-1], k - kk), -1)], dim=-1)
    return ids


def sample_gold_mask(keys: Sequence[int], n_chunks: int, p_ss: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """use_supplied [len(keys), n_chunks] bool: True (use the gold neighbours) independently with probability p_ss.

    Row b is drawn on the CPU from a generator seeded with keys[b]; the loop derives the key from the run's seed and
    the sequence's position in the data stream. The draw is therefore a function of the data alone: the same on
    resume, and the same however the global batch is split into ranks and micro-batches. It never touches the
    global RNG that dropout uses.
    """
    shape = (len(keys), n_chunks)
    if p_ss <= 0.0:
        return torch.zeros(shape, dtype=torch.bool, device=device)
    if p_ss >= 1.0:
        return torch.ones(shape, dtype=torch.bool, device=device)
    rows = [torch.rand(n_chunks, generator=torch.Generator().manual_seed(int(k))) for k in keys]
    return (torch.stack(rows) < p_ss).to(device)
