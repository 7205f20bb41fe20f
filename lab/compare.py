"""The paper's comparison tables from `rpt eval` results: every setting over its seeds, with spread, retrieval gains,
retrieval metrics, and the paper's figure beside it.

A *setting* is everything in a result's config except the seed and the run folder, plus the checkpoint's step and the
number of neighbours at inference; its results over several seeds and several neighbour sources make one row:

    ppl         test perplexity with the variant's own source (own retriever for rpt-*, BM25 for retro, none for
                the rest), mean ± sd over seeds
    vs xl       ppl / xl's ppl, per seed (paired: xl's result with the same seed, data and step), mean ± sd
    gain        retrieval gain: ppl with no neighbours / ppl with the own source, per seed (same checkpoint)
    oracle      ppl with the oracle's neighbours, and its gain over no neighbours
    random      ppl with K random retrievable chunks of the same document, and that gain: the control a retrieval gain
                must beat (any chunk of the document may help by priming its vocabulary); own vs random: ppl with
                random neighbours / ppl with the own source (above 1: the retriever's choice helps)
    BM25        for a model with its own retriever: ppl with BM25's neighbours instead, and that gain (is the reader or
                the retriever the weak part?)
    DPR         ppl with a DPR-style retriever's neighbours instead (`rpt eval --source dpr`), and that gain
    vs REF      with --against (an ablation table): ppl / the reference setting's ppl, per seed, for every other
                setting of the same data and step (paired like vs xl)
    P@2 R@10 nDCG@20   the retriever against the oracle's labels (results made with --metrics); BM25's in its own row

An ordering between two rows is supported only where the gap of the means exceeds the spread; the table prints the
spread next to every mean so that a reader can check, and `n` says how many runs stand behind it. A setting trained
more than once with one seed (in other run folders) pools every run: each run is one replicate, paired with the
results of the same run folder (and, for vs xl, with xl's run of the same seed and repeat). The paired ratios (vs
xl, vs REF, the gains) also get a 95% interval from a two-level bootstrap: each draw resamples the runs with replacement
(where a seed has several runs: the seeds, then each drawn seed's runs, since runs of one seed share their start and
data order) and the test documents with replacement (one document draw for every run and both sides of the ratio), recomputes each
drawn run's ratio from the drawn documents' NLL sums and token counts, and takes the mean over the drawn runs; the
2.5th and 97.5th percentiles of BOOTSTRAP draws bound it, so the interval holds run-to-run (seed) spread as well as
the spread over documents. An interval that contains 1 means the runs and documents do not support a difference.
The model's retriever gets the same kind of interval on its P@2 difference from BM25, recency and random (results
whose documents carry their metric sums, `rpt eval --metrics`): each run's difference recomputed from the drawn
documents' sums over their query chunks; an interval that contains 0 does not support a difference. With one test
document there is no interval (one document cannot be resampled); the table says so.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.compat import with_former_defaults
from rpt.config import BOOKKEEPING, VARIANTS, RPTConfig, effective_fields, flat_config, resolve_paths
from rpt.eval.metrics import bucket_lo
from rpt.utils import UserError

DOMAINS = ("arxiv", "code", "pg19", "books3")

# Test perplexity of the paper's Table 2 (main results, 500K updates, 2 neighbours) and Table 4 (ablations), in the
# order of DOMAINS; params and time per update relative to Transformer-XL as printed (Table 2 only).
PAPER: dict[str, dict[str, Any]] = {
    "Transformer-XL": {"ppl": (3.11, 2.30, 11.48, 15.00), "params": "202M", "time": 1.0},
    "Transformer-XL +2 layers": {"ppl": (3.07, 2.26, 11.2, 14.52), "params": "228M", "time": 1.14},
    "Transformer-XL 1.5x steps": {"ppl": (3.11, 2.26, 11.39, 14.70), "params": "202M", "time": 1.0},
    "RETRO w. BM25": {"ppl": (2.94, 2.17, 11.44, 14.60), "params": "236M", "time": 1.35},
    "RPT-Lex": {"ppl": (2.92, 2.23, 11.59, 14.32), "params": "242M", "time": 1.51},
    "RPT-Sem": {"ppl": (2.77, 2.17, 10.96, 13.91), "params": "242M", "time": 1.51},
    "RPT-Sem w. 3 neighbours": {"ppl": (2.75, 2.16, 10.92, 13.87)},
    "RPT-Sem w. 4 neighbours": {"ppl": (2.74, 2.15, 10.93, 13.91)},
    "Memorizing Transformer (32K)": {"ppl": (2.92, 2.18, 10.97, 14.40), "params": "212M", "time": 1.82},
    "Memorizing Transformer (65K)": {"ppl": (2.93, 2.15, 10.99, 14.3), "params": "212M", "time": 2.12},
    "Block-Recurrent Transformer": {"ppl": (2.89, 2.73, 10.95, 14.64), "params": "212M", "time": 1.56},
    "Griffin": {"ppl": (3.08, 2.24, 11.26, 14.16), "params": "240M", "time": 1.15},
    "RPT-Lex w. Oracle": {"ppl": (2.80, 2.12, 10.88, 13.30)},
    "RPT-Sem w. Oracle": {"ppl": (2.69, 2.10, 10.26, 12.74)},
    "RPT-Sem - Only Teacher forcing": {"ppl": (2.91, 2.22, 11.54, 14.66)},
    "RPT-Sem - No Teacher forcing": {"ppl": (2.95, 2.26, 13.10, 14.40)},
    "RPT-Sem - No Neighbor Gating": {"ppl": (2.92, 2.20, 11.50, 18.68)},
    "RETRO w. DPR-style retriever": {"ppl": (2.97, 2.28, 11.7, 14.86)},
    "RPT-Lex w. DPR-style retriever": {"ppl": (2.84, 2.26, 11.11, 14.17)},
    "RPT-Sem w. DPR-style retriever": {"ppl": (2.98, 2.33, 11.62, 14.66)},
}
# the corpus of each of the paper's datasets, as a `rpt prepare --corpus` spec names it (a substring of data.corpus)
PAPER_CORPORA = {"arxiv": "proof-pile", "code": "codeparrot", "pg19": "pg19", "books3": "books3"}
# Table 3: retrieval metrics on Code (BM25, RPT-Lex, RPT-Sem)
PAPER_METRICS = {"code": {"bm25": (0.29, 0.53, 0.25), "rpt-lex": (0.26, 0.52, 0.23), "rpt-sem": (0.34, 0.56, 0.30)},
                 "arxiv": {"bm25": (0.27, 0.55, 0.24), "rpt-lex": (0.26, 0.54, 0.24), "rpt-sem": (0.32, 0.58, 0.30)},
                 "pg19": {"bm25": (0.22, 0.55, 0.18), "rpt-lex": (0.22, 0.55, 0.18), "rpt-sem": (0.28, 0.61, 0.23)},
                 "books3": {"bm25": (0.23, 0.55, 0.18), "rpt-lex": (0.19, 0.50, 0.16), "rpt-sem": (0.26, 0.58, 0.22)}}
# what may differ between the results of one setting: the seed and run folder, bookkeeping, the chunked LM loss (the
# same function: tests/model), and the training config's own eval section (the eval run's settings are in "eval")
_IGNORED = ("train.seed", "train.out_dir", *BOOKKEEPING, "train.loss_chunk")
METRICS = ("precision@2", "recall@10", "ndcg@20")
# the rankings of `rpt eval --metrics`: the model's own retriever, then those that are the same for every model of a
# split (BM25, a DPR-style retriever, and the chance levels and ceiling: recency, random, the oracle)
RANKINGS = ("model", "bm25", "dpr", "recency", "random", "oracle")
FIXED_NAMES = {"bm25": "BM25", "dpr": "DPR-style", "recency": "recency (chance)", "random": "random (chance, expected)",
               "oracle": "oracle (ceiling)"}


def training_recall(result: dict[str, Any], window: int = 100) -> float | None:
    """The retriever's training recall@K (K = n_neighbors; the share of each query's positives among its top K inside
    the training span), the mean of the run's logged values over the last `window` updates up to the result's step;
    None where the run's log.jsonl is not beside its checkpoint."""
    step = result.get("step")
    ckpt = Path(str(result.get("checkpoint", "")))
    log = ckpt.parent.parent / "log.jsonl"
    if step is None or not log.is_file():
        return None
    k = result["config"]["model"].get("n_neighbors", 2)
    values = []
    for line in log.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and f"recall@{k}" in rec and step - window < rec.get("step", -1) <= step:
            values.append(float(rec[f"recall@{k}"]))
    return statistics.fmean(values) if values else None


def load_results(paths: list[str | Path]) -> list[dict[str, Any]]:
    """`rpt eval` result files, from files and (recursively) folders; any other JSON in a folder is skipped, a named
    file that is not a result is an error naming it."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found.extend(sorted(p.rglob("*.json")))
        elif p.is_file():
            found.append(p)
        else:
            raise UserError(f"{p}: no such file or folder")
    results = []
    for f in found:
        try:
            r = json.loads(f.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            r = None
        if not (isinstance(r, dict) and {"config", "eval", "total"} <= set(r)):
            if f in map(Path, paths):
                raise UserError(f"{f}: not an `rpt eval` result (no config / eval / total)")
            continue
        r["_path"] = str(f)
        results.append(r)
    if not results:
        raise UserError(f"no `rpt eval` results in {', '.join(map(str, paths))}")
    return results


Run = tuple[int, int]  # (seed, repeat): one trained run of a setting


@dataclass
class Setting:
    variant: str
    config: dict[str, Any]  # flat, without the seed and the run folder
    step: int | None
    k: int
    # every per-run field is keyed by the run: (seed, repeat), repeat 0, 1, ... over the run folders of that seed
    ppl: dict[str, dict[Run, float]] = field(default_factory=lambda: defaultdict(dict))  # source -> run -> ppl
    metrics: dict[str, dict[Run, tuple[float, ...]]] = field(default_factory=lambda: defaultdict(dict))  # who -> run
    # who -> run -> {pool-size bucket: P@2}
    buckets: dict[str, dict[Run, dict[str, float | None]]] = field(default_factory=lambda: defaultdict(dict))
    gold: set[str] = field(default_factory=set)  # what the metrics' gold holds (exhaustive, or BM25's top-k)
    train_recall: dict[Run, float] = field(default_factory=dict)  # run -> its training recall@K (its log)
    # source -> run -> {document index: (NLL sum, predicted tokens)}, for the bootstrap
    docs: dict[str, dict[Run, dict[int, tuple[float, int]]]] = field(default_factory=lambda: defaultdict(dict))
    # ranking -> run -> {document index: (P@2 sum over its query chunks, query chunks)}, for the metric intervals
    doc_metrics: dict[str, dict[Run, dict[int, tuple[float, int]]]] = field(default_factory=lambda: defaultdict(dict))
    # source -> run -> (ppl, token share) over the tokens whose gold was scored, from results evaluated with labels
    scored: dict[str, dict[Run, tuple[float, float]]] = field(default_factory=lambda: defaultdict(dict))
    sampled_gold: set[float] = field(default_factory=set)  # query fractions < 1 of the oracle's labels
    label: str = ""


def _run_folder(r: dict[str, Any]) -> str:
    """The run a result was evaluated from: its training run folder (every source of one checkpoint shares it)."""
    return str(r["config"].get("train", {}).get("out_dir", ""))


def group_settings(results: list[dict[str, Any]]) -> list[Setting]:
    settings: dict[tuple, Setting] = {}
    defaults = flat_config(RPTConfig().to_dict())  # a result written before a field existed ran with its default then
    keyed = []
    folders: dict[tuple, set[str]] = defaultdict(set)  # (setting, seed) -> its run folders
    for r in results:
        recorded = {**defaults, **flat_config(with_former_defaults(r["config"]))}
        flat = effective_fields(resolve_paths({k: v for k, v in recorded.items()
                                               if k not in _IGNORED and not k.startswith("eval.")}))
        if flat["model.variant"] == "memorizing":  # the memory it was evaluated with (`rpt eval --memory-tokens`)
            flat["eval.memory_tokens"] = r["eval"].get("memory_tokens") or flat["model.memorizing.tokens"]
        k = int(r["eval"]["n_neighbors"])
        key = (json.dumps(flat, sort_keys=True), r.get("step"), k, r["eval"].get("split"))
        seed = int(r["config"]["train"]["seed"])
        folders[key, seed].add(_run_folder(r))
        keyed.append((key, flat, k, seed, r))
    for key, flat, k, seed, r in keyed:
        s = settings.get(key)
        if s is None:
            s = settings[key] = Setting(flat["model.variant"], flat, r.get("step"), k)
        run = (seed, sorted(folders[key, seed]).index(_run_folder(r)))  # repeats of a seed: in run-folder order
        source = r["eval"]["source"]
        if run in s.ppl[source] and not math.isclose(s.ppl[source][run], r["total"]["perplexity"], rel_tol=1e-9):
            raise UserError(f"{r['_path']}: a second, different result for {s.variant} seed {seed} source {source} at "
                            f"step {s.step} from the same run folder {_run_folder(r)} (remove one)")
        s.ppl[source][run] = r["total"]["perplexity"]
        if (sc := r["total"].get("scored")) and sc.get("perplexity") is not None:
            s.scored[source][run] = (float(sc["perplexity"]), float(sc["token_share"]))
        if source == "oracle" and float(r["eval"].get("query_fraction") or 1.0) < 1:
            s.sampled_gold.add(float(r["eval"]["query_fraction"]))
        per_doc = {int(d["index"]): (float(d["nll_sum"]), int(d["n_targets"])) for d in r.get("documents", [])
                   if d.get("n_targets")}
        if per_doc:
            s.docs[source][run] = per_doc
        for who in RANKINGS:
            per_doc_m = {int(d["index"]): (float(d["metrics"][who][METRICS[0]]), int(d["metrics"][who]["n_queries"]))
                         for d in r.get("documents", []) if who in (d.get("metrics") or {})}
            if per_doc_m:
                s.doc_metrics[who][run] = per_doc_m
        for who, m in (r.get("retrieval") or {}).items():
            if isinstance(m, dict) and all(n in m for n in METRICS):
                s.metrics[who][run] = tuple(m[n] for n in METRICS)
                if m.get("buckets"):
                    s.buckets[who][run] = {b: v.get(METRICS[0]) for b, v in m["buckets"].items()}
        if "model" in (r.get("retrieval") or {}) and (rec := training_recall(r)) is not None:
            s.train_recall[run] = rec
        if r.get("retrieval"):
            s.gold.add(r["retrieval"].get("gold", "bm25 top-k: only BM25's candidates can be positives"))
    out = list(settings.values())
    _label(out)
    return sorted(out, key=lambda s: (VARIANTS.index(s.variant), s.label, s.step or 0))


def _label(settings: list[Setting]) -> None:
    """Name each setting by its variant plus what sets it apart from the other settings of that variant."""
    by_variant: dict[str, list[Setting]] = defaultdict(list)
    for s in settings:
        by_variant[s.variant].append(s)
    for group in by_variant.values():
        keys = sorted({k for s in group for k in s.config})
        # a key some settings lack is one they do not read (its presence follows from a key they all have)
        differing = [k for k in keys if all(k in s.config for s in group)
                     and len({json.dumps(s.config[k]) for s in group}) > 1]
        for s in group:
            extra = [f"{k.split('.', 1)[1]}={s.config.get(k)}" + (" at eval" if k.startswith("eval.") else "")
                     for k in differing]
            if len({g.step for g in group}) > 1 and not all(g.step == g.config.get("train.steps") for g in group):
                extra.append(f"step {s.step}")
            if len({g.k for g in group}) > 1:
                extra.append(f"K={s.k}")
            s.label = s.variant + (f" ({', '.join(extra)})" if extra else "")


def paper_row(s: Setting, source: str | None = None, base_xl: Setting | None = None) -> str | None:
    """The row of the paper's Table 2 / 4 this setting reproduces, or None. An xl setting other than `base_xl` (the
    plain xl of the same data) is its "+2 layers" row with two more layers, its "1.5x steps" row with 1.5x the
    updates."""
    c, v = s.config, s.variant
    if v == "xl" and base_xl is not None and s is not base_xl:
        b = base_xl.config
        if any(c.get(k) != b.get(k) for k in set(c) | set(b) if k not in ("model.n_layers", "train.steps")):
            return None  # xl with other settings still (lr, batch, ...): none of the paper's rows
        if c["model.n_layers"] == b["model.n_layers"] + 2 and c["train.steps"] == b["train.steps"]:
            return "Transformer-XL +2 layers"
        if c["model.n_layers"] == b["model.n_layers"] and 2 * c["train.steps"] == 3 * b["train.steps"]:
            return "Transformer-XL 1.5x steps"
        return None
    if source == "oracle":
        return {"rpt-lex": "RPT-Lex w. Oracle", "rpt-sem": "RPT-Sem w. Oracle"}.get(v)
    if source == "dpr":
        return {"retro": "RETRO w. DPR-style retriever", "rpt-lex": "RPT-Lex w. DPR-style retriever",
                "rpt-sem": "RPT-Sem w. DPR-style retriever"}.get(v)
    if v == "rpt-sem":
        if c.get("train.ss_schedule") == "gold":
            return "RPT-Sem - Only Teacher forcing"
        if c.get("train.ss_schedule") == "own":
            return "RPT-Sem - No Teacher forcing"
        if c.get("model.gate.kind") == "none":
            return "RPT-Sem - No Neighbor Gating"
        return {3: "RPT-Sem w. 3 neighbours", 4: "RPT-Sem w. 4 neighbours"}.get(s.k, "RPT-Sem")
    if v == "rpt-lex" and (c.get("train.ss_schedule", "anneal") != "anneal" or c.get("model.gate.kind") == "none"):
        return None  # the paper's ablations (Table 4) are of RPT-Sem only
    if v == "memorizing":
        size = c.get("eval.memory_tokens", c.get("model.memorizing.tokens"))  # the memory it was evaluated with
        return {32768: "Memorizing Transformer (32K)", 65536: "Memorizing Transformer (65K)"}.get(size)
    return {"xl": "Transformer-XL", "retro": "RETRO w. BM25", "rpt-lex": "RPT-Lex",
            "block-recurrent": "Block-Recurrent Transformer", "griffin": "Griffin"}.get(v)


def _stats(values: list[float]) -> tuple[float, float, int] | None:
    if not values:
        return None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0, len(values)


def _ratios(num: dict[Run, float], den: dict[Run, float]) -> list[float]:
    return [num[x] / den[x] for x in sorted(set(num) & set(den))]


BOOTSTRAP = 2000  # resamples (of runs and test documents) behind each interval
BOOTSTRAP_SEED = 0
PerDoc = dict[Run, dict[int, tuple[float, int]]]  # run -> {document index: (sum, count)}


def _resampled_means(a: PerDoc, b: PerDoc, draws: int, rng):
    """Resample the test documents: ([runs, draws] pooled mean of a, the same of b, number of documents, the runs),
    where a, b: run -> {document index: (sum, count)} (NLL and tokens, or a metric and its query chunks); one document
    draw serves every run and both sides; only runs and documents on both sides count. None with fewer than two
    documents."""
    import numpy as np

    runs = sorted(set(a) & set(b))
    docs = sorted(set.intersection(*(set(a[x]) & set(b[x]) for x in runs))) if runs else []
    if len(docs) < 2:
        return None
    arr = np.array([[[*a[x][d], *b[x][d]] for d in docs] for x in runs], dtype=np.float64)  # [runs, docs, 4]
    # how often each document is drawn in each resample (n draws with replacement): [draws, docs]
    counts = rng.multinomial(len(docs), np.full(len(docs), 1 / len(docs)), size=draws).astype(np.float64)
    sums = np.einsum("bd,sdk->sbk", counts, arr)  # [runs, draws, 4]: resampled sums and counts of both sides
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums[..., 0] / sums[..., 1], sums[..., 2] / sums[..., 3], len(docs), runs


def _over_runs(values, rng, runs: list):
    """[runs, draws] -> [draws]: each draw's mean over as many runs, drawn with replacement (the bootstrap's outer
    level: run-to-run spread enters the interval). Runs of one seed trained again (the same command in another
    numeric environment, or another folder) share their initial weights and data order, so they are not drawn as
    independent: where a seed has several runs, each draw takes as many seeds with replacement and, for each seed
    taken, as many of its runs with replacement. NaN values (nothing to average in that resample) are left out."""
    import numpy as np

    n_runs, draws = values.shape
    seed_of = [x[0] if isinstance(x, tuple) else x for x in runs]  # a Run is (seed, repeat); a bare key is its seed
    seeds = sorted(set(seed_of))
    if len(seeds) == n_runs:  # one run per seed
        pick = rng.integers(0, n_runs, size=(n_runs, draws))  # [runs drawn, draws]
        with np.errstate(invalid="ignore"):
            return np.nanmean(np.take_along_axis(values, pick, axis=0), axis=0)
    of_seed = [np.array([i for i, seed in enumerate(seed_of) if seed == s]) for s in seeds]
    out = np.empty(draws)
    for d, taken in enumerate(rng.integers(0, len(seeds), size=(draws, len(seeds)))):
        rows = np.concatenate([rng.choice(of_seed[s], size=len(of_seed[s])) for s in taken])
        with np.errstate(invalid="ignore"):
            out[d] = np.nanmean(values[rows, d])
    return out


def _interval(values, n_docs: int) -> tuple[float, float, int] | None:
    """The 2.5th and 97.5th percentiles of the finite resampled values, with the number of documents."""
    import numpy as np

    values = values[np.isfinite(values)]  # a resample with nothing to average (no query chunk with a positive)
    if not len(values):
        return None
    lo, hi = np.percentile(values, [2.5, 97.5])
    return float(lo), float(hi), n_docs


def bootstrap_ratio(num: PerDoc, den: PerDoc, draws: int = BOOTSTRAP,
                    seed: int = BOOTSTRAP_SEED) -> tuple[float, float, int] | None:
    """95% interval of the runs' mean of ppl(num) / ppl(den) under resampling runs and test documents together
    (module docstring). num, den: run -> {document index: (NLL sum, tokens)}; only runs and documents present on
    both sides count. Returns (low, high, number of documents), or None with fewer than two documents."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if (r := _resampled_means(num, den, draws, rng)) is None:
        return None
    nll_num, nll_den, n_docs, runs = r
    return _interval(_over_runs(np.exp(nll_num - nll_den), rng, runs), n_docs)


def bootstrap_difference(a: PerDoc, b: PerDoc, draws: int = BOOTSTRAP,
                         seed: int = BOOTSTRAP_SEED) -> tuple[float, float, int] | None:
    """95% interval of the runs' mean of mean(a) - mean(b) under resampling runs and test documents together, where
    a, b: run -> {document index: (metric sum over its query chunks, query chunks)} and each side's mean is its
    resampled sum over its resampled count (the pooled, "micro" mean of rpt.eval.metrics). Only runs and documents on
    both sides count. Returns (low, high, number of documents), or None with fewer than two documents."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if (r := _resampled_means(a, b, draws, rng)) is None:
        return None
    mean_a, mean_b, n_docs, runs = r
    return _interval(_over_runs(mean_a - mean_b, rng, runs), n_docs)


def _n_docs(*sides: PerDoc) -> int:
    """Documents common to every run of every side (what a bootstrap would resample)."""
    sets = [set(d) for side in sides for d in side.values()]
    return len(set.intersection(*sets)) if sets else 0


def _means(per_doc: PerDoc) -> dict[Run, float]:
    """run -> the pooled mean of the per-document (sum, count) pairs."""
    return {x: sum(v for v, _ in d.values()) / n for x, d in per_doc.items() if (n := sum(c for _, c in d.values()))}


# the rankings the model's own retriever is set against, per document, in `compare` ("p2_vs_<who>" fields)
AGAINST = ("bm25", "recency", "random")


def _paired(row: dict[str, Any], key: str, num: Setting, num_source: str, den: Setting, den_source: str) -> None:
    """row[key]: ppl of `num` with num_source / ppl of `den` with den_source, per run (mean ± sd), and row[key_ci]: its
    95% interval over runs and test documents (None without per-document results)."""
    row[key] = _stats(_ratios(num.ppl.get(num_source, {}), den.ppl.get(den_source, {})))
    row[f"{key}_ci"] = bootstrap_ratio(num.docs.get(num_source, {}), den.docs.get(den_source, {}))


def _final(r: dict[str, Any]) -> bool:
    return r.get("step") is not None and r.get("step") == r["config"].get("train", {}).get("steps")


def compare(results: list[dict[str, Any]], domain: str | None = None, step: int | str | None = None,
            against: str | None = None) -> dict[str, Any]:
    """The comparison as data: one row per setting (see the module docstring); `domain` adds the paper's figure;
    `step` keeps only the results of checkpoints at that step, or with "final" each run's last one (train.steps:
    the rows of xl with 1.5x the updates then stand beside the others); `against`: one setting's label, or text that
    only its label contains (e.g. "ss_schedule=anneal"), which every other setting of the same data and step is paired
    with ("vs_ref"); with several steps among the results, `step` must pick one (or "final")."""
    if domain is not None and domain not in DOMAINS:
        raise UserError(f"--paper {domain!r}: choose from {', '.join(DOMAINS)}")
    if step == "final":
        results = [r for r in results if _final(r)]
        if not results:
            raise UserError("--step final: no result is of a run's final checkpoint (step = its train.steps)")
    elif step is not None:
        kept = [r for r in results if r.get("step") == step]
        if not kept:
            raise UserError(f"--step {step}: no result is of a checkpoint at that step "
                            f"(steps found: {sorted({r.get('step') for r in results}, key=str)})")
        results = kept
    from rpt.eval.perplexity import default_source

    settings = group_settings(results)
    data_keys = ("data.store", "data.seq_len", "data.tokenizer")

    def xl_for(s: Setting) -> Setting | None:
        """The plain xl of s's data and step: of the xl settings there, the one with both the fewest layers and the
        fewest updates, when exactly one is. With --step final (each run's last checkpoint) an xl row is paired with
        plain xl whatever its updates, any other row only with an xl trained as long."""
        same = [x for x in settings if x.variant == "xl" and all(x.config.get(k) == s.config.get(k) for k in data_keys)]
        if step != "final":
            same = [x for x in same if x.step == s.step]
        elif s.variant != "xl":
            same = [x for x in same if x.config["train.steps"] == s.config["train.steps"]]
        if not same:
            return None
        layers = min(x.config["model.n_layers"] for x in same)
        steps = min(x.config["train.steps"] for x in same)
        base = [x for x in same if x.config["model.n_layers"] == layers and x.config["train.steps"] == steps]
        return base[0] if len(base) == 1 else None

    ref = None
    if against is not None:
        if step != "final" and len(steps := sorted({s.step for s in settings}, key=str)) > 1:
            raise UserError(f"--against: the results hold checkpoints at several steps ({', '.join(map(str, steps))}); "
                            "choose one with --step N, or each run's last with --step final")
        named = [s for s in settings if s.label == against] or [s for s in settings if against in s.label]
        if len(named) != 1:
            raise UserError(f"--against {against!r}: {'no setting' if not named else f'{len(named)} settings'} "
                            f"match; the settings are: {'; '.join(s.label for s in settings)}")
        ref = named[0]

    def pairs_with_ref(s: Setting) -> bool:
        return (ref is not None and s is not ref and all(ref.config.get(k) == s.config.get(k) for k in data_keys)
                and (s.config["train.steps"] == ref.config["train.steps"] if step == "final" else s.step == ref.step))

    rows = []
    for s in settings:
        src = default_source(s.variant)
        own = s.ppl.get(src, {})
        row: dict[str, Any] = {"label": s.label, "variant": s.variant, "step": s.step, "k": s.k, "source": src,
                               "seeds": sorted({seed for seed, _ in own}), "runs": len(own),
                               "ppl": _stats(list(own.values()))}
        if 0 < _n_docs(*(s.docs.get(x, {}) for x in (src, "none") if s.docs.get(x))) < 2:
            row["one_document"] = True  # no interval: one document cannot be resampled
        xl = xl_for(s)
        if xl is not None and xl is not s:
            _paired(row, "vs_xl", s, src, xl, "none")
        if pairs_with_ref(s):
            _paired(row, "vs_ref", s, src, ref, default_source(ref.variant))
        if src != "none":
            row["none"] = _stats(list(s.ppl.get("none", {}).values()))
            _paired(row, "gain", s, "none", s, src)
        if "oracle" in s.ppl and not s.sampled_gold:
            row["oracle"] = _stats(list(s.ppl["oracle"].values()))
            _paired(row, "oracle_gain", s, "none", s, "oracle")
        elif "oracle" in s.ppl:  # a sampled gold: the oracle is a ceiling only on the tokens whose gold was scored
            oracle = {x: v[0] for x, v in s.scored.get("oracle", {}).items()}
            none = {x: v[0] for x, v in s.scored.get("none", {}).items()}
            own_scored = {x: v[0] for x, v in s.scored.get(src, {}).items()}
            row["oracle"] = _stats(list(oracle.values()))
            row["oracle_gain"] = _stats(_ratios(none, oracle))
            row["oracle_scope"] = {"query_fraction": sorted(s.sampled_gold),
                                   "token_share": _stats([v[1] for v in s.scored.get("oracle", {}).values()]),
                                   "own": _stats(list(own_scored.values())), "none": _stats(list(none.values()))}
        if "dpr" in s.ppl:  # a DPR-style retriever's neighbours instead (`rpt eval --source dpr`), and that gain
            row["dpr"] = _stats(list(s.ppl["dpr"].values()))
            _paired(row, "dpr_gain", s, "none", s, "dpr")
        if "random" in s.ppl:  # the control: random retrievable chunks of the same document
            row["random"] = _stats(list(s.ppl["random"].values()))
            row["random_gain"] = _stats(_ratios(s.ppl.get("none", {}), s.ppl["random"]))
            # own neighbours against random ones: does the retriever's choice matter beyond any chunk of the document?
            if src != "none":
                _paired(row, "own_vs_random", s, "random", s, src)
        if src == "model" and "bm25" in s.ppl:  # an own retriever's model read with BM25's neighbours instead
            row["bm25"] = _stats(list(s.ppl["bm25"].values()))
            _paired(row, "bm25_gain", s, "none", s, "bm25")
        for who in RANKINGS:
            if s.metrics.get(who):
                vals = list(s.metrics[who].values())
                row[f"metrics_{who}"] = [_stats([v[i] for v in vals]) for i in range(len(METRICS))]
            if s.buckets.get(who):
                names = sorted({b for v in s.buckets[who].values() for b in v}, key=bucket_lo)
                row[f"buckets_{who}"] = {b: _stats([v[b] for v in s.buckets[who].values()
                                                    if v.get(b) is not None]) for b in names}
        own_docs = s.doc_metrics.get("model", {})
        for who in AGAINST if own_docs else ():
            other = s.doc_metrics.get(who, {})
            mine, theirs = _means(own_docs), _means(other)
            if diffs := [mine[x] - theirs[x] for x in sorted(set(mine) & set(theirs))]:
                row[f"p2_vs_{who}"] = _stats(diffs)
                row[f"p2_vs_{who}_ci"] = bootstrap_difference(own_docs, other)
        if s.gold:
            row["gold"] = sorted(s.gold)
        if s.train_recall:
            row["train_recall"] = _stats(list(s.train_recall.values()))
        name = paper_row(s, base_xl=xl)
        if domain is not None and name is not None:
            i = DOMAINS.index(domain)
            row["paper"] = {"row": name, "ppl": PAPER[name]["ppl"][i]}
            for src in ("oracle", "dpr"):
                if src in s.ppl and (o := paper_row(s, src)):
                    row["paper"][src] = PAPER[o]["ppl"][i]
            if domain in PAPER_METRICS and s.variant in PAPER_METRICS[domain]:
                row["paper"]["metrics"] = PAPER_METRICS[domain][s.variant]
        rows.append(row)
    from rpt.utils import environment

    note = None
    if domain is not None:
        corpora = sorted({str(r["config"].get("data", {}).get("corpus") or "?") for r in results})
        if other := [c for c in corpora if PAPER_CORPORA[domain] not in c.lower()]:
            note = (f"Not comparable: these results are on {', '.join(other)}, not the paper's {domain} dataset "
                    f"({PAPER_CORPORA[domain]}), with other models and budgets; the paper's figures stand beside them "
                    "for reference only.")
    envs: list[dict[str, Any]] = []
    trained: list[dict[str, Any]] = []
    for r in results:  # the machines and versions behind the results, each once (a rerun must match them)
        if (e := r.get("environment")) and e not in envs:
            envs.append(e)
        for e in r.get("train_environments") or []:  # where the checkpoints' updates ran
            if (e := {k: v for k, v in e.items() if k != "from_step"}) not in trained:
                trained.append(e)
    return {"domain": domain, "paper_note": note, "rows": rows, "against": ref.label if ref is not None else None,
            "environment": environment(), "result_environments": envs,
            "train_environments": trained,
            "note": "mean ± sd over runs (n: runs; a seed trained again in another folder is one more run); gains and "
                    "vs-xl (and vs-reference) ratios are paired per run; an ordering holds only where the gap exceeds the "
                    "spread; "
                    "[low, high]: 95% interval from resampling runs (seeds first where a seed has several) and test "
                    f"documents together ({BOOTSTRAP} draws; an interval containing 1 does not support a difference)"}


def _fmt(st: tuple[float, float, int] | None, digits: int = 1, pct: bool = False, n_row: int | None = None) -> str:
    """mean ± sd; "(n=k)" where fewer seeds stand behind it than behind its row (a paired ratio missing a partner)."""
    if st is None:
        return ""
    m, sd, n = st
    scale, unit, digits = (100, "%", 1) if pct else (1, "", digits)
    text = f"{scale * m:.{digits}f}{unit}" + (f" ± {scale * sd:.{digits}f}" if n > 1 else "")
    return text + (f" (n={n})" if n_row is not None and n != n_row else "")


def _once(st: tuple[float, float, int] | None, who: str) -> tuple[float, float, int] | None:
    """A ranking that is the same for every seed (all but the model's own) seen n times with no spread: its value once,
    not "± 0.0", a spread nobody measured."""
    if st is not None and who != "model" and st[1] == 0:
        return st[0], 0.0, 1
    return st


def _metric_rows(rows: list[dict[str, Any]]) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, ranking, row) of every retrieval-metric line: each model's own retriever, then every ranking that is the
    same for every model of a split (BM25, DPR, the chance levels, the oracle) once per distinct value."""
    out, shown = [], defaultdict(list)
    for who in RANKINGS:
        for r in rows:
            m = r.get(f"metrics_{who}")
            if m is None:
                continue
            name = r["label"]
            if who != "model":
                means = [round(x[0], 6) for x in m]
                if means in shown[who]:
                    continue
                shown[who].append(means)
                name = FIXED_NAMES[who] if len(shown[who]) == 1 else f"{FIXED_NAMES[who]} (with {r['label']})"
            out.append((name, who, r))
    return out


def _ci(ci: tuple[float, float, int] | list | None) -> str:
    return "" if not ci else f" [{ci[0]:.3f}, {ci[1]:.3f}]"


def to_markdown(table: dict[str, Any]) -> str:
    """Two Markdown tables: perplexity and gains (Table 2 / 4 layout), then retrieval metrics (Table 3 layout)."""
    paper = table["domain"] is not None
    dpr = any("dpr" in r for r in table["rows"])
    bm25 = any("bm25" in r for r in table["rows"])
    vs_ref = [f"vs {table['against']}"] if table.get("against") else []
    head = ["model", "n", "ppl", "vs xl", *vs_ref, "ppl, no neighbours", "retrieval gain", "oracle ppl", "oracle gain"]
    rand = any("random" in r for r in table["rows"])
    head += ["ppl, random neighbours", "random gain", "own vs random"] if rand else []
    head += ["ppl, BM25 neighbours", "BM25 gain"] if bm25 else []
    head += ["ppl, DPR neighbours", "DPR gain"] if dpr else []
    if paper:
        head += [f"paper ({table['domain']})", "paper oracle"] + (["paper DPR"] if dpr else [])
    lines = [table["paper_note"], ""] if table.get("paper_note") else []
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table["rows"]:
        n = r.get("runs", len(r["seeds"]))
        runs = str(n) if n == len(r["seeds"]) else f"{n} ({len(r['seeds'])} seeds)"
        cells = [r["label"], runs, _fmt(r["ppl"]), _fmt(r.get("vs_xl"), 3, n_row=n) + _ci(r.get("vs_xl_ci")),
                 *([_fmt(r.get("vs_ref"), 3, n_row=n) + _ci(r.get("vs_ref_ci"))] if vs_ref else []),
                 _fmt(r.get("none"), n_row=n), _fmt(r.get("gain"), 3, n_row=n) + _ci(r.get("gain_ci")),
                 _fmt(r.get("oracle"), n_row=n) + ("¹" if r.get("oracle_scope") else ""),
                 _fmt(r.get("oracle_gain"), 3, n_row=n) + _ci(r.get("oracle_gain_ci"))]
        cells += [_fmt(r.get("random"), n_row=n), _fmt(r.get("random_gain"), 3, n_row=n),
                  _fmt(r.get("own_vs_random"), 3, n_row=n) + _ci(r.get("own_vs_random_ci"))] if rand else []
        cells += [_fmt(r.get("bm25"), n_row=n), _fmt(r.get("bm25_gain"), 3, n_row=n) + _ci(r.get("bm25_gain_ci"))] if bm25 else []
        cells += [_fmt(r.get("dpr"), n_row=n), _fmt(r.get("dpr_gain"), 3, n_row=n) + _ci(r.get("dpr_gain_ci"))] if dpr else []
        if paper:
            p = r.get("paper") or {}
            cells += [str(p.get("ppl", "")), str(p.get("oracle", ""))] + ([str(p.get("dpr", ""))] if dpr else [])
        lines.append("| " + " | ".join(cells) + " |")
    if scoped := [r for r in table["rows"] if r.get("oracle_scope")]:
        lines += ["", "¹ The oracle's labels score a sample of query chunks (--query-fraction), and it gives the others no "
                  "neighbours: its ppl and gain are over the target chunks of scored query chunks only."]
        for r in scoped:
            sc = r["oracle_scope"]
            share = sc["token_share"]  # the same documents for every seed: one share
            lines.append(f"- {r['label']}: {_fmt(share and (share[0], 0.0, 1), pct=True)} of tokens; own neighbours "
                         f"{_fmt(sc['own']) or '(not evaluated with the labels)'}, no neighbours "
                         f"{_fmt(sc['none']) or '(not evaluated with the labels)'} on the same tokens")
    with_metrics = [r for r in table["rows"] if any(f"metrics_{w}" in r for w in RANKINGS)]
    if with_metrics:
        golds = sorted({g for r in with_metrics for g in r.get("gold", [])})
        lines += ["", "Retrieval metrics; gold: " + "; ".join(golds) + ".", "",
                  "| retriever | n | P@2 | R@10 | nDCG@20 | training recall@K |"
                  + (" paper P@2 / R@10 / nDCG@20 |" if paper else ""),
                  "|---|---|---|---|---|---|" + ("---|" if paper else "")]
        buckets: list[tuple[str, str, dict[str, Any]]] = []
        for name, who, r in _metric_rows(with_metrics):
            m = r[f"metrics_{who}"]
            n = m[0][2]
            if who != "model" and n > 1 and all(x[1] == 0 for x in m):  # one ranking seen n times: no spread to show
                cells = [name, f"{n} (same ranking)", *(_fmt((x[0], 0.0, 1), pct=True) for x in m)]
            else:
                cells = [name, str(n), *(_fmt(x, pct=True) for x in m)]
            cells.append(_fmt(r.get("train_recall"), pct=True) if who == "model" else "")
            if paper:
                ref = PAPER_METRICS.get(table["domain"], {}).get({"model": r["variant"], "bm25": "bm25"}.get(who, ""))
                cells.append(" / ".join(f"{100 * x:.0f}%" for x in ref) if ref else "")
            lines.append("| " + " | ".join(cells) + " |")
            if r.get(f"buckets_{who}"):
                buckets.append((name, who, r[f"buckets_{who}"]))
        if buckets:
            names = sorted({b for _, _, bs in buckets for b in bs}, key=bucket_lo)
            lines += ["", "P@2 by pool size (retrievable chunks of the query):", "",
                      "| retriever | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
            for name, who, bs in buckets:
                lines.append(f"| {name} | " + " | ".join(_fmt(_once(bs.get(b), who), pct=True) for b in names) + " |")
        against = [r for r in with_metrics if any(f"p2_vs_{w}" in r for w in AGAINST)]
        if against:
            lines += ["", "The model's P@2 minus another ranking's, in points (mean ± sd over runs; [low, high]: 95% "
                      "interval from resampling runs (seeds first where a seed has several) and test documents "
                      "together; an interval containing 0 does not support a difference):", "",
                      "| retriever | " + " | ".join(f"− {FIXED_NAMES[w]}" for w in AGAINST) + " |",
                      "|---|" + "---|" * len(AGAINST)]
            for r in against:
                cells = [_fmt(r.get(f"p2_vs_{w}"), pct=True) + _ci_points(r.get(f"p2_vs_{w}_ci")) for w in AGAINST]
                lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    if one := [r["label"] for r in table["rows"] if r.get("one_document")]:
        lines += ["", f"No interval for {', '.join(one)}: the results hold one test document, and an interval "
                  "resamples documents (one cannot be resampled); the spread over runs is the ± beside the mean."]
    for key, title in (("train_environments", "Trained on"), ("result_environments", "Results from")):
        if envs := table.get(key):
            lines += ["", f"{title}: " + "; ".join(map(_environment_text, envs)) + "."]
    lines += ["", table["note"]]
    return "\n".join(lines)


def _environment_text(e: dict[str, Any]) -> str:
    """"x86_64 (AMD EPYC; AVX2 kernels), 2 CPUs, 1 threads, torch 2.13.0+cpu, Python 3.11.7, rpt 0.1.0"."""
    cpu = "; ".join(x for x in (e.get("cpu"), e.get("cpu_capability") and f"{e['cpu_capability']} kernels",
                                *(f"{k}={v}" for k, v in (e.get("isa_variables") or {}).items())) if x)
    return (f"{e.get('machine')}" + (f" ({cpu})" if cpu else "") + f", {e.get('cpu_count')} CPUs, "
            f"{e.get('threads')} threads" + (f", {e['gpu']}" if e.get("gpu") else "")
            + f", torch {e.get('torch')}, Python {e.get('python')}, rpt {e.get('rpt')}")


def _ci_points(ci: tuple[float, float, int] | list | None) -> str:
    return "" if not ci else f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"
