"""Chance levels, pool-size buckets and the random-neighbour control of the retrieval evaluation."""

import itertools

import numpy as np
import pytest

from rpt.chunks import last_retrievable
from rpt.eval import metrics
from rpt.eval.perplexity import random_neighbors, training_pool


def gold(pool: int, positives: dict[int, float], width: int) -> tuple[np.ndarray, np.ndarray]:
    """One query's exhaustive gold: candidates 0 .. pool-1 (padded to width), s_t given for `positives`, else -0.5."""
    cand = np.full((1, width), -1)
    cand[0, :pool] = np.arange(pool)
    target = np.full((1, width), np.nan)
    target[0, :pool] = -0.5
    for j, s in positives.items():
        target[0, j] = s
    return cand, target


@pytest.mark.parametrize("pool,positives", [(1, {0: 0.3}), (3, {2: 1.0}), (5, {0: 0.2, 3: 1.5}),
                                            (6, {1: 0.4, 2: 0.1, 5: 2.0})])
def test_expected_random_is_the_mean_over_every_order_of_the_pool(pool, positives):
    cand, target = gold(pool, positives, 8)
    exact = metrics.expected_random(cand, target, np.array([pool]))
    by_order = {k: [] for k in exact}
    for order in itertools.permutations(range(pool)):
        ranked = np.full((1, 20), -1)
        ranked[0, :pool] = order
        for k, v in metrics.ranking_values(ranked, cand, target).items():
            by_order[k].append(v[0])
    for k in exact:
        assert exact[k][0] == pytest.approx(np.mean(by_order[k]), abs=1e-12), k


def test_a_ranking_that_knows_nothing_scores_the_chance_level_under_exhaustive_gold():
    """Random gold over pools of 40: a fixed ranking that ignores the gold (recency) lands on the random expectation,
    as does a random draw; the gold's own order scores the ceiling."""
    rng = np.random.default_rng(0)
    Q, pool = 4000, 40
    cand = np.tile(np.arange(pool), (Q, 1))
    target = np.where(rng.random((Q, pool)) < 0.1, rng.exponential(1.0, (Q, pool)), -1.0)
    pools = np.full(Q, pool)
    chance = metrics.expected_random(cand, target, pools)["precision@2"]
    valid = metrics.n_positives(cand, target) > 0
    recency = metrics.ranking_values(metrics.recency_ranking(pools, 20), cand, target)["precision@2"]
    assert recency[valid].mean() == pytest.approx(chance[valid].mean(), abs=0.01)
    assert chance[valid].mean() == pytest.approx(0.1 * 40 / 40 / (1 - 0.9**40), abs=0.01)  # E[n_pos] / pool given >= 1
    from rpt.eval.perplexity import oracle_neighbors

    best = metrics.ranking_values(oracle_neighbors(cand, target, 20), cand, target)["precision@2"]
    assert best[valid].mean() > 0.5


def test_recency_ranking_is_the_most_recent_retrievable_first():
    r = metrics.recency_ranking(np.array([0, 2, 5]), 4)
    np.testing.assert_array_equal(r, [[-1, -1, -1, -1], [1, 0, -1, -1], [4, 3, 2, 1]])


def test_buckets_split_queries_by_pool_and_finalize_gives_means_per_bucket():
    assert [b[0] for b in metrics.pool_buckets(27)] == ["pool 1-27", "pool 28-128", "pool 129+"]
    assert [b[0] for b in metrics.pool_buckets(200)] == ["pool 1-200", "pool 201+"]
    pools = np.array([5, 20, 50, 300, 300])
    width = 300
    cands, targets = zip(*(gold(p, {0: 1.0} if i != 4 else {}, width) for i, p in enumerate(pools)), strict=True)
    cand, target = np.concatenate(cands), np.concatenate(targets)
    stats = metrics.query_stats(cand, target, pools)
    ranked = np.full((5, 20), -1)
    ranked[:, 0] = 0  # chunk 0 alone: every query with a positive finds it at rank 1 (P@2 = 1/2)
    sums = metrics.bucketed_sums(metrics.ranking_values(ranked, cand, target), stats, metrics.pool_buckets(27))
    out = metrics.finalize(sums)
    assert out["precision@2"] == pytest.approx(0.5) and out["n_queries"] == 4 and out["n_scored"] == 5
    assert out["positives"] == pytest.approx(4 / 5) and out["pool"] == pytest.approx(pools.mean())
    b = out["buckets"]
    assert list(b) == ["pool 1-27", "pool 28-128", "pool 129+"]
    assert (b["pool 1-27"]["n_queries"], b["pool 28-128"]["n_queries"], b["pool 129+"]["n_queries"]) == (2, 1, 1)
    assert b["pool 129+"]["n_scored"] == 2 and b["pool 129+"]["positives"] == pytest.approx(0.5)


def test_random_neighbours_are_distinct_retrievable_and_a_fixed_draw_per_document():
    M, S, n, K = 64, 128, 40, 3
    ids = random_neighbors(n, M, S, K, doc=3)
    last = last_retrievable(np.arange(n), M, S)
    for i in range(n):
        got = ids[i][ids[i] >= 0]
        assert len(got) == min(K, max(int(last[i]) + 1, 0)) and len(set(got)) == len(got)
        assert (got <= last[i]).all()
    np.testing.assert_array_equal(ids, random_neighbors(n, M, S, K, doc=3))
    assert not np.array_equal(ids, random_neighbors(n, M, S, K, doc=4))
    late = ids[30:]
    assert len(np.unique(late)) > 10  # spread over the pool, not the most recent chunks


def test_training_pool_of_a_span():
    assert training_pool(2048, 64, 128) == 27  # 32 chunks; the last query with a target (30) retrieves 0 .. 26
    assert training_pool(16384, 64, 1024) == int(last_retrievable(254, 64, 1024)) + 1
