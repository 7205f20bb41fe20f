"""benchmarks/copy_ablation.py: one row per copytest summary, each seed's figures from its neighbour sources."""

import json
import math

import pytest


def summary(overrides: dict, evals: list[dict]) -> dict:
    runs = [{"setting": "near", "variant": "xl", "seed": 0, "eval": {"none": {"all": 5.0, "advantage": 1.0}}}]
    runs += [{"setting": "far", "variant": "rpt-sem", "seed": s, "eval": ev} for s, ev in enumerate(evals)]
    return {"settings": {"out": "x", "steps": 100, "model_overrides": overrides}, "runs": runs, "path": "x.json"}


def ev(own: float, none: float, rand: float, oracle: float, hit: float, adv: float) -> dict:
    return {"model": {"all": own, "hit@1": hit, "advantage": adv}, "none": {"all": none}, "random": {"all": rand},
            "oracle": {"all": oracle}}


def test_rows_hold_every_seed_and_the_random_chunk_control(tmp_path, benchmark_script):
    mod = benchmark_script("copy_ablation")
    a = tmp_path / "a.json"
    a.write_text(json.dumps(summary({}, [ev(2.0, 5.0, 4.0, 3.0, 0.9, 5.0), ev(3.0, 5.0, 4.0, 3.0, 0.7, 4.0)])))
    b = tmp_path / "b.json"  # an older summary without the random-chunk control
    old = [ev(5.0, 5.0, 0, 5.0, 0.1, 0.0), ev(5.0, 5.0, 0, 5.0, 0.3, 0.0)]
    for e in old:
        del e["random"]
    b.write_text(json.dumps(summary({"cca_shift_values": False}, old)))
    out = tmp_path / "rows.json"
    assert mod.main([str(a), str(b), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    s0 = rows[0]["seeds"][0]
    assert s0["gain"] == pytest.approx(math.exp(3.0)) and s0["random_gain"] == pytest.approx(math.exp(1.0))
    assert s0["own_vs_random"] == pytest.approx(math.exp(2.0)) and s0["oracle_gain"] == pytest.approx(math.exp(2.0))
    assert rows[0]["mean"]["source_at_1"] == pytest.approx(0.8) and rows[0]["mean"]["advantage"] == pytest.approx(4.5)
    assert rows[1]["overrides"] == {"cca_shift_values": False} and math.isnan(rows[1]["mean"]["own_vs_random"])
    text = mod.table(rows)
    assert "| default | 13.74 ±" in text and "| cca_shift_values=False | 1.00 ± 0.00 | not run | not run |" in text


def test_a_file_that_is_not_a_summary_is_named(tmp_path, benchmark_script, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert benchmark_script("copy_ablation").main([str(bad)]) == 2
    assert "bad.json: not a copytest summary" in capsys.readouterr().err
