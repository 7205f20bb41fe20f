"""`python -m lab demo` end to end at a reduced size (the copy test, its table, figure and explorer page), and
`python -m lab bench`'s training rows on a store made by the pipeline's own verbs."""

import json

import pytest
from cli_parsers import main

from rpt.config import VARIANTS


@pytest.mark.slow  # 8 s: the default suite keeps its 5-minute budget; -m slow runs it
def test_demo_end_to_end(tmp_path, capsys, monkeypatch):
    import lab.demo as demo

    # smaller still: one document per update, one test document (the copy test's flags, printed with its command)
    monkeypatch.setattr(demo, "COPY_SIZE", {**demo.COPY_SIZE, "batch_size": 1, "eval_docs": 1})
    out = tmp_path / "demo"
    code = main(["demo", "--out", str(out), "--seeds", "0,1", "--steps", "2", "--near-steps", "3", "--no-progress"])
    res = out / "results"
    summary = json.loads((res / "demo.json").read_text())
    assert code == (0 if summary["passed"] else 1)  # 1: a check expected at this size is not met
    assert "xl copies near repeats" in summary["not_expected"] or summary["checks"]["checks"]["xl copies near repeats"]
    rows = summary["rows"]  # xl near (control and scorer, first seed), xl and rpt-sem far for both seeds
    assert set(rows) == {"xl (near)", "xl (far)", "rpt-sem (far)"}
    assert rows["xl (near)"]["perplexity"]["n"] == 1 and "retrieval_gain" not in rows["xl (far)"]
    sem = rows["rpt-sem (far)"]
    for key in ("perplexity", "perplexity_none", "retrieval_gain", "own_vs_random", "oracle_gain", "source_at_1"):
        assert sem[key]["n"] == 2, key
    assert sem["retrieval_gain"]["mean"] == pytest.approx(sem["perplexity_none"]["mean"] / sem["perplexity"]["mean"],
                                                          rel=0.2)  # a mean of ratios beside a ratio of means
    assert summary["far_distance"] == [3, 6] and summary["seeds"] == [0, 1]
    for f in ("copy_test.png", "explore.html"):
        assert (res / f).stat().st_size > 1000, f
    text = capsys.readouterr().out
    assert "$ python -m lab copytest" in text and "$ rpt explore" in text and "source@1" in text and "± " in text
    assert "--batch-size 1 --eval-docs 1" in text
    assert "longer comparisons:" in text and "scripts/domain_sweep.sh" in text
    assert ("FAILED" in text) == (not summary["passed"])  # a check not expected at this size is marked, not failed


def _copy_summary(checks: dict[str, bool], skip: dict[str, str]) -> dict:
    """A copy test's summary with these checks, as `verdict` writes it for settings whose not_expected is `skip`."""
    ev = {"all": 1.0, "advantage": 0.5}
    runs = [{"setting": "near", "variant": "xl", "seed": 0, "eval": {"none": ev}},
            {"setting": "far", "variant": "xl", "seed": 0, "eval": {"none": ev}},
            {"setting": "far", "variant": "rpt-sem", "seed": 0,
             "eval": {"model": {**ev, "hit@1": 0.9}, "none": {"all": 3.0, "advantage": 0.0}}}]
    skipped = {k: why for k, why in skip.items() if not checks[k]}
    verdict = {"checks": checks, "passed": all(checks.values()), "not_expected": skipped,
               "passed_at_this_size": all(ok for k, ok in checks.items() if k not in skipped)}
    return {"settings": {"variants": ["rpt-sem"]}, "runs": runs, "far_distance": [3, 6], "verdict": verdict}


def test_the_demo_table_marks_a_check_not_expected_at_its_size_and_never_says_failed():
    from lab.demo import DemoSettings, format_table, not_expected, summarize_copy

    near, far = "xl copies near repeats", "rpt-sem far gain comes from its neighbours"
    skip = not_expected(DemoSettings())  # the default: a near control of 400 updates
    assert set(skip) == {near} and not not_expected(DemoSettings(near_steps=1000))
    met = summarize_copy(_copy_summary({near: False, far: True}, skip))
    assert met["passed"] and met["not_expected"] == skip
    text = format_table(met)
    assert f"[-] {near} (not expected at this size: the near control trains 400 updates" in text
    assert f"[x] {far}" in text and "copy test: every check expected at this size is met (1 of 2)" in text
    assert "FAILED" not in text
    missed = summarize_copy(_copy_summary({near: False, far: False}, skip))
    assert not missed["passed"] and "FAILED: 1 of the 1 checks expected at this size are not met" in format_table(missed)
    # a near control that was expected to copy and did not: not skipped
    strict = summarize_copy(_copy_summary({near: False, far: True}, not_expected(DemoSettings(near_steps=1000))))
    assert not strict["passed"] and f"[ ] {near}" in format_table(strict) and "copy test: FAILED" in format_table(strict)


def test_demo_refuses_a_variant_without_retrieval(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "d"), "--variants", "xl"]) == 2
    assert "--variants 'xl'" in capsys.readouterr().err and not (tmp_path / "d").exists()


@pytest.mark.slow  # seconds to tens of seconds: -m slow runs it
def test_bench_training_rows_on_a_store_made_by_the_pipeline(tmp_path, capsys):
    store = tmp_path / "store"
    corpus = "synthetic:copy-far?docs=3&eval_docs=2&passages=32&passage=64&distance=2-4"  # 12 spans of 512 tokens
    span = ["--span", "512", "--segment-len", "64", "--k", "2", "--no-progress"]
    for argv in (["prepare", "--corpus", corpus, "--tokenizer", "corpus", "--out", str(store), "--no-progress"],
                 ["train", "--preset", "tiny", "--variant", "xl", "--store", str(store), "--seq-len", "512", "--set",
                  "model.segment_len=64", "--steps", "2", "--out", str(tmp_path / "scorer"), "--no-progress"],
                 ["label", "--store", str(store), "--kind", "lex", *span],
                 ["label", "--store", str(store), "--kind", "sem", "--scorer", str(tmp_path / "scorer"), *span]):
        assert main(argv) == 0, argv
    bench = tmp_path / "bench.json"
    assert main(["bench", "--store", str(store), "--seq-len", "512", "--segment-len", "64", "--steps", "5",
                 "--batch-size", "1", "--rounds", "1", "--eval-lengths", "512,1024", "--skip-labels", "--out", str(bench)]) == 0
    b = json.loads(bench.read_text())
    assert set(b["training"]["variants"]) == set(VARIANTS)  # the baselines beside RPT's four
    assert b["training"]["rounds"] == 1  # rounds in alternating order: tests/lab/test_bench_training.py
    xl = b["training"]["variants"]["xl"]["seconds_per_update"]
    for v, x in b["training"]["variants"].items():  # each variant's time over xl's
        assert x["seconds_per_update"] > 0 and x["time_vs_xl"] == pytest.approx(x["seconds_per_update"] / xl), v
    sizes = [r["memory_bytes"] for r in b["eval_scaling"]["rows"]]
    assert 1.8 < sizes[1] / sizes[0] < 2.2  # the document memory grows linearly with the document


def test_bench_without_a_store_or_labels_is_a_clear_error(tmp_path, capsys):
    assert main(["bench"]) == 2
    assert "--store is required" in capsys.readouterr().err
    assert main(["bench", "--store", str(tmp_path)]) == 2
    assert "rpt label --kind lex" in capsys.readouterr().err
