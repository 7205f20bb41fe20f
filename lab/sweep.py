"""`python -m lab sweep`: the paper's comparison on one store in one command, over paired seeds.

For every seed, and every variant of that seed (so that a sweep stopped early has whole seeds):

    rpt train  <the train arguments> --variant V --seed S --out OUT/V-seedS [--labels ...]
    rpt eval   the run's final checkpoint on the test split, once per neighbour source that tells something:
                   variants without neighbours        none
                   retro (BM25's neighbours)          bm25, none, random         (+ oracle with test labels)
                   rpt-lex / rpt-sem (own retriever)  model, none, random, bm25  (+ oracle, and --metrics, with test labels)
               (with test labels, the own source, none and the oracle read them: each result then also holds its
               perplexity over the tokens whose gold was scored, where a sampled gold's oracle is a ceiling)
               into OUT/eval/V-seedS-STEP-SOURCE.json

then the `python -m lab compare` table of exactly these results (OUT/compare.md, OUT/compare.json): mean ± sd over seeds, the
retrieval gain ppl(none) / ppl(own neighbours) paired per seed, the ratio to xl paired per seed, the oracle, the
retriever read with BM25's neighbours instead, and the paper's figure beside each row (--paper). Every variant of one
seed starts from the same weights for the modules they share (paired initialisation, `rpt.model.layers.init_weights`).

Before any work the sweep checks everything that can fail later: each run's config (the train arguments may not
override the per-run variant, seed or folder), each variant's training labels against the store and config, the
memory a training step needs, the test labels against the documents evaluated, and that every run or result already
in OUT was made with the settings planned now (otherwise it names the file: a changed --lr or --steps never silently
continues an old run, a changed --max-documents never mixes results over other documents).

Stopping and starting again loses nothing: a run whose final checkpoint exists is not trained again, a killed
training run resumes from its last checkpoint (`rpt train` resumes by default), an evaluation whose result exists is
not run again (results are written atomically). Each command that completed is appended to OUT/commands.txt.

With --jobs N, N runs go at once: each run's jobs (its training, then its evaluations, in order) in `rpt` processes of
their own, their output in OUT/logs/V-seedS.log, without progress bars. A failed job lets the jobs under way finish
and starts no new one; the sweep then stops naming it and its log.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpt.config import BOOKKEEPING  # keys that may differ between a finished run and the plan
from rpt.utils import UserError, write_json_atomic

# flags of `rpt train` that the sweep controls, per run or for the whole sweep
SWEEP_OWNED = ("--variant", "--seed", "--out", "--labels", "--no-resume", "--stop-after", "--no-progress", "--threads")


@dataclass
class SweepSettings:
    out: Path
    variants: tuple[str, ...]
    seeds: tuple[int, ...]
    train_args: list[str]  # handed to every `rpt train` (preset or config, store, steps, --set ...)
    labels: dict[str, Path] = field(default_factory=dict)  # "lex" / "sem" -> the train split's label store
    test_labels: Path | None = None  # sem labels of the test split, span doc: the oracle and retrieval metrics
    max_documents: int = 0  # test documents evaluated (0: all)
    memory: str = "auto"
    paper: str | None = None  # the paper's dataset whose figures stand beside the rows
    threads: int = 0
    progress: bool = True
    jobs: int = 1  # runs at the same time, each in processes of its own


@dataclass
class Job:
    what: str  # "train retro seed 1", "eval retro seed 1 bm25"
    argv: list[str]  # an `rpt` command line (without "rpt")
    done: Path  # exists once the job has finished
    run: str = ""  # the run it belongs to ("retro-seed1"): a run's jobs go in order


@dataclass
class Plan:
    jobs: list[Job]
    step: int  # the final step every run trains to
    store: str
    results: list[Path]  # every eval result of the sweep
    test_labels: Path | None
    missing: list[str] = field(default_factory=list)  # label stores a dry run planned with before they exist


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise UserError(f"train arguments: {message}")


def _train_namespace(train_args: list[str], variant: str, seed: int, run: Path) -> argparse.Namespace:
    from rpt.commands import train as train_cmd

    for a in train_args:
        if a.split("=", 1)[0] in SWEEP_OWNED:
            raise UserError(f"{a.split('=', 1)[0]} among the train arguments: the sweep controls it (--variants, "
                            "--seeds, --out, --labels-lex / --labels-sem, --threads, --no-progress; runs resume)")
    p = _Parser(prog="python -m lab sweep ... --", add_help=False, allow_abbrev=False)
    train_cmd.add_arguments(p)
    args, unknown = p.parse_known_args([*train_args, "--variant", variant, "--seed", str(seed), "--out", str(run)])
    if unknown:
        raise UserError(f"train arguments: {' '.join(unknown)} is not a flag of `rpt train` (see rpt train --help)")
    return args


def run_config(train_args: list[str], variant: str, seed: int, run: Path):
    """(the RPTConfig `rpt train` will train for this run, its parsed arguments); refuses train arguments that would
    change the run's variant, seed or folder."""
    from rpt.commands.train import config_from_args

    args = _train_namespace(train_args, variant, seed, run)
    cfg = config_from_args(args)
    for key, got, want in (("model.variant", cfg.model.variant, variant), ("train.seed", cfg.train.seed, seed),
                           ("train.out_dir", cfg.train.out_dir, str(run))):
        if got != want:
            raise UserError(f"--set {key}={got} among the train arguments overrides the sweep's own (here {want}): "
                            "remove it")
    return cfg, args


def eval_sources(variant: str, with_test_labels: bool) -> list[str]:
    """The neighbour sources a variant's checkpoint is evaluated with; its own source first."""
    from rpt.eval.perplexity import default_source

    own = default_source(variant)
    more = {"none": [], "bm25": ["none", "random"], "model": ["none", "random", "bm25"]}[own]
    return [own, *more] + (["oracle"] if with_test_labels and own != "none" else [])


def _flat_config(cfg) -> dict[str, Any]:
    """The fields a run's settings are compared by; paths resolved, so runs/x and /abs/runs/x are the same folder."""
    from rpt.config import effective_fields, flat_config, resolve_paths

    return effective_fields(resolve_paths({k: v for k, v in flat_config(cfg.to_dict()).items()
                                           if k not in BOOKKEEPING and not k.startswith("eval.")}))


def _check_run(run: Path, cfg) -> None:
    """A run folder that exists was started with the config planned now (else it would resume another run)."""
    import yaml

    from lab.compat import with_former_defaults
    from rpt.config import RPTConfig, config_differences

    done = run / "config.yaml"
    if not done.is_file():
        return
    try:
        recorded = with_former_defaults(yaml.safe_load(done.read_text()))  # missing fields: the defaults of its time
        old = _flat_config(RPTConfig.from_yaml(yaml.safe_dump(recorded)))
    except Exception as e:  # a config of an older version or a damaged file: say which
        raise UserError(f"{done}: cannot be read as a run config ({e}); move {run} away to train it again") from None
    new = _flat_config(cfg)
    diff = config_differences(old, new)
    if diff:
        raise UserError(f"{done}: this run was trained with other settings ({'; '.join(diff[:3])}"
                        f"{'; ...' if len(diff) > 3 else ''}): use another --out, or move {run} away")


def _check_result(path: Path, checkpoint: Path, step: int, source: str, s: SweepSettings, labels: Path | None,
                  metrics: bool) -> None:
    """A result that exists was made from this checkpoint with the evaluation planned now."""
    import json

    if not path.is_file():
        return
    try:
        r = json.loads(path.read_text())
        ev = r["eval"]
        made = {"step": r["step"], "source": ev["source"], "split": ev["split"], "max_documents": ev["max_documents"],
                "labels": ev.get("labels"), "metrics": "model" in (r.get("retrieval") or {}),
                "memory_tokens": ev.get("memory_tokens"),
                "oracle": ev.get("oracle", "positives") if ev["source"] == "oracle" else None}
    except (ValueError, KeyError, TypeError):
        raise UserError(f"{path}: not an `rpt eval` result; delete it to evaluate again") from None
    want = {"step": step, "source": source, "split": "test", "max_documents": s.max_documents,
            "labels": str(labels) if labels is not None else None, "metrics": metrics, "memory_tokens": None,
            "oracle": "top-k" if source == "oracle" else None}  # a result without the key fed only positives
    diff = [f"{k} {made[k]!r}, now {want[k]!r}" for k in want if made[k] != want[k]]
    if Path(str(r.get("checkpoint"))).resolve() != checkpoint.resolve():
        diff.insert(0, f"checkpoint {r.get('checkpoint')}")
    if diff:
        raise UserError(f"{path}: made with other settings ({'; '.join(diff)}): delete it to evaluate again, or use "
                        "another --out")


def _check_test_labels(s: SweepSettings, cfg, test_labels: Path) -> None:
    """Test labels that do not fit the test split or miss a document evaluated, refused before any work."""
    from rpt.data.store import StoreError
    from rpt.eval.perplexity import open_eval_labels
    from rpt.training.data import open_store

    try:
        test = open_store(cfg.data.store, "test")
    except StoreError as e:
        raise UserError(str(e)) from None
    n = len(test) if not s.max_documents else min(s.max_documents, len(test))
    open_eval_labels(test_labels, test, cfg.model.segment_len, list(range(n)))


def _check_inputs(variant: str, cfg, args: argparse.Namespace, labels: Path | None) -> None:
    """What `rpt train` would refuse hours into the sweep, refused now: labels that do not fit the store and config,
    a step that does not fit in memory."""

    from rpt.data.store import StoreError
    from rpt.labels.store import LabelError
    from rpt.training.data import LabelMismatch, check_labels, open_labels, open_store
    from rpt.training.footprint import check_fits

    try:
        if labels is not None:
            check_labels(open_labels(labels), open_store(cfg.data.store, "train"), cfg)
    except (StoreError, LabelError, LabelMismatch) as e:
        raise UserError(f"{variant}: {e}") from None
    if not args.no_memory_check:
        from rpt.utils import resolve_device

        check_fits(cfg, resolve_device(args.device))


def plan(s: SweepSettings, dry_run: bool = False) -> Plan:
    """Every job of the sweep, in order, after the checks of the module docstring. dry_run: label stores that do not
    exist yet are planned with (the commands name them; `Plan.missing` lists them) instead of refused, and not checked."""
    from rpt.labels.store import default_label_path, default_labels
    from rpt.model.registry import spec

    if not s.variants or not s.seeds:
        raise UserError("--variants and --seeds must each name at least one")
    missing: list[str] = []
    flags = [(f"--labels-{kind}", path) for kind, path in s.labels.items()]
    for flag, path in flags + ([("--test-labels", s.test_labels)] if s.test_labels else []):
        if not (Path(path) / "manifest.json").is_file():
            if not dry_run:
                raise UserError(f"{flag} {path}: not a label store (no manifest.json; made by `rpt label`)")
            missing.append(f"{flag} {path}")
    configs = {(v, seed): run_config(s.train_args, v, seed, s.out / f"{v}-seed{seed}")
               for seed in s.seeds for v in s.variants}
    first = configs[s.variants[0], s.seeds[0]][0]
    step, store, seq_len = first.train.steps, first.data.store, first.data.seq_len
    test_labels = s.test_labels
    if test_labels is None:
        default = default_label_path(store, "test", "sem", None)
        test_labels = default if (default / "manifest.json").is_file() else None
    labels: dict[str, Path | None] = {}
    for v in s.variants:
        cfg, args = configs[v, s.seeds[0]]
        labels[v] = default_labels(store, v, seq_len, s.labels)
        if spec(v).labels is not None and labels[v] is None:
            flag = "--labels-sem" if spec(v).labels == "sem" else "--labels-lex (or --labels-sem)"
            kind = "sem --scorer RUN" if spec(v).labels == "sem" else "lex"
            need = (f"variant {v} needs training labels: pass {flag}, made by `rpt label --store {store} "
                    f"--split train --kind {kind} --span {seq_len} --segment-len {cfg.model.segment_len}`")
            if not dry_run:
                raise UserError(need)
            labels[v] = default_label_path(store, "train", spec(v).labels, seq_len)
            missing.append(f"{labels[v]} ({need})")
        usable = labels[v] is not None and (Path(labels[v]) / "manifest.json").is_file()
        _check_inputs(v, cfg, args, labels[v] if usable or not dry_run else None)
    if test_labels is not None and any(spec(v).neighbours != "none" for v in s.variants):
        if (Path(test_labels) / "manifest.json").is_file() or not dry_run:
            _check_test_labels(s, first, test_labels)

    common = (["--threads", str(s.threads)] if s.threads else []) + ([] if s.progress and s.jobs == 1 else ["--no-progress"])
    jobs, results = [], []
    for seed in s.seeds:
        for v in s.variants:
            run = s.out / f"{v}-seed{seed}"
            cfg = configs[v, seed][0]
            _check_run(run, cfg)
            ckpt = run / "checkpoints" / f"step_{step:08d}"
            argv = ["train", *s.train_args, "--variant", v, "--seed", str(seed), "--out", str(run), *common]
            if labels[v] is not None:
                argv += ["--labels", str(labels[v])]
            jobs.append(Job(f"train {v} seed {seed}", argv, ckpt / "state.json", run.name))
            for src in eval_sources(v, test_labels is not None):
                res = s.out / "eval" / f"{v}-seed{seed}-{step}-{src}.json"
                # the oracle, the own source and no neighbours read the test labels: under a sampled gold the
                # oracle is compared with the other two on the tokens whose gold was scored (`python -m lab compare`)
                own = eval_sources(v, False)[0]
                with_labels = test_labels is not None and own != "none" and src in ("oracle", "none", own)
                _check_result(res, ckpt, step, src, s, test_labels if with_labels else None,
                              metrics=src == "model" and test_labels is not None)
                argv = ["eval", "--checkpoint", str(ckpt), "--store", store, "--split", "test", "--source", src,
                        "--memory", s.memory, "--out", str(res), *common]
                if s.max_documents:
                    argv += ["--max-documents", str(s.max_documents)]
                if with_labels:
                    argv += ["--labels", str(test_labels)]
                if src == "model" and test_labels is not None:
                    argv.append("--metrics")
                jobs.append(Job(f"eval {v} seed {seed} {src}", argv, res, run.name))
                results.append(res)
    return Plan(jobs, step, store, results, test_labels, missing)


def run_sweep(s: SweepSettings, dry_run: bool = False) -> dict[str, Any] | None:
    """Run (or with dry_run only print) every job not yet done, then tabulate; returns the `python -m lab compare` table."""
    from rpt.cli import command_line, run_verb

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UserError("python -m lab sweep runs in one process: start it without torchrun (each `rpt train` it runs uses one "
                        "device); for multi-GPU runs, run `rpt train` under torchrun and `python -m lab compare` on the results")
    p = plan(s, dry_run)
    todo = [j for j in p.jobs if not j.done.exists()]
    print(f"sweep: {len(s.variants)} variants x {len(s.seeds)} seeds to step {p.step} on {p.store}; "
          f"{len(p.jobs)} jobs, {len(p.jobs) - len(todo)} already done"
          + ("" if p.test_labels else "; no test labels: no oracle, no retrieval metrics"), flush=True)
    if dry_run:
        for m in p.missing:
            print(f"# not yet made (the sweep refuses to start without it): {m}")
        for j in p.jobs:
            print(("# done: " if j.done.exists() else "") + command_line(j.argv))
        return None
    s.out.mkdir(parents=True, exist_ok=True)
    if s.jobs > 1:
        run_side_by_side(p.jobs, s.jobs, s.out)
        return tabulate(s, p)
    for i, j in enumerate(p.jobs, 1):
        if j.done.exists():
            continue
        print(f"\n[{i}/{len(p.jobs)}] {j.what}", flush=True)
        t = time.perf_counter()
        log: list[str] = []
        code = run_verb(j.argv, log)
        if why := _failure(j, code):
            raise UserError(f"sweep stopped: {j.what} failed ({why}); fix it and run the sweep again to go on: {log[0]}")
        _finished(s.out, f"[{i}/{len(p.jobs)}] {j.what}", log[0], t)
    return tabulate(s, p)


def _failure(j: Job, code: int) -> str | None:
    """Why job `j`, ended with exit status `code`, failed, or None if it did not."""
    if code != 0:
        return f"exit {code}"
    return None if j.done.exists() else f"exit 0, but {j.done} was not written"


def _finished(out: Path, what: str, line: str, t0: float) -> None:
    """A job's command line appended to OUT/commands.txt, and its time printed."""
    with open(out / "commands.txt", "a") as f:
        f.write(line + "\n")
    print(f"{what}: {time.perf_counter() - t0:.0f} s", flush=True)


# `rpt ARGV` in a process of its own, with this interpreter (and so this environment's rpt)
RPT_PROCESS = [sys.executable, "-c", "import sys; from rpt.cli import main; sys.exit(main(sys.argv[1:]))"]


def run_side_by_side(jobs: list[Job], n: int, out: Path) -> None:
    """Every job not yet done, `n` runs at a time: a run's jobs one after another, each in a process of its own with
    its output appended to OUT/logs/RUN.log. After a failure no job starts; the ones under way finish, then UserError.
    A SIGTERM to the sweep is passed on to the jobs under way (a training run stops with a checkpoint), and no more
    start."""
    from rpt.cli import command_line

    runs: dict[str, list[tuple[int, Job]]] = {}
    for i, j in enumerate(jobs, 1):
        if not j.done.exists():
            runs.setdefault(j.run, []).append((i, j))
    (out / "logs").mkdir(exist_ok=True)
    lock, failed, procs, stopped = threading.Lock(), [], set(), []

    def go(run: str) -> None:
        for i, j in runs[run]:
            if failed or stopped:
                return
            log_path = out / "logs" / f"{run}.log"
            line = command_line(j.argv)
            with lock:
                print(f"[{i}/{len(jobs)}] {j.what} (log: {log_path})", flush=True)
            t = time.perf_counter()
            with open(log_path, "a") as log:
                log.write(f"\n$ {line}\n")
                log.flush()
                with lock:
                    if stopped:
                        return
                    proc = subprocess.Popen([*RPT_PROCESS, *j.argv], stdout=log, stderr=subprocess.STDOUT)
                    procs.add(proc)
                code = proc.wait()
            with lock:
                procs.discard(proc)
                if stopped:
                    return
                if why := _failure(j, code):
                    failed.append(f"{j.what} failed ({why}); its output: {log_path}; the command: {line}")
                    return
                _finished(out, f"[{i}/{len(jobs)}] {j.what}", line, t)

    def stop(signum: int, frame: Any) -> None:  # SIGTERM: each run under way stops as `rpt train` does (a checkpoint)
        with lock:
            stopped.append(signum)
            for proc in procs:
                proc.send_signal(signal.SIGTERM)

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, stop) if main_thread else None
    try:
        with ThreadPoolExecutor(max_workers=n) as pool:
            for future in [pool.submit(go, run) for run in runs]:
                future.result()
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    if stopped:
        raise KeyboardInterrupt("SIGTERM: the runs under way were stopped; run the sweep again to go on")
    if failed:
        raise UserError(f"sweep stopped: {failed[0]}; fix it and run the sweep again to go on")


def tabulate(s: SweepSettings, p: Plan) -> dict[str, Any]:
    """The `python -m lab compare` table of this sweep's results only (other files in OUT/eval are left out)."""
    from lab.compare import compare, load_results, to_markdown

    table = compare(load_results(p.results), s.paper, p.step)
    text = to_markdown(table)
    write_json_atomic(s.out / "compare.json", table)
    (s.out / "compare.md").write_text(text + "\n")
    print("\n" + text + f"\n\ntable: {s.out / 'compare.md'} ({s.out / 'compare.json'}); the commands that made it: "
          f"{s.out / 'commands.txt'}")
    return table
