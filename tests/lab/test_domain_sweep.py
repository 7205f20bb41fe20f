"""scripts/domain_sweep.sh, the per-domain comparison of docs/results/domains.md: lex labels, the seed-0 xl as the sem
scorer, sem labels, the sweep and the table; run again, it redoes nothing.

In the default suite the script runs dry, with a stand-in `rpt` that records its commands: each parses, they come in
order with the right scorer, labels and paper figures, and a second run runs only the two sweeps, with the same
arguments (a finished sweep redoes nothing: tests/lab/test_sweep.py). The same script runs end to end on a CPU in
tests/lab/test_gpu_retrieval.py (scripts/gpu_retrieval.sh is this script with other settings) and, at these settings,
under -m slow here."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_parsers import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
RPT = Path(sys.executable).parent / "rpt"
SPEC = "synthetic:copy-far?docs=6&eval_docs=2&passages=8&passage=64&distance=2-4"
SETTINGS = {"STEPS": "2", "SEEDS": "0", "VARIANTS": "xl,retro,rpt-sem", "SEQ_LEN": "512", "SEGMENT": "64"}
OWN = {"SCORER": "own", "GOLD": "bm25", "K": "4"}  # the sweep's own seed-0 xl as scorer, BM25's top 4 as test gold


def run_script(out: Path, rpt: Path, timeout: int = 600, **settings: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, **SETTINGS, **settings, OUT=str(out), RPT=str(rpt), LAB=str(rpt))
    return subprocess.run(["bash", str(ROOT / "scripts" / "domain_sweep.sh"), SPEC, "pg19"], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_domain_sweep_script_runs_the_headline_setting_without_settings_and_resumes_dry(tmp_path, recording_command):
    """No variable names the headline setting: k = 20, a copying scorer, exhaustive test gold for a quarter of the
    test query chunks, all four variants."""
    rpt = recording_command("rpt")
    out = tmp_path / "dom"
    store = out / "store"
    env = {k: v for k, v in os.environ.items() if k not in ("STEPS", "SEEDS", "VARIANTS", "SEQ_LEN", "SEGMENT", "K",
                                                             "SCORER", "GOLD", "QUERY_FRACTION")}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "domain_sweep.sh"), "stdlib", "code"],
                          env=dict(env, OUT=str(out), RPT=str(rpt), LAB=str(rpt)), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    calls = recording_command.calls("rpt")
    parser = build_parser()
    args = [parser.parse_args(argv) for argv in calls]  # every command names only flags its verb has
    assert [a[0] for a in calls] == ["prepare", "label", "label", "label", "sweep"]  # no scorer of the student's size
    prepare, lex, sem_train, sem_test, sweep = args
    assert prepare.corpus == "stdlib" and Path(prepare.out) == store
    assert (lex.kind, lex.split, lex.span, lex.k, lex.segment_len) == ("lex", "train", "2048", 20, 128)
    assert (sem_train.kind, sem_train.split, sem_train.k, sem_train.scorer) == ("sem", "train", 20, "induction")
    assert (sem_test.kind, sem_test.span, sem_test.candidates, sem_test.query_fraction, sem_test.scorer) == (
        "sem", "doc", "all", 0.25, "induction")
    assert (sweep.variants, sweep.seeds, sweep.paper) == ("xl,retro,rpt-lex,rpt-sem", "0,1,2", "code")
    assert (Path(sweep.labels_lex), Path(sweep.labels_sem), Path(sweep.test_labels)) == (
        Path(lex.out), Path(sem_train.out), Path(sem_test.out))
    assert Path(sem_test.out).name == "test-sem-doc-all-q0.25-induction"
    train = parser.parse_args(["train", *sweep.train_args])
    assert (train.preset, train.seq_len, train.steps, train.lr) == ("tiny", 2048, 400, 0.01)


def test_domain_sweep_script_with_its_own_scorer_runs_its_commands_in_order_and_resumes_dry(tmp_path,
                                                                                            recording_command):
    rpt = recording_command("rpt")
    out = tmp_path / "dom"
    store = out / "store"
    done = run_script(out, rpt, timeout=60, **OWN)
    assert done.returncode == 0, done.stderr[-2000:]
    calls = recording_command.calls("rpt")
    parser = build_parser()
    args = [parser.parse_args(argv) for argv in calls]  # every command names only flags its verb has
    assert [a[0] for a in calls] == ["prepare", "label", "sweep", "label", "label", "sweep"]
    prepare, lex, scorer_sweep, sem_train, sem_test, sweep = args
    assert prepare.corpus == SPEC and Path(prepare.out) == store
    assert (lex.kind, lex.split, lex.span, lex.k, lex.segment_len) == ("lex", "train", "512", 4, 64)
    assert (scorer_sweep.variants, scorer_sweep.seeds, scorer_sweep.paper) == ("xl", "0", "pg19")
    # the sem labels of train and test are scored by the sweep's own seed-0 xl, trained by the sweep above
    xl = out / "sweep" / "xl-seed0"
    assert (sem_train.kind, sem_train.split, sem_train.span, Path(sem_train.scorer)) == ("sem", "train", "512", xl)
    assert (sem_test.kind, sem_test.split, sem_test.span, Path(sem_test.scorer)) == ("sem", "test", "doc", xl)
    assert (sweep.variants, sweep.seeds, sweep.paper) == ("xl,retro,rpt-sem", "0", "pg19")
    assert sweep.test_labels == store / "labels" / "test-sem-doc-k4-own" and sweep.out == scorer_sweep.out == out / "sweep"
    assert sweep.train_args == scorer_sweep.train_args  # the scorer is the sweep's own seed-0 xl run: one setting
    train = parser.parse_args(["train", *sweep.train_args])
    assert (Path(train.store), train.seq_len, train.steps) == (store, 512, 2) and "model.segment_len=64" in train.set

    # run again with the outputs in place (the folders the labels were written to): only the sweeps run again
    (store / "labels").mkdir(parents=True)
    (store / "tokenizer.json").write_text("{}")
    for name in ("train-lex-512-k4", "train-sem-512-k4-own", "test-sem-doc-k4-own"):
        (store / "labels" / name).mkdir()
    again = run_script(out, rpt, timeout=60, **OWN)
    assert again.returncode == 0, again.stderr[-2000:]
    assert recording_command.calls("rpt")[len(calls):] == [calls[2], calls[5]]
    # another K is labelled anew, not read from the k = 4 folders
    run_script(out, rpt, timeout=60, **{**OWN, "K": "20"})
    assert [a[0] for a in recording_command.calls("rpt")[len(calls) + 2:]] == ["label", "sweep", "label", "label", "sweep"]


def test_domain_sweep_script_labels_the_train_split_by_meaning_only_for_rpt_sem(tmp_path, recording_command,
                                                                                monkeypatch):
    rpt = recording_command("rpt")
    monkeypatch.setitem(SETTINGS, "VARIANTS", "xl,retro")
    done = run_script(tmp_path / "dom", rpt, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    calls = recording_command.calls("rpt")
    assert [a[0] for a in calls] == ["prepare", "label", "label", "sweep"]
    parser = build_parser()
    sem_test, sweep = parser.parse_args(calls[2]), parser.parse_args(calls[3])
    assert sweep.labels_sem is None
    assert (sem_test.kind, sem_test.split, sem_test.span) == ("sem", "test", "doc")  # retro's oracle still has labels
    assert sweep.variants == "xl,retro"


def test_domain_sweep_script_evaluates_the_retrievers_at_earlier_checkpoints(tmp_path, recording_command,
                                                                             monkeypatch):
    rpt = recording_command("rpt")
    monkeypatch.setitem(SETTINGS, "VARIANTS", "xl,rpt-sem")
    monkeypatch.setitem(SETTINGS, "SEEDS", "0,1")
    monkeypatch.setitem(SETTINGS, "CURVE", "1,2")
    monkeypatch.setitem(SETTINGS, "CHECKPOINT_EVERY", "1")
    out = tmp_path / "dom"
    done = run_script(out, rpt, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    calls = recording_command.calls("rpt")
    parser = build_parser()
    sweep = parser.parse_args(calls[4])
    assert "train.checkpoint_every=1" in parser.parse_args(["train", *sweep.train_args]).set
    evals = [parser.parse_args(c) for c in calls[5:-1]]
    assert [(Path(e.checkpoint).parts[-3], Path(e.checkpoint).name) for e in evals] == [
        ("rpt-sem-seed0", "step_00000001"), ("rpt-sem-seed0", "step_00000002"),
        ("rpt-sem-seed1", "step_00000001"), ("rpt-sem-seed1", "step_00000002")]  # xl has no retriever to rank with
    assert all(e.metrics and e.source == "model" and Path(e.labels) == Path(sweep.test_labels) for e in evals)
    assert [Path(e.out).name for e in evals][:2] == ["rpt-sem-seed0-1-model.json", "rpt-sem-seed0-2-model.json"]
    table = parser.parse_args(calls[-1])
    assert table.verb == "compare" and [Path(r) for r in table.results] == [out / "sweep" / "curve",
                                                                               out / "sweep" / "eval"]
    assert (Path(table.out), Path(table.markdown), table.paper) == (out / "sweep" / "curve.json",
                                                                    out / "sweep" / "curve.md", "pg19")


@pytest.mark.slow
@pytest.mark.skipif(not RPT.exists(), reason="the rpt console script is not installed beside this python")
def test_domain_sweep_script_runs_end_to_end_and_resumes(tmp_path):
    out = tmp_path / "dom"
    assert main(["prepare", "--corpus", SPEC, "--out", str(out / "store"), "--no-progress"]) == 0  # skips `prepare`
    done = run_script(out, RPT, **OWN)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(re.findall(r"^labels: ", done.stdout, re.M)) == 3  # lex, sem train, sem test
    labels = sorted(p.name for p in (out / "store" / "labels").iterdir())
    assert labels == ["test-sem-doc-k4-own", "train-lex-512-k4", "train-sem-512-k4-own"]
    table = json.loads((out / "sweep" / "compare.json").read_text())
    rows = {row["variant"]: row for row in table["rows"]}
    assert list(rows) == ["xl", "retro", "rpt-sem"] and all(row["step"] == 2 for row in rows.values())
    assert rows["rpt-sem"]["oracle"][2] == 1 and rows["xl"]["paper"]["ppl"] == 11.48  # PG19's xl figure
    sem = json.loads((out / "store" / "labels" / "train-sem-512-k4-own" / "manifest.json").read_text())
    assert str(out / "sweep" / "xl-seed0") in json.dumps(sem)  # scored by the sweep's own seed-0 xl

    again = run_script(out, RPT, **OWN)
    assert again.returncode == 0, again.stderr[-2000:]
    counts = re.findall(r"(\d+) jobs, (\d+) already done", again.stdout)
    assert len(counts) == 2 and all(total == done_ for total, done_ in counts)  # both sweeps: nothing left to do
    assert not re.findall(r"^labels: ", again.stdout, re.M)  # no label store made again
