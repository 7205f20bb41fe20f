"""`rpt eval`: long-document perplexity with a document memory, retrieval metrics and the §5.4 analyses (rpt/eval/)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rpt.config import EvalConfig

HELP = "evaluate a checkpoint: perplexity over whole documents with retrieval from the document so far, retrieval " \
       "metrics (P@2, R@10, nDCG@20) and analyses"
ORDER = 40
FLAGS = {"n_neighbors": "--neighbors", "with_metrics": "--metrics", "bm25_statistics": "--bm25-stats"}  # argument -> flag


def add_arguments(p: argparse.ArgumentParser) -> None:
    from rpt.commands.options import add_config, add_device
    from rpt.config import MAX_NEIGHBORS

    p.add_argument("--checkpoint", required=True, help="checkpoint folder (checkpoints/step_*), its model.safetensors, "
                   "or a run folder (its newest checkpoint)")
    add_config(p, "its eval section gives the defaults of the evaluation's flags (--split to --precision), and its "
               "data.store the default of --store")
    p.add_argument("--store", help="token store root written by `rpt prepare` (or one split's folder; default: "
                   "--config's data.store)")
    p.add_argument("--split", help="split to evaluate (default test)")
    p.add_argument("--neighbors", type=int, help=f"K, neighbours per chunk at inference: 1..{MAX_NEIGHBORS}; "
                   "each adds 2 chunks of keys to every CCA layer (the paper uses 2, 3 or 4; default 2)")
    p.add_argument("--source", choices=("auto", "model", "bm25", "oracle", "dpr", "random", "none"),
                   help="neighbours fed to CCA: auto (the variant's default, below), model (own retriever; default "
                   "for rpt-*), bm25 (query c_q only; default for retro), oracle (the scorer's best candidates, "
                   "--oracle; needs --labels), dpr (a DPR-style retriever, --retriever), random (random retrievable "
                   "chunks of the same document: the control), none (default for xl and the baselines)")
    p.add_argument("--oracle", choices=("top-k", "positives"),
                   help="what --source oracle feeds: top-k (the scorer's K best scored candidates, positives first; "
                   "default) or positives (only candidates with s_t > 0: fewer than K where fewer exist)")
    p.add_argument("--retriever", help="a DPR-style retriever folder (`rpt dpr`) or hf:NAME: the neighbours of --source "
                   "dpr, and one more ranking under --metrics")
    p.add_argument("--labels", help="sem label store of this split with span doc (`rpt label --kind sem --span doc`): "
                   "needed by --source oracle, --metrics and --baseline")
    p.add_argument("--memory", choices=("auto", "faiss", "torch"),
                   help="document memory: faiss (CPU index) or torch (matmul); auto = torch on GPU, faiss on CPU "
                   "(default auto)")
    p.add_argument("--memory-tokens", type=int, metavar="N", help="memorizing: evaluate with a kNN memory of N "
                   "tokens instead of the checkpoint's model.memorizing.tokens (no weight depends on it); recorded as the "
                   "result's eval.memory_tokens, the trained size stays in its config")
    p.add_argument("--max-documents", type=int, help="evaluate only the first N documents (default 0: all)")
    p.add_argument("--out", help="result JSON (default: <checkpoint>/eval-<split>-<source>-k<K>[-mem<N>].json)")
    p.add_argument("--metrics", action="store_true", default=None, help="also retrieval metrics against --labels "
                   "(model retriever and BM25 side by side) and the token-overlap analysis")
    p.add_argument("--per-chunk", action="store_true", default=None, help="store per-chunk NLL and neighbours in the "
                   "result (needed for --baseline, in this run and in the baseline's)")
    p.add_argument("--baseline", help="a Transformer-XL result JSON (made with --per-chunk on the same split): relative "
                   "improvement per chunk with / without a gold chunk retrieved")
    p.add_argument("--plots", metavar="DIR", help="write PNG plots of the analyses (and supervision quality of --labels)")
    p.add_argument("--compare", nargs="+", default=[], metavar="RESULT", help="other result JSONs shown beside this "
                   "one in --plots (e.g. retro and rpt-lex)")
    p.add_argument("--bm25-stats", choices=("causal", "document"),
                   help="BM25 idf/length statistics at inference: of the retrievable chunks so far (causal, default) or "
                   "of the whole document (as the training labels)")
    p.add_argument("--precision", choices=("fp32", "bf16"),
                   help="bf16 runs the model under autocast on GPUs (NLL in fp32); fp32 on CPU (default fp32)")
    add_device(p, "model")
    p.add_argument("--threads", type=int, help="torch CPU threads (set once, at start)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def format_summary(result: dict[str, Any]) -> str:
    """A short table: totals, then retrieval metrics and analyses when present."""
    t, ev = result["total"], result["eval"]
    variant = result["config"]["model"]["variant"]
    ppl = "-" if t["perplexity"] is None else f"{t['perplexity']:.4f}"
    tps = "-" if t["tokens_per_second"] is None else f"{t['tokens_per_second']:,.0f}"
    lines = [
        f"{variant}  source {ev['source']}  K {ev['n_neighbors']}  memory {ev['memory'] or '-'}"
        + (f" of {ev['memory_tokens']:,} tokens" if ev.get("memory_tokens") else "") + f"  split {ev['split']}",
        f"  {'documents':<22}{t['n_documents']:>12,}",
        f"  {'tokens':<22}{t['n_tokens']:>12,}",
        f"  {'NLL / token (nats)':<22}{'-' if t['nll_mean'] is None else format(t['nll_mean'], '.4f'):>12}",
        f"  {'perplexity':<22}{ppl:>12}",
        *([f"  {'  on scored gold':<22}{t['scored']['perplexity']:>12.4f}  ({100 * t['scored']['token_share']:.1f}% of "
           f"tokens: the target chunks of query chunks whose gold was scored, {ev.get('gold')})"]
          if (t.get("scored") or {}).get("perplexity") is not None else []),
        f"  {'time':<22}{t['seconds']:>11.1f}s  ({tps} tokens/s)",
        f"  {'peak memory':<22}{t['peak_memory_bytes'] / 2**20:>10.2f}MB  (document memory)",
    ]
    if not ev.get("tokenizer_checked", True):
        lines.append("  note: the checkpoint does not say which tokenizer it was trained with; only chunk size and "
                     "vocabulary size were checked")
    ret = result.get("retrieval")
    if ret:
        lines.extend(retrieval_lines(ret))
    ov = result.get("overlap")
    if ov:
        lines.append(f"  {'overlap':<12}{'query':>13}{'target':>13}   (unique tokens shared with the best neighbour)")
        for n, v in ov.items():
            if n != "definition":
                lines.append(f"  {n:<12}" + "".join("{:>13}".format("-" if v[k] is None else f"{v[k]:.2f}")
                                                   for k in ("query", "target")))
    sg = result.get("subgroups")
    if sg:
        lines.append("  improvement over the baseline (mean 1 - NLL/NLL_xl per chunk):")
        for n in ("gold", "no_gold", "all"):
            lines.append(f"    {n:<10}{_pct(sg[n]['improvement']):>10}  ({sg[n]['n']:,} chunks)")
    return "\n".join(lines)


# flag (argparse dest) -> EvalConfig field
_EVAL_FLAGS = {"split": "split", "neighbors": "n_neighbors", "source": "source", "memory": "memory",
               "max_documents": "max_documents", "labels": "labels", "metrics": "with_metrics",
               "per_chunk": "per_chunk", "baseline": "baseline", "bm25_stats": "bm25_statistics",
               "precision": "precision", "retriever": "retriever", "memory_tokens": "memory_tokens",
               "oracle": "oracle"}


def apply_eval_config(args: argparse.Namespace) -> EvalConfig:
    """Fill the flags left unset from --config's eval section (else EvalConfig's defaults), and --store from its
    data.store; a flag given on the command line wins. Returns the evaluation's settings; on `args`, an empty path
    and memory size are None, and source auto is None (the variant's default, once the checkpoint is read)."""
    from rpt.commands.options import config_of
    from rpt.config import EvalConfig
    from rpt.utils import UserError

    cfg = config_of(args)
    ev = cfg.eval if cfg else EvalConfig()
    for flag, field in _EVAL_FLAGS.items():
        if getattr(args, flag) is None:
            setattr(args, flag, getattr(ev, field))
    settings = EvalConfig(**{field: getattr(args, flag) for flag, field in _EVAL_FLAGS.items()})
    for flag in ("labels", "baseline", "retriever"):
        setattr(args, flag, getattr(args, flag) or None)  # "" in a config: none
    args.memory_tokens = args.memory_tokens or None
    if args.source == "auto":
        args.source = None  # the variant's default, once the checkpoint is read
    if args.store is None:
        if cfg is None:
            raise UserError("--store is required (or a --config whose data.store names the store)")
        args.store = cfg.data.store
    return settings


def run(args: argparse.Namespace) -> int:
    import torch

    from rpt.config import check_neighbors
    from rpt.eval.perplexity import checkpoint_config, default_source, read_result, resolve_checkpoint, run_eval
    from rpt.utils import UserError, require, resolve_device

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_tokens is not None and args.memory_tokens < 1:
        raise UserError(f"--memory-tokens must be >= 1, not {args.memory_tokens}")
    settings = apply_eval_config(args)
    # before the default --out below resolves (and verifies) the checkpoint
    check_neighbors(args.neighbors)
    if args.plots:
        from rpt.outputs import check_writable, claim_file

        require("matplotlib", "--plots")  # now, not after the evaluation
        check_writable(args.plots, "plots")
        for name in ("token_overlap.png", "subgroups.png", "supervision_quality.png"):  # replaced only if rpt's
            claim_file(Path(args.plots) / name, "eval", arg="plots")
    compare = {path: read_result(path, "--compare") for path in args.compare}
    out = args.out
    if out is None:
        folder = resolve_checkpoint(args.checkpoint)
        src = args.source or default_source(checkpoint_config(folder).model.variant)
        mem = f"-mem{args.memory_tokens}" if args.memory_tokens else ""
        name = f"eval-{args.split}-{src}-k{args.neighbors}{mem}"
        # a checkpoint of a run (checkpoints/step_N, or best): the result goes into the run folder, named by the
        # checkpoint, since training prunes old checkpoints and replaces best/ with everything inside them
        run_dir = folder.parent.parent if folder.parent.name == "checkpoints" else folder.parent
        in_run = (folder.parent.name == "checkpoints" or folder.name == "best") and (run_dir / "config.yaml").is_file()
        out = run_dir / f"{name}-{folder.name}.json" if in_run else folder / f"{name}.json"
    from rpt.outputs import claim_file

    # before any work: never over a file of the user's, nor one of the inputs
    claim_file(out, "eval", inputs={"checkpoint": args.checkpoint, "store": args.store, "labels": args.labels,
                                    "compare": list(args.compare)})
    result = run_eval(args.checkpoint, args.store, settings, out=out, device=str(resolve_device(args.device)),
                      progress=not args.no_progress)
    if os.environ.get("RANK", "0") != "0":
        return 0  # rank 0 writes and prints
    print(format_summary(result))
    print(f"  result: {out}")
    if args.plots:
        from rpt.eval.plots import plot_results, result_name

        results = {result_name(r): r for r in compare.values()}
        results[result_name(result)] = result
        written = plot_results(results, args.plots)
        if args.labels:
            from rpt.labels.quality import plot_supervision_quality, supervision_quality

            curve = supervision_quality(args.labels)
            written.append(plot_supervision_quality({args.split: curve}, Path(args.plots) / "supervision_quality.png"))
        for png in written:
            print(f"  plot: {png}")
    return 0


def retrieval_lines(ret: dict) -> list[str]:
    """The retrieval metrics of a result as a table: every ranking (chance levels included), then per pool bucket."""
    names = [n for n, v in ret.items() if isinstance(v, dict)]
    if not names:
        return []
    keys = [k for k in ret[names[0]] if "@" in k]
    lines = [f"  gold: {ret.get('gold', 'bm25 top-k')}"]

    def table(title: str, rows: dict[str, dict]) -> None:
        first = next(iter(rows.values()))
        lines.append(f"  {title:<22}" + "".join(f"{k:>13}" for k in keys) + f"{'queries':>10}"
                     + (f"{'positives':>11}{'pool':>8}" if "pool" in first else ""))
        for n, m in rows.items():
            extra = ""
            if "pool" in m:
                extra = "".join(f"{'-' if m[k] is None else format(m[k], '.1f'):>{w}}"
                                for k, w in (("positives", 11), ("pool", 8)))
            lines.append(f"  {n:<22}" + "".join(f"{_pct(m[k]):>13}" for k in keys) + f"{m['n_queries']:>10,}" + extra)

    table("retrieval", {n: ret[n] for n in names})
    for bucket in ret[names[0]].get("buckets", {}):
        table(f"  {bucket}", {n: ret[n]["buckets"][bucket] for n in names if bucket in ret[n].get("buckets", {})})
    return lines
