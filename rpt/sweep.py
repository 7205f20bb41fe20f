"""`rpt sweep`: the paper's comparison on one store in one command, over paired seeds.

For every seed, and every variant of that seed (so that a sweep stopped early has whole seeds):

    rpt train  <the train arguments> --variant V --seed S --out OUT/V-seedS [--labels ...]
    rpt eval   the run's final checkpoint on the test split, once per neighbour source that tells something:
                   variants without neighbours        none
                   retro (BM25's neighbours)          bm25, none                 (+ oracle with test labels)
                   rpt-lex / rpt-sem (own retriever)  model, none, bm25          (+ oracle, and --metrics, with test labels)
               into OUT/eval/V-seedS-STEP-SOURCE.json

then `rpt compare OUT/eval --step STEP` (OUT/compare.json, OUT/compare.md): mean ± sd over seeds, the retrieval gain
ppl(none) / ppl(own neighbours) paired per seed, the ratio to xl paired per seed, the oracle, the retriever read with
BM25's neighbours instead, and the paper's figure beside each row (--paper). Every variant of one seed starts from the
same weights for the modules they share (paired initialisation, `rpt.model.layers.init_weights`).

Stopping and starting again loses nothing: a run whose final checkpoint exists is not trained again, a killed
training run resumes from its last checkpoint (`rpt train` resumes by default), an evaluation whose result exists is
not run again (results are written atomically). Every command is printed and appended to OUT/commands.txt, so the
sweep doubles as the recipe of its table.
"""

from __future__ import annotations

import argparse
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpt.utils import UserError, write_json_atomic

# flags of `rpt train` that the sweep sets itself, per run
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


@dataclass
class Job:
    what: str  # "train retro seed 1", "eval retro seed 1 bm25"
    argv: list[str]  # an `rpt` command line (without "rpt")
    done: Path  # exists once the job has finished

    @property
    def line(self) -> str:
        return "rpt " + " ".join(shlex.quote(a) for a in self.argv)


@dataclass
class Plan:
    jobs: list[Job]
    step: int  # the final step every run trains to
    store: str
    eval_dir: Path
    test_labels: Path | None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise UserError(f"train arguments: {message}")


def train_config(train_args: list[str], variant: str):
    """The RPTConfig `rpt train <train_args> --variant <variant>` would train, and refusal of flags the sweep owns."""
    from rpt.commands import train as train_cmd

    for a in train_args:
        if a.split("=", 1)[0] in SWEEP_OWNED:
            raise UserError(f"{a.split('=', 1)[0]} among the train arguments: the sweep sets it for each run "
                            "(--variants, --seeds, --out, --labels-lex / --labels-sem, --threads, --no-progress)")
    p = _Parser(prog="rpt sweep ... --", add_help=False)
    train_cmd.add_arguments(p)
    args, unknown = p.parse_known_args([*train_args, "--variant", variant])
    if unknown:
        raise UserError(f"train arguments: {' '.join(unknown)} is not a flag of `rpt train` (see rpt train --help)")
    return train_cmd.config_from_args(args)


def eval_sources(variant: str, with_test_labels: bool) -> list[str]:
    """The neighbour sources a variant's checkpoint is evaluated with; its own source first."""
    from rpt.model.registry import spec

    kind = spec(variant).neighbours
    if kind == "none":
        return ["none"]
    sources = ["bm25", "none"] if kind == "bm25" else ["model", "none", "bm25"]
    return sources + (["oracle"] if with_test_labels else [])


def train_labels(variant: str, s: SweepSettings, store: str, seq_len: int) -> Path | None:
    """The train label store a variant trains with: sem for rpt-sem; lex (else sem) for retro and rpt-lex; the flags
    first, then the folder `rpt label` writes by default. None for the variants that need none."""
    from rpt.commands.train import default_labels
    from rpt.model.registry import spec

    need = spec(variant).labels
    if need is None:
        return None
    for kind in (["sem"] if need == "sem" else ["lex", "sem"]):
        if kind in s.labels:
            return s.labels[kind]
    found = default_labels(store, variant, seq_len)
    if found is None:
        flag = "--labels-sem" if need == "sem" else "--labels-lex (or --labels-sem)"
        raise UserError(f"variant {variant} needs training labels: pass {flag}, made by `rpt label --store {store} "
                        f"--split train --span {seq_len}`")
    return found


def plan(s: SweepSettings) -> Plan:
    """Every job of the sweep, in order; checks what can be checked before any work."""
    from rpt.labels.store import default_label_path

    if not s.variants or not s.seeds:
        raise UserError("--variants and --seeds must each name at least one")
    cfg = train_config(s.train_args, s.variants[0])
    step, store, seq_len = cfg.train.steps, cfg.data.store, cfg.data.seq_len
    flags = [(f"--labels-{kind}", path) for kind, path in s.labels.items()]
    for flag, path in flags + ([("--test-labels", s.test_labels)] if s.test_labels else []):
        if not (Path(path) / "manifest.json").is_file():
            raise UserError(f"{flag} {path}: not a label store (no manifest.json; made by `rpt label`)")
    test_labels = s.test_labels
    if test_labels is None:
        default = default_label_path(store, "test", "sem", None)
        test_labels = default if (default / "manifest.json").is_file() else None
    labels = {v: train_labels(v, s, store, seq_len) for v in s.variants}
    for v in s.variants[1:]:
        train_config(s.train_args, v)  # a variant the config cannot build (e.g. CCA layers) fails here, not hours in
    common = (["--threads", str(s.threads)] if s.threads else []) + ([] if s.progress else ["--no-progress"])
    eval_dir = s.out / "eval"
    jobs = []
    for seed in s.seeds:
        for v in s.variants:
            run = s.out / f"{v}-seed{seed}"
            ckpt = run / "checkpoints" / f"step_{step:08d}"
            argv = ["train", *s.train_args, "--variant", v, "--seed", str(seed), "--out", str(run), *common]
            if labels[v] is not None:
                argv += ["--labels", str(labels[v])]
            jobs.append(Job(f"train {v} seed {seed}", argv, ckpt / "state.json"))
            for src in eval_sources(v, test_labels is not None):
                res = eval_dir / f"{v}-seed{seed}-{step}-{src}.json"
                argv = ["eval", "--checkpoint", str(ckpt), "--store", store, "--split", "test", "--source", src,
                        "--memory", s.memory, "--out", str(res), *common]
                if s.max_documents:
                    argv += ["--max-documents", str(s.max_documents)]
                if src == "oracle" or (src == "model" and test_labels is not None):
                    argv += ["--labels", str(test_labels)]
                if src == "model" and test_labels is not None:
                    argv.append("--metrics")
                jobs.append(Job(f"eval {v} seed {seed} {src}", argv, res))
    return Plan(jobs, step, store, eval_dir, test_labels)


def run_sweep(s: SweepSettings, dry_run: bool = False) -> dict[str, Any] | None:
    """Run (or with dry_run only print) every job not yet done, then tabulate; returns the `rpt compare` table."""
    from rpt.cli import main

    p = plan(s)
    todo = [j for j in p.jobs if not j.done.exists()]
    print(f"sweep: {len(s.variants)} variants x {len(s.seeds)} seeds to step {p.step} on {p.store}; "
          f"{len(p.jobs)} jobs, {len(p.jobs) - len(todo)} already done"
          + ("" if p.test_labels else "; no test labels: no oracle, no retrieval metrics"), flush=True)
    if dry_run:
        for j in p.jobs:
            print(("# done: " if j.done.exists() else "") + j.line)
        return None
    s.out.mkdir(parents=True, exist_ok=True)
    for i, j in enumerate(p.jobs, 1):
        if j.done.exists():
            continue
        print(f"\n[{i}/{len(p.jobs)}] {j.what}\n$ {j.line}", flush=True)
        with open(s.out / "commands.txt", "a") as f:
            f.write(j.line + "\n")
        t = time.perf_counter()
        code = main(j.argv)
        if code != 0 or not j.done.exists():
            raise UserError(f"sweep stopped: {j.what} failed (exit {code}); fix it and run the sweep again to go on: "
                            f"{j.line}")
        print(f"[{i}/{len(p.jobs)}] {j.what}: {time.perf_counter() - t:.0f} s", flush=True)
    return tabulate(s, p)


def tabulate(s: SweepSettings, p: Plan) -> dict[str, Any]:
    from rpt.compare import compare, load_results, to_markdown

    names = {f"{v}-seed{seed}-{p.step}-{src}.json" for v in s.variants for seed in s.seeds
             for src in eval_sources(v, p.test_labels is not None)}
    files = sorted(f for f in p.eval_dir.glob("*.json") if f.name in names)  # this sweep's results only
    table = compare(load_results(files), s.paper, p.step)
    text = to_markdown(table)
    write_json_atomic(s.out / "compare.json", table)
    (s.out / "compare.md").write_text(text + "\n")
    print("\n" + text + f"\n\ntable: {s.out / 'compare.md'} ({s.out / 'compare.json'}); every command: "
          f"{s.out / 'commands.txt'}")
    return table
