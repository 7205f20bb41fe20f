"""`python -m lab compare`'s per-document intervals on retrieval metrics: the model's P@2 against BM25, recency and random,
resampling the test documents."""

import math

import pytest
from test_compare import result

from lab.compare import bootstrap_difference, bootstrap_ratio, compare, to_markdown
from rpt.utils import UserError


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


def test_seed_to_seed_spread_widens_the_interval():
    """Three runs whose gap is the same in every document but differs from run to run (0, 10 and 20 points): resampling
    documents alone would give [10, 10]; resampling the runs too spreads it over the runs' gaps."""
    counts = [4, 4, 4, 4, 4]
    b = per_doc([0.3] * 5, counts)
    runs = {(seed, 0): per_doc([0.3 + gap] * 5, counts) for seed, gap in ((0, 0.0), (1, 0.1), (2, 0.2))}
    lo, hi, n = bootstrap_difference(runs, {x: b for x in runs})
    assert n == 5 and lo == pytest.approx(0.0) and hi == pytest.approx(0.2)
    # the same mean gap in every run: no spread to add, the interval stays at the gap
    same = {(seed, 0): per_doc([0.4] * 5, counts) for seed in range(3)}
    assert bootstrap_difference(same, {x: b for x in same})[:2] == pytest.approx((0.1, 0.1))


def test_the_ratio_interval_holds_the_spread_between_runs():
    docs = [(100.0, 50), (120.0, 60), (90.0, 45), (110.0, 55)]
    num = {(s, 0): {d: (v * (1 + 0.05 * s), n) for d, (v, n) in enumerate(docs)} for s in range(3)}
    den = {x: dict(enumerate(docs)) for x in num}
    lo, hi, _ = bootstrap_ratio(num, den)  # per-run ratios exp(0), exp(0.05 x 2), exp(0.1 x 2) in every document
    assert lo == pytest.approx(1.0) and hi == pytest.approx(math.exp(0.2))


def test_runs_of_one_seed_in_other_folders_are_pooled(tmp_path):
    def run(seed, folder, source, ppl):
        r = result("rpt-sem", seed, source, ppl)
        r["config"]["train"]["out_dir"] = folder
        return r

    rs = [run(0, "runs/a", "model", 90.0), run(0, "runs/a", "none", 99.0),
          run(0, "runs/b", "model", 80.0), run(0, "runs/b", "none", 96.0)]
    (row,) = compare(rs)["rows"]
    assert row["seeds"] == [0] and row["runs"] == 2 and row["ppl"][0] == pytest.approx(85.0)
    assert row["gain"][0] == pytest.approx((99 / 90 + 96 / 80) / 2)  # each run paired with its own no-neighbour result
    assert "| rpt-sem | 2 (1 seeds) | 85.0 ± 7.1 |" in to_markdown(compare(rs))
    with pytest.raises(UserError, match="from the same run folder runs/a"):
        compare([*rs, run(0, "runs/a", "model", 91.0)])


def test_one_test_document_says_why_there_is_no_interval():
    rs = [with_one_doc(result("rpt-sem", s, "model", 90.0 + s)) for s in (0, 1)]
    rs += [with_one_doc(result("rpt-sem", s, "none", 95.0 + s)) for s in (0, 1)]
    table = compare(rs)
    (row,) = table["rows"]
    assert row["one_document"] and row["gain_ci"] is None
    assert "No interval for rpt-sem: the results hold one test document" in to_markdown(table)


def with_one_doc(r: dict) -> dict:
    r["documents"] = [{"index": 0, "id": "doc0", "n_tokens": 100, "nll_sum": 400.0, "n_targets": 99}]
    return r


def test_compare_records_the_environments_of_its_results():
    env = {"machine": "x86_64", "cpu_count": 2, "gpu": None, "threads": 1, "torch": "2.13.0+cpu", "python": "3.11.7",
           "rpt": "0.1.0", "platform": "Linux"}
    rs = [result("xl", 0, "none", 100.0), result("xl", 1, "none", 104.0)]
    for r in rs:
        r["environment"] = env
    rs[0]["train_environments"] = [{"from_step": 0, **env, "cpu": "AMD EPYC", "threads": 2},
                                   {"from_step": 100, **env, "cpu": "AMD EPYC"}]
    rs[1]["train_environments"] = [{"from_step": 0, **env, "cpu": "AMD EPYC"}]
    table = compare(rs)
    assert table["result_environments"] == [env] and {"threads", "torch", "python", "rpt"} <= set(table["environment"])
    assert [e["threads"] for e in table["train_environments"]] == [2, 1]  # each environment once, without its step
    text = to_markdown(table)
    assert "Results from: x86_64, 2 CPUs, 1 threads, torch 2.13.0+cpu, Python 3.11.7, rpt 0.1.0." in text
    assert ("Trained on: x86_64 (AMD EPYC), 2 CPUs, 2 threads, torch 2.13.0+cpu, Python 3.11.7, rpt 0.1.0; "
            "x86_64 (AMD EPYC), 2 CPUs, 1 threads") in text
    # the kernels' vector extension, and a variable that overrode it, name runs whose CPU names are alike
    rs[1]["train_environments"] = [{"from_step": 0, **env, "cpu": "AMD EPYC", "cpu_capability": "AVX2",
                                    "isa_variables": {"ATEN_CPU_CAPABILITY": "avx2"}}]
    assert ("x86_64 (AMD EPYC; AVX2 kernels; ATEN_CPU_CAPABILITY=avx2), 2 CPUs, 1 threads"
            in to_markdown(compare(rs)))


def test_runs_of_one_seed_are_resampled_within_their_seed_not_as_independent_runs():
    """Three seeds, each trained again twice (in other numeric environments) to the same per-document differences:
    the extra runs add no information, so the interval must stay as wide as with one run per seed. Drawn as nine
    independent runs it would narrow by about sqrt(3)."""
    counts = [4] * 6
    gaps = {0: 0.02, 1: 0.10, 2: 0.18}  # seed-to-seed spread dominates

    def side(diff: float) -> dict[int, tuple[float, int]]:
        return per_doc([0.3 + diff] * 6, counts)

    def base() -> dict[int, tuple[float, int]]:
        return per_doc([0.3] * 6, counts)

    one = bootstrap_difference({(s, 0): side(g) for s, g in gaps.items()}, {(s, 0): base() for s in gaps})
    three = bootstrap_difference({(s, r): side(g) for s, g in gaps.items() for r in range(3)},
                                 {(s, r): base() for s in gaps for r in range(3)})
    width = lambda ci: ci[1] - ci[0]  # noqa: E731
    assert width(three) == pytest.approx(width(one), rel=0.15)
    assert three[0] <= 0.03 and three[1] >= 0.17  # as wide as the seeds' own spread
    # unequal numbers of runs per seed are drawn the same way
    uneven = bootstrap_difference({(0, 0): side(0.02), (1, 0): side(0.10), (1, 1): side(0.10), (2, 0): side(0.18)},
                                  {(0, 0): base(), (1, 0): base(), (1, 1): base(), (2, 0): base()})
    assert width(uneven) == pytest.approx(width(one), rel=0.15)
