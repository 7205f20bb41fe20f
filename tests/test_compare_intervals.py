"""`rpt compare`'s per-document intervals on retrieval metrics: the model's P@2 against BM25, recency and random,
resampling the test documents."""

import pytest
from test_compare import result

from rpt.experiments.compare import bootstrap_difference, compare, to_markdown


def per_doc(rates: list[float], counts: list[int]) -> dict[int, tuple[float, int]]:
    """{document: (P@2 sum, query chunks)} from per-document rates."""
    return {d: (r * n, n) for d, (r, n) in enumerate(zip(rates, counts, strict=True))}


def test_a_constant_per_document_difference_has_an_interval_of_one_point():
    """Every document 10 points apart with equal counts on both sides: every resample gives exactly 0.1."""
    counts = [3, 5, 2, 7]
    a = {0: per_doc([0.6, 0.5, 0.3, 0.4], counts), 1: per_doc([0.7, 0.6, 0.4, 0.5], counts)}
    b = {0: per_doc([0.5, 0.4, 0.2, 0.3], counts), 1: per_doc([0.6, 0.5, 0.3, 0.4], counts)}
    lo, hi, n = bootstrap_difference(a, b)
    assert lo == pytest.approx(0.1) and hi == pytest.approx(0.1) and n == 4


def test_differences_of_either_sign_across_documents_give_an_interval_containing_zero():
    counts = [4] * 8
    a = {0: per_doc([0.9, 0.1, 0.8, 0.2, 0.7, 0.3, 0.9, 0.1], counts)}
    b = {0: per_doc([0.1, 0.9, 0.2, 0.8, 0.3, 0.7, 0.1, 0.9], counts)}  # the same mean, opposite per document
    lo, hi, _ = bootstrap_difference(a, b)
    assert lo < -0.1 < 0 < 0.1 < hi
    # the pooled (micro) mean: a long document (many query chunks) weighs more
    lo, hi, _ = bootstrap_difference({0: {0: (9.0, 10), 1: (0.0, 1)}}, {0: {0: (0.0, 10), 1: (1.0, 1)}}, draws=200)
    assert hi <= 1.0 and lo >= -1.0
    assert bootstrap_difference({0: {0: (1.0, 2)}}, {0: {0: (0.0, 2)}}) is None  # one document: no interval


def with_docs(r: dict, rates: dict[str, list[float]], counts: list[int]) -> dict:
    """An eval result whose documents carry per-document P@2 sums of each ranking."""
    r["documents"] = [{"index": d, "id": f"doc{d}", "n_tokens": 100, "nll_sum": 1.0, "n_targets": 10,
                       "metrics": {who: {"precision@2": v[d] * n, "n_queries": n} for who, v in rates.items()}}
                      for d, n in enumerate(counts)]
    return r


def test_compare_sets_the_model_against_bm25_recency_and_random_per_document():
    counts = [5, 5, 5, 5, 5]
    rates = {"model": [0.4, 0.4, 0.4, 0.4, 0.4], "bm25": [0.5, 0.5, 0.5, 0.5, 0.5],
             "recency": [0.4, 0.5, 0.3, 0.4, 0.4], "random": [0.2, 0.2, 0.2, 0.2, 0.2]}
    rs = [with_docs(result("rpt-sem", seed, "model", 50.0, metrics=(0.4, 0.5, 0.5)), rates, counts) for seed in (0, 1)]
    row = compare(rs)["rows"][0]
    assert row["p2_vs_bm25"][0] == pytest.approx(-0.1) and row["p2_vs_bm25"][2] == 2
    assert row["p2_vs_bm25_ci"][:2] == pytest.approx((-0.1, -0.1))  # the same gap in every document
    assert row["p2_vs_random_ci"][:2] == pytest.approx((0.2, 0.2))
    lo, hi, n = row["p2_vs_recency_ci"]
    assert lo < 0 < hi and n == 5 and row["p2_vs_recency"][0] == pytest.approx(0.0)
    md = to_markdown(compare(rs))
    assert "− BM25" in md and "-10.0% ± 0.0 [-10.0, -10.0]" in md and "20.0% ± 0.0 [20.0, 20.0]" in md


def test_results_without_per_document_metrics_get_no_interval():
    rs = [result("rpt-sem", 0, "model", 50.0, metrics=(0.4, 0.5, 0.5))]
    row = compare(rs)["rows"][0]
    assert not any(k.startswith("p2_vs_") for k in row)
    assert "− BM25" not in to_markdown(compare(rs))
