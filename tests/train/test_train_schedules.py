import math

import pytest
import torch

from rpt.config import TrainConfig
from rpt.training.schedules import (
    gold_neighbors,
    learning_rate,
    margin,
    retrieval_weight,
    sample_gold_mask,
    sampling_probability,
)


def cfg(**kw) -> TrainConfig:
    base = dict(steps=1000, lr=5e-3, min_lr_ratio=0.1, warmup_steps=100, tau_max=8.0, alpha_ret=0.1, alpha_ramp_steps=200,
                ss_fraction=0.9)
    base.update(kw)
    return TrainConfig(**base)


def test_learning_rate_end_points():
    c = cfg()
    assert learning_rate(0, c) == pytest.approx(5e-3 / 101)
    assert learning_rate(100, c) == pytest.approx(5e-3)  # end of warm-up: peak
    assert learning_rate(550, c) == pytest.approx(5e-4 + 4.5e-3 * 0.5)  # half-way through the cosine
    assert learning_rate(1000, c) == pytest.approx(5e-4)  # 0.1 x peak
    assert learning_rate(5000, c) == pytest.approx(5e-4)
    lrs = [learning_rate(s, c) for s in range(1001)]
    assert all(a < b for a, b in zip(lrs[:100], lrs[1:101], strict=True))
    assert all(a >= b for a, b in zip(lrs[100:], lrs[101:], strict=False))
    assert learning_rate(0, cfg(warmup_steps=0)) == pytest.approx(5e-3)


def test_margin_end_points():
    c = cfg()
    assert margin(0, c) == 1.0
    assert margin(500, c) == pytest.approx(4.5)
    assert margin(1000, c) == 8.0 and margin(2000, c) == 8.0


def test_retrieval_weight_end_points():
    c = cfg()
    assert retrieval_weight(0, c) == 0.0
    assert retrieval_weight(100, c) == pytest.approx(0.05)
    assert retrieval_weight(200, c) == pytest.approx(0.1) and retrieval_weight(999, c) == pytest.approx(0.1)
    assert retrieval_weight(0, cfg(alpha_ramp_steps=0)) == 0.1


def test_sampling_probability_end_points():
    c = cfg()
    assert sampling_probability(0, c) == 1.0
    assert sampling_probability(450, c) == pytest.approx(0.5)  # half of the 900-step cosine
    assert sampling_probability(899, c) == pytest.approx(0.5 * (1 + math.cos(math.pi * 899 / 900)))
    assert sampling_probability(900, c) == 0.0 and sampling_probability(1000, c) == 0.0
    ps = [sampling_probability(s, c) for s in range(901)]
    assert all(a >= b for a, b in zip(ps, ps[1:], strict=False))


def test_gold_neighbors_are_the_best_positives_then_empty_slots():
    inf = float("inf")
    rel = torch.tensor([[0.5, 2.0, -inf, 1.0, -0.3], [0.7, -inf, -inf, -inf, -inf]])
    pos = torch.tensor([[True, True, False, True, False], [True, False, False, False, False]])
    assert gold_neighbors(rel, pos, 2).tolist() == [[1, 3], [0, -1]]
    assert gold_neighbors(rel, pos, 4).tolist() == [[1, 3, 0, -1], [0, -1, -1, -1]]
    assert gold_neighbors(rel[:, :2], pos[:, :2], 3).tolist() == [[1, 0, -1], [0, -1, -1]]  # K > C


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.85, 1.0])
def test_scheduled_sampling_draws_gold_with_probability_p(p):
    keys, C = list(range(1000, 6000)), 8  # 40,000 query chunks
    use = sample_gold_mask(keys, C, p)
    assert use.shape == (5000, C) and use.dtype == torch.bool
    n = use.numel()
    freq = use.float().mean().item()
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(freq - p) <= 4 * sigma + 1e-12
    # per chunk position too (no chunk is favoured)
    per_chunk = use.float().mean(0)
    assert ((per_chunk - p).abs() <= 4 * math.sqrt(p * (1 - p) / len(keys)) + 1e-12).all()
    # a function of the keys alone: the same rows whatever batch they are drawn in
    assert torch.equal(use[7:9], sample_gold_mask(keys[7:9], C, p))


@pytest.mark.parametrize(("schedule", "p"), [("gold", 1.0), ("own", 0.0)])
def test_ss_schedule_ablations_hold_p_ss_constant(schedule, p):
    """Table 4's teacher-forcing ablations: p_ss = 1 (gold neighbours) or 0 (own) at every step, the anneal ignored."""
    c = cfg(ss_schedule=schedule)
    assert [sampling_probability(s, c) for s in (0, 1, 450, 899, 900, 1000, 5000)] == [p] * 7
    assert sampling_probability(0, cfg()) == 1.0 and sampling_probability(900, cfg()) == 0.0  # the anneal
