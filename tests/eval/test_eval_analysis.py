"""§5.4 analyses on hand-computed cases: unique-token overlap of the best neighbour, relative improvement over
Transformer-XL split by gold retrieved or not, and the plots."""

import numpy as np
import pytest

from rpt.eval.analysis import (
    finalize_overlap,
    finalize_subgroups,
    gold_retrieved,
    neighbor_overlap,
    overlap_sums,
    relative_improvement,
    subgroup_sums,
    unique_overlap,
)


def test_unique_overlap_counts_distinct_tokens():
    assert unique_overlap(np.array([1, 1, 2, 3]), np.array([1, 3, 3, 9])) == 2
    assert unique_overlap(np.array([4]), np.array([5])) == 0


def test_best_neighbour_overlap_by_hand():
    # chunk size 2; chunks: c0=[1,2] c1=[3,4] c2=[1,3] c3=[4,9] c4=[7,7]
    toks = np.array([1, 2, 3, 4, 1, 3, 4, 9, 7, 7])
    best = np.array([-1, -1, 0, 0, 1])
    q, t, v = neighbor_overlap(toks, 2, best)
    # query 2 = [1,3], neighbour 0 + continuation = [1,2,3,4]: overlap with query {1,3} = 2, with target c3 {4} = 1
    # query 3 = [4,9], same neighbour: query {4} = 1, target c4 {} = 0; query 4 has no target chunk
    np.testing.assert_array_equal(v, [False, False, True, True, False])
    np.testing.assert_array_equal(q[v], [2, 1])
    np.testing.assert_array_equal(t[v], [1, 0])
    q1, t1, _ = neighbor_overlap(toks, 2, best, continuation=False)  # neighbour 0 alone = [1,2]
    np.testing.assert_array_equal(q1[v], [1, 0])
    s = overlap_sums(toks, 2, best)
    assert s == {"query": 3.0, "target": 1.0, "n": 2.0}
    assert finalize_overlap(s) == {"query": 1.5, "target": 0.5, "n": 2}
    assert finalize_overlap({}) == {"query": None, "target": None, "n": 0}


def test_relative_improvement():
    np.testing.assert_allclose(relative_improvement(np.array([9.0, 12.0]), np.array([10.0, 10.0])), [0.1, -0.2])
    assert np.isnan(relative_improvement(np.array([1.0]), np.array([0.0]))[0])


def test_gold_retrieved():
    neighbors = np.array([[3, 1], [-1, -1], [0, 2]])
    cand = np.array([[1, 3, -1], [0, -1, -1], [2, 0, -1]])
    target = np.array([[0.4, -0.1, np.nan], [0.9, np.nan, np.nan], [-0.2, -0.3, np.nan]])
    np.testing.assert_array_equal(gold_retrieved(neighbors, cand, target), [True, False, False])


def test_subgroups_by_hand():
    """chunk size 2, segment 4: chunks 0..3 retrieve nothing, chunk 4 and 5 may retrieve chunk 0."""
    chunk_nll = np.array([1.0, 2.0, 2.0, 2.0, 2.0, 8.0, 9.0])  # model: NLL of each chunk's tokens
    base_nll = np.array([1.0, 2.0, 2.0, 2.0, 2.0, 10.0, 10.0])  # Transformer-XL
    tokens = np.array([1, 2, 2, 2, 2, 2, 1])
    neighbors = np.array([[-1], [-1], [-1], [-1], [0], [0]])  # query chunks 0..5 (chunk 6 unfinished)
    cand = np.array([[-1]] * 4 + [[0], [0]])
    target = np.array([[np.nan]] * 4 + [[0.7], [-0.4]])
    s = subgroup_sums(chunk_nll, base_nll, tokens, neighbors, cand, target, chunk_size=2, segment_len=4)
    # query 4 (target chunk 5): gold retrieved, 1 - 8/10 = 0.2; query 5 (target chunk 6): not gold, 1 - 9/10 = 0.1
    assert s == pytest.approx({"gold": 0.2, "gold_n": 1, "no_gold": 0.1, "no_gold_n": 1})
    out = finalize_subgroups(s)
    assert out["gold"] == pytest.approx({"improvement": 0.2, "n": 1})
    assert out["all"] == pytest.approx({"improvement": 0.15, "n": 2})
    assert finalize_subgroups({})["gold"] == {"improvement": None, "n": 0}


def test_plots_write_pngs(tmp_path):
    pytest.importorskip("matplotlib")
    from rpt.eval.plots import plot_results, plot_subgroups, plot_token_overlap

    p = plot_token_overlap({"rpt-sem retriever": {"query": 5.0, "target": 4.0}, "BM25": {"query": 7.0, "target": 3.0}},
                           tmp_path / "ov.png")
    assert p.read_bytes()[:4] == b"\x89PNG"
    g = {"gold": {"improvement": 0.1, "n": 3}, "no_gold": {"improvement": None, "n": 0}, "all": {}}
    assert plot_subgroups({"rpt-sem": g}, tmp_path / "sg.png").stat().st_size > 0
    res = {"eval": {"source": "model", "n_neighbors": 2}, "config": {"model": {"variant": "rpt-sem"}},
           "overlap": {"model": {"query": 1.0, "target": 2.0, "n": 4}, "bm25": {"query": 3.0, "target": 1.0, "n": 4},
                       "definition": "..."}, "subgroups": g}
    written = plot_results([res], tmp_path / "plots")
    assert [w.name for w in written] == ["token_overlap.png", "subgroups.png"]
