"""`rpt prepare`: a corpus -> one memory-mapped token store per split, plus the tokenizer, under one folder.

    <out>/
      tokenizer.json       the tokenizer every store below was written with (its hash is in each manifest)
      train/               a TokenStore (tokens.bin, offsets.npy, documents.jsonl, manifest.json)
      validation/
      test/
      prepare.json         the run's summary: corpus, tokenizer identity, per-split statistics, time

The corpus is streamed: documents are read one at a time and tokenized in batches of a few MB, so memory holds one
batch, never the corpus. Each store is published atomically by `StoreWriter` (a killed run leaves only a hidden
`.<split>.partial` folder, which `TokenStore.open` refuses with a hint).

Documents that cannot be used are skipped and counted by reason, never dropped silently: "empty" (only whitespace),
"too_short" (fewer than `min_chunks` chunks of `chunk_size` tokens: retrieval needs at least one earlier chunk),
plus the readers' reasons ("binary", "undecodable", ...). Counts and examples go into the manifest and the report.

An existing store is reused when its manifest matches the tokenizer, chunk size, corpus and filters; a mismatch is
an error naming the difference, and `force=True` (``--force``) rebuilds.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rpt.data.corpora import Corpus, Document, Skips, load_corpus, normalize_split
from rpt.data.store import StoreError, StoreWriter, TokenStore
from rpt.data.tokenizer import DEFAULT_SAMPLE_BYTES, Tokenizer, load_tokenizer
from rpt.utils import write_json_atomic

BATCH_CHARS = 4 << 20  # tokenize ~4 MB of text per encode_batch call
BATCH_DOCS = 256


@dataclass
class SplitStats:
    """What `prepare` reports for one split (also written into the store's manifest)."""

    split: str
    path: str
    documents: int = 0
    tokens: int = 0
    median_doc_tokens: float = 0.0
    mean_doc_tokens: float = 0.0
    min_doc_tokens: int = 0
    max_doc_tokens: int = 0
    documents_read: int = 0  # documents the corpus yielded (before the empty / too_short filters)
    skipped: dict[str, Any] = field(default_factory=dict)  # reason -> {"count", "examples"}
    seconds: float = 0.0
    reused: bool = False  # True: an up-to-date store was found and kept

    @property
    def n_skipped(self) -> int:
        return sum(v["count"] for v in self.skipped.values())


@dataclass
class PrepareSummary:
    out: str
    corpus: dict[str, Any]
    tokenizer: dict[str, Any]
    chunk_size: int
    min_tokens: int
    max_documents: int | None
    splits: list[SplitStats]
    seconds: float
    tokenizer_seconds: float
    tokenizer_cache_hit: bool | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def documents(self) -> int:
        return sum(s.documents for s in self.splits)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.splits)


def store_settings(corpus: Corpus, chunk_size: int, min_chunks: int, max_documents: int | None) -> dict[str, Any]:
    """The manifest fields (besides tokenizer and chunk size) that must match for a store to be reused."""
    return {"corpus": corpus.identity(), "min_tokens": min_chunks * chunk_size, "max_documents": max_documents}


def check_reusable(path: Path, tokenizer: Tokenizer, chunk_size: int, settings: dict[str, Any]) -> TokenStore:
    """Open the store at `path` and raise StoreError unless it was built with exactly these settings."""
    store = TokenStore.open(path)
    store.check_compatible(tokenizer_id=tokenizer.identity, chunk_size=chunk_size)
    for key, want in settings.items():
        have = store.manifest.get(key)
        if have != want:
            raise StoreError(f"{path} was built with {key}={have!r}, this run asks for {want!r}")
    return store


def prepare(corpus: str | Corpus, tokenizer: str | Tokenizer, out: str | Path, *, chunk_size: int = 64,
            splits: list[str] | None = None, max_documents: int | None = None, min_chunks: int = 2,
            force: bool = False, tokenizer_cache: str | Path | None = None,
            sample_bytes: int = DEFAULT_SAMPLE_BYTES, progress: bool | None = None) -> PrepareSummary:
    """Tokenize `corpus` into `<out>/<split>/` token stores; return the statistics (also in `<out>/prepare.json`).

    corpus: a spec for `load_corpus` or a Corpus. tokenizer: a spec for `load_tokenizer` (``bpe:<vocab>`` trains on
    the train split, at most `sample_bytes`, cached in `tokenizer_cache`) or a Tokenizer. max_documents: keep at most
    this many documents per split. min_chunks: shorter documents are skipped as "too_short".
    progress: a tqdm bar per split (None: only when stderr is a terminal).
    """
    t0 = time.perf_counter()
    if chunk_size < 1 or min_chunks < 1:
        raise ValueError(f"chunk_size ({chunk_size}) and min_chunks ({min_chunks}) must be >= 1")
    if max_documents is not None and max_documents < 1:
        raise ValueError(f"max_documents must be >= 1, got {max_documents}")
    corpus = load_corpus(corpus) if isinstance(corpus, str) else corpus
    splits = [normalize_split(s) for s in splits] if splits else list(corpus.splits)
    missing = [s for s in splits if s not in corpus.splits]
    if missing:
        raise ValueError(f"corpus {corpus.spec!r} has no split(s) {', '.join(missing)} (it has {', '.join(corpus.splits)})")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a folder")

    tt = time.perf_counter()
    if tokenizer == "corpus":
        if not hasattr(corpus, "tokenizer"):
            raise ValueError(f"corpus {corpus.spec!r} has no tokenizer of its own: pass a tokenizer (bpe:<vocab>, a "
                             "file, a name)")
        tokenizer = corpus.tokenizer()
    if isinstance(tokenizer, str):
        train_split = "train" if "train" in corpus.splits else corpus.splits[0]

        def training_texts() -> Iterator[str]:
            for _, text in _limit(corpus.documents(train_split), max_documents):
                yield text

        tokenizer = load_tokenizer(tokenizer, training_texts, cache_dir=tokenizer_cache, sample_bytes=sample_bytes)
    tokenizer_seconds = time.perf_counter() - tt
    settings = store_settings(corpus, chunk_size, min_chunks, max_documents)

    # Decide reuse before writing anything, so a mismatch fails fast and leaves the folder as it was.
    reuse: dict[str, TokenStore] = {}
    for split in splits:
        path = out / split
        if path.exists() and not force:
            try:
                reuse[split] = check_reusable(path, tokenizer, chunk_size, settings)
            except StoreError as e:
                raise StoreError(f"{e}; pass --force (force=True) to rebuild {path}") from None
    old_tok = out / "tokenizer.json"
    if reuse and old_tok.exists() and Tokenizer.from_file(old_tok).hash != tokenizer.hash:
        raise StoreError(f"{old_tok} differs from the tokenizer of the stores in {out}; pass --force to rebuild")

    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(old_tok)
    stats = []
    for split in splits:
        if split in reuse:
            stats.append(_stats_from_manifest(reuse[split]))
            continue
        stats.append(write_split(corpus, split, tokenizer, out / split, chunk_size=chunk_size, min_chunks=min_chunks,
                                 max_documents=max_documents, extra=settings, progress=progress))
    summary = PrepareSummary(out=str(out), corpus=corpus.identity(), tokenizer=tokenizer.identity, chunk_size=chunk_size,
                             min_tokens=min_chunks * chunk_size, max_documents=max_documents, splits=stats,
                             seconds=time.perf_counter() - t0, tokenizer_seconds=tokenizer_seconds,
                             tokenizer_cache_hit=tokenizer.cache_hit)
    write_json_atomic(out / "prepare.json", summary.to_dict())
    return summary


def write_split(corpus: Corpus, split: str, tokenizer: Tokenizer, path: Path, *, chunk_size: int, min_chunks: int,
                max_documents: int | None, extra: dict[str, Any], progress: bool | None = None) -> SplitStats:
    """Stream one split into a new store at `path` (published atomically when complete)."""
    t0 = time.perf_counter()
    skips = Skips()
    min_tokens = min_chunks * chunk_size
    lengths: list[int] = []
    n_read = n_tokens = 0
    bar = _progress(progress, f"prepare {split}")
    writer = StoreWriter(path, tokenizer.identity, chunk_size, extra=extra)
    try:
        with writer:
            for batch in _batches(corpus.documents(split, skips)):
                kept = []
                for doc in batch:
                    if doc.text.strip():
                        kept.append(doc)
                    else:
                        skips.add("empty", doc.id)
                        n_read += 1
                for doc, ids in zip(kept, tokenizer.encode_batch([d.text for d in kept]) if kept else [], strict=True):
                    if max_documents is not None and len(lengths) >= max_documents:
                        break
                    n_read += 1
                    if len(ids) < min_tokens:
                        skips.add("too_short", f"{doc.id} ({len(ids)} tokens)")
                        continue
                    writer.add(doc.id, ids)
                    lengths.append(len(ids))
                    n_tokens += len(ids)
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(tokens=f"{n_tokens:,}", refresh=False)
                if max_documents is not None and len(lengths) >= max_documents:
                    break
            arr = np.asarray(lengths, dtype=np.int64)
            stats = SplitStats(split=split, path=str(path), documents=len(arr), tokens=int(arr.sum()),
                               median_doc_tokens=float(np.median(arr)) if len(arr) else 0.0,
                               mean_doc_tokens=float(arr.mean()) if len(arr) else 0.0,
                               min_doc_tokens=int(arr.min()) if len(arr) else 0, max_doc_tokens=int(arr.max()) if len(arr) else 0,
                               documents_read=n_read, skipped=skips.to_dict())
            stats.seconds = time.perf_counter() - t0
            writer.close({"split": split, "mean_doc_tokens": stats.mean_doc_tokens, "min_doc_tokens": stats.min_doc_tokens,
                          "max_doc_tokens": stats.max_doc_tokens, "documents_read": n_read, "skipped": stats.skipped,
                          "seconds": round(stats.seconds, 3), "tokenized_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    finally:
        if bar is not None:
            bar.close()
    return stats


def _limit(docs: Iterator[Document], n: int | None) -> Iterator[Document]:
    for i, d in enumerate(docs):
        if n is not None and i >= n:
            return
        yield d


def _batches(docs: Iterator[Document]) -> Iterator[list[Document]]:
    batch: list[Document] = []
    chars = 0
    for d in docs:
        batch.append(d)
        chars += len(d.text)
        if chars >= BATCH_CHARS or len(batch) >= BATCH_DOCS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _progress(enabled: bool | None, desc: str) -> Any:
    if enabled is False or (enabled is None and not sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(desc=desc, unit="doc", dynamic_ncols=True)


def _stats_from_manifest(store: TokenStore) -> SplitStats:
    m = store.manifest
    return SplitStats(split=str(m.get("split", store.path.name)), path=str(store.path), documents=int(m["n_documents"]),
                      tokens=int(m["n_tokens"]), median_doc_tokens=float(m.get("median_doc_tokens", 0.0)),
                      mean_doc_tokens=float(m.get("mean_doc_tokens", 0.0)), min_doc_tokens=int(m.get("min_doc_tokens", 0)),
                      max_doc_tokens=int(m.get("max_doc_tokens", 0)), documents_read=int(m.get("documents_read", 0)),
                      skipped=m.get("skipped", {}), seconds=0.0, reused=True)


def format_summary(s: PrepareSummary) -> str:
    """The end-of-run report: one row per split, the skips by reason, the time."""
    tok = s.tokenizer
    hit = {True: ", from cache", False: ", trained", None: ""}[s.tokenizer_cache_hit]
    lines = [f"corpus {s.corpus['spec']}  ->  {s.out}",
             f"tokenizer {tok['name']} (vocab {tok['vocab_size']:,}, sha256 {tok['hash'][:12]}{hit}, "
             f"{s.tokenizer_seconds:.1f} s)",
             f"chunk size {s.chunk_size}; documents shorter than {s.min_tokens} tokens are skipped"
             + (f"; at most {s.max_documents} documents per split" if s.max_documents else ""),
             "",
             f"{'split':<11}{'documents':>10}{'tokens':>14}{'median':>10}{'mean':>10}{'skipped':>9}  time"]
    for st in s.splits:
        when = "reused" if st.reused else f"{st.seconds:.1f} s"
        lines.append(f"{st.split:<11}{st.documents:>10,}{st.tokens:>14,}{st.median_doc_tokens:>10,.0f}"
                     f"{st.mean_doc_tokens:>10,.0f}{st.n_skipped:>9,}  {when}")
    lines.append(f"{'total':<11}{s.documents:>10,}{s.tokens:>14,}")
    for st in s.splits:
        for reason, v in st.skipped.items():
            lines.append(f"  skipped in {st.split}: {v['count']} {reason} (e.g. {', '.join(v['examples'][:3])})")
        if st.documents == 0:
            lines.append(f"  warning: split {st.split} has no documents")
    lines.append(f"time {s.seconds:.1f} s (tokenizer {s.tokenizer_seconds:.1f} s)")
    return "\n".join(lines)
