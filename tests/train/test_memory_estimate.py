"""The pre-flight memory estimate against what autograd really keeps (saved-tensor hooks), for every variant, on the
fused attention path and on the math path that attention dropout takes on a CPU (docs/results/speed.md#step-memory)."""

from __future__ import annotations

import pytest

from lab.bench import scale_config
from rpt.config import VARIANTS
from rpt.training.footprint import estimate_step_memory, saved_tensor_bytes

# (d_model, n_heads, segment_len): the tiny preset's shape and one twice as wide with other head and window sizes
SHAPES = [(64, 4, 128), (128, 8, 256)]
# rpt-lex's model is rpt-sem's (tests/model/test_model.py::test_rpt_lex_and_rpt_sem_are_one_model): one estimate, one case
MODELS = tuple(v for v in VARIANTS if v != "rpt-lex")


def _cfg(variant: str, shape: tuple[int, int, int], attn_dropout: float):
    D, H, S = shape
    cfg = scale_config(variant, "tiny", 4 * S, batch_size=1, vocab_size=512, loss_chunk=256,
                       overrides={"model.d_model": D, "model.n_heads": H, "model.segment_len": S,
                                  "model.mlp_hidden": 8 * D // 3, "model.dropout": 0.05,
                                  "model.attn_dropout": attn_dropout})
    return cfg


# every variant on both paths and at both shapes, each path at both shapes: a pairwise cover (12 cases instead of 24)
ESTIMATE_CASES = [pytest.param(v, p, SHAPES[(i + j) % 2], id=f"{v}-{path}-D{SHAPES[(i + j) % 2][0]}")
                  for i, v in enumerate(MODELS) for j, (p, path) in enumerate([(0.0, "fused"), (0.05, "math-path")])]


@pytest.mark.parametrize("variant, attn_dropout, shape", ESTIMATE_CASES)
def test_the_estimate_counts_what_autograd_keeps(variant, attn_dropout, shape):
    cfg = _cfg(variant, shape, attn_dropout)
    saved = sum(saved_tensor_bytes(cfg).values())
    est = estimate_step_memory(cfg, "cpu")
    counted = est.layers - _temporary(cfg) + est.retrieval
    assert 0.85 < counted / saved < 1.18, f"{variant}: estimate {counted / 2**20:.1f} MiB, saved {saved / 2**20:.1f} MiB"


def _temporary(cfg) -> int:
    from rpt.model.registry import model_class

    return model_class(cfg.model.variant).temporary_bytes(cfg.model, cfg.train.batch_size, cfg.data.seq_len)


def test_attention_dropout_sends_the_cpu_estimate_to_the_math_path_and_a_gpu_estimate_nowhere():
    fused, math = (estimate_step_memory(_cfg("rpt-sem", SHAPES[1], p), "cpu") for p in (0.0, 0.05))
    # three [H, 2S] rows a token and layer instead of the float window mask: D=128, H=8, S=256, 4 layers
    T, L, H, S = 4 * 256, 4, 8, 256
    assert math.layers - fused.layers == 4 * T * L * (3 * H * 2 * S - 2 * S)
    assert math.retrieval > fused.retrieval
    on_gpu = [estimate_step_memory(_cfg("rpt-sem", SHAPES[1], p), "cuda") for p in (0.0, 0.05)]
    assert on_gpu[0].layers == on_gpu[1].layers and on_gpu[0].retrieval == on_gpu[1].retrieval


def test_saved_tensor_bytes_names_the_modules_that_keep_them():
    per = saved_tensor_bytes(_cfg("rpt-sem", SHAPES[0], 0.05))
    assert {"layers.*.attn", "layers.*.mlp", "layers.*.cca", "query_aug.self_attn", "encoder.attn"} <= set(per)
    # the math path's three score rows dominate a layer's attention at this width
    assert per["layers.*.attn"] > per["layers.*.mlp"]
