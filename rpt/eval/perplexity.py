"""Long-document perplexity with a document memory (§3.4 "Retrieval at inference time", §5 Table 2).

Each document is read segment by segment with `model.step` and a NEW cache: the sliding-window K/V cache holds at
most two segments (bounded), and the document memory holds every finished chunk of the document so far (linear), so
every chunk retrieves from everything retrievable since the document began. Nothing is carried across documents.

Neighbour sources (`source`):
    model   the model's own retriever (rpt-lex, rpt-sem)
    bm25    RETRO at inference: BM25 with the query chunk c_q ONLY over the retrievable chunks of the document so far,
            with BM25 statistics of those chunks (`bm25_neighbors`; bm25_candidates' whole-document statistics are an
            option)
    oracle  the scoring LM's best candidates (§5 "Oracles": the best neighbours according to the scoring LM): the
            top K by target score s_t among the scored candidates of a ``sem`` label store with span ``doc``, the
            positives (s_t > 0) first; ``oracle="positives"`` gives only the positives, so a query chunk with fewer
            than K positives gets fewer neighbours (a model trained with K neighbours then reads fewer than it was
            trained with, and the row is no ceiling)
    random  K distinct retrievable chunks of the same document drawn uniformly (a fixed draw per document): the
            control for a retrieval gain, which any chunk of the document might bring by priming its vocabulary
    none    no neighbours (CCA sees only its null key); the only source for xl

Perplexity = exp(sum of token NLL / number of predicted tokens): every token but the first of each document is
predicted once. Sums are all-reduced over ranks (documents are sharded round-robin over RANK/WORLD_SIZE) and divided
once. The result file layout is documented on `run_eval`.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from rpt.checkpoint import checkpoint_config, checkpoint_tokenizer, load_model, read_state, resolve_checkpoint  # noqa: F401
from rpt.chunks import pool_size
from rpt.config import EvalConfig, check_neighbors
from rpt.data.store import TokenStore, open_split
from rpt.eval import analysis, metrics
from rpt.labels.bm25 import bm25_neighbors
from rpt.model.memory import ChunkMemory, make_memory, memory_name
from rpt.model.registry import spec
from rpt.utils import UserError, argument_error, environment, write_json_atomic

RESULT_VERSION = 1
SOURCES = ("model", "bm25", "oracle", "dpr", "random", "none")
SCORED = ("the target chunks c_{i+1} of the query chunks i whose gold was scored (every query chunk with a pool under "
          "exhaustive gold; a sample of them under --query-fraction): where the oracle's neighbours are the scorer's best")
METRIC_DEPTH = 20  # rankings are taken to depth 20 for the retrieval metrics (nDCG@20)
RANDOM_SEED = 7919  # the draw of source "random": fixed per document, so every checkpoint reads the same chunks


# --------------------------------------------------------------------------------------------------------------
# checkpoints


# --------------------------------------------------------------------------------------------------------------
# neighbour sources


def random_neighbors(n_chunks: int, chunk_size: int, segment_len: int, k: int, doc: int = 0) -> np.ndarray:
    """[C, k] k distinct retrievable chunks per query chunk, uniformly drawn (all of them, in random order, where
    fewer than k are retrievable; -1 fills), from a generator seeded by the document index: the same for every
    checkpoint evaluated on the store."""
    rng = np.random.default_rng([RANDOM_SEED, int(doc)])
    pool = pool_size(np.arange(n_chunks), chunk_size, segment_len)
    ids = np.full((n_chunks, k), -1, np.int64)
    for i in np.nonzero(pool)[0]:
        n = int(pool[i])
        pick = rng.choice(n, size=min(k, n), replace=False)
        ids[i, : len(pick)] = pick
    return ids


ORACLES = ("top-k", "positives")  # what the oracle feeds: the scorer's top K of the scored candidates | its positives


def check_oracle(oracle: str) -> None:
    if oracle not in ORACLES:
        raise argument_error("oracle", oracle, f"must be one of {', '.join(ORACLES)}")


def oracle_neighbors(candidates: np.ndarray, target: np.ndarray, k: int, oracle: str = "top-k") -> np.ndarray:
    """The scorer's best candidates [C, k] by s_t: oracle "top-k" ranks every scored candidate (finite s_t), so the
    positives come first and a query chunk gets k neighbours wherever k were scored; "positives" ranks only the
    positives (s_t > 0). -1 where fewer exist. The retrieval metrics count only positives, so both rank the same."""
    check_oracle(oracle)
    cand = np.asarray(candidates, dtype=np.int64)
    t = np.asarray(target, dtype=np.float64)
    keep = (cand >= 0) & np.isfinite(t) & ((t > 0) if oracle == "positives" else True)
    score = np.where(keep, t, -np.inf)
    order = np.argsort(-score, axis=1, kind="stable")[:, :k]
    ids = np.take_along_axis(cand, order, 1)
    ids[~np.isfinite(np.take_along_axis(score, order, 1))] = -1
    if ids.shape[1] < k:
        ids = np.pad(ids, ((0, 0), (0, k - ids.shape[1])), constant_values=-1)
    return ids


def scored_queries(target: np.ndarray) -> np.ndarray:
    """Bool [C]: query chunks whose gold was scored (a finite s_t in their label row). Under a sampled gold (`rpt label
    --query-fraction`) the others have no gold, so the oracle gives them no neighbours."""
    t = np.asarray(target, dtype=np.float64)
    return np.isfinite(t).any(axis=1) if t.ndim == 2 and t.shape[1] else np.zeros(len(t), dtype=bool)


def scored_sums(chunk_nll: np.ndarray, chunk_tokens: np.ndarray, target: np.ndarray) -> dict[str, float]:
    """{"nll_sum", "n_targets"} over the target chunks c_{i+1} of the query chunks i whose gold was scored
    (`scored_queries`): the tokens on which the oracle's neighbours are the scorer's best, so the oracle is a ceiling
    only there. chunk_nll / chunk_tokens [C_all] as in DocumentEval; target [C, k] the document's label rows."""
    idx = np.nonzero(scored_queries(target))[0] + 1
    idx = idx[idx < len(chunk_nll)]
    return {"nll_sum": float(np.asarray(chunk_nll)[idx].sum()), "n_targets": float(np.asarray(chunk_tokens)[idx].sum())}


# --------------------------------------------------------------------------------------------------------------
# one document


@dataclass
class DocumentEval:
    """What evaluating one document gives.

    nll_sum / n_targets  summed NLL (nats) over the predicted tokens (all but the first) and their number
    chunk_nll [C_all]    summed NLL of the tokens of each chunk (C_all = ceil(T / M); token 0 is never predicted)
    chunk_tokens [C_all] predicted tokens of each chunk
    neighbors [C, K]     neighbour ids CCA used for each finished chunk (document-absolute, -1 empty); None for xl
    top_ids [C, R]       the retriever's own top-R (R = max(K, retrieve_k)); None without a retriever
    memory_bytes         size of the document memory at the end of the document (its peak: it only grows)
    kv_cache_bytes       size of the sliding-window K/V cache at the end (bounded by two segments per layer)
    """

    nll_sum: float
    n_targets: int
    chunk_nll: np.ndarray
    chunk_tokens: np.ndarray
    neighbors: np.ndarray | None
    top_ids: np.ndarray | None
    memory_bytes: int
    kv_cache_bytes: int
    seconds: float


def evaluate_document(model: torch.nn.Module, tokens: np.ndarray | torch.Tensor, *, neighbor_ids: np.ndarray | None = None,
                      n_neighbors: int | None = None, memory: Callable[[], ChunkMemory] | None = None,
                      retrieve_k: int | None = None, on_tokens: Callable[[int], None] | None = None,
                      autocast_dtype: torch.dtype | None = None) -> DocumentEval:
    """NLL of one document [T], segment by segment with a new cache (model in eval mode; its device is used).

    neighbor_ids [T // M, K'] document-absolute ids fed to CCA instead of the model's own retriever (bm25 / oracle /
    none sources); None = the model retrieves itself (or has no retrieval, xl). autocast_dtype: e.g. torch.bfloat16 to
    run the model under autocast (GPUs); the NLL is always computed in fp32.
    """
    cfg = model.cfg
    M, S = cfg.chunk_size, cfg.segment_len
    device = next(model.parameters()).device
    t0 = time.perf_counter()
    x = torch.as_tensor(np.asarray(tokens, dtype=np.int64), device=device)[None]  # [1, T]
    T = x.shape[1]
    n_all = -(-T // M)
    chunk_nll = torch.zeros(n_all, dtype=torch.float64, device=device)
    chunk_tok = torch.zeros(n_all, dtype=torch.float64, device=device)
    nb = None if neighbor_ids is None else torch.as_tensor(np.asarray(neighbor_ids, dtype=np.int64), device=device)[None]
    cache = model.new_cache(memory=memory)
    used, top = [], []
    for p in range(0, T, S):  # one segment per call: the cache keeps the previous segment's K/V
        n = min(S, T - p)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            out = model.step(x[:, p : p + n], cache, neighbor_ids=nb, n_neighbors=n_neighbors, retrieve_k=retrieve_k)
        tgt = x[0, p + 1 : p + n + 1]  # position t predicts token t + 1; the last token of the document predicts nothing
        nll = F.cross_entropy(out.logits[0, : len(tgt)].float(), tgt, reduction="none").double()  # [n or n-1]
        chunk_of = torch.arange(p + 1, p + 1 + len(tgt), device=device) // M
        chunk_nll.index_add_(0, chunk_of, nll)
        chunk_tok.index_add_(0, chunk_of, torch.ones_like(nll))
        if out.neighbor_ids is not None:
            used.append(out.neighbor_ids[0].cpu())
        if out.top_ids is not None:
            top.append(out.top_ids[0].cpu())
        if on_tokens is not None:
            on_tokens(n)
    mem_bytes, kv_bytes = cache.memory_bytes(), cache.window_bytes()
    return DocumentEval(
        nll_sum=float(chunk_nll.sum()), n_targets=int(chunk_tok.sum()), chunk_nll=chunk_nll.cpu().numpy(),
        chunk_tokens=chunk_tok.cpu().numpy().astype(np.int64),
        neighbors=torch.cat(used).numpy() if used else None, top_ids=torch.cat(top).numpy() if top else None,
        memory_bytes=int(mem_bytes), kv_cache_bytes=int(kv_bytes), seconds=time.perf_counter() - t0)


# --------------------------------------------------------------------------------------------------------------
# a split


def default_source(variant: str) -> str:
    return {"none": "none", "bm25": "bm25", "own": "model"}[spec(variant).neighbours]


def check_source(variant: str, source: str) -> None:
    if source not in SOURCES:
        raise argument_error("source", source, f"must be one of {', '.join(SOURCES)}")
    if spec(variant).neighbours == "none" and source != "none":
        raise argument_error("source", source, f"needs a retrieval model, and variant {variant} has no chunked "
                             "cross-attention (use source none)")
    if variant == "retro" and source == "model":
        raise argument_error("source", source, "variant retro has no retriever of its own: use source bm25 (its "
                             "inference-time neighbours), oracle or none")


def shard(docs: list[int], rank: int, world_size: int) -> list[int]:
    """This rank's documents: round-robin, so long and short documents spread over ranks."""
    return docs[rank::world_size]


def open_eval_labels(path: str | Path, store: TokenStore, segment_len: int, docs: list[int]):
    """A ``sem`` label store with span ``doc`` matching `store`, covering `docs`, or a UserError naming the mismatch."""
    from rpt.labels.store import LabelError, LabelStore

    try:
        labels = LabelStore.open(path)
        labels.check_compatible(store, segment_len, "doc", kind="sem")
    except LabelError as e:
        raise UserError(f"{e} (evaluation needs `rpt label --kind sem --span doc` labels of this split)") from None
    lo, hi = labels.doc_range
    missing = [d for d in docs if not lo <= d < hi]
    if missing:
        raise argument_error("labels", labels.path, f"covers documents {lo}..{hi - 1}, evaluation needs document "
                             f"{missing[0]}{' and more' if len(missing) > 1 else ''} (lower {{max_documents}} or label "
                             "all documents)")
    return labels


def evaluate(model: torch.nn.Module, store: TokenStore, docs: list[int], *, source: str = "model", n_neighbors: int = 2,
             labels=None, memory: Callable[[], ChunkMemory] | None = None, with_metrics: bool = False,
             per_chunk: bool = False, bm25_statistics: Literal["causal", "document"] = "causal", rank: int = 0,
             world_size: int = 1, progress: bool = False, autocast_dtype: torch.dtype | None = None,
             retriever=None, train_pool: int = 27, oracle: str = "top-k") -> dict[str, Any]:
    """Evaluate this rank's share of `docs`; returns sums (not yet reduced over ranks) and per-document records.
    train_pool: the largest pool of retrievable chunks a training span gave (`training_pool`), the first bound of
    the metrics' pool-size buckets.
    retriever: the DPR-style retriever of source "dpr" (`rpt.retrievers.dpr`); with --metrics it is ranked too.
    oracle: what source "oracle" feeds, "top-k" or "positives" (`oracle_neighbors`).

    Returns {"sums": {"nll_sum", "n_targets", "metrics.model.*", "metrics.bm25.*", "overlap.model.*", ...},
             "documents": [record, ...]} with one record per document of this rank (see `run_eval`).
    """
    from tqdm.auto import tqdm

    cfg = model.cfg
    M, S, K = cfg.chunk_size, cfg.segment_len, n_neighbors
    check_source(cfg.variant, source)
    check_oracle(oracle)
    if (source == "oracle" or with_metrics) and labels is None:
        if source == "oracle":
            raise argument_error("source", source, "needs {labels} (sem, span doc)")
        raise argument_error("with_metrics", problem="needs {labels} (sem, span doc)")
    if source == "dpr" and retriever is None:
        raise argument_error("source", source, "needs {retriever}: a folder trained by `rpt dpr`, or hf:NAME")
    mine = shard(docs, rank, world_size)
    lengths = store.doc_lengths()
    bar = tqdm(total=int(sum(int(lengths[d]) for d in mine)), unit="tok", unit_scale=True, desc="eval",
               disable=not progress)
    sums: dict[str, float] = {"nll_sum": 0.0, "n_targets": 0.0}
    records = []
    retrieve_k = METRIC_DEPTH if with_metrics and cfg.has_retriever else None
    for d in mine:
        tokens = np.asarray(store.document(d), dtype=np.int64)
        n_chunks = len(tokens) // M
        rows = labels.rows(d) if labels is not None else None
        bm25_ids = None
        if source == "bm25" or with_metrics:
            bm25_ids = bm25_neighbors(tokens, M, S, max(K, METRIC_DEPTH if with_metrics else K), bm25_statistics)
        dpr_ids = None
        if source == "dpr" or (with_metrics and retriever is not None):
            from rpt.retrievers.dpr import dpr_neighbors

            dpr_ids = dpr_neighbors(retriever, tokens, M, S, max(K, METRIC_DEPTH if with_metrics else K))
        supplied = None
        if source == "bm25":
            supplied = bm25_ids[:, :K]
        elif source == "dpr":
            supplied = dpr_ids[:, :K]
        elif source == "oracle":
            supplied = oracle_neighbors(rows.candidates, rows.target, K, oracle)
        elif source == "random":
            supplied = random_neighbors(n_chunks, M, S, K, doc=d)
        elif source == "none" and cfg.uses_retrieval:
            supplied = np.full((n_chunks, K), -1, np.int64)
        ev = evaluate_document(model, tokens, neighbor_ids=supplied, n_neighbors=K, memory=memory,
                               retrieve_k=retrieve_k, on_tokens=bar.update, autocast_dtype=autocast_dtype)
        sums["nll_sum"] += ev.nll_sum
        sums["n_targets"] += ev.n_targets
        rec: dict[str, Any] = {"index": d, "id": store.doc_ids[d], "n_tokens": len(tokens), "n_chunks": n_chunks,
                               "nll_sum": ev.nll_sum, "n_targets": ev.n_targets,
                               "perplexity": math.exp(ev.nll_sum / ev.n_targets) if ev.n_targets else None,
                               "memory_bytes": ev.memory_bytes, "kv_cache_bytes": ev.kv_cache_bytes, "seconds": ev.seconds}
        if rows is not None:  # the tokens whose neighbours come from a query chunk with scored gold
            part = scored_sums(ev.chunk_nll, ev.chunk_tokens, rows.target)
            rec["scored"] = part
            for key, v in part.items():
                sums[f"scored.{key}"] = sums.get(f"scored.{key}", 0.0) + v
        if with_metrics:
            pool = pool_size(np.arange(n_chunks), M, S)
            stats = metrics.query_stats(rows.candidates, rows.target, pool)
            rankings = {"bm25": bm25_ids[:, :METRIC_DEPTH]}
            if dpr_ids is not None:
                rankings["dpr"] = dpr_ids[:, :METRIC_DEPTH]
            if ev.top_ids is not None:
                rankings = {"model": ev.top_ids[:, :METRIC_DEPTH], **rankings}
            rankings["recency"] = metrics.recency_ranking(pool, METRIC_DEPTH)
            values = {name: metrics.ranking_values(ranked, rows.candidates, rows.target)
                      for name, ranked in rankings.items()}
            values["random"] = metrics.expected_random(rows.candidates, rows.target, pool)
            values["oracle"] = metrics.ranking_values(oracle_neighbors(rows.candidates, rows.target, METRIC_DEPTH),
                                                      rows.candidates, rows.target)
            rec["metrics"] = {}  # this document's sums (no buckets), for per-document intervals (python -m lab compare)
            for name, v in values.items():
                for key, x in metrics.bucketed_sums(v, stats, metrics.pool_buckets(train_pool)).items():
                    sums[f"metrics.{name}.{key}"] = sums.get(f"metrics.{name}.{key}", 0.0) + x
                    if "|" not in key and key not in ("n_scored", "positives_sum", "pool_sum"):
                        rec["metrics"].setdefault(name, {})[key] = x
            for name, ranked in rankings.items():
                if name == "recency":
                    continue
                for key, v in analysis.overlap_sums(tokens, M, ranked[:, 0]).items():
                    sums[f"overlap.{name}.{key}"] = sums.get(f"overlap.{name}.{key}", 0.0) + v
        if per_chunk:
            rec["chunks"] = {"nll": ev.chunk_nll.tolist(), "tokens": ev.chunk_tokens.tolist(),
                             "neighbors": None if ev.neighbors is None else ev.neighbors.tolist()}
        records.append(rec)
    bar.close()
    return {"sums": sums, "documents": records}


def reduce_sums(sums: dict[str, float], names: list[str], info) -> dict[str, float]:
    """All-reduce (sum) the named sums over ranks, in float64, in a fixed order."""
    from rpt.training import distributed as D

    t = torch.tensor([float(sums.get(n, 0.0)) for n in names], dtype=torch.float64, device=info.device)
    D.all_reduce_sum(t, info)
    return dict(zip(names, t.tolist(), strict=True))


def gold_name(manifest: dict[str, Any]) -> str:
    """What a label store's gold holds: "exhaustive" (every retrievable chunk scored) or "bm25 top-k" (k = ...)."""
    if manifest.get("candidates", "bm25") == "all":
        frac = float(manifest.get("query_fraction", 1.0))
        return "exhaustive" + ("" if frac >= 1 else f" (a {frac:g} sample of query chunks)")
    return f"bm25 top-k (k = {manifest.get('k')}): only BM25's candidates can be positives"


def training_pool(seq_len: int, chunk_size: int, segment_len: int) -> int:
    """The largest number of retrievable chunks a query of a training span of seq_len tokens has (pair queries: the
    last chunk with a target)."""
    return int(pool_size(seq_len // chunk_size - 2, chunk_size, segment_len))


def summarize(sums: dict[str, float], documents: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """Totals, retrieval metrics and overlaps from reduced sums (the one division)."""
    n = sums["n_targets"]
    total = {"n_documents": len(documents), "n_tokens": int(sum(r["n_tokens"] for r in documents)),
             "nll_sum": sums["nll_sum"], "n_targets": int(n), "nll_mean": sums["nll_sum"] / n if n else None,
             "perplexity": math.exp(sums["nll_sum"] / n) if n else None, "seconds": seconds,
             "tokens_per_second": sum(r["n_tokens"] for r in documents) / seconds if seconds > 0 else None,
             "peak_memory_bytes": max((r["memory_bytes"] for r in documents), default=0)}
    if "scored.n_targets" in sums:  # evaluated with labels: the same figure over the tokens whose gold was scored
        ns = sums["scored.n_targets"]
        total["scored"] = {"nll_sum": sums["scored.nll_sum"], "n_targets": int(ns),
                           "perplexity": math.exp(sums["scored.nll_sum"] / ns) if ns else None,
                           "token_share": ns / n if n else None, "definition": SCORED}
    out: dict[str, Any] = {"total": total}

    def group(prefix: str) -> dict[str, dict[str, float]]:
        g: dict[str, dict[str, float]] = {}
        for k, v in sums.items():
            if k.startswith(prefix + "."):
                name, key = k[len(prefix) + 1 :].split(".", 1)
                g.setdefault(name, {})[key] = v
        return g

    if ret := group("metrics"):
        first = ("model", "bm25", "dpr", "recency", "random", "oracle")
        out["retrieval"] = {name: metrics.finalize(ret[name])
                            for name in sorted(ret, key=lambda n: (first.index(n) if n in first else 9, n))}
        out["retrieval"]["gain"] = metrics.GAIN
        out["retrieval"]["chance"] = metrics.CHANCE
    if ov := group("overlap"):
        out["overlap"] = {name: analysis.finalize_overlap(ov[name]) for name in sorted(ov, key=lambda n: (n != "model", n))}
        out["overlap"]["definition"] = analysis.OVERLAP
    return out


def subgroups_against(result: dict[str, Any], baseline: dict[str, Any], labels, chunk_size: int,
                      segment_len: int) -> dict[str, Any]:
    """Relative improvement over a Transformer-XL result file, per document chunk, split by gold retrieved or not.
    Both results must hold per-chunk data ("chunks") for the same documents."""
    base_docs = {r["index"]: r for r in baseline.get("documents", [])}
    sums: dict[str, float] = {}
    for rec in result["documents"]:
        b = base_docs.get(rec["index"])
        if b is None or b["id"] != rec["id"] or b["n_tokens"] != rec["n_tokens"]:
            raise UserError(f"baseline result has no matching document {rec['index']} ({rec['id']}): evaluate the "
                            "baseline on the same store and split")
        if "chunks" not in b or "chunks" not in rec or rec["chunks"]["neighbors"] is None:
            raise UserError("subgroup analysis needs per-chunk data in both results (per_chunk=True, rpt eval --per-chunk) from "
                            "a retrieval model")
        if not rec["n_chunks"]:
            continue
        rows = labels.rows(rec["index"])
        neighbors = np.asarray(rec["chunks"]["neighbors"], dtype=np.int64).reshape(rec["n_chunks"], -1)
        s = analysis.subgroup_sums(np.asarray(rec["chunks"]["nll"]), np.asarray(b["chunks"]["nll"]),
                                   np.asarray(rec["chunks"]["tokens"]), neighbors, np.asarray(rows.candidates),
                                   np.asarray(rows.target), chunk_size, segment_len)
        sums = {k: sums.get(k, 0.0) + v for k, v in s.items()}
    return {**analysis.finalize_subgroups(sums), "definition": analysis.IMPROVEMENT}


def read_result(path: str | Path, arg: str, per_chunk: bool = False) -> dict[str, Any]:
    """A result JSON written by `run_eval` (the file argument `arg` names; a flag such as "--baseline" is read as its
    argument), checked before any evaluation: a file that is not JSON, or JSON of something else, is an
    ArgumentError naming it, not a KeyError (or a traceback) after minutes of work.
    per_chunk: it must also hold per-chunk data (made with per_chunk=True), as a baseline needs."""
    arg = arg.lstrip("-").replace("-", "_")
    p = Path(path)
    if not p.is_file():
        raise argument_error(arg, p, "no such result file")
    try:
        result = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise argument_error(arg, p, f"not a JSON file ({e})") from None
    if (not isinstance(result, dict) or not {"format_version", "config", "eval", "total", "documents"} <= set(result)
            or not isinstance(result["eval"], dict)):
        raise argument_error(arg, p, "not a result of `rpt eval` (no format_version, config, eval, total and documents)")
    if result["format_version"] != RESULT_VERSION:
        raise argument_error(arg, p, f"result format {result['format_version']}, this version reads {RESULT_VERSION}")
    if per_chunk and not result["eval"].get("per_chunk"):
        raise argument_error(arg, p, "has no per-chunk data; evaluate it again with {per_chunk=True}")
    return result


def run_eval(checkpoint: str | Path | None, store: Any, settings: EvalConfig | None = None, *,
             out: str | Path | None = None, device: str | None = None, progress: bool = True,
             loaded: Any = None) -> dict[str, Any]:
    """`rpt eval`: perplexity of a checkpoint over the documents of a split, optionally with retrieval metrics and the
    §5.4 analyses, as `settings` (an EvalConfig: the eval section of a config; default EvalConfig()) says. Writes the
    result JSON to `out` (rank 0) and returns it.

    `store` is a token store root (or one split's folder), or an opened store (anything with TokenStore's `document`,
    `doc_lengths`, `doc_ids`, `path` and `check_compatible`, e.g. documents tokenized in memory by `rpt.evaluate`).
    `loaded`: a model already loaded (`rpt.load`, an `rpt.decoding.LoadedModel`), evaluated on its own device instead
    of loading `checkpoint` (which may then be None). Layout of the result::

        {"format_version": 1, "checkpoint": str, "step": int | None, "config": RPTConfig as a dict,
         "environment": rpt.utils.environment() (machine, CPU and its kernels, GPU, threads, versions),
         "train_environments": [{"from_step", **environment}]  (the checkpoint's, see rpt.checkpoint),
         "eval": {"store", "split", "n_neighbors", "source", "memory", "labels", "max_documents", "device",
                  "world_size", "tokenizer_checked", "per_chunk", "baseline", "bm25_statistics", "precision",
                  "retriever", "memory_tokens", "oracle", ["gold", "query_fraction"] (with labels)},
         "total": {"n_documents", "n_tokens", "nll_sum", "n_targets", "nll_mean", "perplexity", "seconds",
                   "tokens_per_second", "peak_memory_bytes",
                   ["scored": {"nll_sum", "n_targets", "perplexity", "token_share", "definition"}]  (with labels)},
         "documents": [{"index", "id", "n_tokens", "n_chunks", "nll_sum", "n_targets", "perplexity", "memory_bytes",
                        "kv_cache_bytes", "seconds", ["scored": {"nll_sum", "n_targets"}],
                        ["chunks": {"nll": [C_all], "tokens": [C_all], "neighbors": [[K] x C] | null}]}],
         ["retrieval": {"model": {"precision@2", "recall@10", "ndcg@20", "n_queries"}, "bm25": {...}, "gain": str}],
         ["overlap": {"model": {"query", "target", "n"}, "bm25": {...}, "definition": str}],
         ["subgroups": {"gold": {"improvement", "n"}, "no_gold": {...}, "all": {...}, "definition": str}]}
    """
    from rpt.data.store import StoreError as _StoreError
    from rpt.training import distributed as D

    s = settings if settings is not None else EvalConfig()
    if not isinstance(s, EvalConfig):
        raise argument_error("settings", s, "must be an rpt.config.EvalConfig")
    split, n_neighbors, memory, max_documents = s.split, s.n_neighbors, s.memory, s.max_documents
    with_metrics, per_chunk, bm25_statistics, precision = s.with_metrics, s.per_chunk, s.bm25_statistics, s.precision
    source = None if s.source == "auto" else s.source
    labels, baseline, retriever = s.labels or None, s.baseline or None, s.retriever or None
    memory_tokens = s.memory_tokens or None
    check_neighbors(n_neighbors, "n_neighbors")
    if max_documents < 0:
        raise argument_error("max_documents", max_documents, "must be >= 0")
    if loaded is not None and memory_tokens is not None:
        raise argument_error("memory_tokens", memory_tokens, "give a checkpoint path, not a loaded model: the model is "
                             "built with that memory")
    # before anything heavy: a wrong path is the commonest mistake
    ckpt = resolve_checkpoint(checkpoint) if loaded is None else Path(loaded.path)
    tokens_store = open_split(store, split) if isinstance(store, (str, Path)) else store
    base = None
    if baseline is not None:
        base = read_result(baseline, "baseline", per_chunk=True)
        per_chunk = True
    if loaded is not None:
        device = str(next(loaded.model.parameters()).device)
    info = D.setup(None if device in (None, "auto") else device)
    dev = info.device
    if device not in (None, "auto") and info.world_size == 1:
        dev = torch.device(device)
    try:
        if loaded is None:
            model, cfg = load_model(ckpt, dev, memory_tokens=memory_tokens)
            tok_id = checkpoint_tokenizer(ckpt, cfg)
        else:
            model, cfg = loaded.model.eval(), loaded.config
            tok_id = loaded.tokenizer.identity if loaded.tokenizer is not None else None
        mcfg = model.cfg
        try:
            tokens_store.check_compatible(tokenizer_id=tok_id, chunk_size=mcfg.chunk_size, vocab_size=mcfg.vocab_size)
        except _StoreError as e:
            raise UserError(f"checkpoint {ckpt} does not match the token store: {e}") from None
        source = source or default_source(mcfg.variant)
        check_source(mcfg.variant, source)
        docs = list(range(len(tokens_store)))[: max_documents or None]
        label_store = None
        if labels is not None:
            label_store = open_eval_labels(labels, tokens_store, mcfg.segment_len, docs)
        elif source == "oracle" or with_metrics or base is not None:
            need = (f"needs {{labels}}: a sem label store of this split with span doc (`rpt label --store {store} "
                    f"--split {split} --kind sem --span doc`)")
            if source == "oracle":
                raise argument_error("source", source, need)
            raise argument_error("with_metrics" if with_metrics else "baseline", problem=need)
        factory = make_memory(memory, dev)
        dpr = None
        if retriever is not None:
            from rpt.retrievers.dpr import load_retriever

            dpr = load_retriever(retriever, dev)
            dpr.check_store(tokens_store)
            dpr.check_chunks(mcfg.chunk_size, 0)
        if precision not in ("fp32", "bf16"):
            raise argument_error("precision", precision, "must be fp32 or bf16")
        if precision == "bf16" and dev.type != "cuda":
            warnings.warn("bf16 is for GPUs (bf16 matmuls are ~600x slower on these CPUs): evaluating in fp32", stacklevel=2)
            precision = "fp32"
        t0 = time.perf_counter()
        part = evaluate(model, tokens_store, docs, source=source, n_neighbors=n_neighbors, labels=label_store,
                        memory=factory, with_metrics=with_metrics, per_chunk=per_chunk, bm25_statistics=bm25_statistics,
                        rank=info.rank, world_size=info.world_size, progress=progress and info.is_main,
                        autocast_dtype=torch.bfloat16 if precision == "bf16" else None, retriever=dpr,
                        train_pool=training_pool(cfg.data.seq_len, mcfg.chunk_size, mcfg.segment_len),
                        oracle=s.oracle)
        # every rank reduces the same names in the same order (a rank without documents has no metric keys)
        names = sorted({n for ns in D.all_gather_object(sorted(part["sums"]), info) for n in ns})
        sums = reduce_sums(part["sums"], names, info)
        documents = sorted((r for rs in D.all_gather_object(part["documents"], info) for r in rs), key=lambda r: r["index"])
        seconds = max(D.all_gather_object(time.perf_counter() - t0, info))
        state = read_state(ckpt)  # {} for a folder without one (an export)
        result: dict[str, Any] = {
            "format_version": RESULT_VERSION,
            "checkpoint": str(ckpt),
            "step": state.get("step"),
            "config": cfg.to_dict(),
            "eval": {"store": str(tokens_store.path), "split": split, "n_neighbors": n_neighbors, "source": source,
                     "memory": memory_name(factory) if spec(mcfg.variant).state in ("chunk-memory", "token-memory") else None,
                     "labels": None if label_store is None else str(label_store.path), "max_documents": max_documents,
                     "device": str(dev), "world_size": info.world_size, "tokenizer_checked": tok_id is not None,
                     "per_chunk": per_chunk, "baseline": None if baseline is None else str(baseline),
                     "bm25_statistics": bm25_statistics, "precision": precision,
                     "retriever": None if dpr is None else str(retriever),
                     "memory_tokens": memory_tokens, "oracle": s.oracle},
        }
        result["environment"] = environment()
        # where the checkpoint was trained (one entry per stretch of updates; none for a checkpoint from before rpt
        # recorded it): the figures depend on it more than on where they were evaluated
        result["train_environments"] = state.get("environments", [])
        result.update(summarize(sums, documents, seconds))
        if label_store is not None:  # what the labels' gold holds, for the oracle and the scored-chunk figures
            result["eval"]["gold"] = gold_name(label_store.manifest)
            result["eval"]["query_fraction"] = float(label_store.manifest.get("query_fraction", 1.0))
        if "retrieval" in result:
            result["retrieval"]["gold"] = gold_name(label_store.manifest)
        result["documents"] = documents
        if base is not None and info.is_main:
            result["subgroups"] = subgroups_against(result, base, label_store, mcfg.chunk_size, mcfg.segment_len)
        if out is not None and info.is_main:
            write_json_atomic(out, result, "eval")
        return result
    finally:
        D.teardown(info)
