"""Retrieval metrics on hand-computed rankings (Table 3: Precision@2, Recall@10, nDCG@20 against the scorer's gold)."""

import math

import numpy as np
import pytest

from rpt.eval.metrics import add_sums, finalize, metric_sums, n_positives, ndcg_at_k, precision_at_k, ranked_gains, recall_at_k

NAN = np.nan
# query 0: candidates 5 (s_t 0.5), 3 (-0.2), 8 (1.0), 1 (unscored)  -> positives 8 (gain 1.0) and 5 (gain 0.5)
# query 1: candidates 2 (0.3), 6 (-1)                               -> positive 2 (gain 0.3)
# query 2: no positive                                              -> not counted
CAND = np.array([[5, 3, 8, 1], [2, 6, -1, -1], [4, 0, -1, -1]])
TARGET = np.array([[0.5, -0.2, 1.0, NAN], [0.3, -1.0, NAN, NAN], [-0.1, -0.5, NAN, NAN]])
RANKED = np.array([[3, 8, 5, 7, -1], [6, 9, 4, 0, 2], [4, 0, -1, -1, -1]])


def test_gains_of_a_ranking():
    np.testing.assert_allclose(ranked_gains(RANKED, CAND, TARGET), [[0, 1.0, 0.5, 0, 0], [0, 0, 0, 0, 0.3], [0] * 5])
    np.testing.assert_array_equal(n_positives(CAND, TARGET), [2, 1, 0])


def test_precision_recall_ndcg_by_hand():
    g = ranked_gains(RANKED, CAND, TARGET)
    np.testing.assert_allclose(precision_at_k(g, 2), [0.5, 0.0, 0.0])
    np.testing.assert_allclose(recall_at_k(g, n_positives(CAND, TARGET), 2), [0.5, 0.0, NAN])
    np.testing.assert_allclose(recall_at_k(g, n_positives(CAND, TARGET), 5)[:2], [1.0, 1.0])
    # query 0: DCG@3 = 1.0/log2(3) + 0.5/log2(4); ideal = 1.0/log2(2) + 0.5/log2(3)
    dcg0, idcg0 = 1.0 / math.log2(3) + 0.5 / 2, 1.0 + 0.5 / math.log2(3)
    # query 1: the positive at rank 5: 0.3/log2(6); ideal 0.3
    nd = ndcg_at_k(g, CAND, TARGET, 20)
    np.testing.assert_allclose(nd[:2], [dcg0 / idcg0, 1 / math.log2(6)])
    assert math.isnan(nd[2])
    np.testing.assert_allclose(ndcg_at_k(g, CAND, TARGET, 2)[:2], [(1.0 / math.log2(3)) / idcg0, 0.0])


def test_perfect_ranking_scores_one():
    ranked = np.array([[8, 5, 3, 1]])
    g = ranked_gains(ranked, CAND[:1], TARGET[:1])
    assert precision_at_k(g, 2)[0] == 1.0 and recall_at_k(g, np.array([2]), 10)[0] == 1.0
    assert ndcg_at_k(g, CAND[:1], TARGET[:1], 20)[0] == pytest.approx(1.0)


def test_sums_count_only_queries_with_a_positive_and_divide_once():
    s = metric_sums(RANKED, CAND, TARGET)
    assert s["n_queries"] == 2
    assert s["precision@2"] == pytest.approx(0.5) and s["recall@10"] == pytest.approx(2.0)
    # two shards (e.g. two documents or ranks) add up before the one division
    a, b = metric_sums(RANKED[:1], CAND[:1], TARGET[:1]), metric_sums(RANKED[1:], CAND[1:], TARGET[1:])
    merged = finalize(add_sums(a, b))
    assert merged == pytest.approx(finalize(s))
    assert merged["precision@2"] == pytest.approx(0.25) and merged["recall@10"] == pytest.approx(1.0)
    assert merged["n_queries"] == 2


def test_no_positive_anywhere():
    out = finalize(metric_sums(RANKED[2:], CAND[2:], TARGET[2:]))
    assert out["n_queries"] == 0 and out["precision@2"] is None and out["ndcg@20"] is None


def test_chunks_outside_the_candidates_are_not_positives():
    """A retriever may rank chunks BM25 never proposed: they count as non-relevant (gain 0), never as errors."""
    g = ranked_gains(np.array([[11, 12, 8]]), CAND[:1], TARGET[:1])
    np.testing.assert_allclose(g, [[0, 0, 1.0]])
