"""benchmarks/induction_probe.py: which targets copying by content can predict, and a short run of both models."""

import json

import numpy as np
import pytest


def test_copied_targets_are_the_continuations_of_a_copied_run(benchmark_script):
    rng = np.random.default_rng(0)
    a, b, c = rng.integers(0, 256, 20), rng.integers(0, 256, 13), rng.integers(0, 256, 5)
    doc = np.concatenate([a, b, a, c])  # a copied 33 tokens back, at another offset than its source
    copied = benchmark_script("induction_probe").copied_targets(doc)
    assert copied.shape == (len(doc) - 1,)
    first = len(a) + len(b)  # the copy's first token: nothing before it says a copy begins
    assert not copied[: first].any()  # targets 1 .. first: fresh, or the copy's first token
    assert copied[first : first + len(a) - 1].all()  # targets first + 1 .. : each continues the run from the token before
    assert not copied[first + len(a) - 1 :].any()  # c is fresh


@pytest.mark.parametrize("model", ["xl", "reference"])
def test_a_short_run_logs_the_copy_advantage(tmp_path, model, benchmark_script):
    out = tmp_path / "log.json"
    args = ["--model", model, "--steps", "3", "--log-every", "2", "--batch-size", "2", "--seq-len", "256",
            "--segment-len", "128", "--json", str(out)]
    assert benchmark_script("induction_probe").main(args) == 0
    log = json.loads(out.read_text())["log"]
    assert [r["step"] for r in log] == [2, 3]
    assert all(abs(r["advantage"] - (r["rest"] - r["copied"])) < 1e-3 for r in log)
    assert all(4.0 < r["rest"] < 7.0 for r in log)  # about ln 256 before any learning


def test_a_bad_passage_range_is_one_line(capsys, benchmark_script):
    with pytest.raises(SystemExit):
        benchmark_script("induction_probe").main(["--passage", "160-96"])
    assert "--passage" in capsys.readouterr().err


def test_plot_reads_the_logs_and_refuses_a_plot_without_them(tmp_path, capsys, benchmark_script):
    pytest.importorskip("matplotlib")
    out = tmp_path / "log.json"
    probe = benchmark_script("induction_probe")
    assert probe.main(["--steps", "2", "--log-every", "1", "--batch-size", "1", "--seq-len", "256",
                       "--segment-len", "128", "--json", str(out)]) == 0
    assert probe.main(["--plot", str(tmp_path / "curve.png"), str(out)]) == 0
    assert (tmp_path / "curve.png").stat().st_size > 1000
    with pytest.raises(SystemExit):
        probe.main(["--plot", str(tmp_path / "curve.png")])
    assert "--plot" in capsys.readouterr().err
