"""The label pipeline (§3.2): token store -> BM25 candidates (+ target scores) -> label store.

Two label sets:
- ``lex``: BM25 top-k candidates only (RPT-Lex takes them as positives; RETRO feeds them to CCA).
- ``sem``: the same candidates plus the scoring LM's target score s_t of each (RPT-Sem).

Retrieval spans: a training sequence length (e.g. 16384 tokens: every document is cut into consecutive spans from its
start, the last one shorter, and retrieval and segments are counted from each span's start, as the model sees them
in training), or ``None`` = the whole document (evaluation). Candidate ids are document-absolute chunk indices.

Work is split into documents: documents are divided into contiguous shards of about equal chunk counts (``shard=(i,
n)`` or RANK/WORLD_SIZE from torchrun), each document is labelled and made durable before the next, a killed run
resumes after its last complete document, and a folder appears only when complete. When the last shard finishes, the
shards are merged into the final folder.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rpt.chunks import chunks_per_segment, pool_size
from rpt.labels.bm25 import K1, B, Query, bm25_candidates
from rpt.labels.scorer import DecodeBatch, Scorer, target_scores
from rpt.labels.store import OWNER as LABELS_OWNER
from rpt.labels.store import LabelError, LabelStore, LabelWriter, merge_label_stores, span_name
from rpt.locks import folder_lock
from rpt.outputs import claim_folder
from rpt.utils import argument_error

Kind = Literal["lex", "sem"]
Candidates = Literal["bm25", "all"]
BM25_VARIANT = "lucene"  # see rpt/labels/bm25.py
SCORE_ROWS = 256  # query chunks per target_scores call (each brings k + 1 scorer sequences) ...
SCORE_PAIRS = 8192  # ... and at most about this many (query, candidate) pairs per call (exhaustive candidates)
QUERY_SEED = 20231  # the draw of sampled query chunks (query_fraction < 1): fixed, so a resumed run draws the same


@dataclass(frozen=True)
class LabelSpec:
    """What a label set is: everything that changes its contents (the scorer aside)."""

    kind: Kind = "sem"  # lex: BM25 candidates only | sem: candidates + target scores
    span: int | None = 16384  # tokens per retrieval span (a training sequence); None = whole document
    chunk_size: int = 64  # M
    segment_len: int = 1024  # S; the retrievable rule counts segments from each span's start
    k: int = 20  # candidates per query chunk
    k1: float = K1
    b: float = B
    query: Query = "pair"  # pair: (c_i, c_{i+1}) as in §3.2 | chunk: c_i alone
    # bm25: BM25's top-k retrievable chunks (training labels, §3.2) | all: EVERY retrievable chunk, BM25's order first
    # (k is then the largest pool of the labelled documents): exhaustive gold for the retrieval metrics (§5.2)
    candidates: Candidates = "bm25"
    query_fraction: float = 1.0  # share of query chunks scored (kind sem): a fixed random draw per document

    def validate(self) -> None:
        if self.kind not in ("lex", "sem"):
            raise LabelError(f"kind must be lex or sem, not {self.kind!r}")
        if self.query not in ("pair", "chunk"):
            raise LabelError(f"query must be pair or chunk, not {self.query!r}")
        try:
            chunks_per_segment(self.chunk_size, self.segment_len)
        except ValueError as e:
            raise LabelError(str(e)) from None
        if self.span is not None and (self.span <= 0 or self.span % self.segment_len):
            raise LabelError(f"span={self.span} must be a positive multiple of segment_len={self.segment_len}")
        if self.k < 1:
            raise LabelError(f"k must be >= 1, not {self.k}")
        if self.candidates not in ("bm25", "all"):
            raise LabelError(f"candidates must be bm25 or all, not {self.candidates!r}")
        if not 0 < self.query_fraction <= 1:
            raise LabelError(f"query_fraction must be in (0, 1], not {self.query_fraction}")

    def manifest(self) -> dict[str, Any]:
        d = asdict(self)
        d["span"] = span_name(self.span) if self.span is None else int(self.span)
        d["bm25"] = BM25_VARIANT
        for key, default in (("candidates", "bm25"), ("query_fraction", 1.0)):  # label stores made before these
            if d[key] == default:  # existed hold what their defaults give: their manifests match without them
                del d[key]
        return d

    def width(self, doc_chunks: np.ndarray) -> int:
        """Columns of the label arrays: k, or with candidates "all" the largest pool of any query chunk of documents
        with these chunk counts (the spans cut them to at most span / M chunks)."""
        if self.candidates == "bm25":
            return self.k
        n = int(np.max(doc_chunks, initial=0))
        if self.span is not None:
            n = min(n, self.span // self.chunk_size)
        last_query = n - 2 if self.query == "pair" else n - 1
        return max(1, int(pool_size(last_query, self.chunk_size, self.segment_len)))


def pool_sizes(n_chunks: int, spec: LabelSpec) -> np.ndarray:
    """[C] retrievable chunks of each query chunk of a document (its whole pool, whatever the candidates kept)."""
    starts = span_starts(n_chunks, spec)
    span_of = np.searchsorted(starts, np.arange(n_chunks), side="right") - 1
    local = np.arange(n_chunks) - starts[span_of]
    return pool_size(local, spec.chunk_size, spec.segment_len)


def sampled_queries(n_chunks: int, fraction: float, doc: int) -> np.ndarray:
    """Bool [C]: which query chunks of document `doc` are scored at this query_fraction (all at 1.0)."""
    if fraction >= 1:
        return np.ones(n_chunks, bool)
    return np.random.default_rng([QUERY_SEED, int(doc)]).random(n_chunks) < fraction


def span_starts(n_chunks: int, spec: LabelSpec) -> np.ndarray:
    """First chunk of each retrieval span of a document with n_chunks chunks, plus n_chunks at the end: int [n+1]."""
    if spec.span is None or n_chunks == 0:
        return np.array([0, n_chunks], dtype=np.int64)
    step = spec.span // spec.chunk_size
    return np.append(np.arange(0, n_chunks, step, dtype=np.int64), n_chunks)


def label_document(tokens: np.ndarray, spec: LabelSpec, scorer: Scorer | None = None, decode: DecodeBatch | None = None,
                   on_progress: Callable[[int], None] | None = None, width: int | None = None, doc: int = 0,
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    """Labels of one document: candidates int32 [C, k] (document-absolute, -1 = none), bm25 float32 [C, k],
    target float32 [C, k] (NaN unless kind "sem"), and counts {n_scored, n_positive}. C = len(tokens) // M.

    width: the arrays' k (default spec.width of this document; a split's label store passes its own); doc: the
    document's index, which seeds the draw of sampled query chunks (spec.query_fraction < 1). Query chunks are scored
    SCORE_ROWS (and about SCORE_PAIRS pairs) at a time, bounded memory on long documents; on_progress(c) is told how
    many chunks of the document are done so far."""
    m = spec.chunk_size
    n_chunks = len(tokens) // m
    k = width if width is not None else spec.width(np.array([n_chunks]))
    cand = np.full((n_chunks, k), -1, np.int32)
    bm25 = np.full((n_chunks, k), np.nan, np.float32)
    target = np.full((n_chunks, k), np.nan, np.float32)
    starts = span_starts(n_chunks, spec)
    for s0, s1 in zip(starts[:-1], starts[1:], strict=False):
        ids, scores = bm25_candidates(np.asarray(tokens[s0 * m : s1 * m]), m, spec.segment_len, k, spec.query, spec.k1,
                                      spec.b, keep_unmatched=spec.candidates == "all")
        cand[s0:s1] = np.where(ids >= 0, ids + s0, -1)
        bm25[s0:s1] = scores
    if spec.kind == "sem":
        if scorer is None:
            raise LabelError("kind 'sem' needs a scorer")
        span_of = np.searchsorted(starts, np.arange(n_chunks), side="right") - 1  # [C] span index of each chunk
        first, end = starts[span_of], starts[span_of + 1]
        # Rows with candidates whose target c_{i+1} lies in the same span (always so for query "pair").
        rows = np.nonzero((cand >= 0).any(axis=1) & (np.arange(n_chunks) + 1 < end)
                          & sampled_queries(n_chunks, spec.query_fraction, doc))[0]
        chunks = np.asarray(tokens[: n_chunks * m]).reshape(n_chunks, m)
        per_call = max(1, min(SCORE_ROWS, SCORE_PAIRS // k))
        for g in range(0, len(rows), per_call):
            group = rows[g : g + per_call]
            target[group] = target_scores(scorer, chunks, group, cand[group], first[group], decode)
            if on_progress is not None:
                on_progress(int(group[-1]) + 1)
    if on_progress is not None:
        on_progress(n_chunks)
    scored = np.isfinite(target)
    return cand, bm25, target, {"n_scored": int(scored.sum()), "n_positive": int((target[scored] > 0).sum())}


def shard_range(doc_chunks: np.ndarray, shard: int, n_shards: int) -> tuple[int, int]:
    """Contiguous documents [lo, hi) of shard ``shard`` of ``n_shards``, balanced by chunk count."""
    if not 0 <= shard < n_shards:
        raise LabelError(f"shard {shard}/{n_shards}: need 0 <= i < n")
    starts = np.concatenate([[0], np.cumsum(doc_chunks)[:-1]]) if len(doc_chunks) else np.zeros(0)
    total = float(np.sum(doc_chunks))

    def bound(i: int) -> int:
        return len(doc_chunks) if i == n_shards else int(np.searchsorted(starts, total * i / n_shards, side="left"))

    return bound(shard), bound(shard + 1)


def parse_shard(value: str) -> tuple[int, int]:
    """``"i/n"`` -> (i, n)."""
    try:
        i, n = (int(x) for x in value.split("/"))
    except ValueError:
        raise argument_error("shard", value, "must look like i/n (e.g. 0/4)", LabelError) from None
    if not 0 <= i < n:
        raise argument_error("shard", value, "need 0 <= i < n", LabelError)
    return i, n


def shard_from_env() -> tuple[int, int] | None:
    """(RANK, WORLD_SIZE) under torchrun with more than one process, else None."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return (int(os.environ.get("RANK", "0")), world) if world > 1 else None


def shard_path(out: str | Path, shard: int, n_shards: int) -> Path:
    out = Path(out)
    return out.parent / f"{out.name}.shard-{shard}-of-{n_shards}"


def merge_shards(out: str | Path, n_shards: int, remove: bool = True) -> Path:
    """Merge the n complete shard folders of ``out`` into ``out`` (and remove them)."""
    out = Path(out)
    paths = [shard_path(out, i, n_shards) for i in range(n_shards)]
    missing = [str(p) for p in paths if not (p / "manifest.json").exists()]
    if missing:
        raise LabelError(f"cannot merge {out}: shards not finished: {', '.join(missing)}")
    merge_label_stores(paths, out)
    if remove:
        for p in paths:
            shutil.rmtree(p)
    return out


def _merge_if_complete(out: Path, n_shards: int) -> bool:
    """Merge when every shard is done; a lock file makes sure only one finishing process merges."""
    if not all((shard_path(out, i, n_shards) / "manifest.json").exists() for i in range(n_shards)):
        return False
    lock = out.parent / f".{out.name}.merge.lock"
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False  # another shard's process is merging
    try:
        os.close(fd)
        merge_shards(out, n_shards)
    finally:
        lock.unlink(missing_ok=True)
    return True


def label_split(store, out: str | Path, spec: LabelSpec, scorer: Scorer | None = None, decode: DecodeBatch | None = None,
                shard: tuple[int, int] | None = None, max_documents: int | None = None, progress: bool = True,
                overwrite: bool = False, on_document: Callable[[int], None] | None = None) -> Path:
    """Label the documents of a token store into ``out``; returns the folder written (``out``, or this shard's folder
    while other shards are unfinished).

    store: a `rpt.data.store.TokenStore`; decode: store token ids -> texts (needed by scorers with their own
    tokenizer); shard: (i, n), default RANK/WORLD_SIZE under torchrun, else (0, 1); on_document(d) is called after
    document d is durable (progress hooks, tests).
    """
    spec.validate()
    if store.chunk_size != spec.chunk_size:
        raise LabelError(f"token store {store.path} has chunk_size {store.chunk_size}, labels asked for {spec.chunk_size}")
    if spec.kind == "sem" and scorer is None:
        raise LabelError("kind 'sem' needs a scorer")
    if max_documents is not None and (isinstance(max_documents, bool) or not isinstance(max_documents, int)
                                      or max_documents < 1):
        raise argument_error("max_documents", max_documents, "a number of documents, at least 1 (leave it out for all)",
                             ValueError)
    out = Path(out)
    n_docs = len(store) if max_documents is None else min(len(store), max_documents)
    doc_chunks = store.doc_lengths()[:n_docs] // spec.chunk_size
    i, n = shard or shard_from_env() or (0, 1)
    lo, hi = shard_range(doc_chunks, i, n)
    path = out if n == 1 else shard_path(out, i, n)
    for folder in dict.fromkeys((out, path)):  # before any work: never into a folder of the user's, nor the store
        claim_folder(folder, LABELS_OWNER, arg="out", inputs={"store": store.path.parent, "split": store.path},
                     inside_ok=("store",))
    width = spec.width(doc_chunks)  # the whole split's, so that shards merge
    config = {
        **spec.manifest(),
        "k": width,  # the arrays' columns (spec.k, or the largest pool with candidates "all")
        "scorer": scorer.name if (scorer is not None and spec.kind == "sem") else None,
        "tokenizer": store.tokenizer_id,
        "token_store": {"n_documents": len(store), "n_tokens": int(store.manifest.get("n_tokens", 0))},
        "labelled_documents": n_docs,
        "shard": [i, n] if n > 1 else None,
    }
    for done_path in dict.fromkeys((out, path)):  # the final folder, then this shard's
        if (done_path / "manifest.json").exists():
            if overwrite:  # replaced only when the new labels are complete (LabelWriter.publish): a failed run keeps them
                continue
            old = LabelStore.open(done_path).manifest
            same = not _differing(old, config)
            if same and done_path == out and old.get("doc_range") == [0, n_docs]:
                return out  # already complete: nothing to do
            if same and done_path == path:  # this shard is done; the merge may not be
                return out if _merge_if_complete(out, n) else path
            asked = {**config, "doc_range": [lo, hi] if done_path == path else [0, n_docs]}
            raise LabelError(f"{done_path} already holds labels made with other settings ({settings_diff(old, asked)}); "
                             "delete it or pass overwrite=True (rpt label --overwrite)")
    with folder_lock(path, "labelled"):  # one writer per label folder (and its .partial); a second is refused
        writer = LabelWriter(path, config, (lo, hi), doc_chunks[lo:hi], width)
        writer.note_environment()  # a scorer's labels differ in the last digits from one setup to another
        from tqdm.auto import tqdm

        # the bar counts work: chunks, or under exhaustive gold the pairs scored (each query chunk's whole pool, so a
        # document's cost grows with the square of its length and a count of chunks would run early and fast)
        pairs = spec.kind == "sem" and spec.candidates == "all"
        work = {d: np.cumsum(pool_sizes(int(doc_chunks[d]), spec) if pairs else np.ones(int(doc_chunks[d])))
                for d in range(lo, hi)}
        total = {d: int(w[-1]) if len(w) else 0 for d, w in work.items()}
        bar = tqdm(total=sum(total.values()), initial=sum(total[d] for d in range(lo, writer.next_doc)),
                   unit="pair" if pairs else "chunk", disable=not progress, desc=f"label {spec.kind} {path.name}",
                   dynamic_ncols=True)
        try:
            for d in range(writer.next_doc, hi):
                shown = [0]  # work of document d already counted on the bar

                def advance(done: int, shown: list[int] = shown, w: np.ndarray = work[d]) -> None:
                    now = int(w[done - 1]) if done > 0 else 0
                    bar.update(now - shown[0])
                    shown[0] = now

                cand, bm25, target, stats = label_document(store.document(d), spec, scorer, decode, on_progress=advance,
                                                           width=width, doc=d)
                writer.write(d, cand, bm25, target, stats)
                if spec.kind == "sem" and writer.stats["n_scored"]:
                    bar.set_postfix(positive=f"{writer.stats['n_positive'] / writer.stats['n_scored']:.3f}", refresh=False)
                if on_document is not None:
                    on_document(d)
        finally:
            bar.close()
        writer.publish({})
    if n > 1 and _merge_if_complete(out, n):
        return out
    return path


def _differing(existing: dict[str, Any], asked: dict[str, Any]) -> list[str]:
    """Keys of `asked` whose value differs in `existing` (the shard aside; a tokenizer is compared by its hash: the
    same tokenizer loaded under another name labels the same)."""
    def differs(key: str) -> bool:
        have, want = existing.get(key), asked[key]
        if key == "tokenizer" and isinstance(have, dict) and isinstance(want, dict):
            return have.get("hash") != want.get("hash")
        return have != want

    return [k for k in asked if k != "shard" and differs(k)]


def settings_diff(existing: dict[str, Any], asked: dict[str, Any]) -> str:
    """The settings that differ, e.g. "k: existing 4, asked 20; scorer: existing smollm2, asked none"."""
    keys = _differing(existing, asked)
    return "; ".join(f"{k}: existing {_shown(existing.get(k))}, asked {_shown(asked[k])}" for k in keys) or "none found"


def _shown(value: Any) -> str:
    if isinstance(value, dict) and "hash" in value:  # a tokenizer identity
        return f"{value.get('name')} (sha256 {str(value.get('hash'))[:12]})"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_shown(v)}" for k, v in value.items())
    return "none" if value is None else str(value)


def store_decoder(tokenizer_json: str | Path) -> DecodeBatch:
    """Batch decoder (token ids -> text) of the tokenizer file a token store was written with."""
    from tokenizers import Tokenizer

    path = Path(tokenizer_json)
    if not path.exists():
        raise LabelError(f"{path} not found: the store tokenizer is needed to give the scorer the chunks' text")
    tok = Tokenizer.from_file(str(path))
    return lambda seqs: tok.decode_batch(seqs)
