"""Corpus readers: each turns a source of long documents into a stream of (document id, text) per split.

A corpus spec is one string (``DataConfig.corpus``); `load_corpus(spec)` resolves it:

    stdlib                 the running Python's standard library, one document per top-level package (below)
    stdlib:json,email      the same, only these packages (tests use small subsets)
    code:<folder>          a code tree: one document per top-level folder (a repository or package), all its .py
                           files concatenated in sorted path order, each under a ``# ---- path/to/file.py ----`` line,
                           as the paper does for CodeParrot (§4.1, following Memorizing Transformers); a top-level
                           .py file is its own document
    <folder>               text files, one file = one document, recursive
    synthetic:copy-near | synthetic:copy-far[?params]
                           the copy corpus whose answer is known, with its own word-level tokenizer
                           (`rpt.data.synthetic`; tokenizer spec "corpus")
    <file>.jsonl[.gz]      one JSON object per line: "text" (required), "id" and "split" (optional)
    hf:pg19 | hf:codeparrot | hf:proof-pile | hf:<owner>/<name>
                           Hugging Face datasets (needs `datasets` and the hub); ``hf:<name>@<folder>`` reads a local
                           copy (parquet/JSON files named by split, e.g. train-00000.parquet) with that dataset's fields

  Books and mathematics from Debian packages, fetched without root by `rpt.data.debian` (``apt-get download`` into
  ~/.cache/rpt/debian or $RPT_CACHE_DIR/debian, once; ``<name>@<folder>`` reads a package unpacked there instead).
  The store's manifest records each package's name, version and licence (`Corpus.provenance`):

    austen                 Jane Austen's six novels (r-cran-janeaustenr, R lazy-load data; needs `rdata`,
                           pip install 'rpt[books]'): one document per novel
    kjv                    the King James Bible (bible-kjv-text, its LZW-compressed text file): one document per book
    pari                   the PARI/GP manuals' TeX sources (pari-doc): one document per .tex file
    metamath               the Metamath databases (metamath-databases: set.mm and the small ones that do not copy it):
                           one document per part or chapter; ``metamath:all`` adds iset.mm and nf.mm,
                           ``metamath:set.mm,nf.mm`` reads only these files
    coq                    the Coq standard library (libcoq-stdlib): one document per library folder (its .v files)

  A spec name of this list wins over a folder of the same name: write ./austen for a folder.

Splits. A corpus has the splits "train", "validation", "test". Where the source does not define them (a code tree, a
folder without train/validation/test subfolders, JSONL lines without "split", CodeParrot), a document's split is a
deterministic hash of its id (of the package or repository name for code, so no repository straddles splits):
sha256(id) mapped to [0, 1): < 0.90 train, < 0.95 validation, else test. Corpora of a few dozen fixed documents
(austen, kjv, pari, coq), where that could leave a split empty, rank their documents by the same hash instead and
hold out the top 5% (at least one document each for test and validation) among those of >= 20,000 characters
(`ranked_splits`); metamath (154 documents) uses the hash.

Nothing is dropped silently: unreadable inputs are counted in a `Skips` (reason -> count and a few example ids) that
`rpt prepare` reports and writes into the manifest. Dropped by rule, and documented here, are only: hidden files and
folders (names starting with "."), ``__pycache__``, the stdlib exclusions listed in `StdlibCorpus`, and the files
of a Debian package that its reader does not read (each reader's docstring says which it reads).
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
import os
import re
import struct
import sys
import sysconfig
import zlib
from abc import abstractmethod
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from rpt.data.documents import SPLIT_ALIASES, SPLITS, Corpus, Document, Skips, normalize_split  # noqa: F401 (re-exported)
from rpt.utils import require

SPLIT_FRACTIONS = (0.90, 0.05, 0.05)


def split_hash(key: str) -> float:
    """sha256(key) mapped to [0, 1): the number both split rules below are made of."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64


def split_of(key: str) -> str:
    """The split of a document or package named `key`: a fixed hash, ~90/5/5, stable across machines and runs."""
    u = split_hash(key)
    edge = 0.0
    for name, frac in zip(SPLITS, SPLIT_FRACTIONS, strict=True):
        edge += frac
        if u < edge:
            return name
    return SPLITS[-1]


HELDOUT_MIN_CHARS = 20_000


def ranked_splits(sizes: dict[str, int], min_heldout: int = HELDOUT_MIN_CHARS) -> dict[str, str]:
    """Splits of a small corpus of fixed documents (id -> size in characters), where `split_of`'s 5% + 5% could
    leave validation or test empty (6 novels: P(no test document) = 0.95**6 = 0.74).

    The rule: documents are ranked by `split_hash(id)`, highest first (ties by id); among those of at least
    `min_heldout` characters (a held-out split of a macro file or a one-page book says nothing about long-range
    modelling), the first n_test = max(1, round(5% of n)) are test and the next n_val = max(1, round(5% of n))
    validation; every other document is train. At least one document stays train (n < 3: everything is train).
    Deterministic across machines; a document keeps its split as long as the set of documents is the same.
    """
    n = len(sizes)
    n_test = max(1, round(SPLIT_FRACTIONS[2] * n))
    n_val = max(1, round(SPLIT_FRACTIONS[1] * n))
    order = sorted(sizes, key=lambda i: (-split_hash(i), i))
    held = [i for i in order if sizes[i] >= min_heldout][: max(0, min(n_test + n_val, n - 1))] if n >= 3 else []
    out = dict.fromkeys(sizes, "train")
    for k, i in enumerate(held):
        out[i] = "test" if k < n_test else "validation"
    return out


def read_text(path: Path) -> tuple[str | None, str]:
    """(text, "") or (None, reason) with reason "binary" (a NUL byte) or "undecodable" (not UTF-8)."""
    data = path.read_bytes()
    if b"\x00" in data:
        return None, "binary"
    try:
        return data.decode("utf-8-sig"), ""
    except UnicodeDecodeError:
        return None, "undecodable"


def _visible(p: Path) -> bool:
    return not p.name.startswith(".") and p.name != "__pycache__"


def _walk(root: Path, suffix: str | None = None, _seen: set[str] | None = None,
          _stack: tuple[str, ...] = ()) -> list[Path]:
    """Files under `root` in sorted relative-path order, hidden entries and __pycache__ pruned. Each real folder is
    read once: a folder already read (a second link to it) is skipped, and so is a symlink to a folder that holds the
    one being read (a loop such as `train/up -> ..`)."""
    top = os.path.realpath(root)
    seen = _seen if _seen is not None else {top}
    stack = (*_stack, top)
    out = []
    for p in sorted(root.iterdir()):
        if not _visible(p):
            continue
        if p.is_dir():
            real = os.path.realpath(p)
            if real in seen or any(a == real or a.startswith(real + os.sep) for a in stack):
                continue  # read already, or it holds a folder being read (a loop)
            seen.add(real)
            out.extend(_walk(p, suffix, seen, stack))
        elif p.is_file() and (suffix is None or p.name.endswith(suffix)):
            out.append(p)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Plain files


class TextFolderCorpus(Corpus):
    """Every file under `root` (recursive) is one document, id = its path relative to `root`.

    If `root` holds folders named train/validation/test (or dev/valid/val), they are the splits (files beside them
    are counted as "outside_split_folders", once, in the first split); otherwise a document's split is
    `split_of(id)`. Binary files (a NUL byte) and non-UTF-8 files are skipped and counted.
    """

    def __init__(self, root: str | Path, spec: str | None = None) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"corpus folder {self.root} does not exist")
        self.spec = spec or str(root)
        self.split_dirs = {SPLIT_ALIASES[p.name.lower()]: p for p in sorted(self.root.iterdir())
                           if p.is_dir() and p.name.lower() in SPLIT_ALIASES}
        if self.split_dirs:
            self.splits = tuple(s for s in SPLITS if s in self.split_dirs)

    def documents(self, split: str, skips: Skips | None = None) -> Iterator[Document]:
        split = self._check_split(split)
        skips = skips if skips is not None else Skips()
        base = self.split_dirs.get(split, self.root)
        if self.split_dirs and split == self.splits[0]:  # files beside the split folders belong to no split
            chosen = {p.resolve() for p in self.split_dirs.values()}
            for p in sorted(self.root.iterdir()):
                if _visible(p) and p.resolve() not in chosen:
                    for f in _walk(p) if p.is_dir() else [p]:
                        skips.add("outside_split_folders", f.relative_to(self.root).as_posix())
        for path in _walk(base):
            doc_id = path.relative_to(base).as_posix()
            if not self.split_dirs and split_of(doc_id) != split:
                continue
            text, reason = read_text(path)
            if text is None:
                skips.add(reason, doc_id)
                continue
            yield Document(doc_id, text)


class JsonlCorpus(Corpus):
    """One JSON object per line: {"text": str, "id"?: str, "split"?: train|validation|test}. Gzip if *.gz.

    Lines that are not UTF-8 ("undecodable"), not JSON ("bad_json"), have no string "text" ("no_text") or an unknown
    "split" ("bad_split") are skipped and counted once, in the split their <file>:<line> hashes to. Without "id" a
    document is named <file>:<line number>; without "split", its split is split_of(id).
    """

    def __init__(self, path: str | Path, spec: str | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"corpus file {self.path} does not exist")
        self.spec = spec or str(path)

    def documents(self, split: str, skips: Skips | None = None) -> Iterator[Document]:
        split = self._check_split(split)
        skips = skips if skips is not None else Skips()
        opener = gzip.open if self.path.suffix == ".gz" else open
        with opener(self.path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                where = f"{self.path.name}:{lineno}"
                if not raw.strip():
                    continue
                # A line that cannot be read has no split of its own: it is counted once, in split_of(where).
                reason = ""
                try:
                    rec = json.loads(raw.decode("utf-8-sig" if lineno == 1 else "utf-8"))  # a BOM opens some files
                except UnicodeDecodeError:
                    reason = "undecodable"
                except (ValueError, RecursionError):  # not JSON, or nested deeper than the decoder goes
                    reason = "bad_json"
                else:
                    if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                        reason = "no_text"
                    elif rec.get("split") is not None and str(rec["split"]).lower() not in SPLIT_ALIASES:
                        reason = "bad_split"
                if reason:
                    if split_of(where) == split:
                        skips.add(reason, where)
                    continue
                doc_id = str(rec["id"]) if rec.get("id") is not None else where
                doc_split = normalize_split(str(rec["split"])) if rec.get("split") is not None else split_of(doc_id)
                if doc_split == split:
                    yield Document(doc_id, rec["text"])


# ---------------------------------------------------------------------------------------------------------------
# Code: repository-level documents


def concat_files(files: list[Path], root: Path, skips: Skips, header: str = "# ---- {path} ----") -> str:
    """Files concatenated in the given order, each under a header line (`# ---- relative/path.py ----` by default:
    a comment in the files' own language)."""
    parts = []
    for f in files:
        rel = f.relative_to(root).as_posix()
        text, reason = read_text(f)
        if text is None:
            skips.add(reason, rel)
            continue
        parts.append(header.format(path=rel) + f"\n{text}" + ("" if text.endswith("\n") or not text else "\n"))
    return "".join(parts)


class CodeTreeCorpus(Corpus):
    """A folder of repositories or packages: each top-level folder is one document (its .py files in sorted path
    order, each under a header line); each top-level .py file is its own document. The split is split_of(name), so
    a repository never straddles splits. Non-.py files are not code and are not read; unreadable .py files are
    skipped and counted (the rest of the repository is kept)."""

    suffix = ".py"

    def __init__(self, root: str | Path, spec: str | None = None, only: list[str] | None = None) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"code folder {self.root} does not exist")
        self.spec = spec or f"code:{root}"
        self.only = only
        if only is not None:
            known = set(self._all_names())
            missing = [n for n in only if n not in known]
            if missing:
                raise ValueError(f"{self.spec}: no package(s) {', '.join(missing)} under {self.root}")

    def include(self, p: Path) -> bool:
        """Whether a top-level entry is a document (subclasses add exclusions)."""
        return _visible(p) and (p.is_dir() or p.name.endswith(self.suffix))

    def include_dir(self, p: Path) -> bool:
        """Whether a folder inside a package is read."""
        return True

    def _all_names(self) -> list[str]:
        return [_unit_name(p, self.suffix) for p in sorted(self.root.iterdir()) if self.include(p)]

    def units(self) -> Iterator[tuple[str, Path]]:
        """(document name, top-level path) in sorted order."""
        for p in sorted(self.root.iterdir()):
            if not self.include(p):
                continue
            name = _unit_name(p, self.suffix)
            if self.only is None or name in self.only:
                yield name, p

    def _files(self, d: Path) -> list[Path]:
        out = []
        for p in sorted(d.iterdir()):
            if not _visible(p):
                continue
            if p.is_dir():
                if self.include_dir(p):
                    out.extend(self._files(p))
            elif p.is_file() and p.name.endswith(self.suffix):
                out.append(p)
        return out

    def documents(self, split: str, skips: Skips | None = None) -> Iterator[Document]:
        split = self._check_split(split)
        skips = skips if skips is not None else Skips()
        for name, p in self.units():
            if split_of(name) != split:
                continue
            files = self._files(p) if p.is_dir() else [p]
            # An empty package yields an empty document, which `rpt prepare` counts as "empty".
            yield Document(name, concat_files(files, self.root, skips))


def _unit_name(p: Path, suffix: str) -> str:
    return p.name[: -len(suffix)] if p.is_file() and p.name.endswith(suffix) else p.name


class StdlibCorpus(CodeTreeCorpus):
    """The running Python's standard library (``sysconfig.get_paths()["stdlib"]``) as repository-level documents.

    One document per top-level package (all its .py files) or top-level module. Excluded, by rule:
      - site-packages / dist-packages (third-party code), lib-dynload, __pycache__, hidden entries;
      - test code: any folder named ``test``, ``tests`` or ``idle_test`` at any depth (Lib/test, idlelib/idle_test,
        lib2to3/tests, unittest/test, ctypes/test, tkinter/test, distutils/tests, ...) - the regression suite is
        mostly generated data and fixtures, and would dominate the corpus;
      - top-level names that are not Python identifiers (config-3.x-<platform>/, _sysconfigdata_<platform>.py),
        which are build-machine specific;
      - every non-.py file.
    Splits: split_of(package name), ~90/5/5 (the same package lands in the same split on every machine).
    """

    EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "lib-dynload"})

    def __init__(self, only: list[str] | None = None, root: str | Path | None = None) -> None:
        root = Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])
        spec = "stdlib" + (f":{','.join(only)}" if only else "")
        super().__init__(root, spec=spec, only=only)

    def include(self, p: Path) -> bool:
        name = _unit_name(p, self.suffix)
        return super().include(p) and p.name not in self.EXCLUDED_DIRS and name.isidentifier()

    def include_dir(self, p: Path) -> bool:
        return _visible(p) and p.name not in self.EXCLUDED_DIRS

    def identity(self) -> dict[str, Any]:
        # The library differs between Python versions: a store built on 3.11 is not reused on 3.12.
        return {"spec": self.spec, "python": ".".join(map(str, sys.version_info[:3]))}


# ---------------------------------------------------------------------------------------------------------------
# Hugging Face datasets


@dataclass(frozen=True)
class HFLayout:
    """Where a known dataset lives on the hub and which fields hold text, id and (for code) the repository."""

    repo: str
    revision: str | None = None  # e.g. the parquet conversion of a script-based dataset
    text: str = "text"
    id: str | None = None  # field naming a document; None = "<split>/<row number>"
    group: str | None = None  # rows with the same value form one document (CodeParrot: repo_name)
    path: str | None = None  # with group: the file path field, used for ordering and headers
    hash_split: bool = False  # True: ignore the source's splits; split_of(group or id)


# pg19 and proof-pile are script-based on the hub, which `datasets` >= 4 no longer runs: read the hub's parquet
# conversion. CodeParrot has a single split; like the paper we make our own split, by repository.
HF_DATASETS = {
    "pg19": HFLayout("deepmind/pg19", revision="refs/convert/parquet", id="short_book_title"),
    "codeparrot": HFLayout("codeparrot/codeparrot-clean", text="content", group="repo_name", path="path", hash_split=True),
    "proof-pile": HFLayout("hoskinson-center/proof-pile", revision="refs/convert/parquet"),
}


class HFCorpus(Corpus):
    """A Hugging Face dataset, streamed (or, for grouped code, sorted on disk by repository and then streamed).

    `local` reads a local copy instead of the hub: a folder or file that `datasets.load_dataset` understands (it
    infers the splits from file names such as train-*.parquet, validation.jsonl, test/...).
    """

    def __init__(self, name: str, local: str | Path | None = None, cache_dir: str | Path | None = None) -> None:
        self.datasets = require("datasets", f"the Hugging Face corpus hf:{name}")
        self.name = name
        self.layout = HF_DATASETS.get(name) or HFLayout(name)
        self.local = Path(local) if local is not None else None
        if self.local is not None and not self.local.exists():
            raise FileNotFoundError(f"hf:{name}@{local}: no such file or folder")
        self.cache_dir = str(cache_dir) if cache_dir is not None else None
        self.spec = f"hf:{name}" + (f"@{local}" if local is not None else "")
        self._source_splits: dict[str, str] | None = None

    def _load(self, split: str | None, streaming: bool) -> Any:
        kw: dict[str, Any] = {"streaming": streaming, "cache_dir": self.cache_dir}
        if self.local is not None:
            path = str(self.local)
            if self.local.is_file():
                builder = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".gz": "json"}.get(self.local.suffix)
                if builder is None:
                    raise ValueError(f"{self.spec}: cannot tell the format of {self.local.name} (use .parquet or .jsonl)")
                path, kw["data_files"] = builder, {"train": str(self.local)}
        else:
            path = self.layout.repo
            if self.layout.revision:
                kw["revision"] = self.layout.revision
        try:
            return self.datasets.load_dataset(path, split=split, **kw)
        except Exception as e:  # no network, unknown repo, unreadable files, ...: one clear line for the CLI
            if self.local is not None:
                raise ValueError(f"{self.spec}: could not read {self.local}: {type(e).__name__}: {e}") from e
            raise ValueError(f"{self.spec}: could not load {self.layout.repo} from the hub: {type(e).__name__}: {e}. "
                             f"Without network, download it elsewhere and use hf:{self.name}@<folder>") from e

    def _split_map(self) -> dict[str, str]:
        """Our split name -> the source's split name."""
        if self._source_splits is None:
            ds = self._load(None, streaming=True)
            self._source_splits = {}
            for s in ds.keys():
                ours = SPLIT_ALIASES.get(s.lower())
                if ours is not None:
                    self._source_splits[ours] = s
            if not self._source_splits:
                raise ValueError(f"{self.spec}: no train/validation/test split among {list(ds.keys())}")
        return self._source_splits

    @property
    def splits(self) -> tuple[str, ...]:  # type: ignore[override]
        if self.layout.hash_split:
            return SPLITS
        return tuple(s for s in SPLITS if s in self._split_map())

    def documents(self, split: str, skips: Skips | None = None) -> Iterator[Document]:
        split = self._check_split(split)
        skips = skips if skips is not None else Skips()
        lay = self.layout
        if lay.group is not None:
            yield from self._grouped(split, skips)
            return
        sources = list(self._split_map().items()) if lay.hash_split else [(split, self._split_map()[split])]
        for _, source in sources:
            for i, row in enumerate(self._load(source, streaming=True)):
                doc_id = str(row[lay.id]) if lay.id and row.get(lay.id) is not None else f"{source}/{i}"
                if lay.hash_split and split_of(doc_id) != split:
                    continue
                text = row.get(lay.text)
                if not isinstance(text, str):
                    skips.add("no_text", doc_id)
                    continue
                yield Document(doc_id, text)

    def _grouped(self, split: str, skips: Skips) -> Iterator[Document]:
        """Rows of one repository -> one document, files in path order. Sorting is done by `datasets` on disk
        (an index over the memory-mapped table), so a repository at a time is in memory, never the corpus."""
        lay = self.layout
        assert lay.group is not None and lay.path is not None
        full = self._load(None, streaming=False)
        for source in sorted(full.keys()):
            ds = full[source].select_columns([lay.group, lay.path, lay.text]).sort([lay.group, lay.path])
            group: str | None = None
            parts: list[str] = []
            for row in ds:
                if row[lay.group] != group:
                    if group is not None and split_of(group) == split:
                        yield Document(group, "".join(parts))
                    group, parts = row[lay.group], []
                if split_of(row[lay.group]) != split:
                    continue
                text = row[lay.text]
                if not isinstance(text, str):
                    skips.add("no_text", f"{row[lay.group]}/{row[lay.path]}")
                    continue
                parts.append(f"# ---- {row[lay.path]} ----\n{text}" + ("" if text.endswith("\n") or not text else "\n"))
            if group is not None and split_of(group) == split:
                yield Document(group, "".join(parts))


# ---------------------------------------------------------------------------------------------------------------
# Debian packages: books and mathematics (fetched by `rpt.data.debian`, read in their real formats)


class DebianCorpus(Corpus):
    """A corpus read from one Debian package: fetched into the cache on first use (`rpt.data.debian.fetch`), or
    read from a folder where the package is unpacked (spec ``<name>@<folder>``: the folder holding usr/, or the
    package's data folder itself).

    Subclasses yield every document in a fixed order (`_read_all`); the split of a document is `split_of(id)` or,
    for corpora of a few dozen documents, `ranked_splits` (``split_rule = "ranked"``). Inputs that cannot be read
    belong to no split: they are counted once, in the train split's `Skips`.
    """

    name: ClassVar[str]
    package: ClassVar[str]
    data_dir: ClassVar[str]  # where the documents are, relative to the package root
    marker: ClassVar[str]  # a path inside data_dir that identifies it
    split_rule: ClassVar[str] = "hash"  # "hash": split_of(id); "ranked": ranked_splits
    text_license: ClassVar[str | None] = None  # the licence of the text itself, where the package's says less
    # True: decode once and keep the documents (a few MB) for the other splits and the tokenizer's pass, where
    # decoding costs seconds (R serialization, LZW in Python) and the text is small.
    keep_in_memory: ClassVar[bool] = False

    def __init__(self, folder: str | Path | None = None, cache_dir: str | Path | None = None) -> None:
        from rpt.data import debian

        if folder is not None:
            self.package_info = debian.from_folder(self.package, folder)
        else:
            self.package_info = debian.fetch(self.package, cache_dir, spec=self.name)
        self.spec = self.name + (f"@{folder}" if folder is not None else "")
        self.data = self._locate()
        self._assignment: dict[str, str] | None = None
        self._kept: tuple[list[Document], Skips] | None = None

    def _locate(self) -> Path:
        root = self.package_info.root
        for cand in (root / self.data_dir, root):
            if (cand / self.marker).exists():
                return cand
        raise FileNotFoundError(f"corpus {self.spec}: {root / self.data_dir / self.marker} does not exist (expected "
                                f"{self.package} unpacked in {root}, e.g. with dpkg -x)")

    def identity(self) -> dict[str, Any]:
        # Another version of the package is another corpus: a store is not reused across versions.
        return {"spec": self.spec, "package": self.package, "version": self.package_info.version}

    def provenance(self) -> dict[str, Any]:
        out: dict[str, Any] = {"debian": [self.package_info.provenance()]}
        if self.text_license:
            out["text_license"] = self.text_license
        return out

    @abstractmethod
    def _read_all(self, skips: Skips) -> Iterator[Document]:
        """Every document of the corpus, in a fixed order."""

    def _all(self, skips: Skips) -> Iterator[Document]:
        if not self.keep_in_memory:
            yield from self._read_all(skips)
            return
        if self._kept is None:
            kept = Skips()
            self._kept = (list(self._read_all(kept)), kept)
        docs, kept = self._kept
        for reason, n in kept.counts.items():
            skips.counts[reason] += n
            ex = skips.examples.setdefault(reason, [])
            ex.extend(kept.examples.get(reason, [])[: max(0, skips.max_examples - len(ex))])
        yield from docs

    def split_of_document(self, doc_id: str) -> str:
        if self.split_rule == "hash":
            return split_of(doc_id)
        if self._assignment is None:
            self._assignment = ranked_splits({d.id: len(d.text) for d in self._all(Skips())})
        return self._assignment.get(doc_id, "train")

    def documents(self, split: str, skips: Skips | None = None) -> Iterator[Document]:
        split = self._check_split(split)
        skips = skips if skips is not None else Skips()
        sink = skips if split == self.splits[0] else Skips()
        for doc in self._all(sink):
            if self.split_of_document(doc.id) == split:
                yield doc


# --- Jane Austen: R lazy-load data ---------------------------------------------------------------------------


def read_lazyload(index: Path) -> Iterator[tuple[str, Any]]:
    """The objects of an R lazy-load database (``<name>.rdx`` beside ``<name>.rdb``), as `rdata` converts them, in
    sorted name order.

    The .rdx is a compressed serialized R list: ``variables`` (name -> c(offset, length) into the .rdb),
    ``references`` (environments, unused by data) and ``compressed``. Each .rdb record is a 4-byte big-endian
    uncompressed length followed by the compressed serialization: zlib when ``compressed`` is TRUE/1; for 2 and 3
    a type byte comes first ("Z" zlib, "2" bzip2, "X" xz, "0" stored)."""
    rdata = require("rdata", "the austen corpus (R lazy-load data)")
    idx = rdata.conversion.convert(rdata.parser.parse_data(index.read_bytes(), extension=".rds"))
    variables = idx["variables"]
    flag = idx.get("compressed")
    mode = int(flag[0]) if flag is not None and len(flag) else 1
    blob = index.with_suffix(".rdb").read_bytes()
    for name in sorted(variables, key=str):
        offset, length = (int(x) for x in variables[name][:2])
        data = _rdb_payload(blob[offset: offset + length], mode)
        yield str(name), rdata.conversion.convert(rdata.parser.parse_data(data, extension=".rds"))


def _rdb_payload(record: bytes, mode: int) -> bytes:
    body = record[4:]
    kind = b"Z" if mode == 1 else body[:1]
    if mode != 1:
        body = body[1:]
    if kind == b"Z":
        return zlib.decompress(body)
    if kind == b"2":
        return bz2.decompress(body)
    if kind == b"X":
        return lzma.decompress(body)
    if kind == b"0":
        return body
    raise ValueError(f"unknown R lazy-load compression {kind!r} (mode {mode})")


class AustenCorpus(DebianCorpus):
    """Jane Austen's six completed novels (Debian ``r-cran-janeaustenr``, CRAN's janeaustenr): one document per
    novel, id = the R object's name (emma, mansfieldpark, northangerabbey, persuasion, prideprejudice,
    sensesensibility), text = its lines joined with newlines. The novels are R lazy-load data
    (data/Rdata.rdx + .rdb), read with `rdata` (``pip install 'rpt[books]'``); an object that is not a character
    vector is skipped as "not_text".
    Splits: ranked_splits (six documents): 4 train / 1 validation / 1 test."""

    name = "austen"
    package = "r-cran-janeaustenr"
    data_dir = "usr/lib/R/site-library/janeaustenr/data"
    marker = "Rdata.rdx"
    split_rule = "ranked"
    keep_in_memory = True
    text_license = "public domain (novels published 1811-1818); the package (MIT) is the R packaging"

    def __init__(self, folder: str | Path | None = None, cache_dir: str | Path | None = None) -> None:
        require("rdata", "the austen corpus (R lazy-load data)")  # before any download
        super().__init__(folder, cache_dir)

    def _read_all(self, skips: Skips) -> Iterator[Document]:
        for name, value in read_lazyload(self.data / self.marker):
            lines = _r_strings(value)
            if lines is None:
                skips.add("not_text", name)
                continue
            yield Document(name, "\n".join(lines) + "\n")


def _r_strings(value: Any) -> list[str] | None:
    """An R character vector as `rdata` converts it (a numpy str/object array; a list before rdata 1.0) -> its
    strings (NA as ""); None for anything else."""
    if hasattr(value, "dtype"):
        if value.dtype.kind not in "UO":
            return None
        value = value.tolist()
    if not isinstance(value, list | tuple) or not all(x is None or isinstance(x, str) for x in value):
        return None
    return ["" if x is None else x for x in value]


# --- The King James Bible: the BRS compressed text ---------------------------------------------------------------


def unlzw(data: bytes, max_bits: int = 16, block_mode: bool = True) -> bytes:
    """Decode an LZW stream of Unix `compress` (.Z) without its 3-byte header.

    Codes are packed least-significant bit first, starting at 9 bits. A code is added to the table per code read
    (after the first); when the next free code would not fit, the width grows by one bit up to `max_bits`, and
    the input skips to the end of the current group of 8 codes (compress writes whole groups of n_bits bytes, so
    the padding is counted from where the current width began). In block mode code 256 clears the table and the
    width goes back to 9 bits, with the same skip. A code one past the table is the "KwKwK" case (the previous
    string plus its own first byte).
    """
    table = [bytes([i]) for i in range(256)]
    if block_mode:
        table.append(b"")  # 256: CLEAR
    limit = 1 << max_bits
    n_bits, maxcode = 9, (1 << 9) - 1
    buf = data + b"\0\0\0"
    end = len(data) * 8
    pos = start = 0  # bit position; where the current width began
    out = bytearray()
    prev: bytes | None = None
    while pos + n_bits <= end:
        if len(table) > maxcode and n_bits < max_bits:
            group = n_bits * 8
            pos = start = start + -(-(pos - start) // group) * group
            n_bits += 1
            maxcode = limit if n_bits == max_bits else (1 << n_bits) - 1
            continue
        i = pos >> 3
        code = ((buf[i] | buf[i + 1] << 8 | buf[i + 2] << 16) >> (pos & 7)) & ((1 << n_bits) - 1)
        pos += n_bits
        if prev is None:
            if code > 255:
                raise ValueError(f"corrupt LZW stream: first code {code}")
            prev = table[code]
            out += prev
            continue
        if code == 256 and block_mode:
            del table[256:]
            group = n_bits * 8
            pos = start = start + -(-(pos - start) // group) * group
            n_bits, maxcode = 9, (1 << 9) - 1
            continue
        if code < len(table):
            entry = table[code]
        elif code == len(table):
            entry = prev + prev[:1]
        else:
            raise ValueError(f"corrupt LZW stream: code {code} with {len(table)} in the table")
        out += entry
        if len(table) < limit:
            table.append(prev + entry[:1])
        prev = entry
    return bytes(out)


BRS_MAGIC = b"EC02"


def read_brs_text(path: Path) -> str:
    """The text of a Bible Retrieval System data file (Debian bible-kjv-text's /usr/lib/bible.data).

    Layout (big-endian): "EC02" and an 80-byte description; the uncompressed block size (65,536) and the number of
    blocks n at byte 84; n + 1 block offsets at byte 92 (the last = the file size); a `compress` header
    (1f 9d, then flags: bits 0-4 the maximum code width, bit 7 block mode) just before the first block. Each block
    is an LZW stream of its own (`unlzw`) that decodes to one block of text (the last one shorter)."""
    blob = path.read_bytes()
    if blob[:4] != BRS_MAGIC or len(blob) < 92:
        raise ValueError(f"{path}: not a Bible Retrieval System data file (no {BRS_MAGIC!r} header)")
    block_size, n = struct.unpack(">II", blob[84:92])
    offsets = struct.unpack(f">{n + 1}I", blob[92: 92 + 4 * (n + 1)])
    if list(offsets) != sorted(offsets) or offsets[-1] != len(blob):
        raise ValueError(f"{path}: damaged block table ({n} blocks, last offset {offsets[-1]}, file {len(blob)} bytes)")
    max_bits, block_mode = 16, True
    head = blob[offsets[0] - 3: offsets[0]]
    if head[:2] == b"\x1f\x9d":
        max_bits, block_mode = head[2] & 0x1F, bool(head[2] & 0x80)
    parts = []
    for k in range(n):
        part = unlzw(blob[offsets[k]: offsets[k + 1]], max_bits, block_mode)
        if len(part) != block_size and k < n - 1:
            raise ValueError(f"{path}: block {k} decodes to {len(part)} bytes, not {block_size}")
        parts.append(part)
    return b"".join(parts).decode("utf-8")


KJV_BOOKS = (
    "Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth", "1 Samuel", "2 Samuel",
    "1 Kings", "2 Kings", "1 Chronicles", "2 Chronicles", "Ezra", "Nehemiah", "Esther", "Job", "Psalms", "Proverbs",
    "Ecclesiastes", "Song of Solomon", "Isaiah", "Jeremiah", "Lamentations", "Ezekiel", "Daniel", "Hosea", "Joel",
    "Amos", "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah", "Haggai", "Zechariah", "Malachi",
    "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "1 Corinthians", "2 Corinthians", "Galatians", "Ephesians",
    "Philippians", "Colossians", "1 Thessalonians", "2 Thessalonians", "1 Timothy", "2 Timothy", "Titus", "Philemon",
    "Hebrews", "James", "1 Peter", "2 Peter", "1 John", "2 John", "3 John", "Jude", "Revelation",
)
_VERSE = re.compile(r"(\d?[A-Za-z]+)(\d+):(\d+) (.*)")


class KJVCorpus(DebianCorpus):
    """The King James Bible (Debian ``bible-kjv-text``: the Bible Retrieval System's compressed text, decoded
    here by `read_brs_text`, no need for the `bible` program). One document per book (66), id = the book's name
    (Genesis ... Revelation, the canonical order of the file's books), text = the name, then one line per verse
    "<chapter>:<verse> <text>" with a blank line between chapters. Lines that are not verses (the file's title
    line) are counted as "not_a_verse".
    Splits: ranked_splits (66 documents: 60 train / 3 validation / 3 test; only books of >= 20,000 characters are
    held out)."""

    name = "kjv"
    package = "bible-kjv-text"
    data_dir = "usr/lib"
    marker = "bible.data"
    split_rule = "ranked"
    keep_in_memory = True
    text_license = ("public domain: the package's copyright file says the copyright of the 1611 text has expired "
                    "(in the UK it is under Crown letters patent); the package (GPL-2+) is the program's")

    def _read_all(self, skips: Skips) -> Iterator[Document]:
        books: list[tuple[str, list[str]]] = []
        chapter = None
        for line in read_brs_text(self.data / self.marker).splitlines():
            m = _VERSE.fullmatch(line)
            if m is None:
                if line.strip():
                    skips.add("not_a_verse", line[:40])
                continue
            abbrev, ch, verse, text = m.groups()
            if not books or books[-1][0] != abbrev:
                books.append((abbrev, []))
                chapter = None
            lines = books[-1][1]
            if chapter is not None and ch != chapter:
                lines.append("")
            chapter = ch
            lines.append(f"{ch}:{verse} {text}")
        if len(books) != len(KJV_BOOKS):
            raise ValueError(f"{self.data / self.marker}: {len(books)} books, expected {len(KJV_BOOKS)} "
                             f"({', '.join(b for b, _ in books[:5])}, ...)")
        for name, (_, lines) in zip(KJV_BOOKS, books, strict=True):
            yield Document(name, f"{name}\n\n" + "\n".join(lines) + "\n")


# --- PARI/GP: the manuals' TeX sources ----------------------------------------------------------------------------


class PariCorpus(DebianCorpus):
    """The PARI/GP documentation's TeX sources (Debian ``pari-doc``, /usr/share/pari/doc): one document per .tex
    file (a .tex.gz is read decompressed), id = the file name: the chapters of the User's Guide and of the library
    manual (usersch1-8.tex), the tutorials, the developer's guide, the reference card, appendices, and the macro
    and configuration files (the small ones are skipped by `rpt prepare` as too short, and counted). The
    .pdf/.dvi renderings and the gphelp keyword list are not read.
    Splits: ranked_splits (18 documents: 16 train / 1 validation / 1 test)."""

    name = "pari"
    package = "pari-doc"
    data_dir = "usr/share/pari/doc"
    marker = "parimacro.tex"
    split_rule = "ranked"

    def _read_all(self, skips: Skips) -> Iterator[Document]:
        for path in _walk(self.data):
            if path.name.endswith(".tex"):
                raw = path.read_bytes()
                doc_id = path.relative_to(self.data).as_posix()
            elif path.name.endswith(".tex.gz"):
                doc_id = path.relative_to(self.data).as_posix()
                try:
                    raw = gzip.decompress(path.read_bytes())
                except (OSError, EOFError, zlib.error):
                    skips.add("bad_gzip", doc_id)
                    continue
            else:
                continue
            try:
                yield Document(doc_id, raw.decode("utf-8-sig"))
            except UnicodeDecodeError:
                skips.add("undecodable", doc_id)


# --- Metamath: set.mm and the other databases ----------------------------------------------------------------------


_MM_DECORATION = re.compile(r"#{4,}|(?:#\*){2,}#?")  # a part ("####...") or chapter ("#*#*...") header line
_MM_COMMENT = re.compile(r"\$\(.*?\$\)", re.S)


def split_metamath(name: str, text: str) -> list[tuple[str, str]]:
    """A Metamath database cut into (id, text) documents at its part and chapter headers.

    A header is a comment whose first line is "$(" alone and whose next line is a decoration of "####" (a part)
    or "#*#*" (a chapter); the title is the text up to the closing decoration. Section ("=-=-") and subsection
    ("-.-.") headers do not cut: in set.mm chapters are tens of thousands of tokens (sections a few thousand).
    A header that follows the previous one with no statement between them (only comments: a part's introduction)
    does not cut either: its title is appended to that document's. Text before the first header belongs to the
    first document. id = "<file>:<title> / <title>...", with " (2)", " (3)" for a repeated title; a file
    without headers is one document named by the file.
    """
    lines = text.split("\n")
    cuts: list[tuple[int, str]] = []  # (line of "$(", title)
    for i in range(len(lines) - 1):
        if lines[i].strip() != "$(" or not _MM_DECORATION.fullmatch(lines[i + 1].strip()):
            continue
        deco, title = lines[i + 1].strip(), []
        for line in lines[i + 2: i + 12]:
            if line.strip() == deco or _MM_DECORATION.fullmatch(line.strip()):
                break
            if line.strip():
                title.append(line.strip())
        cuts.append((i, " ".join(title) or f"line {i + 1}"))
    if not cuts:
        return [(name, text)]
    groups: list[tuple[int, list[str]]] = []
    for k, (line, title) in enumerate(cuts):
        if groups:
            between = "\n".join(lines[groups[-1][0]: line])
            if not _MM_COMMENT.sub("", between).strip():
                groups[-1][1].append(title)
                continue
        groups.append((0 if k == 0 else line, [title]))
    out, seen = [], Counter()
    for k, (start, titles) in enumerate(groups):
        stop = groups[k + 1][0] if k + 1 < len(groups) else len(lines)
        doc_id = f"{name}:{' / '.join(titles)}"
        seen[doc_id] += 1
        if seen[doc_id] > 1:
            doc_id += f" ({seen[doc_id]})"
        body = "\n".join(lines[start:stop])
        out.append((doc_id, body + "\n" if stop < len(lines) else body))
    return out


class MetamathCorpus(DebianCorpus):
    """The Metamath databases (Debian ``metamath-databases``, /usr/share/metamath/databases/*.mm), each cut into
    part/chapter documents by `split_metamath`: set.mm (ZFC set theory, ~41 MB: 130 documents) and the databases
    that do not copy it (ql.mm, hol.mm, peano.mm, miu.mm, big-unifier.mm, demo0.mm).

    Left out by default (`DERIVED`): iset.mm and nf.mm, whose logic chapters are copies of set.mm's (64% and 54% of
    their lines of over 30 characters are lines of set.mm, against <= 5% for the others but demo0.mm's 12): with
    them, near-copies of training chapters land in validation and test. ``metamath:all`` reads every .mm file,
    ``metamath:set.mm,nf.mm`` only these.
    Splits: split_of(document id)."""

    name = "metamath"
    package = "metamath-databases"
    data_dir = "usr/share/metamath/databases"
    marker = "set.mm"
    DERIVED = ("iset.mm", "nf.mm")

    def __init__(self, folder: str | Path | None = None, cache_dir: str | Path | None = None,
                 only: list[str] | None = None) -> None:
        super().__init__(folder, cache_dir)
        self.only = only
        if only is not None:
            self.spec = f"{self.name}:{','.join(only)}" + (f"@{folder}" if folder is not None else "")
            missing = [n for n in only if n != "all" and not (self.data / n).is_file()]
            if missing:
                have = ", ".join(p.name for p in sorted(self.data.glob("*.mm")))
                raise ValueError(f"corpus {self.spec}: no database(s) {', '.join(missing)} in {self.data} ({have})")

    def include(self, name: str) -> bool:
        if self.only is None:
            return name not in self.DERIVED
        return "all" in self.only or name in self.only

    def _read_all(self, skips: Skips) -> Iterator[Document]:
        for path in sorted(self.data.glob("*.mm")):
            if not self.include(path.name):
                continue
            text, reason = read_text(path)
            if text is None:
                skips.add(reason, path.name)
                continue
            for doc_id, body in split_metamath(path.name, text):
                yield Document(doc_id, body)


# --- Coq: the standard library ------------------------------------------------------------------------------------


class CoqCorpus(DebianCorpus):
    """The Coq standard library's sources (Debian ``libcoq-stdlib``, /usr/lib/ocaml/coq): one document per
    top-level library folder of theories/ and user-contrib/ (theories/Arith, theories/Reals, ...,
    user-contrib/Ltac2), its .v files concatenated in sorted path order, each under a
    ``(* ---- theories/Arith/PeanoNat.v ---- *)`` line (as `CodeTreeCorpus` does for Python); a .v file directly
    in theories/ or user-contrib/ is its own document. The compiled .vo/.glob files and the HTML are not read.
    Splits: ranked_splits (39 documents: 35 train / 2 validation / 2 test)."""

    name = "coq"
    package = "libcoq-stdlib"
    data_dir = "usr/lib/ocaml/coq"
    marker = "theories/Init/Prelude.v"
    split_rule = "ranked"
    TOP = ("theories", "user-contrib")

    def _read_all(self, skips: Skips) -> Iterator[Document]:
        for top in self.TOP:
            base = self.data / top
            if not base.is_dir():
                continue
            for p in sorted(base.iterdir()):
                if not _visible(p) or not (p.is_dir() or p.name.endswith(".v")):
                    continue
                files = _walk(p, ".v") if p.is_dir() else [p]
                doc_id = p.relative_to(self.data).as_posix()
                yield Document(doc_id, concat_files(files, self.data, skips, header="(* ---- {path} ---- *)"))


DEBIAN_CORPORA: dict[str, type[DebianCorpus]] = {c.name: c for c in (AustenCorpus, KJVCorpus, PariCorpus,
                                                                      MetamathCorpus, CoqCorpus)}


# ---------------------------------------------------------------------------------------------------------------


def load_corpus(spec: str, cache_dir: str | Path | None = None) -> Corpus:
    """Resolve a corpus spec (see the module docstring). `cache_dir`: the `datasets` cache for hf: corpora, the
    Debian package cache for austen, kjv, pari, metamath, coq (default: `rpt.data.debian.cache_root()`)."""
    spec = spec.strip()
    head, at, folder = spec.partition("@")
    name, _, only = head.partition(":")
    if name in DEBIAN_CORPORA:
        if at and not folder:
            raise ValueError(f"corpus {spec!r}: expected {name}@<folder where {DEBIAN_CORPORA[name].package} is unpacked>")
        cls = DEBIAN_CORPORA[name]
        if cls is MetamathCorpus:
            names = [n.strip() for n in only.split(",") if n.strip()] if only else None
            return MetamathCorpus(folder or None, cache_dir, only=names)
        if only:
            raise ValueError(f"corpus {spec!r}: {name} takes no :<selection> (only metamath:<file.mm,...> does)")
        return cls(folder or None, cache_dir)
    if spec == "stdlib" or spec.startswith("stdlib:"):
        names = [n.strip() for n in spec[len("stdlib:"):].split(",") if n.strip()] if ":" in spec else None
        if names is not None and not names:
            raise ValueError("stdlib:<packages> needs at least one package name, e.g. stdlib:json,email")
        return StdlibCorpus(only=names)
    if spec.startswith("synthetic:"):
        from rpt.data.synthetic import CopyCorpus, parse_spec

        return CopyCorpus(parse_spec(spec))
    if spec.startswith("code:"):
        return CodeTreeCorpus(spec[len("code:"):], spec=spec)
    if spec.startswith("hf:"):
        name, _, local = spec[len("hf:"):].partition("@")
        if not name:
            raise ValueError(f"corpus {spec!r}: expected hf:<dataset>[@<local folder>], e.g. hf:pg19")
        return HFCorpus(name, local=local or None, cache_dir=cache_dir)
    path = Path(spec)
    if path.is_dir():
        return TextFolderCorpus(path, spec=spec)
    if path.is_file():
        if path.name.endswith((".jsonl", ".jsonl.gz", ".json")):
            return JsonlCorpus(path, spec=spec)
        raise ValueError(f"corpus file {spec}: expected a .jsonl file (one JSON object with \"text\" per line)")
    raise FileNotFoundError(f"corpus {spec!r} not found: not a folder or file, and not one of stdlib, stdlib:<packages>, "
                            f"code:<folder>, hf:pg19, hf:codeparrot, hf:proof-pile, synthetic:copy-near, synthetic:copy-far, "
                            f"{', '.join(DEBIAN_CORPORA)}")
