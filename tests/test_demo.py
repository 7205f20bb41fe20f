"""The whole pipeline end to end through the CLI at a minimal scale: `rpt demo`, then `rpt bench` on its store."""

import json
import statistics

import pytest

from rpt.cli import main
from rpt.config import VARIANTS


def test_demo_and_bench_end_to_end(tmp_path, capsys):
    out = tmp_path / "demo"
    code = main(["demo", "--out", str(out), "--max-documents", "3", "--eval-documents", "1", "--steps", "6",
                 "--scorer-steps", "4", "--k", "4", "--seeds", "0,1", "--copy-steps", "2", "--copy-near-steps", "3",
                 "--no-progress"])
    assert code == 0
    res = out / "results"
    summary = json.loads((res / "demo.json").read_text())
    rows = summary["rows"]
    assert set(rows) >= {"xl", "retro", "rpt-lex", "rpt-sem", "rpt-sem K=4"}
    for name, row in rows.items():
        assert row["perplexity"]["mean"] > 1.0 and row["perplexity"]["n"] == 2, name
    assert "retrieval_gain" not in rows["xl"]
    for v in ("retro", "rpt-lex", "rpt-sem"):  # with its neighbours, with none, with the oracle, both seeds
        assert rows[v]["retrieval_gain"]["n"] == 2 and rows[v]["oracle_gain"]["n"] == 2, v
    assert (res / "rpt-sem-seed1-none.json").exists()
    assert "precision@2" in rows["rpt-sem"]["model"] and "precision@2" in rows["rpt-sem"]["bm25"]
    for f in ("loss_curves.png", "supervision_quality.png", "token_overlap.png", "subgroups.png", "explore.html"):
        assert (res / f).stat().st_size > 1000, f
    copy = summary["copy"]["rows"]  # the copy part: xl near (control and scorer, first seed), xl / retro / rpt-sem far
    assert set(copy) == {"xl (near)", "xl (far)", "retro (far)", "rpt-sem (far)"}
    assert copy["xl (near)"]["perplexity"]["n"] == 1 and "retrieval_gain" not in copy["xl (far)"]
    for v in ("retro (far)", "rpt-sem (far)"):
        assert copy[v]["retrieval_gain"]["n"] == 2 and copy[v]["oracle_gain"]["n"] == 2, v
    assert "source_at_1" in copy["rpt-sem (far)"] and summary["copy"]["far_distance"] == [3, 6]
    text = capsys.readouterr().out
    assert "$ rpt prepare" in text and "$ rpt train" in text and "oracle gain" in text and "± " in text
    assert "$ rpt copytest" in text and "copy corpus: repeats 3-6 passages" in text

    bench = tmp_path / "bench.json"
    code = main(["bench", "--store", str(out / "store"), "--steps", "5", "--rounds", "2", "--eval-lengths", "512,1024",
                 "--skip-labels", "--out", str(bench)])
    assert code == 0
    b = json.loads(bench.read_text())
    assert set(b["training"]["variants"]) == set(VARIANTS)  # the baselines beside RPT's four
    assert b["training"]["rounds"] == 2
    xl_rounds = b["training"]["variants"]["xl"]["rounds"]["seconds_per_update"]
    for v, x in b["training"]["variants"].items():  # per round: the variant's time over xl's in the same round
        want = [a / c for a, c in zip(x["rounds"]["seconds_per_update"], xl_rounds, strict=True)]
        assert len(want) == 2 and x["rounds"]["time_vs_xl"] == pytest.approx(want), v
        assert x["time_vs_xl"] == pytest.approx(statistics.median(want)), v
    sizes = [r["memory_bytes"] for r in b["eval_scaling"]["rows"]]
    assert 1.8 < sizes[1] / sizes[0] < 2.2  # the document memory grows linearly with the document


def test_bench_without_labels_is_a_clear_error(tmp_path, capsys):
    assert main(["bench", "--store", str(tmp_path)]) == 2
    assert "rpt demo" in capsys.readouterr().err
