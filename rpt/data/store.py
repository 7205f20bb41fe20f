"""The token store: long documents as one flat memory-mapped token array with document offsets.

Layout of a store folder (one per split)::

    tokens.bin      flat token ids, dtype uint16 (vocab <= 65535) or uint32
    offsets.npy     int64 [n_documents + 1]; document d is tokens[offsets[d]:offsets[d+1]]
    documents.jsonl one line per document: {"id": ..., "n_tokens": ...}
    manifest.json   format version, tokenizer identity, chunk size, counts, skips; written last

A store is written into a hidden `.<name>.partial` folder and renamed into place only after its manifest is
complete, so a killed `rpt prepare` never leaves a folder that loads as if complete.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rpt.utils import UserError, WriteFailed, error_line, write_failure, write_json_atomic

FORMAT_VERSION = 1


class StoreError(RuntimeError):
    """A token store is missing, incomplete, or does not match the tokenizer/config it is used with."""


# The folders of a store rebuilt in place (rpt.data.prepare's swap); TokenStore.open names them when a swap was cut short


def real_folder(out: Path) -> Path:
    """The folder itself (through a symlink, so that the swap happens where the store is)."""
    return Path(os.path.realpath(out))


def build_path(out: Path) -> Path:
    """Where `rpt prepare --force` builds the new store: a hidden sibling of `out`."""
    out = real_folder(out)
    return out.parent / f".{out.name}.build"


def old_path(out: Path) -> Path:
    """Where `rpt prepare --force` puts the old store aside: it waits there, between the two renames of a swap, until
    what it shares is moved over."""
    out = real_folder(out)
    return out.parent / f".{out.name}.old"


@dataclass
class TokenStore:
    """A read-only view of one split: `store.document(d)` is a memmapped token array."""

    path: Path
    tokens: np.ndarray
    offsets: np.ndarray
    doc_ids: list[str]
    manifest: dict[str, Any]

    @classmethod
    def open(cls, path: str | Path) -> TokenStore:
        path = Path(path)
        mpath = path / "manifest.json"
        if not mpath.exists():
            partial = path.parent / f".{path.name}.partial"
            swapped = old_path(path.parent)
            hint = f" (an interrupted run left {partial}; run `rpt prepare` again)" if partial.exists() else ""
            if swapped.exists():
                hint = f" (an interrupted `rpt prepare --force` left the old store in {swapped}; run it again to finish)"
            raise StoreError(f"no token store at {path}: {mpath} is missing{hint}")
        cure = "rebuild it with `rpt prepare --force`"
        try:
            manifest = json.loads(mpath.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise StoreError(f"{mpath} is damaged ({error_line(e)}); {cure}") from None
        if not isinstance(manifest, dict):
            raise StoreError(f"{mpath} is damaged (not a JSON object); {cure}")
        if manifest.get("format_version") != FORMAT_VERSION:
            raise StoreError(f"{mpath}: format_version {manifest.get('format_version')} != {FORMAT_VERSION}")
        offsets = _read_offsets(path / "offsets.npy", manifest, cure)
        n = int(offsets[-1])
        try:
            dtype = np.dtype(manifest["dtype"])
            n_tokens = int(manifest["n_tokens"])
        except (KeyError, TypeError, ValueError) as e:
            raise StoreError(f"{mpath} is damaged (dtype / n_tokens: {error_line(e)}); {cure}") from None
        bpath = path / "tokens.bin"
        size = bpath.stat().st_size if bpath.is_file() else None
        if size is None:
            raise StoreError(f"{bpath} is missing; {cure}")
        if n != n_tokens:
            raise StoreError(f"{path / 'offsets.npy'} is damaged: it ends at token {n:,} where {mpath} records "
                             f"{n_tokens:,} tokens; {cure}")
        if size != n * dtype.itemsize:
            raise StoreError(f"{bpath} is damaged: {size:,} bytes where {mpath} records {n:,} {dtype.name} tokens "
                             f"({n * dtype.itemsize:,} bytes; cut short or overwritten); {cure}")
        tokens = np.memmap(bpath, dtype=dtype, mode="r", shape=(n,)) if n else np.zeros(0, dtype)
        try:
            with open(path / "documents.jsonl") as f:
                doc_ids = [json.loads(line)["id"] for line in f]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
            raise StoreError(f"{path / 'documents.jsonl'} is damaged ({error_line(e)}); {cure}") from None
        if len(doc_ids) != len(offsets) - 1:
            raise StoreError(f"{path / 'documents.jsonl'} is damaged: {len(doc_ids):,} documents where "
                             f"{path / 'offsets.npy'} has {len(offsets) - 1:,}; {cure}")
        return cls(path, tokens, offsets, doc_ids, manifest)

    def __len__(self) -> int:
        return len(self.doc_ids)

    @property
    def chunk_size(self) -> int:
        return int(self.manifest["chunk_size"])

    @property
    def tokenizer_id(self) -> dict[str, Any]:
        return self.manifest["tokenizer"]

    def document(self, d: int) -> np.ndarray:
        return self.tokens[self.offsets[d] : self.offsets[d + 1]]

    def doc_lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def check_tokenizer_file(self, path: str | Path) -> None:
        """Raise StoreError unless the tokenizer file `path` (a root's tokenizer.json) is the one this store was
        written with: a tokenizer.json from another `rpt prepare` run beside these tokens would decode them wrongly."""
        from rpt.data.tokenizer import Tokenizer

        have = Tokenizer.from_file(path).hash
        want = str(self.tokenizer_id.get("hash"))
        if have != want:
            raise StoreError(f"{path} (sha256 {have[:12]}) is not the tokenizer {self.path} was written with "
                             f"({self.tokenizer_id.get('name')}, sha256 {want[:12]}): the folder mixes two `rpt prepare` "
                             "runs; rebuild it with `rpt prepare --force`")

    def check_compatible(self, tokenizer_id: dict[str, Any] | None = None, chunk_size: int | None = None,
                         vocab_size: int | None = None) -> None:
        """Raise StoreError naming the mismatch when this store was built for another tokenizer or chunk size."""
        if tokenizer_id is not None and tokenizer_id.get("hash") != self.tokenizer_id.get("hash"):
            raise StoreError(f"{self.path} was tokenized with {self.tokenizer_id.get('name')} "
                             f"(hash {self.tokenizer_id.get('hash')}), not {tokenizer_id.get('name')} "
                             f"(hash {tokenizer_id.get('hash')})")
        if chunk_size is not None and chunk_size != self.chunk_size:
            raise StoreError(f"{self.path} has chunk_size {self.chunk_size}, config asks for {chunk_size}")
        if vocab_size is not None and int(self.tokenizer_id.get("vocab_size", 0)) > vocab_size:
            raise StoreError(f"{self.path}: tokenizer vocabulary {self.tokenizer_id.get('vocab_size')} exceeds "
                             f"model.vocab_size {vocab_size}")


def _read_offsets(path: Path, manifest: dict[str, Any], cure: str) -> np.ndarray:
    """offsets.npy, checked: 1-D integers from 0, never decreasing, one more than the manifest's documents."""
    try:
        offsets = np.load(path)
    except (OSError, ValueError, EOFError) as e:
        raise StoreError(f"{path} is damaged ({error_line(e)}); {cure}") from None
    n_docs = manifest.get("n_documents")
    if (offsets.ndim != 1 or not len(offsets) or offsets.dtype.kind not in "iu" or offsets[0] != 0
            or (len(offsets) > 1 and bool((np.diff(offsets) < 0).any()))):
        raise StoreError(f"{path} is damaged: not document offsets (1-D integers from 0, never decreasing); {cure}")
    if n_docs is not None and len(offsets) != int(n_docs) + 1:
        raise StoreError(f"{path} is damaged: {len(offsets) - 1:,} documents where the manifest records {n_docs:,}; "
                         f"{cure}")
    return offsets


def open_split(store_root: str | Path, split: str) -> TokenStore:
    """<root>/<split>/ of an `rpt prepare` root, or `store_root` itself when it is a store folder; a missing or
    damaged store is a UserError."""
    root = Path(store_root)
    path = root if (root / "manifest.json").exists() and not (root / split).exists() else root / split
    try:
        return TokenStore.open(path)
    except StoreError as e:
        raise UserError(str(e)) from None


@dataclass
class StoreWriter:
    """Streams documents into a new store; `close()` publishes it atomically. Use as a context manager."""

    path: Path
    tokenizer_id: dict[str, Any]
    chunk_size: int
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self.tmp = self.path.parent / f".{self.path.name}.partial"
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir(parents=True)
        vocab = int(self.tokenizer_id.get("vocab_size", 1 << 20))
        self.dtype = "uint16" if vocab <= 65535 else "uint32"
        self._bin = open(self.tmp / "tokens.bin", "wb")
        self._docs = open(self.tmp / "documents.jsonl", "w")
        self.offsets: list[int] = [0]

    def _failed(self, path: Path, e: OSError) -> WriteFailed:
        return write_failure(path, e, f"{self.path} is unchanged (the store is written aside, in {self.tmp}, and "
                                      "published only when complete)")

    def add(self, doc_id: str, token_ids: np.ndarray | list[int]) -> None:
        arr = np.asarray(token_ids, dtype=self.dtype)
        try:
            self._bin.write(arr.tobytes())
        except OSError as e:
            raise self._failed(self.tmp / "tokens.bin", e) from None
        self.offsets.append(self.offsets[-1] + len(arr))
        try:
            self._docs.write(json.dumps({"id": doc_id, "n_tokens": len(arr)}) + "\n")
        except OSError as e:
            raise self._failed(self.tmp / "documents.jsonl", e) from None

    def close(self, stats: dict[str, Any] | None = None) -> Path:
        for f in (self._bin, self._docs):
            try:
                f.close()  # flushes what is buffered
            except OSError as e:
                raise self._failed(Path(f.name), e) from None
        offsets = np.asarray(self.offsets, dtype=np.int64)
        try:
            np.save(self.tmp / "offsets.npy", offsets)
        except OSError as e:
            raise self._failed(self.tmp / "offsets.npy", e) from None
        lengths = np.diff(offsets)
        manifest = {
            "format_version": FORMAT_VERSION,
            "tokenizer": self.tokenizer_id,
            "chunk_size": self.chunk_size,
            "dtype": self.dtype,
            "n_documents": len(lengths),
            "n_tokens": int(offsets[-1]),
            "median_doc_tokens": float(np.median(lengths)) if len(lengths) else 0.0,
            **(stats or {}),
            **self.extra,
        }
        try:
            write_json_atomic(self.tmp / "manifest.json", manifest)
        except OSError as e:
            raise self._failed(self.tmp / "manifest.json", e) from None
        if self.path.exists():
            shutil.rmtree(self.path)
        os.replace(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        for f in (self._bin, self._docs):
            f.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # On an exception the partial folder is left for inspection; it never loads as a store.
        if exc_type is not None:
            for f in (self._bin, self._docs):
                f.close()


def iter_documents(store: TokenStore) -> Iterator[tuple[str, np.ndarray]]:
    for d, doc_id in enumerate(store.doc_ids):
        yield doc_id, store.document(d)
