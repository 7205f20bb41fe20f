"""`rpt demo` end to end at a reduced size (the copy test, its table, figure and explorer page), and `rpt bench`'s
training rows on a store made by the pipeline's own verbs."""

import json

import pytest

from rpt.cli import main
from rpt.config import VARIANTS


def test_demo_end_to_end(tmp_path, capsys, monkeypatch):
    import rpt.experiments.demo as demo

    # smaller still: one document per update, one test document (the copy test's flags, printed with its command)
    monkeypatch.setattr(demo, "COPY_SIZE", {**demo.COPY_SIZE, "batch_size": 1, "eval_docs": 1})
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--seeds", "0,1", "--steps", "2", "--near-steps", "3", "--no-progress"]) == 0
    res = out / "results"
    summary = json.loads((res / "demo.json").read_text())
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
    assert "$ rpt copytest" in text and "$ rpt explore" in text and "source@1" in text and "± " in text
    assert "--batch-size 1 --eval-docs 1" in text
    assert "longer comparisons:" in text and "scripts/domain_sweep.sh" in text


def test_demo_refuses_a_variant_without_retrieval(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "d"), "--variants", "xl"]) == 2
    assert "--variants 'xl'" in capsys.readouterr().err and not (tmp_path / "d").exists()


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
    assert b["training"]["rounds"] == 1  # rounds in alternating order: tests/test_bench_training.py
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
