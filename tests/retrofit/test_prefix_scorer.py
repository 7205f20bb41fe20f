"""The shared-prefix scorer (rpt/labels/scorer.py) gives HFScorer's target scores with fewer tokens run."""

from __future__ import annotations

import numpy as np
import pytest
from retrofit_helpers import TEXT, byte_bpe, tiny_llama

from rpt.labels.scorer import HFScorer, SharedPrefixScorer, target_scores


@pytest.mark.parametrize("batch_size", [3, 64])
def test_shared_prefixes_give_the_unshared_scores(batch_size):
    tok = byte_bpe()
    model = tiny_llama(vocab=len(tok))
    ids = np.asarray(tok(TEXT, add_special_tokens=False)["input_ids"])
    M = 8
    C = len(ids) // M
    chunks = ids[: C * M].reshape(C, M)
    rng = np.random.default_rng(0)
    queries = np.arange(4, min(C - 1, 16))
    cands = np.full((len(queries), 4), -1)
    for r, i in enumerate(queries):
        pick = rng.choice(i - 1, size=min(4, i - 1), replace=False)  # j + 1 < i
        cands[r, : len(pick)] = pick

    def decode(rows):
        return [tok.decode(r) for r in rows]

    plain = HFScorer(model, tok, "tiny", device="cpu", batch_size=batch_size)
    shared = SharedPrefixScorer(model, tok, "tiny", device="cpu", batch_size=batch_size)
    a = target_scores(plain, chunks, queries, cands, 0, decode)
    b = target_scores(shared, chunks, queries, cands, 0, decode)
    np.testing.assert_allclose(b, a, atol=1e-4, rtol=1e-4)
    assert np.isfinite(a[cands >= 0]).all()
    assert shared.tokens_processed + shared.prefix_tokens < 0.8 * plain.tokens_processed
