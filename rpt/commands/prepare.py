"""`rpt prepare`: tokenize a corpus into per-split token stores (see rpt/data/prepare.py)."""

from __future__ import annotations

import argparse

HELP = "tokenize a corpus into per-split memory-mapped token stores (train/validation/test) with the tokenizer"
ORDER = 10
INTERRUPTED = ("finished splits are kept; a split cut short is left in a hidden .<split>.partial folder, which no "
               "verb takes for a store; run the same command to continue")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from rpt.commands.options import add_config

    p.add_argument("--corpus", help="stdlib | stdlib:<pkg,pkg> | code:<folder> | <folder> | <file.jsonl> | hf:pg19 | "
                   "hf:codeparrot | hf:proof-pile | hf:<name>@<local folder> | books from Debian packages: austen, kjv | "
                   "mathematics from Debian packages: pari, metamath, metamath:all, metamath:<file.mm,...>, coq (fetched with "
                   "apt-get download into ~/.cache/rpt/debian, or $RPT_CACHE_DIR/debian; <name>@<folder> reads one "
                   "unpacked there)  (default: data.corpus, stdlib)")
    p.add_argument("--tokenizer", help="bpe:<vocab> (trained on the train split, cached) | <tokenizer.json> or a "
                   "folder holding one (a Hugging Face model folder) | <model.gguf> (its tokenizer: a retrofit "
                   "backbone's own) | <Hugging Face name> | corpus (the corpus' own: synthetic corpora)  "
                   "(default: data.tokenizer, bpe:8192; corpus for synthetic:*)")
    p.add_argument("--out", help="output folder: <out>/<split>/ stores + tokenizer.json (default: data.store)")
    p.add_argument("--chunk-size", type=int, help="tokens per chunk M (default: the config's model.chunk_size, 64)")
    add_config(p, "its data section gives the defaults of the options above")
    p.add_argument("--max-documents", type=int, help="keep at most N documents per split")
    p.add_argument("--splits", help="comma-separated splits to prepare (default: all of the corpus')")
    p.add_argument("--min-chunks", type=int, default=2,
                   help="skip documents shorter than this many chunks (default 2: retrieval needs an earlier chunk)")
    p.add_argument("--force", action="store_true", help="rebuild stores that exist, even when they do not match: the "
                   "new store is built beside --out (hidden .<out>.build) and swapped in whole when complete, so a "
                   "killed run leaves the old store intact (the next --force run resumes the build)")
    p.add_argument("--tokenizer-cache", help="folder for trained tokenizers (default: ~/.cache/rpt/tokenizers, "
                   "or $RPT_CACHE_DIR/tokenizers)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from rpt.commands.options import config_of
    from rpt.config import DataConfig, RPTConfig
    from rpt.data.prepare import format_summary, prepare
    from rpt.data.store import StoreError
    from rpt.utils import UserError

    cfg = config_of(args)
    data = cfg.data if cfg else DataConfig()
    cfg_model_chunk = (cfg or RPTConfig()).model.chunk_size
    splits = [s.strip() for s in args.splits.split(",") if s.strip()] if args.splits else None
    corpus = args.corpus or data.corpus
    tokenizer = args.tokenizer or ("corpus" if corpus.startswith("synthetic:") else data.tokenizer)
    try:
        summary = prepare(corpus, tokenizer, args.out or data.store,
                          chunk_size=args.chunk_size if args.chunk_size is not None else cfg_model_chunk,
                          splits=splits, max_documents=args.max_documents, min_chunks=args.min_chunks,
                          force=args.force, tokenizer_cache=args.tokenizer_cache,
                          progress=False if args.no_progress else None)
    except StoreError as e:
        raise UserError(str(e)) from None
    print(format_summary(summary))
    for pkg in summary.provenance.get("debian", []):
        lic = pkg.get("license") or ("see " + pkg["copyright"] if pkg.get("copyright") else "unknown")
        print(f"source: Debian package {pkg['name']} {pkg.get('version') or '(version unknown)'}, licence {lic}")
    if summary.provenance.get("text_license"):
        print(f"text licence: {summary.provenance['text_license']}")
    return 0
