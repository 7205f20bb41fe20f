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
an error naming the difference, and `force=True` (``--force``) rebuilds. A run without force writes into `<out>`
split by split (a killed run resumes exactly: finished splits are reused), which is safe because every split it
keeps or writes has the tokenizer of `<out>/tokenizer.json`. A forced run may change the tokenizer, so it builds the
whole new store in a hidden sibling `.<out>.build/` and swaps it in only when complete: until then `<out>` is
entirely the old store; a killed forced run is resumed by the next one (its finished splits are kept) or discarded by
a later run without force. The swap renames `<out>` to `.<out>.old` (the commit point), the build to `<out>`, then
moves over what the old folder held besides the store (labels/, other files, splits of the same tokenizer that were
not rebuilt); a run killed in between is finished by the next `prepare` of that folder.

A training split without any usable document is an error (`EmptySplitError`) saying what was skipped and why.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rpt.data.corpora import SPLITS, Corpus, Document, Skips, load_corpus, normalize_split
from rpt.data.store import StoreError, StoreWriter, TokenStore, build_path, old_path, real_folder
from rpt.data.tokenizer import DEFAULT_SAMPLE_BYTES, Tokenizer, load_tokenizer
from rpt.locks import folder_lock
from rpt.outputs import Owner, claim_folder, mark_folder
from rpt.utils import argument_error, write_json_atomic


def _is_store_root(folder: Path) -> bool:
    """A store of an earlier rpt: its prepare.json, or a split whose manifest records a tokenizer hash."""
    if (folder / "prepare.json").is_file():
        return True
    for split in SPLITS:
        try:
            tok = json.loads((folder / split / "manifest.json").read_text()).get("tokenizer")
        except (OSError, ValueError, AttributeError, RecursionError):
            continue
        if isinstance(tok, dict) and tok.get("hash"):
            return True
    return False


# What `rpt prepare` writes into a store folder (rpt.outputs); labels/ is `rpt label`'s default place inside it
OWNER = Owner("prepare", ("tokenizer.json", "prepare.json", *SPLITS, "labels", ".*.partial", ".*.tmp"), _is_store_root)


def store_source(store: str | Path, tokenizer_hash: str | None = None) -> dict[str, str]:
    """What a store under `store` (a `rpt prepare` root, or one of its splits) was built from, as DataConfig fields:
    ``{"corpus": ..., "tokenizer": ..., "store": <its root>}`` from its prepare.json; {} for a store without one (built
    by an earlier rpt, or a single split written another way). With `tokenizer_hash`, only a store of that tokenizer."""
    root = Path(store)
    for folder in (root, root.parent):
        try:
            rec = json.loads((folder / "prepare.json").read_text())
            corpus, tokenizer = rec["corpus"]["spec"], rec["tokenizer"]["name"]
            same = tokenizer_hash is None or rec["tokenizer"].get("hash") == tokenizer_hash
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            continue
        if same and isinstance(corpus, str) and isinstance(tokenizer, str):
            return {"corpus": corpus, "tokenizer": tokenizer, "store": str(folder)}
    return {}


def corpus_paths(corpus: Corpus) -> list[Path]:
    """The local files or folders a corpus reads (none for corpora generated or found by name)."""
    found = [getattr(corpus, a, None) for a in ("root", "path", "folder", "local")]
    return [Path(p) for p in found if isinstance(p, (str, Path)) and str(p)]


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
    dropped: list[str] = field(default_factory=list)  # old splits of another tokenizer removed by a --force swap
    provenance: dict[str, Any] = field(default_factory=dict)  # Corpus.provenance(): source packages, versions, licences

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def documents(self) -> int:
        return sum(s.documents for s in self.splits)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.splits)


class EmptySplitError(ValueError):
    """The training split has no usable document: a store would be empty, and nothing could be trained on it."""


# Skip reasons in words: (name, detail); the other reasons (e.g. "outside_split_folders") are shown as they are.
_REASONS = {"binary": ("binary", "a NUL byte"), "undecodable": ("not UTF-8", ""), "empty": ("empty", "only whitespace"),
            "too_short": ("too short", "under {min_tokens} tokens")}


def no_documents_message(corpus: Corpus, split: str, skipped: dict[str, Any], min_tokens: int) -> str:
    """One line: the corpus, the split, and what was skipped for which reason (or that nothing was found)."""
    if not skipped:
        root = getattr(corpus, "root", None)
        if isinstance(root, Path) and not any(p.is_file() for p in root.rglob("*")):
            why = f"{root} holds no file"
        else:
            why = "no document falls into it (unless the corpus defines its splits, documents are assigned to one by a "
            why += "hash of their name)"
        return f"corpus {corpus.spec}: the {split} split has no usable document: {why}"
    total = sum(v["count"] for v in skipped.values())
    parts = []
    for reason, v in skipped.items():
        name, detail = _REASONS.get(reason, (reason, ""))
        detail = detail.format(min_tokens=min_tokens) + "; " if detail else ""
        parts.append(f"{v['count']} {name} ({detail}e.g. {', '.join(v['examples'][:2])})")
    hint = "; lower --min-chunks or --chunk-size to keep short documents" if "too_short" in skipped else ""
    return (f"corpus {corpus.spec}: the {split} split has no usable document: {total} input(s) skipped: "
            f"{'; '.join(parts)}{hint}")


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
    force: rebuild the whole store aside and swap it in when complete (see the module docstring).
    progress: a tqdm bar per split (None: only when stderr is a terminal).
    Raises EmptySplitError when the training split has no usable document.
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
    read = corpus_paths(corpus)  # the corpus and a tokenizer file are read, never written over
    inputs: dict[str, Any] = {"corpus": read[0]} if read else {}
    if isinstance(tokenizer, (str, Path)) and Path(tokenizer).exists():
        inputs["tokenizer"] = tokenizer
    claim_folder(out, OWNER, arg="out", inputs=inputs)
    with folder_lock(out, "built"):  # one `rpt prepare` per store: a second is refused while this one lives
        dropped = recover_swap(out)
        if out.exists() and not out.is_dir():
            raise argument_error("out", out, "exists and is not a folder", ValueError)

        tt = time.perf_counter()
        train_split = "train" if "train" in corpus.splits else corpus.splits[0]
        tokenizer = _resolve_tokenizer(tokenizer, corpus, train_split, max_documents, min_chunks * chunk_size,
                                       tokenizer_cache, sample_bytes)
        tokenizer_seconds = time.perf_counter() - tt
        settings = store_settings(corpus, chunk_size, min_chunks, max_documents)
        # Where the text came from (packages, versions, licences) goes into every manifest, but is not compared on reuse.
        provenance = corpus.provenance()
        extra = {**settings, "provenance": provenance} if provenance else settings

        # Decide reuse before writing anything, so a mismatch fails fast and leaves the folder as it was.
        build = build_path(out)
        if force:
            root, reuse = build, _reusable_in_build(build, splits, tokenizer, chunk_size, settings)
        else:
            root, reuse = out, _reusable_in_place(out, splits, tokenizer, chunk_size, settings)
        created = not root.exists()
        mark_folder(root, OWNER)
        tokenizer.save(root / "tokenizer.json")
        stats: dict[str, SplitStats] = {}
        try:
            for split in sorted(splits, key=lambda s: s != train_split):  # the split that must not be empty first
                if split in reuse:
                    stats[split] = _stats_from_manifest(reuse[split])
                    if split == train_split and stats[split].documents == 0:
                        raise EmptySplitError(no_documents_message(corpus, split, stats[split].skipped, settings["min_tokens"]))
                    continue
                stats[split] = write_split(corpus, split, tokenizer, root / split, chunk_size=chunk_size,
                                           min_chunks=min_chunks, max_documents=max_documents, extra=extra,
                                           progress=progress, required=split == train_split)
        except EmptySplitError:
            if force or created:  # nothing worth keeping was there before this run
                shutil.rmtree(root, ignore_errors=True)
            raise
        for st in stats.values():
            st.path = str(out / st.split)
        summary = PrepareSummary(out=str(out), corpus=corpus.identity(), tokenizer=tokenizer.identity, chunk_size=chunk_size,
                                 min_tokens=min_chunks * chunk_size, max_documents=max_documents,
                                 splits=[stats[s] for s in splits], seconds=time.perf_counter() - t0,
                                 tokenizer_seconds=tokenizer_seconds, tokenizer_cache_hit=tokenizer.cache_hit,
                                 dropped=dropped, provenance=provenance)
        write_json_atomic(root / "prepare.json", summary.to_dict())  # in a build: the mark that it is complete
        if force:
            summary.dropped += swap_in(build, out)
            if summary.dropped:
                write_json_atomic(out / "prepare.json", summary.to_dict())
        elif build.exists():  # an abandoned forced rebuild: the store in place is now the one asked for
            shutil.rmtree(build)
        return summary


def _resolve_tokenizer(tokenizer: str | Tokenizer, corpus: Corpus, train_split: str, max_documents: int | None,
                       min_tokens: int, cache_dir: str | Path | None, sample_bytes: int) -> Tokenizer:
    """A Tokenizer from a spec; a BPE that finds no training text is an EmptySplitError saying what was skipped."""
    if tokenizer == "corpus":
        if not hasattr(corpus, "tokenizer"):
            raise ValueError(f"corpus {corpus.spec!r} has no tokenizer of its own: pass a tokenizer (bpe:<vocab>, a "
                             "file, a name)")
        return corpus.tokenizer()
    if not isinstance(tokenizer, str):
        return tokenizer
    skips = Skips()
    scan = {"done": False, "usable": 0}

    def training_texts() -> Iterator[str]:
        for doc in _limit(corpus.documents(train_split, skips), max_documents):
            if doc.text.strip():
                scan["usable"] += 1
            else:
                skips.add("empty", doc.id)
            yield doc.text
        scan["done"] = True

    try:
        return load_tokenizer(tokenizer, training_texts, cache_dir=cache_dir, sample_bytes=sample_bytes)
    except ValueError:
        if scan["done"] and not scan["usable"]:  # read to the end and found nothing to train on
            raise EmptySplitError(no_documents_message(corpus, train_split, skips.to_dict(), min_tokens)) from None
        raise


def _reusable_in_place(out: Path, splits: list[str], tokenizer: Tokenizer, chunk_size: int,
                       settings: dict[str, Any]) -> dict[str, TokenStore]:
    """The stores of `out` this run keeps; StoreError when any store there (asked for or not) does not match, since
    one tokenizer.json serves every split of the folder."""
    build = build_path(out)
    hint = f" (an interrupted --force run left {build}: pass --force to resume it)" if build.exists() else ""
    reuse: dict[str, TokenStore] = {}
    for split in SPLITS:
        path = out / split
        if not path.exists() or (split not in splits and not (path / "manifest.json").is_file()):
            continue
        try:
            if split in splits:
                reuse[split] = check_reusable(path, tokenizer, chunk_size, settings)
            else:
                TokenStore.open(path).check_compatible(tokenizer_id=tokenizer.identity)
        except StoreError as e:
            also = "" if split in splits else f" (split {split} shares {out / 'tokenizer.json'} with the splits asked for)"
            raise StoreError(f"{e}{also}; rebuild {out} with force=True (rpt prepare --force){hint}") from None
    old_tok = out / "tokenizer.json"
    stores = any((out / s / "manifest.json").is_file() for s in SPLITS)
    if stores and old_tok.exists() and Tokenizer.from_file(old_tok).hash != tokenizer.hash:
        raise StoreError(f"{old_tok} differs from the tokenizer of the stores in {out}; rebuild with force=True "
                         f"(rpt prepare --force){hint}")
    return reuse


def _reusable_in_build(build: Path, splits: list[str], tokenizer: Tokenizer, chunk_size: int,
                       settings: dict[str, Any]) -> dict[str, TokenStore]:
    """Resume an interrupted forced rebuild: keep the finished splits of `build` made exactly as this run asks,
    delete everything else in it (other settings, other tokenizer, a half-written split)."""
    if not build.exists():
        return {}
    tok = build / "tokenizer.json"
    try:
        same = tok.is_file() and Tokenizer.from_file(tok).hash == tokenizer.hash
    except ValueError:
        same = False
    if not same:
        shutil.rmtree(build)
        return {}
    reuse: dict[str, TokenStore] = {}
    for p in sorted(build.iterdir()):
        if p.name in splits:
            try:
                reuse[p.name] = check_reusable(p, tokenizer, chunk_size, settings)
                continue
            except StoreError:
                pass
        if p.is_dir():
            shutil.rmtree(p)
        elif p.name != "tokenizer.json":
            p.unlink()
    return reuse


# ---------------------------------------------------------------------------------------------------------------
# The whole-store swap of `--force`


def swap_in(build: Path, out: Path) -> list[str]:
    """Put the complete store `build` in the place of `out`; returns the old splits dropped (see `_finish_swap`).

    Renaming `out` aside is the commit point: a run killed after it is finished by the next run (`recover_swap`),
    one killed before it leaves `out` untouched."""
    out, old = real_folder(out), old_path(out)
    if out.exists():
        os.replace(out, old)
    os.replace(build, out)
    return _finish_swap(out, old) if old.exists() else []


def recover_swap(out: Path) -> list[str]:
    """Finish a swap that a killed `rpt prepare --force` left half done (the old store aside, the new one complete)."""
    out, old, build = real_folder(out), old_path(out), build_path(out)
    if not old.exists():
        return []
    if not out.exists():
        if not (build / "prepare.json").is_file():  # cannot happen (a build moves only when complete): roll back
            os.replace(old, out)
            return []
        os.replace(build, out)
    return _finish_swap(out, old)


def _finish_swap(out: Path, old: Path) -> list[str]:
    """Move what the old store held besides the rebuilt parts (labels/, the user's files, splits of the same tokenizer
    that were not rebuilt) into the new store, then delete the old one. Old splits of another tokenizer cannot stay
    beside the new tokenizer.json: they are dropped, and their names returned."""
    new_hash = Tokenizer.from_file(out / "tokenizer.json").hash
    leftovers = {f".{s}.partial" for s in SPLITS}  # half-written splits of the old store, and temporary files
    dropped = []
    for p in sorted(old.iterdir()):
        if (out / p.name).exists() or p.name in leftovers or (p.name.startswith(".") and p.name.endswith(".tmp")):
            continue
        if p.name in SPLITS and (p / "manifest.json").is_file() and _manifest_hash(p) != new_hash:
            dropped.append(p.name)
            continue
        os.replace(p, out / p.name)
    shutil.rmtree(old)
    return dropped


def _manifest_hash(path: Path) -> str | None:
    try:
        return json.loads((path / "manifest.json").read_text())["tokenizer"]["hash"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ---------------------------------------------------------------------------------------------------------------


def write_split(corpus: Corpus, split: str, tokenizer: Tokenizer, path: Path, *, chunk_size: int, min_chunks: int,
                max_documents: int | None, extra: dict[str, Any], progress: bool | None = None,
                required: bool = False) -> SplitStats:
    """Stream one split into a new store at `path` (published atomically when complete). required: a split without
    any usable document is an EmptySplitError, and nothing is published."""
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
            if required and not lengths:
                writer.abort()
                raise EmptySplitError(no_documents_message(corpus, split, skips.to_dict(), min_tokens))
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
    if s.dropped:
        lines.append(f"  removed old split(s) {', '.join(s.dropped)}: made with another tokenizer than the new "
                     f"tokenizer.json (prepare them again with --splits)")
    lines.append(f"time {s.seconds:.1f} s (tokenizer {s.tokenizer_seconds:.1f} s)")
    return "\n".join(lines)
