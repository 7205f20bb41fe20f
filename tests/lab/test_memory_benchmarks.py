"""The memory benchmarks run as documented (toy sizes), and `python -m lab bench --set` reaches the measured configs."""

from __future__ import annotations

import json

import pytest

from lab.cli import main


@pytest.mark.slow  # seconds to tens of seconds: -m slow runs it
def test_memory_estimate_benchmark_takes_config_fields(tmp_path, monkeypatch, benchmark_script):
    out = tmp_path / "m.json"
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    estimate = benchmark_script("memory_estimate")
    estimate.main(["seq=256", "variants=rpt-sem", "batch=1", "set=model.dropout=0.05;model.attn_dropout=0", f"out={out}"])
    row = json.loads(out.read_text())["rows"][0]
    assert row["overrides"] == {"model.dropout": 0.05, "model.attn_dropout": 0}
    assert row["measured_peak_bytes"] > 0 and 0.3 < row["ratio"] < 3


def test_saved_mode_sets_the_estimate_against_the_saved_tensors_on_both_attention_paths(tmp_path, benchmark_script):
    out = tmp_path / "s.json"
    benchmark_script("memory_estimate").main(["saved=1", "seq=512", "vocab=512", "variants=xl,rpt-sem", "batch=1",
                                              "attn_dropout=0.05,0", f"out={out}"])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["variant"], r["attn_dropout"]) for r in rows] == [("xl", 0.05), ("xl", 0), ("rpt-sem", 0.05),
                                                                  ("rpt-sem", 0)]
    for r in rows:
        assert r["saved_bytes"] == sum(r["saved_by_module"].values()) > 0
        assert 0.85 < r["ratio"] < 1.18, r  # the bound tests/train/test_memory_estimate.py holds the estimate to
    by = {(r["variant"], r["attn_dropout"]): r["saved_bytes"] for r in rows}
    assert by["xl", 0.05] > by["xl", 0] and by["rpt-sem", 0.05] > by["rpt-sem", 0]  # the math path's score rows
    assert "layers.*.cca" in rows[2]["saved_by_module"] and "layers.*.cca" not in rows[0]["saved_by_module"]


def test_malloc_threshold_benchmark_alternates_the_two_allocators(tmp_path, monkeypatch, benchmark_script):
    """Each probe's process starts with its own allocator setting, the two alternating by round. The probes are
    scripted here (each is `measure_step`, a fresh process reading MALLOC_MMAP_THRESHOLD_ when it starts, run for real
    by tests/lab/test_bench_scale.py); their arguments must bind to `probe_step`'s."""
    import inspect
    import os

    import lab.bench as bench

    probes = []

    def fake(**spec):
        inspect.signature(bench.probe_step).bind(**spec)
        probes.append((spec["variant"], os.environ.get("MALLOC_MMAP_THRESHOLD_")))
        return {"seconds_per_update": 0.1 * len(probes), "peak_bytes": 2**20 * len(probes)}

    monkeypatch.setattr(bench, "measure_step", fake)
    out = tmp_path / "t.json"
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "999")  # the benchmark sets it per probe and restores it after
    benchmark_script("malloc_threshold").main(["seq=256", "variants=xl", "rounds=2", "steps=2", f"out={out}"])

    assert os.environ["MALLOC_MMAP_THRESHOLD_"] == "999"
    assert probes == [("xl", None), ("xl", "131072"), ("xl", "131072"), ("xl", None)]  # default first, then fixed first
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"xl | default", "xl | fixed 131072"}
    assert all(len(r["seconds_per_update"]) == 2 and len(r["peak_bytes"]) == 2 for r in rows.values())
    base = rows["xl | default"]["seconds_per_update"]
    for name, r in rows.items():  # per round: the setting's time over the default allocator's in the same round
        ratios = [a / b for a, b in zip(r["seconds_per_update"], base, strict=True)]
        assert r["time_vs_default"] == pytest.approx(sum(ratios) / 2), name  # the median of two rounds
        assert r["time_vs_default_range"] == pytest.approx([min(ratios), max(ratios)]), name


def test_bench_scale_set_reaches_the_estimate(tmp_path, capsys):
    out = tmp_path / "s.json"
    args = ["bench", "--scale", "--preset", "small", "--seq-len", "2048", "--variants", "xl", "--loss-chunks", "",
            "--estimate-only", "--device", "cpu", "--memory-budget", "8", "--out", str(out)]
    rows = []
    for extra in ([], ["--set", "model.attn_dropout=0"]):
        assert main([*args, *extra]) == 0
        rows.append(json.loads(out.read_text())["scale"])
    paper, fused = rows
    assert fused["overrides"] == {"model.attn_dropout": 0} and paper["overrides"] == {}
    # the CPU's math path (attention dropout) keeps three [H, 2S] rows a token and layer: the estimate says so
    assert paper["rows"][0]["estimate_bytes"] > 1.5 * fused["rows"][0]["estimate_bytes"]


@pytest.mark.parametrize("value, needle", [("model.nope=1", "model.nope"), ("attn_dropout=0", "SECTION.KEY=VALUE"),
                                           ("model.attn_dropout=lots", "model.attn_dropout")])
def test_bench_scale_bad_set_is_one_line(value, needle, capsys):
    assert main(["bench", "--scale", "--estimate-only", "--variants", "xl", "--set", value]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
