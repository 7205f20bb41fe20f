"""scripts/gpu_retrofit.sh (the retrofit measurement on one GPU): its dry run prints every command, each of which
parses, and runs none; without a GPU and not dry it refuses in one line."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_parsers import build_parser

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_retrofit.sh"


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHON": sys.executable, "RPT": "rpt", **env}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, env=full)


@pytest.mark.parametrize("how", ["flag", "env"])
def test_the_dry_run_prints_every_command_and_runs_none(tmp_path, recording_command, benchmark_script, how):
    rpt = recording_command("rpt")
    out = tmp_path / "gr"
    r = (run(str(out), "--dry-run", RPT=str(rpt), LAB=str(rpt), BACKBONE="/models/smollm2.gguf") if how == "flag"
         else run(str(out), RPT=str(rpt), LAB=str(rpt), BACKBONE="/models/smollm2.gguf", DRY_RUN="1"))
    assert r.returncode == 0, r.stderr
    assert recording_command.calls("rpt") == [] and not out.exists(), "a dry run runs nothing"
    lines = [shlex.split(line[2:]) for line in r.stdout.splitlines() if line.startswith("+ ")]
    assert len(lines) == 1 + 2 * (2 + 3 + 1), r.stdout  # the GGUF dequantised once; two domains: prepare, label, 3 seeds, eval
    assert lines[0] == [sys.executable, "scripts/dequantise_gguf.py", "/models/smollm2.gguf", str(out / "backbone")]
    lines = lines[1:]
    parser = build_parser()
    verbs = []
    for argv in lines:
        if argv[0] == str(rpt):
            args = parser.parse_args(argv[1:])
            verbs.append(argv[1])
            if argv[1] == "train":
                assert args.backbone == str(out / "backbone") and args.device == "cuda" and args.precision == "bf16"
            if argv[1] == "prepare":
                assert args.tokenizer == str(out / "backbone") and args.corpus in ("stdlib", "kjv")
        else:
            assert argv[:2] == [sys.executable, "benchmarks/retrofit_eval.py"]
            args = benchmark_script("retrofit_eval").parser().parse_args(argv[2:])
            assert len(args.checkpoint) == 3 and args.device == "cuda"
            verbs.append("eval")
    assert verbs == ["prepare", "label", "train", "train", "train", "eval"] * 2


def test_refusals_are_one_line(tmp_path):
    r = run(str(tmp_path / "gr"), "--bogus")
    assert r.returncode == 2 and "unknown argument '--bogus'" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # 3 s: a fresh interpreter imports torch to look for CUDA
def test_refuses_without_a_gpu_in_one_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    r = run(str(tmp_path / "gr"), BACKBONE="/models/smollm2.gguf")
    assert r.returncode == 2 and "no CUDA device" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "gr").exists()


def test_seeds_side_by_side_each_failure_named(tmp_path):
    """SIDE_BY_SIDE=1 (the default) trains a domain's seeds at once: a failing seed is named, the others evaluated."""
    stand_in = tmp_path / "rpt"
    stand_in.write_text('#!/bin/bash\necho "$*" >> "$(dirname "$0")/calls"\n'
                        'case " $* " in *" --seed 1 "*) exit 3;; esac\nexit 0\n')
    stand_in.chmod(0o755)
    out = tmp_path / "gr"
    r = run(str(out), RPT=str(stand_in), PYTHON=str(stand_in), BACKBONE="/models/folder", DEVICE="cpu",
            DOMAINS="code:stdlib", LORA_RANK="8")
    assert r.returncode == 1 and "failed steps: code/train-s1" in r.stderr, r.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    trains = [c for c in calls if c.startswith("train ")]
    assert len(trains) == 3 and all(c.endswith("--lora-rank 8") for c in trains)
    evals = [c for c in calls if "retrofit_eval.py" in c]
    assert len(evals) == 1 and f"{out}/code/rpt-lex-s0 {out}/code/rpt-lex-s2 --store" in evals[0]
    assert "== code/train-s1: exit 3 after" in (out / "code" / "train-s1.txt").read_text()
