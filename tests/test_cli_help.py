"""`rpt --help` lists the pipeline's verbs; the experiments are verbs of their own program, `python -m lab --help`
(lab/, beside the library, not installed with it); every verb of either parses and has its own --help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lab.cli import LAB
from lab.cli import main as lab_main
from rpt.cli import RPT, _verbs, build_parser, main, verb_name

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = ["configs", "prepare", "label", "train", "eval", "dpr", "generate", "explore", "export"]
EXPERIMENTS = ["sweep", "compare", "demo", "copytest", "bench"]


def _help(capsys, monkeypatch, run=main) -> str:
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as e:
        run(["--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def _entries(text: str) -> list[tuple[str, int]]:
    """(verb, column of its help) of each line that starts an entry of a list: four spaces, then a name."""
    out = []
    for line in text.splitlines():
        if line.startswith("    ") and line[4] != " ":
            name = line.split()[0]
            out.append((name, len(line) - len(line[4 + len(name):].lstrip())))
    return out


def _listed(text: str) -> list[str]:
    return [name for name, _ in _entries(text)]


def test_the_verbs_of_each_program():
    assert [verb_name(m) for m in _verbs(RPT)] == PIPELINE
    assert [verb_name(m) for m in _verbs(LAB)] == EXPERIMENTS


@pytest.mark.parametrize("program, run, verbs", [(RPT, main, PIPELINE), (LAB, lab_main, EXPERIMENTS)])
def test_help_lists_every_verb_with_its_help(capsys, monkeypatch, program, run, verbs):
    text = _help(capsys, monkeypatch, run)
    assert text.startswith(f"usage: {program.prog} ")
    assert _listed(text.partition("<verb>\n")[2]) == verbs
    flat = "".join(text.split())  # wrapping may break a line at a space or after a hyphen
    for m in _verbs(program):
        assert verb_name(m) + "".join(m.HELP.split()) in flat
    assert len({column for _, column in _entries(text)}) == 1, text


@pytest.mark.parametrize("verb", PIPELINE + EXPERIMENTS)
def test_every_verb_has_its_own_help(verb, capsys):
    program, run = (LAB, lab_main) if verb in EXPERIMENTS else (RPT, main)
    with pytest.raises(SystemExit) as e:
        run([verb, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {program.prog} {verb} ")


def test_an_experiment_parses_like_any_verb():
    args = build_parser(LAB).parse_args(["bench", "--kernels", "--seq-len", "256"])
    assert args.verb == "bench" and args.kernels and args.seq_len == 256


def test_no_verb_prints_the_help(capsys):
    assert main([]) == 2
    assert "usage: rpt" in capsys.readouterr().out
    assert lab_main([]) == 2
    assert "usage: python -m lab" in capsys.readouterr().out


def test_the_lab_runs_as_a_module_from_the_repository():
    r = subprocess.run([sys.executable, "-m", "lab", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and "usage: python -m lab" in r.stdout, r.stderr
