"""`python -m lab sweep`: variants x paired seeds trained, evaluated with each neighbour source and tabulated in one command;
resumed without redoing finished work; stale runs and results named, never reused; bad input is one line before any
work."""

import json
import os

import pytest

import rpt.cli
from lab.cli import main as lab_main
from rpt.cli import main

SMALL = ["--preset", "tiny", "--steps", "3", "--seq-len", "512", "--batch-size", "2", "--set", "model.segment_len=64"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep") / "store"
    spec = "synthetic:copy-far?docs=8&eval_docs=1&passages=8&passage=64&distance=2-4"  # one test document to evaluate
    assert main(["prepare", "--corpus", spec, "--out", str(root), "--no-progress"]) == 0
    assert main(["label", "--store", str(root), "--split", "train", "--kind", "lex", "--span", "512",
                 "--segment-len", "64", "--no-progress"]) == 0
    return root


def sweep(out, store, *flags, variants="xl,retro,rpt-lex", seeds="0,1", train=()):
    return lab_main(["sweep", "--out", str(out), "--variants", variants, "--seeds", seeds, "--no-progress", *flags, "--",
                 *SMALL, "--store", str(store), *train])


@pytest.mark.slow  # 12 s: trains and evaluates every run of a small sweep (the dry-run plan: tests/test_readme.py)
def test_sweep_trains_evaluates_and_tabulates_then_resumes_without_redoing(store, tmp_path, capsys, monkeypatch):
    out = tmp_path / "sw"
    assert sweep(out, store, variants="xl") == 0
    assert "no test labels: no oracle" in capsys.readouterr().out
    # exhaustive test gold (every retrievable chunk) scored by the sweep's own xl: the retrieving variants then get
    # the oracle and retrieval metrics without BM25's bias
    test_labels = tmp_path / "test-sem"
    assert main(["label", "--store", str(store), "--split", "test", "--kind", "sem", "--span", "doc", "--segment-len",
                 "64", "--candidates", "all", "--scorer", str(out / "xl-seed0"), "--out", str(test_labels),
                 "--no-progress"]) == 0
    assert sweep(out, store, "--test-labels", str(test_labels)) == 0
    printed = capsys.readouterr().out
    assert "3 variants x 2 seeds to step 3" in printed and "26 jobs, 4 already done" in printed  # xl's runs and results
    names = sorted(p.name for p in (out / "eval").iterdir())
    # xl: none; retro: its BM25 neighbours, none, random ones, the oracle's; rpt-lex: its own retriever, none, random
    # ones, BM25's, the oracle's
    assert names == sorted(f"{v}-seed{s}-3-{src}.json" for s in (0, 1) for v, srcs in
                           (("xl", ["none"]), ("retro", ["bm25", "none", "random", "oracle"]),
                            ("rpt-lex", ["model", "none", "random", "bm25", "oracle"])) for src in srcs)
    r = json.loads((out / "eval" / "rpt-lex-seed1-3-model.json").read_text())
    assert r["config"]["train"]["seed"] == 1 and r["config"]["model"]["variant"] == "rpt-lex" and r["step"] == 3
    assert r["eval"]["labels"] == str(test_labels) and "precision@2" in r["retrieval"]["model"]
    table = json.loads((out / "compare.json").read_text())
    rows = {row["variant"]: row for row in table["rows"]}
    assert list(rows) == ["xl", "retro", "rpt-lex"]
    assert all(row["seeds"] == [0, 1] for row in rows.values())
    assert rows["retro"]["gain"][2] == 2 and rows["rpt-lex"]["vs_xl"][2] == 2 and rows["rpt-lex"]["bm25_gain"][2] == 2
    assert rows["retro"]["oracle_gain"][2] == 2 and rows["rpt-lex"]["metrics_model"][0][2] == 2
    assert rows["retro"]["random_gain"][2] == 2 and rows["rpt-lex"]["random_gain"][2] == 2
    assert rows["rpt-lex"]["gold"] == ["exhaustive"] and {"metrics_recency", "metrics_random"} <= set(rows["rpt-lex"])
    md = (out / "compare.md").read_text()
    assert "| rpt-lex | 2 |" in md and "random (chance, expected)" in md and "P@2 by pool size" in md
    commands = (out / "commands.txt").read_text().splitlines()
    assert len(commands) == 26 and commands[0].startswith("rpt train --preset tiny")
    retro_train = next(c for c in commands if c.startswith("rpt train") and "--variant retro" in c)
    assert retro_train.endswith("--labels " + str(store / "labels" / "train-lex-512"))  # the store's lex labels

    # a second call finds everything done; a result removed is the only job redone
    (out / "eval" / "retro-seed1-3-none.json").unlink()
    stamp = (out / "xl-seed0" / "log.jsonl").stat().st_mtime_ns
    assert sweep(out, store, "--test-labels", str(test_labels)) == 0
    printed = capsys.readouterr().out
    assert "26 jobs, 25 already done" in printed and "eval retro seed 1 none" in printed and "train " not in printed
    assert (out / "xl-seed0" / "log.jsonl").stat().st_mtime_ns == stamp
    assert len((out / "commands.txt").read_text().splitlines()) == 27

    # the same folders named by relative paths are the same runs and results
    monkeypatch.chdir(tmp_path)
    assert sweep("sw", os.path.relpath(store, tmp_path), "--test-labels", str(test_labels)) == 0
    assert "26 jobs, 26 already done" in capsys.readouterr().out
    monkeypatch.undo()

    # what was made with other settings is named, never silently reused
    assert sweep(out, store, "--test-labels", str(test_labels), "--max-documents", "1") == 2
    err = capsys.readouterr().err
    assert "xl-seed0-3-none.json: made with other settings (max_documents 0, now 1)" in err
    assert sweep(out, store, "--test-labels", str(test_labels), train=["--lr", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "xl-seed0/config.yaml: this run was trained with other settings (train.lr" in err
    assert sweep(out, store) == 2  # without test labels, the results made with them (retro's own first) no longer match
    assert "retro-seed0-3-bm25.json: made with other settings" in capsys.readouterr().err


def test_a_killed_training_run_resumes_inside_the_sweep(store, tmp_path):
    out = tmp_path / "sw"
    # an interrupted run: one update of three, with its checkpoint (as a run killed after a checkpoint leaves it)
    assert main(["train", *SMALL, "--store", str(store), "--variant", "xl", "--seed", "0", "--out", str(out / "xl-seed0"),
                 "--stop-after", "1", "--set", "train.checkpoint_every=1", "--no-progress"]) == 0
    first = out / "xl-seed0" / "checkpoints" / "step_00000001" / "model.safetensors"
    stamp = first.stat().st_mtime_ns
    assert sweep(out, store, variants="xl", seeds="0", train=["--set", "train.checkpoint_every=1"]) == 0
    assert first.stat().st_mtime_ns == stamp  # update 1 was not trained again: the run went on from its checkpoint
    assert (out / "xl-seed0" / "checkpoints" / "step_00000003").is_dir() and (out / "eval" / "xl-seed0-3-none.json").exists()


def test_a_failing_job_stops_the_sweep_with_its_command(store, tmp_path, capsys, monkeypatch):
    out = tmp_path / "sw"
    real = rpt.cli.main
    monkeypatch.setattr(rpt.cli, "main", lambda argv: 1 if argv[0] == "eval" else real(argv))
    assert lab_main(["sweep", "--out", str(out), "--variants", "xl,griffin", "--seeds", "0", "--no-progress", "--",
                     *SMALL, "--store", str(store)]) == 2
    err = capsys.readouterr().err
    assert "sweep stopped: eval xl seed 0 none failed (exit 1)" in err and "rpt eval --checkpoint" in err
    assert (out / "xl-seed0" / "checkpoints" / "step_00000003").is_dir()
    assert not (out / "griffin-seed0").exists() and not (out / "compare.md").exists()


def test_dry_run_prints_every_command_and_marks_the_done_ones(store, tmp_path, capsys):
    out = tmp_path / "sw"
    done = out / "griffin-seed3" / "checkpoints" / "step_00000003" / "state.json"
    done.parent.mkdir(parents=True)
    done.write_text("{}")
    assert sweep(out, store, "--dry-run", variants="xl,griffin", seeds="3") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == [
        f"rpt train {' '.join(SMALL)} --store {store} --variant xl --seed 3 --out {out}/xl-seed3 --no-progress",
        f"rpt eval --checkpoint {out}/xl-seed3/checkpoints/step_00000003 --store {store} --split test --source none "
        f"--memory auto --out {out}/eval/xl-seed3-3-none.json --no-progress",
        f"# done: rpt train {' '.join(SMALL)} --store {store} --variant griffin --seed 3 --out {out}/griffin-seed3 "
        "--no-progress",
        f"rpt eval --checkpoint {out}/griffin-seed3/checkpoints/step_00000003 --store {store} --split test --source none "
        f"--memory auto --out {out}/eval/griffin-seed3-3-none.json --no-progress"]
    assert not (out / "eval").exists()


def test_a_dry_run_plans_with_labels_that_do_not_exist_yet(store, tmp_path, capsys):
    """The plan can be read before `rpt label` has made the train or test labels it names; a real run still refuses."""
    out, gold = tmp_path / "sw", tmp_path / "not-yet" / "test-sem-doc-all"
    assert sweep(out, store, "--dry-run", "--test-labels", str(gold), variants="rpt-sem", seeds="0") == 0
    printed = capsys.readouterr().out
    assert f"# not yet made (the sweep refuses to start without it): --test-labels {gold}" in printed
    assert "variant rpt-sem needs training labels" in printed
    evals = [line for line in printed.splitlines() if line.startswith("rpt eval")]
    assert any("--source oracle" in e and f"--labels {gold}" in e for e in evals)
    assert any("--source model" in e and "--metrics" in e for e in evals)
    assert sweep(out, store, "--test-labels", str(gold), variants="rpt-sem", seeds="0") == 2
    assert "not a label store" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("flags, train, needle", [
    (["--variants", "xl,nope"], [], "--variants 'xl,nope'"),
    (["--variants", "rpt-sem"], [], "variant rpt-sem needs training labels: pass --labels-sem, made by `rpt label "),
    (["--seeds", "0,0"], [], "--seeds '0,0'"),
    (["--jobs", "0"], [], "--jobs 0: must be at least 1"),
    (["--test-labels", "/nowhere"], [], "--test-labels /nowhere: not a label store"),
    ([], ["--seed", "4"], "--seed among the train arguments"),
    ([], ["--stop", "1"], "--stop 1 is not a flag of `rpt train`"),  # no abbreviation of a flag the sweep controls
    ([], ["--bogus", "1"], "--bogus 1 is not a flag of `rpt train`"),
    ([], ["--set", "train.seed=5"], "--set train.seed=5 among the train arguments overrides the sweep's own"),
    ([], ["--set", "model.variant=griffin"], "--set model.variant=griffin among the train arguments"),
    ([], ["--set", "model.cca_layers=[9]"], "cca_layers"),
    # labels of 512-token spans for 256-token training: refused before xl trains
    (["--labels-lex", "STORE/labels/train-lex-512"], ["--seq-len", "256"], "retro: labels"),
    ([], ["--set", "data.seq_len=100000000"], "is available"),  # a step that cannot fit in memory
])
def test_bad_input_is_one_line_before_any_work(store, tmp_path, capsys, flags, train, needle):
    args = {"--variants": "xl,retro", "--seeds": "0"}
    for k, v in zip(flags[::2], flags[1::2], strict=True):
        args[k] = v.replace("STORE", str(store))
    argv = ["sweep", "--out", str(tmp_path / "sw"), *[x for kv in args.items() for x in kv], "--", *SMALL, "--store",
            str(store), *train]
    assert lab_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "sw").exists()


def test_test_labels_of_another_kind_are_refused_before_any_work(store, tmp_path, capsys):
    lex = tmp_path / "test-lex"  # the oracle needs the scorer's labels (sem)
    assert main(["label", "--store", str(store), "--split", "test", "--kind", "lex", "--span", "doc", "--segment-len",
                 "64", "--out", str(lex), "--no-progress"]) == 0
    assert sweep(tmp_path / "sw", store, "--test-labels", str(lex), variants="xl,retro") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"labels {lex} are of kind lex, asked for kind sem" in err[0]
    assert not (tmp_path / "sw").exists()


def test_the_train_arguments_need_a_preset_or_a_config(tmp_path, capsys):
    assert lab_main(["sweep", "--out", str(tmp_path / "sw"), "--variants", "xl", "--", "--steps", "3"]) == 2
    assert "train arguments: one of the arguments --config --preset is required" in capsys.readouterr().err


FAKE_RPT = ("import sys, time, pathlib; a = sys.argv[1:]; print('job', a[0], flush=True); "
            "t = time.time(); time.sleep(float(a[2])); "
            "pathlib.Path(a[1]).write_text(f'{t} {time.time()}') if a[0] != 'fail' else None; sys.exit(3 * (a[0] == 'fail'))")


def _fake_jobs(tmp_path, spec):
    """Jobs of runs named in `spec` ({run: [(kind, seconds), ...]}) for a stand-in `rpt` that sleeps, then writes
    its done file with its start and end times (or, for kind "fail", exits 3 writing nothing)."""
    from lab.sweep import Job

    return [Job(f"{kind} {run} {i}", [kind, str(tmp_path / f"{run}-{i}.done"), str(sec)], tmp_path / f"{run}-{i}.done",
                run) for run, steps in spec.items() for i, (kind, sec) in enumerate(steps)]


def test_jobs_run_side_by_side_a_runs_jobs_in_order(tmp_path, monkeypatch, capsys):
    import sys

    import lab.sweep as S

    monkeypatch.setattr(S, "RPT_PROCESS", [sys.executable, "-c", FAKE_RPT])
    jobs = _fake_jobs(tmp_path, {"xl-seed0": [("train", 0.6), ("eval", 0.1)], "xl-seed1": [("train", 0.6), ("eval", 0.1)],
                                 "xl-seed2": [("train", 0.1)]})
    jobs[-1].done.write_text("0 0")  # done already: not run again
    S.run_side_by_side(jobs, 2, tmp_path)
    times = {j.what: tuple(map(float, j.done.read_text().split())) for j in jobs[:-1]}
    assert times["train xl-seed0 0"][1] <= times["eval xl-seed0 1"][0]  # a run's jobs one after another
    assert times["train xl-seed1 0"][0] < times["train xl-seed0 0"][1]  # two runs at once
    assert len((tmp_path / "commands.txt").read_text().splitlines()) == 4
    assert (tmp_path / "logs" / "xl-seed1.log").read_text().count("job ") == 2
    assert not (tmp_path / "logs" / "xl-seed2.log").exists()
    assert "[3/5] train xl-seed1 0: " in capsys.readouterr().out


def test_a_failed_job_side_by_side_lets_the_others_finish_and_starts_no_more(tmp_path, monkeypatch):
    import sys

    import lab.sweep as S
    from rpt.utils import UserError

    monkeypatch.setattr(S, "RPT_PROCESS", [sys.executable, "-c", FAKE_RPT])
    jobs = _fake_jobs(tmp_path, {"a-seed0": [("fail", 0.0), ("eval", 0.0)], "a-seed1": [("train", 1.0), ("eval", 0.0)],
                                 "a-seed2": [("train", 0.0)]})
    with pytest.raises(UserError, match=r"sweep stopped: fail a-seed0 0 failed \(exit 3\); its output: .*a-seed0.log"):
        S.run_side_by_side(jobs, 2, tmp_path)
    assert [j.done.exists() for j in jobs] == [False, False, True, False, False]  # under way: finished; no new start


@pytest.mark.slow  # 60 s: two small sweeps, one run at a time and two at once
def test_jobs_side_by_side_give_the_results_of_one_at_a_time(store, tmp_path):
    assert sweep(tmp_path / "one", store, "--threads", "1", variants="xl,rpt-lex", seeds="0,1") == 0
    assert sweep(tmp_path / "two", store, "--threads", "1", "--jobs", "2", variants="xl,rpt-lex", seeds="0,1") == 0
    one, two = (json.loads((tmp_path / d / "compare.json").read_text()) for d in ("one", "two"))
    assert [r["ppl"] for r in one["rows"]] == [r["ppl"] for r in two["rows"]]
    assert sorted(p.name for p in (tmp_path / "two" / "logs").iterdir()) == [
        "rpt-lex-seed0.log", "rpt-lex-seed1.log", "xl-seed0.log", "xl-seed1.log"]
    assert len((tmp_path / "two" / "commands.txt").read_text().splitlines()) == 14  # 2 x (xl 2, rpt-lex 5)


def test_a_sigterm_to_side_by_side_runs_stops_the_runs_under_way(tmp_path):
    """SIGTERM to the sweep is passed on to its `rpt` processes (a training run then stops with a checkpoint) and no
    more start; the sweep ends as interrupted."""
    import signal
    import subprocess
    import sys
    import time

    child = "import os, sys, time, pathlib; pathlib.Path(sys.argv[1]).write_text(str(os.getpid())); time.sleep(60)"
    driver = (f"import sys, pathlib; import lab.sweep as S; from lab.sweep import Job; S.RPT_PROCESS = "
              f"[sys.executable, '-c', {child!r}]; d = pathlib.Path({str(tmp_path)!r}); "
              "S.run_side_by_side([Job(f'train r{i}', [str(d / f'r{i}.pid')], d / f'r{i}.done', f'r{i}') "
              "for i in range(3)], 2, d)")
    sweep = subprocess.Popen([sys.executable, "-c", driver], stderr=subprocess.PIPE, text=True)
    pids = [tmp_path / "r0.pid", tmp_path / "r1.pid"]
    deadline = time.time() + 30
    while not all(p.exists() and p.read_text() for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    sweep.send_signal(signal.SIGTERM)
    err = sweep.communicate(timeout=20)[1]
    assert sweep.returncode != 0 and "SIGTERM: the runs under way were stopped" in err
    for p in pids:  # both runs under way are gone, and the third never started
        with pytest.raises(ProcessLookupError):
            os.kill(int(p.read_text()), 0)
    assert not (tmp_path / "r2.pid").exists()
