"""benchmarks/copy_ablation.py: one row per copytest summary, each seed's figures from its neighbour sources."""

import json
import math

import pytest


def summary(overrides: dict, evals: list[dict], variant: str = "rpt-sem", **settings) -> dict:
    runs = [{"setting": "near", "variant": "xl", "seed": 0, "eval": {"none": {"all": 5.0, "advantage": 1.0}}}]
    runs += [{"setting": "far", "variant": variant, "seed": s, "eval": ev} for s, ev in enumerate(evals)]
    settings = {"out": "x", "steps": 100, "lr": 0.01, "model_overrides": overrides, **settings}
    return {"settings": settings, "runs": runs, "path": "x.json"}


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
    assert "| default | 13.74 ±" in text and "| cca_shift_values=False | 1.00 ± 0.00 | not measured | not measured |" in text


def test_a_file_that_is_not_a_summary_is_named(tmp_path, benchmark_script, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert benchmark_script("copy_ablation").main([str(bad)]) == 2
    assert "bad.json: not a copytest summary" in capsys.readouterr().err


def test_retro_reads_bm25_and_rows_are_named_by_the_settings_that_differ(tmp_path, benchmark_script):
    mod = benchmark_script("copy_ablation")
    retro = [{"bm25": {"all": 2.0, "advantage": 5.0}, "none": {"all": 5.0}, "random": {"all": 4.0}}] * 2
    paths = []
    for name, kw in (("a", {}), ("b", {"steps": 200}), ("c", {"lr": 0.003})):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(summary({}, retro, variant="retro", **kw)))
    out = tmp_path / "rows.json"
    assert mod.main([*map(str, paths), "--variant", "retro", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert rows[0]["mean"]["gain"] == pytest.approx(math.exp(3.0))  # own = BM25's neighbours
    assert rows[0]["mean"]["own_vs_random"] == pytest.approx(math.exp(2.0))
    assert math.isnan(rows[0]["mean"]["source_at_1"]) and math.isnan(rows[0]["mean"]["oracle_gain"])
    assert [r["varying"] for r in rows] == [{"lr": 0.01, "steps": 100}, {"lr": 0.01, "steps": 200},
                                            {"lr": 0.003, "steps": 100}]
    assert "lr" not in doc["settings"] and "steps" not in doc["settings"]
    text = mod.table(rows)
    assert "| lr=0.003, steps=100 | 20.09 ± 0.00 |" in text and "| not measured | +5.00 ± 0.00 |" in text
