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

Splits. A corpus has the splits "train", "validation", "test". Where the source does not define them (a code tree, a
folder without train/validation/test subfolders, JSONL lines without "split", CodeParrot), a document's split is a
deterministic hash of its id (of the package or repository name for code, so no repository straddles splits):
sha256(id) mapped to [0, 1): < 0.90 train, < 0.95 validation, else test.

Nothing is dropped silently: unreadable inputs are counted in a `Skips` (reason -> count and a few example ids) that
`rpt prepare` reports and writes into the manifest. Dropped by rule, and documented here, are only: hidden files and
folders (names starting with "."), ``__pycache__``, and the stdlib exclusions listed in `StdlibCorpus`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
import sysconfig
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from rpt.utils import require

SPLITS = ("train", "validation", "test")
SPLIT_FRACTIONS = (0.90, 0.05, 0.05)
_SPLIT_ALIASES = {"train": "train", "validation": "validation", "valid": "validation", "val": "validation",
                  "dev": "validation", "test": "test"}


class Document(NamedTuple):
    id: str
    text: str


@dataclass
class Skips:
    """Inputs that were not turned into documents: reason -> count, with the first few ids for the report."""

    counts: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    max_examples: int = 5

    def add(self, reason: str, item: str) -> None:
        self.counts[reason] += 1
        ex = self.examples.setdefault(reason, [])
        if len(ex) < self.max_examples:
            ex.append(item)

    def total(self) -> int:
        return sum(self.counts.values())

    def to_dict(self) -> dict[str, Any]:
        return {r: {"count": n, "examples": self.examples.get(r, [])} for r, n in sorted(self.counts.items())}

    def __str__(self) -> str:
        if not self.counts:
            return "none"
        return ", ".join(f"{r}: {n} (e.g. {', '.join(self.examples.get(r, [])[:2])})" for r, n in sorted(self.counts.items()))


def split_of(key: str) -> str:
    """The split of a document or package named `key`: a fixed hash, ~90/5/5, stable across machines and runs."""
    u = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
    edge = 0.0
    for name, frac in zip(SPLITS, SPLIT_FRACTIONS, strict=True):
        edge += frac
        if u < edge:
            return name
    return SPLITS[-1]


def normalize_split(name: str) -> str:
    try:
        return _SPLIT_ALIASES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown split {name!r}; use one of {', '.join(SPLITS)}") from None


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


def _walk(root: Path, suffix: str | None = None) -> list[Path]:
    """Files under `root` in sorted relative-path order, hidden entries and __pycache__ pruned."""
    out = []
    for p in sorted(root.iterdir()):
        if not _visible(p):
            continue
        if p.is_dir():
            out.extend(_walk(p, suffix))
        elif p.is_file() and (suffix is None or p.name.endswith(suffix)):
            out.append(p)
    return out


class Corpus(ABC):
    """Long documents grouped into splits. `documents(split)` streams them; nothing is held in memory."""

    spec: str
    splits: tuple[str, ...] = SPLITS

    @abstractmethod
    def documents(self, split: str, skips: Skips | None = None) -> Iterator[Document]:
        """Documents of `split` in a fixed order; inputs that cannot be read are counted in `skips`."""

    def identity(self) -> dict[str, Any]:
        """What a store's manifest records about its source (compared when a store is reused)."""
        return {"spec": self.spec}

    def _check_split(self, split: str) -> str:
        split = normalize_split(split)
        if split not in self.splits:
            raise ValueError(f"corpus {self.spec!r} has no split {split!r} (it has {', '.join(self.splits)})")
        return split


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
        self.split_dirs = {_SPLIT_ALIASES[p.name.lower()]: p for p in sorted(self.root.iterdir())
                           if p.is_dir() and p.name.lower() in _SPLIT_ALIASES}
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
                    rec = json.loads(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    reason = "undecodable"
                except json.JSONDecodeError:
                    reason = "bad_json"
                else:
                    if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                        reason = "no_text"
                    elif rec.get("split") is not None and str(rec["split"]).lower() not in _SPLIT_ALIASES:
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


def concat_files(files: list[Path], root: Path, skips: Skips) -> str:
    """Files concatenated in the given order, each under a `# ---- relative/path.py ----` header line."""
    parts = []
    for f in files:
        rel = f.relative_to(root).as_posix()
        text, reason = read_text(f)
        if text is None:
            skips.add(reason, rel)
            continue
        parts.append(f"# ---- {rel} ----\n{text}" + ("" if text.endswith("\n") or not text else "\n"))
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
                ours = _SPLIT_ALIASES.get(s.lower())
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


def load_corpus(spec: str, cache_dir: str | Path | None = None) -> Corpus:
    """Resolve a corpus spec (see the module docstring). `cache_dir` is the `datasets` cache for hf: corpora."""
    spec = spec.strip()
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
                            f"code:<folder>, hf:pg19, hf:codeparrot, hf:proof-pile, synthetic:copy-near, synthetic:copy-far")
