"""`python -m lab bench` training rows: rounds in alternating order, the ratio to xl taken within each round."""

import pytest

import lab.bench as bench
from lab.cli import main
from rpt.config import VARIANTS


def test_rounds_alternate_and_pair_each_ratio_with_xl_of_the_same_round(tmp_path, monkeypatch):
    class Tok:
        vocab_size = 256

    monkeypatch.setattr("rpt.data.tokenizer.Tokenizer.from_file", staticmethod(lambda path: Tok()))
    calls = []
    base = {v: 1.0 + i for i, v in enumerate(VARIANTS)}  # xl 1.0 s, the next 2.0 s, ...

    def fake(cfg, store, labels, warmup, device):  # the machine is twice as slow in round 1 as in rounds 0 and 2
        calls.append(cfg.model.variant)
        slow = 2.0 if len(calls) > len(VARIANTS) and len(calls) <= 2 * len(VARIANTS) else 1.0
        return {"sec": base[cfg.model.variant] * slow, "peak_rss_mb": 100.0 + len(calls), "own_peak": True}

    monkeypatch.setattr(bench, "_time_training", fake)
    labels = {"retro": tmp_path, "rpt-lex": tmp_path, "rpt-sem": tmp_path}
    r = bench.bench_training(tmp_path, labels, steps=5, rounds=3)
    assert calls == list(VARIANTS) + list(VARIANTS)[::-1] + list(VARIANTS)  # forward, reversed, forward
    for i, v in enumerate(VARIANTS):
        row = r["variants"][v]
        assert row["rounds"]["time_vs_xl"] == pytest.approx([1.0 + i] * 3)  # the slow round moves both alike
        assert row["time_vs_xl"] == pytest.approx(1.0 + i) and row["time_vs_xl_range"] == pytest.approx([1.0 + i] * 2)
        assert row["seconds_per_update"] == pytest.approx(1.0 + i)  # median of (t, 2t, t)
        assert row["peak_rss_mb"] == 100.0 + min(k + 1 for k, c in enumerate(calls) if c == v)  # the least inflated
    assert r["rounds"] == 3 and "3 rounds in alternating order" in bench.format_training(r)
    assert "--rounds 3" in bench.format_training(bench.bench_training(tmp_path, labels, steps=5, rounds=1))


def test_rounds_below_one_is_a_one_line_error(tmp_path, capsys):
    assert main(["bench", "--store", str(tmp_path), "--rounds", "0"]) == 2
    assert "--rounds 0" in capsys.readouterr().err
