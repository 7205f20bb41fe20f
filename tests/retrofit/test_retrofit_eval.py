"""benchmarks/retrofit_eval.py end to end on a tiny random Llama: a retrofit trained a few updates, then every
control in one JSON and one table; and `rpt eval` loads a retrofit checkpoint (the backbone from its recorded path)."""

from __future__ import annotations

import json
import math


def test_every_control_in_one_json_and_table(retrofit_run, tmp_path, benchmark_script, capsys):
    from rpt.cli import main

    store, run = retrofit_run
    assert main(["eval", "--checkpoint", str(run), "--store", str(store), "--split", "train", "--source", "none",
                 "--max-documents", "1", "--out", str(tmp_path / "none.json"), "--no-progress"]) == 0
    script = benchmark_script("retrofit_eval")
    result = script.main(["--checkpoint", str(run), str(run), "--store", str(store), "--split", "train",
                          "--documents", "1", "--tokens", "96", "--first", "64", "--work", str(tmp_path / "work"),
                          "--out", str(tmp_path / "result.json")])
    text = capsys.readouterr().out
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["written_by"] == "rpt eval" and saved["documents"] == 1
    assert saved["target_tokens"] == 32 and saved["oracle"] == "top-k"  # the scorer's K best, as `rpt eval`
    for source in ("model", "none", "random", "bm25", "oracle"):
        row = saved["rows"][source]
        assert len(row["seeds"]) == 2 and row["seeds"][0] == row["seeds"][1] and math.isfinite(row["mean"])
    for row in ("full", "window", "in-context bm25", "in-context random"):
        assert math.isfinite(saved["backbone_rows"][row]["perplexity"])
    assert {"model", "bm25", "recency", "random", "oracle"} <= set(saved["retrieval"])
    assert "retrofit, its own neighbours" in text and "backbone, full context" in text and "| recency |" in text
    assert result["rows"] == saved["rows"]
    for run_result in saved["checkpoints"]:  # each document's sums, so an interval can resample documents
        for got in run_result["sources"].values():
            t = got["targets"]
            assert len(t["documents"]) == 1 and sum(n for _, n in t["documents"]) == t["n"]
            assert math.isclose(sum(x for x, _ in t["documents"]), t["nll_sum"])
