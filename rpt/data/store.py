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

from rpt.utils import write_json_atomic

FORMAT_VERSION = 1


class StoreError(RuntimeError):
    """A token store is missing, incomplete, or does not match the tokenizer/config it is used with."""


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
            from rpt.data.prepare import old_path  # the --force swap's aside folder

            swapped = old_path(path.parent)
            hint = f" (an interrupted run left {partial}; run `rpt prepare` again)" if partial.exists() else ""
            if swapped.exists():
                hint = f" (an interrupted `rpt prepare --force` left the old store in {swapped}; run it again to finish)"
            raise StoreError(f"no token store at {path}: {mpath} is missing{hint}")
        manifest = json.loads(mpath.read_text())
        if manifest.get("format_version") != FORMAT_VERSION:
            raise StoreError(f"{mpath}: format_version {manifest.get('format_version')} != {FORMAT_VERSION}")
        offsets = np.load(path / "offsets.npy")
        n = int(offsets[-1])
        dtype = manifest["dtype"]
        tokens = np.memmap(path / "tokens.bin", dtype=dtype, mode="r", shape=(n,)) if n else np.zeros(0, dtype)
        with open(path / "documents.jsonl") as f:
            doc_ids = [json.loads(line)["id"] for line in f]
        if len(doc_ids) != len(offsets) - 1 or n != manifest["n_tokens"]:
            raise StoreError(f"{path}: documents.jsonl/offsets.npy/manifest disagree; rebuild with `rpt prepare`")
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

    def add(self, doc_id: str, token_ids: np.ndarray | list[int]) -> None:
        arr = np.asarray(token_ids, dtype=self.dtype)
        self._bin.write(arr.tobytes())
        self.offsets.append(self.offsets[-1] + len(arr))
        self._docs.write(json.dumps({"id": doc_id, "n_tokens": len(arr)}) + "\n")

    def close(self, stats: dict[str, Any] | None = None) -> Path:
        self._bin.close()
        self._docs.close()
        offsets = np.asarray(self.offsets, dtype=np.int64)
        np.save(self.tmp / "offsets.npy", offsets)
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
        write_json_atomic(self.tmp / "manifest.json", manifest)
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
