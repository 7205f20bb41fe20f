import numpy as np
import torch

from rpt.chunks import last_retrievable, retrievable_mask, retrievable_mask_np


def brute(n, m, s):
    cps = s // m
    out = np.zeros((n, n), bool)
    for i in range(n):
        window_start_token = max(0, (i // cps - 1)) * s  # first token segment(i) sees through self-attention
        for j in range(n):
            cont_end_token = (j + 2) * m  # chunk j and its continuation j+1 end here (exclusive)
            out[i, j] = cont_end_token <= window_start_token and i // cps >= 1
    return out


def test_mask_matches_token_level_rule():
    for n, m, s in [(40, 4, 8), (64, 64, 1024), (33, 2, 6)]:
        ref = brute(n, m, s)
        assert (retrievable_mask_np(n, m, s) == ref).all()
        assert (retrievable_mask(n, m, s).numpy() == ref).all()


def test_first_two_segments_retrieve_nothing():
    m, s = 64, 128
    assert last_retrievable(3, m, s) < 0
    assert last_retrievable(4, m, s) == 0  # segment 2 sees segments 1,2; chunk 0 + continuation 1 precede them
    assert (last_retrievable(torch.arange(8), m, s) == torch.tensor([-4, -4, -2, -2, 0, 0, 2, 2])).all()


def test_pool_size_counts_the_retrievable_chunks():
    from rpt.chunks import pool_size, retrievable_mask_np

    m, s = 4, 8  # 2 chunks per segment
    counts = retrievable_mask_np(12, m, s).sum(1)
    np.testing.assert_array_equal(pool_size(np.arange(12), m, s), counts)
    assert [pool_size(i, m, s) for i in range(12)] == counts.tolist()
    assert torch.equal(pool_size(torch.arange(12), m, s), torch.as_tensor(counts))
