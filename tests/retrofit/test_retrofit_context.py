"""The no-training rows a retrofit is measured against (rpt.retrofit.context_rows) on a tiny random Llama."""

from __future__ import annotations

import math

import numpy as np
from retrofit_helpers import retrofit_config, tiny_llama

from rpt.model.retrofit import RetrofitRPT
from rpt.retrofit import CONTEXT_ROWS, context_rows, target_chunks


def test_where_the_window_holds_every_earlier_token_every_row_is_the_full_context():
    hf = tiny_llama()
    window = RetrofitRPT(retrofit_config("xl"), seed=0, backbone=hf).eval()
    tokens = np.random.default_rng(0).integers(3, 256, 96)
    first = context_rows(hf, tokens, 16, 8, 2, [2, 3], retrofit=window)  # segment 1: the window starts at token 0
    assert set(first) == set(CONTEXT_ROWS)
    for name, (nll, n) in first.items():
        assert n == 16 and math.isclose(nll, first["full"][0], rel_tol=1e-4), name
    late = context_rows(hf, tokens, 16, 8, 2, target_chunks(96, 8, 64, 32), retrofit=window)  # segments 4, 5
    assert all(n == 32 and math.isfinite(nll) for nll, n in late.values())
    assert not math.isclose(late["in-context bm25"][0], late["in-context none"][0], rel_tol=1e-6)
