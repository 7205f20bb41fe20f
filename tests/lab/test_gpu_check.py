"""scripts/gpu_check.sh (the GPU checks): every stage's command is real; without a GPU it refuses in one line.

In the default suite the script runs with stand-ins for rpt and python that record its commands: each parses, and the
kernels stage's command runs here on the CPU and the scale stage's with --estimate-only (the measurement behind it,
each variant in its own process, runs in tests/lab/test_bench_scale.py). Under -m slow its stages run, dry, on a CPU at a
tiny size."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_parsers import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def run(out: Path, *stages: str, **env: str) -> subprocess.CompletedProcess:
    bindir = Path(sys.executable).parent
    rpt = bindir / "rpt"
    full = {**os.environ, "PYTHON": sys.executable, "RPT": str(rpt) if rpt.exists() else f"{sys.executable} -m rpt.cli",
            **env}
    return subprocess.run(["bash", str(SCRIPT), str(out), *stages], capture_output=True, text=True, cwd=ROOT, env=full)


TINY = {"DEVICE": "cpu", "PRESET": "tiny", "SEQ": "512", "PRECISION": "fp32", "STEPS": "2", "VARIANTS": "xl,rpt-sem",
        "KERNEL_VARIANTS": "xl,rpt-sem"}


@pytest.mark.slow  # 4 s: every stage's command, dry, on the CPU
def test_every_stage_runs_its_command(tmp_path, recording_command, monkeypatch):
    out = tmp_path / "gc"
    rec = str(recording_command("rpt"))
    r = run(out, RPT=rec, LAB=rec, PYTHON=str(recording_command("python")), SCORER="tiny", **TINY)
    assert r.returncode == 0, r.stderr + r.stdout[-2000:]
    for stage in ("env", "tests", "kernels", "scale", "compile", "labels"):
        assert f"== {stage}: exit 0 after" in (out / f"{stage}.txt").read_text(), stage
    kernels, scale, compiled = (build_parser().parse_args(argv) for argv in recording_command.calls("rpt"))
    assert kernels.kernels and (kernels.variants, kernels.device, kernels.preset) == ("xl,rpt-sem", "cpu", "tiny")
    assert scale.scale and (scale.variants, scale.steps, scale.seq_len, scale.precision) == ("xl,rpt-sem", 2, 512, "fp32")
    assert compiled.scale and compiled.compile == "both" and compiled.out == out / "compile.json"
    env, tests, labels = recording_command.calls("python")
    assert env[0] == "-c" and tests == ["-m", "pytest", "-m", "gpu", "-n", "0", "-q", "-p", "no:cacheprovider"]
    import lab.bench_labels as bench_labels

    got = []
    monkeypatch.setattr(bench_labels, "run_benchmark", lambda *a: got.append(a) or {"scripted": True})
    monkeypatch.setattr(bench_labels, "format_report", str)
    assert labels[0] == "benchmarks/bench_labels.py" and (ROOT / labels[0]).is_file()
    assert bench_labels.main(labels[1:]) == 0  # its flags parse; the benchmark itself is scripted here
    assert got[0][:6] == ((100000,), 3, 20, "tiny", "cpu", 64)  # sizes, rank_bm25 and bm25s queries, scorer, device

    # the kernels stage's command runs as written; the scale stage's as estimates (--estimate-only)
    assert main(recording_command.calls("rpt")[0]) == 0
    assert [k["variant"] for k in json.loads((out / "kernels.json").read_text())["kernels"]] == ["xl", "rpt-sem"]
    assert main([*recording_command.calls("rpt")[1], "--estimate-only"]) == 0
    rows = json.loads((out / "scale.json").read_text())["scale"]["rows"]
    assert [x["variant"] for x in rows] == ["xl", "rpt-sem", "xl"] and all(x["estimate_bytes"] > 0 for x in rows)


@pytest.mark.slow
def test_dry_run_on_cpu_writes_each_stage(tmp_path):
    out = tmp_path / "gc"
    r = run(out, "env", "kernels", "scale", **TINY)
    assert r.returncode == 0, r.stderr + r.stdout[-2000:]
    assert {"env.txt", "kernels.txt", "kernels.json", "scale.txt", "scale.json"} <= {p.name for p in out.iterdir()}
    kernels = json.loads((out / "kernels.json").read_text())["kernels"]
    assert [k["variant"] for k in kernels] == ["xl", "rpt-sem"]
    rows = json.loads((out / "scale.json").read_text())["scale"]["rows"]
    assert [x["variant"] for x in rows] == ["xl", "rpt-sem", "xl"] and all(x["seconds_per_update"] > 0 for x in rows)
    assert "exit 0 after" in (out / "scale.txt").read_text()


def test_refusals_are_one_line(tmp_path):
    r = run(tmp_path / "gc", "kernels", "bogus", DEVICE="cpu")
    assert r.returncode == 2 and "unknown stage 'bogus'" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # 3 s: a fresh interpreter imports torch to look for CUDA
def test_refuses_without_a_gpu_in_one_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    r = run(tmp_path / "gc", "kernels")
    assert r.returncode == 2 and "no CUDA device" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "gc").exists()
