"""`rpt explore`: an HTML page showing, for every chunk of one document, what the model retrieved next to BM25 and the
scorer's gold candidates (rpt/eval/explore.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "write an HTML page of one document's query chunks with the model's, BM25's and the gold neighbours"
ORDER = 55


def add_arguments(p: argparse.ArgumentParser) -> None:
    from rpt.commands.options import add_device
    from rpt.config import MAX_NEIGHBORS

    p.add_argument("--checkpoint", required=True, help="a checkpoint folder, its model.safetensors, or a run folder")
    p.add_argument("--store", help="token store root written by `rpt prepare` (the document is <store>/<split> --doc)")
    p.add_argument("--split", default="test", help="split of --store (default test)")
    p.add_argument("--doc", default="0", help="document index in the split, or its id from documents.jsonl (default 0)")
    p.add_argument("--text", help="explore a text file instead of a stored document (encoded with the checkpoint's "
                   "tokenizer; no labels)")
    p.add_argument("--labels", help="label store with whole-document spans (`rpt label --span doc`) for the gold column; "
                   "default: <store>/labels/<split>-sem-doc (or -lex-doc) when it exists")
    p.add_argument("--out", default="explore.html", help="the HTML file to write (default explore.html)")
    p.add_argument("--top", type=int, default=4, help="neighbours shown per column (default 4)")
    p.add_argument("--neighbors", type=int, help=f"K neighbours fed to CCA, 1..{MAX_NEIGHBORS} (default: the model's "
                   "n_neighbors; the paper uses 2 to 4)")
    p.add_argument("--chunks", help="query chunks to show: A:B (A to B-1), A: (A to the end) or A; a query chunk needs a "
                   "target chunk after it, so A is at most the document's chunk count - 2 (default: every chunk that "
                   "can retrieve)")
    p.add_argument("--compare", default="", help="comma list of none,bm25,gold: also compute each target chunk's loss "
                   "with no neighbours / BM25's / the gold ones fed to CCA (one more pass over the document each)")
    p.add_argument("--memory", choices=["auto", "torch", "faiss"], default="auto",
                   help="document memory: torch matmul, Faiss on CPU, or auto (torch on GPU, Faiss on CPU if installed)")
    p.add_argument("--tokenizer", help="tokenizer.json (default: the checkpoint's, else the store's); refused when the "
                   "run recorded another one")
    p.add_argument("--allow-other-tokenizer", action="store_true", help="use --tokenizer even though the run recorded "
                   "another tokenizer (one you know maps the same ids to the same tokens)")
    add_device(p, "model")
    p.add_argument("--threads", type=int, help="torch CPU threads (set once, at start)")


def _chunk_range(spec: str | None, n_chunks: int) -> range | None:
    """--chunks as a range of query chunks of a document of `n_chunks` chunks. Query chunks are 0 .. n_chunks - 2 (the
    last chunk has no target); an empty or reversed range, or one that starts past them, selects nothing and is an
    error rather than a page without chunks. An end past the document is cut to it (A: means exactly that)."""
    from rpt.utils import UserError

    if not spec:
        return None
    a, sep, b = spec.partition(":")
    try:
        lo = int(a) if a else 0
        hi = int(b) if b else sys.maxsize
        if not sep:
            hi = lo + 1
    except ValueError:
        raise UserError(f"--chunks {spec!r}: expected A:B (e.g. 40:80), A: or a single chunk index") from None
    last = n_chunks - 2
    if lo < 0 or hi <= lo:
        raise UserError(f"--chunks {spec!r}: an empty or reversed range; give A:B with 0 <= A < B (query chunks 0..{last})")
    if lo > last:
        raise UserError(f"--chunks {spec!r}: the document has query chunks 0..{last} ({n_chunks} chunks; the last one "
                        "is only a target)")
    return range(lo, min(hi, last + 1))


def _doc_index(store, doc: str) -> int:
    from rpt.utils import UserError

    if doc in store.doc_ids:
        return store.doc_ids.index(doc)
    try:
        d = int(doc)
    except ValueError:
        raise UserError(f"--doc {doc!r}: no document with that id in {store.path}") from None
    if not 0 <= d < len(store):
        raise UserError(f"--doc {d}: {store.path} has documents 0..{len(store) - 1}")
    return d


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from rpt.utils import resolve_device

    if args.threads:
        torch.set_num_threads(args.threads)
    from rpt.outputs import claim_file
    from rpt.utils import write_text_atomic

    claim_file(args.out, "explore", inputs={"checkpoint": args.checkpoint})  # before any work
    from rpt.api import load_model
    from rpt.config import check_neighbors
    from rpt.data.store import StoreError, TokenStore
    from rpt.data.tokenizer import Tokenizer
    from rpt.decoding import memory_factory, read_text_file
    from rpt.eval.explore import COMPARE, explore_document, render_html
    from rpt.utils import UserError

    if (args.store is None) == (args.text is None):
        raise UserError("give the document with --store ROOT [--split S --doc D] or with --text FILE (one of them)")
    if args.text and args.labels:
        raise UserError("--labels go with a stored document (--store), not with --text")
    compare = [c.strip() for c in args.compare.split(",") if c.strip()]
    bad = [c for c in compare if c not in COMPARE]
    if bad:
        raise UserError(f"--compare: unknown {bad}; choose from {','.join(COMPARE)}")
    if args.top < 1:
        raise UserError("--top must be >= 1")
    check_neighbors(args.neighbors)
    device = str(resolve_device(args.device))
    loaded = load_model(args.checkpoint, device, args.tokenizer, allow_other_tokenizer=args.allow_other_tokenizer)
    mcfg = loaded.config.model
    tok = loaded.tokenizer
    meta: dict[str, str] = {"checkpoint": str(loaded.path)}
    labels, label_kind = None, "sem"

    if args.text:
        text = read_text_file(args.text, "--text")
        if tok is None:
            raise UserError(f"cannot find the tokenizer of {loaded.path}: pass --tokenizer")
        tokens = np.asarray(tok.encode(text), dtype=np.int64)
        meta["document"] = args.text
    else:
        root = Path(args.store)
        try:
            store = TokenStore.open(root / args.split)
        except StoreError as e:
            raise UserError(str(e)) from None
        if tok is None:
            if not (root / "tokenizer.json").is_file():
                raise UserError(f"cannot find the tokenizer of {loaded.path} nor {root}/tokenizer.json: pass --tokenizer")
            tok = Tokenizer.from_file(root / "tokenizer.json")
            print(f"rpt explore: warning: {loaded.path} names no tokenizer; using {root}/tokenizer.json (unverified)",
                  file=sys.stderr)
        if store.tokenizer_id.get("hash") != tok.hash:
            raise UserError(f"{store.path} was tokenized with {store.tokenizer_id.get('name')} (hash "
                            f"{str(store.tokenizer_id.get('hash'))[:12]}), but the checkpoint's tokenizer is {tok.name} "
                            f"(hash {tok.hash[:12]}): explore a store made with the model's tokenizer")
        if store.chunk_size != mcfg.chunk_size:
            raise UserError(f"{store.path} has chunk_size {store.chunk_size}, the model {mcfg.chunk_size}")
        d = _doc_index(store, args.doc)
        tokens = np.asarray(store.document(d), dtype=np.int64)
        meta["document"] = f"{store.path} #{d} ({store.doc_ids[d]})"
        label_path = Path(args.labels) if args.labels else None
        for kind in ("sem", "lex"):  # labels made for this split with whole-document spans, when they exist
            default = root / "labels" / f"{args.split}-{kind}-doc"
            if label_path is None and (default / "manifest.json").is_file():
                label_path = default
        if label_path is not None:
            from rpt.labels.store import LabelStore

            ls = LabelStore.open(label_path)  # LabelError (a ValueError) says what is missing
            ls.check_compatible(store, mcfg.segment_len, span="doc")
            labels, label_kind = ls.rows(d), ls.kind
            meta["labels"] = f"{label_path} ({ls.kind}, scorer {ls.manifest.get('scorer', '?')})"
    if len(tokens) < 2 * mcfg.chunk_size:
        raise UserError(f"the document has {len(tokens)} tokens: fewer than two chunks of {mcfg.chunk_size}")
    chunks = _chunk_range(args.chunks, len(tokens) // mcfg.chunk_size)
    exp = explore_document(loaded.model, tokens, labels=labels, label_kind=label_kind, top=args.top,
                           n_neighbors=args.neighbors, chunks=chunks, compare=compare,
                           memory=memory_factory(args.memory, device))
    page = render_html(exp, tok, title=f"RPT retrieval explorer — {meta['document']}", meta=meta)
    out = write_text_atomic(args.out, page)
    print(f"wrote {out} ({len(exp.queries)} query chunks, {len(page) / 1e6:.1f} MB)")
    return 0
