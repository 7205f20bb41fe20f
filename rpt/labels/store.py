"""The label store: BM25 candidates and target scores of every chunk, beside the token store
(docs/design.md#label-store).

Layout of a label folder (default ``<root>/labels/<split>-<kind>-<span>/``, e.g. ``train-sem-16384``)::

    candidates.npy    int32   [N, k]  candidate chunk ids, DOCUMENT-absolute chunk indices, best BM25 first; -1 = none
    bm25.npy          float32 [N, k]  BM25 score of each candidate; NaN where the id is -1
    target.npy        float32 [N, k]  s_t of each candidate (§3.2); NaN where unscored (-1, or kind "lex")
    chunk_offsets.npy int64   [D + 1] rows of document doc_range[0] + d are chunk_offsets[d] : chunk_offsets[d + 1]
    manifest.json     format version, kind, span, query, k, k1, b, chunk_size, segment_len, scorer, tokenizer identity,
                      doc_range, n_rows, positive share; written last

Row r of a document is its chunk r (a document of n tokens has n // M chunks). Arrays are .npy files, opened
memory-mapped.

Writing is resumable and atomic: rows go into preallocated memory-mapped arrays in a hidden ``.<name>.partial``
folder, one document at a time; after each document the arrays are flushed and ``progress.json`` (next document,
running counts) is written and fsynced. A restarted run with the same configuration continues after the last
complete document; the folder is renamed into place only when every document is done.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rpt.outputs import Owner, claim_folder, mark_folder
from rpt.utils import note_environment, write_failure

FORMAT_VERSION = 1
ARRAYS = {"candidates": np.int32, "bm25": np.float32, "target": np.float32}
FILL = {"candidates": -1, "bm25": np.nan, "target": np.nan}


class LabelError(ValueError):
    """Labels are missing, incomplete, or do not match the token store / configuration they are used with."""


def span_name(span: int | None) -> str:
    """``"doc"`` for whole-document spans, else the span length in tokens."""
    return "doc" if span is None else str(int(span))


def parse_span(value: str | int | None) -> int | None:
    if value is None or str(value) == "doc":
        return None
    try:
        span = int(value)
    except ValueError:
        raise LabelError(f"span must be a number of tokens or 'doc', not {value!r}") from None
    if span <= 0:
        raise LabelError(f"span must be positive, not {span}")
    return span


def _is_label_folder(folder: Path) -> bool:
    try:
        m = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(m, dict) and {"format_version", "kind", "k", "arrays", "doc_range"} <= m.keys()


# What `rpt label` writes into a label folder (rpt.outputs): its arrays and manifest, and while running progress.json
OWNER = Owner("label", ("manifest.json", "progress.json", "chunk_offsets.npy", *(f"{n}.npy" for n in ARRAYS),
                        ".*.tmp"), _is_label_folder)


def default_label_path(root: str | Path, split: str, kind: str, span: int | None) -> Path:
    return Path(root) / "labels" / f"{split}-{kind}-{span_name(span)}"


def _fsync_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _reserve(path: Path) -> None:
    """Allocate the blocks of a (sparse) file now, so that a full disk is an OSError here, not a SIGBUS when a page of
    its memory map is written back. File systems without fallocate are left as they are."""
    with open(path, "r+b") as f:
        try:
            os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
        except AttributeError:  # no posix_fallocate on this platform
            pass


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class LabelRows:
    """Labels of one document: arrays [n_chunks, k] (see the module docstring)."""

    candidates: np.ndarray
    bm25: np.ndarray
    target: np.ndarray


@dataclass
class LabelStore:
    """A read-only, memory-mapped label folder. ``store.rows(doc)`` gives one document's labels."""

    path: Path
    candidates: np.ndarray
    bm25: np.ndarray
    target: np.ndarray
    chunk_offsets: np.ndarray
    manifest: dict[str, Any]

    @classmethod
    def open(cls, path: str | Path) -> LabelStore:
        path = Path(path)
        mpath = path / "manifest.json"
        if not mpath.exists():
            partial = path.parent / f".{path.name}.partial"
            hint = f" (an interrupted run left {partial}: run `rpt label` again to resume it)" if partial.exists() else ""
            raise LabelError(f"no label store at {path}: {mpath} is missing{hint}")
        manifest = json.loads(mpath.read_text())
        if manifest.get("format_version") != FORMAT_VERSION:
            raise LabelError(f"{mpath}: format_version {manifest.get('format_version')} != {FORMAT_VERSION}; "
                             "relabel with `rpt label`")
        arrays = {name: np.load(path / f"{name}.npy", mmap_mode="r") for name in ARRAYS}
        offsets = np.load(path / "chunk_offsets.npy")
        n_rows, k = int(manifest["n_rows"]), int(manifest["k"])
        for name, arr in arrays.items():
            if arr.shape != (n_rows, k):
                raise LabelError(f"{path}/{name}.npy has shape {arr.shape}, manifest says ({n_rows}, {k})")
        if int(offsets[-1]) != n_rows or len(offsets) != manifest["doc_range"][1] - manifest["doc_range"][0] + 1:
            raise LabelError(f"{path}: chunk_offsets.npy disagrees with the manifest")
        return cls(path, arrays["candidates"], arrays["bm25"], arrays["target"], offsets, manifest)

    @property
    def kind(self) -> str:
        return self.manifest["kind"]

    @property
    def span(self) -> int | None:
        return parse_span(self.manifest["span"])

    @property
    def k(self) -> int:
        return int(self.manifest["k"])

    @property
    def doc_range(self) -> tuple[int, int]:
        lo, hi = self.manifest["doc_range"]
        return int(lo), int(hi)

    def __len__(self) -> int:
        return len(self.chunk_offsets) - 1

    def rows(self, doc: int) -> LabelRows:
        """Labels of document ``doc`` (the token store's document index): arrays [n_chunks, k]."""
        lo, hi = self.doc_range
        if not lo <= doc < hi:
            raise LabelError(f"{self.path} holds labels for documents {lo}..{hi - 1}, not document {doc}")
        a, b = int(self.chunk_offsets[doc - lo]), int(self.chunk_offsets[doc - lo + 1])
        return LabelRows(self.candidates[a:b], self.bm25[a:b], self.target[a:b])

    def check_compatible(self, token_store, segment_len: int, span: int | str | None, kind: str | None = None) -> None:
        """Raise LabelError naming both values when these labels were made for another tokenizer, chunk size,
        segment length, span (or kind), or for documents other than the token store's."""
        m = self.manifest
        where = f"labels {self.path}"
        mine, theirs = m["tokenizer"], token_store.tokenizer_id
        if mine.get("hash") != theirs.get("hash"):
            raise LabelError(f"{where} were made with tokenizer {mine.get('name')} (hash {mine.get('hash')}), but token "
                             f"store {token_store.path} uses {theirs.get('name')} (hash {theirs.get('hash')}); relabel")
        if int(m["chunk_size"]) != token_store.chunk_size:
            raise LabelError(f"{where} have chunk_size {m['chunk_size']}, token store {token_store.path} has "
                             f"chunk_size {token_store.chunk_size}")
        if int(m["segment_len"]) != int(segment_len):
            raise LabelError(f"{where} have segment_len {m['segment_len']}, the model uses segment_len {segment_len}")
        if self.span != parse_span(span):
            raise LabelError(f"{where} have span {span_name(self.span)}, asked for span {span_name(parse_span(span))}")
        if kind is not None and kind != self.kind:
            raise LabelError(f"{where} are of kind {self.kind}, asked for kind {kind}")
        lo, hi = self.doc_range
        if hi > len(token_store):
            raise LabelError(f"{where} cover documents {lo}..{hi - 1}; token store {token_store.path} has only "
                             f"{len(token_store)}")
        expected = token_store.doc_lengths()[lo:hi] // token_store.chunk_size
        got = np.diff(self.chunk_offsets)
        if not np.array_equal(expected, got):
            d = int(np.nonzero(expected != got)[0][0])
            raise LabelError(f"{where}: document {lo + d} has {got[d]} labelled chunks, token store "
                             f"{token_store.path} gives it {expected[d]} chunks; relabel")


class LabelWriter:
    """Writes one label folder resumably and publishes it atomically (see the module docstring).

    ``config`` is everything that defines the labels (it must equal a partial run's to resume it); ``doc_chunks`` the
    number of chunks of each document doc_range[0] .. doc_range[1] - 1.
    """

    def __init__(self, path: str | Path, config: dict[str, Any], doc_range: tuple[int, int], doc_chunks: np.ndarray,
                 k: int):
        self.path = Path(path)
        self.tmp = self.path.parent / f".{self.path.name}.partial"
        self.config = {**config, "doc_range": [int(doc_range[0]), int(doc_range[1])]}
        self.doc_range = (int(doc_range[0]), int(doc_range[1]))
        self.offsets = np.concatenate([[0], np.cumsum(doc_chunks, dtype=np.int64)]).astype(np.int64)
        self.k = k
        n_rows = int(self.offsets[-1])
        progress = self._read_progress()
        self.resumed = progress is not None
        if progress is None:
            if self.tmp.exists():
                warnings.warn(f"{self.tmp}: an unfinished run with other settings (or unreadable progress) is discarded; "
                              "starting over", stacklevel=2)
                shutil.rmtree(self.tmp)
            self.tmp.mkdir(parents=True)
            with self._writing(self.tmp / "chunk_offsets.npy"):
                np.save(self.tmp / "chunk_offsets.npy", self.offsets)
            self.next_doc, self.stats = self.doc_range[0], {"n_scored": 0, "n_positive": 0}
        else:
            self.next_doc, self.stats = int(progress["next_doc"]), dict(progress["stats"])
        # where the documents were labelled: [{"from_document", **rpt.utils.environment()}], one per stretch
        self.environments: list[dict[str, Any]] = list((progress or {}).get("environments", []))
        self.arrays: dict[str, np.ndarray] = {}
        for name, dtype in ARRAYS.items():
            file = self.tmp / f"{name}.npy"
            if n_rows == 0:  # a zero-length file cannot be memory-mapped
                self.arrays[name] = np.zeros((0, k), dtype)
            elif progress is None:
                with self._writing(file):
                    self.arrays[name] = np.lib.format.open_memmap(file, mode="w+", dtype=dtype, shape=(n_rows, k))
                    _reserve(file)  # a memory-mapped file is sparse: a disk that fills up later would kill the process
                    self.arrays[name][:] = FILL[name]
            else:
                self.arrays[name] = np.lib.format.open_memmap(file, mode="r+")
        if progress is None:
            self._commit()

    def _read_progress(self) -> dict[str, Any] | None:
        p = self.tmp / "progress.json"
        if not p.exists():
            return None
        try:
            progress = json.loads(p.read_text())
        except json.JSONDecodeError:
            return None
        return progress if progress.get("config") == json.loads(json.dumps(self.config, default=str)) else None

    @property
    def done(self) -> bool:
        return self.next_doc >= self.doc_range[1]

    def rows_of(self, doc: int) -> tuple[int, int]:
        d = doc - self.doc_range[0]
        return int(self.offsets[d]), int(self.offsets[d + 1])

    def write(self, doc: int, candidates: np.ndarray, bm25: np.ndarray, target: np.ndarray, stats: dict[str, int]) -> None:
        """Store document ``doc``'s rows and make them durable; ``doc`` must be the next one."""
        if doc != self.next_doc:
            raise LabelError(f"documents must be written in order: expected {self.next_doc}, got {doc}")
        a, b = self.rows_of(doc)
        for name, arr in (("candidates", candidates), ("bm25", bm25), ("target", target)):
            if arr.shape != (b - a, self.k):
                raise LabelError(f"document {doc}: {name} has shape {arr.shape}, expected {(b - a, self.k)}")
            self.arrays[name][a:b] = arr
        for key, value in stats.items():
            self.stats[key] = self.stats.get(key, 0) + int(value)
        self.next_doc = doc + 1
        self._commit()

    @contextlib.contextmanager
    def _writing(self, path: Path) -> Iterator[None]:
        """An OSError while writing `path` (a full disk) as one line saying what is kept."""
        try:
            yield
        except OSError as e:
            kept = (f"the documents that {self.tmp / 'progress.json'} records as done are kept: free space and run "
                    "`rpt label` again to resume" if (self.tmp / "progress.json").exists() else
                    "no labels were written yet: free space and run `rpt label` again")
            raise write_failure(path, e, kept) from None

    def _commit(self) -> None:
        with self._writing(self.tmp):
            for arr in self.arrays.values():
                if isinstance(arr, np.memmap):
                    arr.flush()  # msync: the rows are on disk before progress.json says so
        with self._writing(self.tmp / "progress.json"):
            _fsync_json(self.tmp / "progress.json", {"config": self.config, "next_doc": self.next_doc, "stats": self.stats,
                                                     "environments": self.environments})

    def note_environment(self) -> None:
        """Record that the documents from the next one on are labelled here (a new entry only where this differs)."""
        if note_environment(self.environments, "from_document", self.next_doc):
            self._commit()

    def publish(self, manifest: dict[str, Any]) -> Path:
        """Write the manifest and rename the finished folder into place (replacing an older one)."""
        if not self.done:
            raise LabelError(f"{self.tmp}: documents {self.next_doc}..{self.doc_range[1] - 1} are not labelled yet")
        if self.path.exists():  # an older label folder: checked to hold only labels while the new ones can still resume
            claim_folder(self.path, OWNER, arg="out")
        n_scored, n_pos = self.stats.get("n_scored", 0), self.stats.get("n_positive", 0)
        full = {
            "format_version": FORMAT_VERSION,
            **self.config,
            "n_rows": int(self.offsets[-1]),
            "n_documents": self.doc_range[1] - self.doc_range[0],
            "n_scored": n_scored,
            "n_positive": n_pos,
            "positive_share": n_pos / n_scored if n_scored else None,
            "arrays": {name: np.dtype(dtype).name for name, dtype in ARRAYS.items()},
            "environments": self.environments,
            **manifest,
        }
        for name, arr in self.arrays.items():
            with self._writing(self.tmp / f"{name}.npy"):
                if isinstance(arr, np.memmap):
                    arr.flush()
                else:  # zero rows: never memory-mapped
                    np.save(self.tmp / f"{name}.npy", arr)
        self.arrays.clear()
        (self.tmp / "progress.json").unlink(missing_ok=True)
        with self._writing(self.tmp / "manifest.json"):
            _fsync_json(self.tmp / "manifest.json", full)
        mark_folder(self.tmp, OWNER)
        if self.path.exists():  # the older label folder (checked above), moved aside before it is deleted
            old = self.path.with_name(f".{self.path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(self.path, old)
            os.replace(self.tmp, self.path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(self.tmp, self.path)
        _fsync_dir(self.path.parent)
        return self.path


def merge_label_stores(paths: list[str | Path], out: str | Path) -> Path:
    """Concatenate label folders covering consecutive document ranges (shards) into one folder at ``out``."""
    stores = sorted((LabelStore.open(p) for p in paths), key=lambda s: s.doc_range)
    if not stores:
        raise LabelError("nothing to merge")
    ignore = {"doc_range", "n_rows", "n_documents", "n_scored", "n_positive", "positive_share", "shard", "environments"}
    base = {k: v for k, v in stores[0].manifest.items() if k not in ignore}
    for prev, s in zip(stores, stores[1:], strict=False):
        other = {k: v for k, v in s.manifest.items() if k not in ignore}
        if other != base:
            diff = sorted(k for k in set(base) | set(other) if base.get(k) != other.get(k))
            raise LabelError(f"cannot merge {stores[0].path} and {s.path}: they differ in {', '.join(diff)}")
        if s.doc_range[0] != prev.doc_range[1]:
            raise LabelError(f"cannot merge: {prev.path} ends at document {prev.doc_range[1]} but {s.path} starts at "
                             f"{s.doc_range[0]}")
    lo, hi = stores[0].doc_range[0], stores[-1].doc_range[1]
    config = {k: v for k, v in base.items() if k not in ("format_version", "arrays")}
    counts = np.concatenate([np.diff(s.chunk_offsets) for s in stores])
    writer = LabelWriter(out, config, (lo, hi), counts, int(base["k"]))
    for name in ARRAYS:  # bulk copy, shard by shard (documents stay in order)
        row = 0
        for s in stores:
            arr = getattr(s, name)
            writer.arrays[name][row : row + len(arr)] = arr
            row += len(arr)
    writer.next_doc = hi
    writer.environments = [e for s in stores for e in s.manifest.get("environments", [])]  # each shard's, in order
    writer.stats = {"n_scored": sum(int(s.manifest.get("n_scored") or 0) for s in stores),
                    "n_positive": sum(int(s.manifest.get("n_positive") or 0) for s in stores)}
    writer._commit()
    return writer.publish({"shard": None})


def default_labels(store_root: str | Path, variant: str, seq_len: int,
                   given: dict[str, Path] | None = None) -> Path | None:
    """The training labels of a variant: sem for rpt-sem, lex (else sem) for retro and rpt-lex; of each kind first the
    folder given for it (`given`: kind -> folder), then the one `rpt label` writes by default. None if none exists."""
    from rpt.model.registry import spec

    kinds = {None: [], "sem": ["sem"]}.get(spec(variant).labels, ["lex", "sem"])
    for kind in kinds:
        if given and kind in given:
            return Path(given[kind])
        path = default_label_path(store_root, "train", kind, seq_len)
        if (path / "manifest.json").exists():
            return path
    return None
