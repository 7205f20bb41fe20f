"""A synthetic copy corpus whose answer is known: the project's proof that retrieval is used.

A document is a run of passages, each `passage` words drawn uniformly from `vocab` words ``w0 ... w{vocab-1}``; from
passage `min_distance` on, each passage is, with probability `p_repeat`, an exact copy of the passage `d` places
back, d uniform in [min_distance, max_distance]. A word is one token (the corpus ships its own word-level tokenizer),
so a passage of 128 words is exactly two 64-token chunks, and passages are chunk-aligned.

Two settings, named by where the copy source lies relative to a sliding-window model's reach:

    synthetic:copy-near   repeats one passage back (d = 1): the source is inside one layer's attention window, so
                          Transformer-XL can learn to copy it. The control: this setting can teach copying at all.
    synthetic:copy-far    repeats 6-12 passages back (768-1,536 tokens with 128-word passages): beyond the tiny
                          preset's whole receptive field, (n_layers + 1) * segment_len = 640 tokens, but inside a
                          2,048-token training span. Only retrieval can help there.

Parameters follow the name as ``synthetic:copy-far?docs=4000&vocab=256&passage=128&passages=16&distance=6-12&p=0.5``.
``passage=LO-HI`` draws each fresh passage's length uniformly from LO..HI words (a repeat keeps its source's length):
passages then start at every offset to the chunk grid, and a source and its copy at different offsets, as repeats in
real text do (the *unaligned* corpus; the default, 128, keeps every passage on the grid).
``words=text`` writes each word as a pseudo-word of 3-8 letters instead of ``w<id>`` and ships no tokenizer: a BPE
trained on the corpus (``rpt prepare --tokenizer bpe:N``) then splits words into one or more tokens, so passages
are of varying token length and chunk boundaries fall inside words, as in real text (the *text* corpus).
Splits: train has `docs` documents, validation and test `eval_docs` each, from independent random streams (seeded by
(seed, split)), so no test passage is a training passage. Everything is a pure function of the parameters.

Token classes (`copy_classes`), per 64-token chunk, from the token ids alone (a repeated passage is one whose words
equal an earlier passage's; with random words a chance collision has probability ~vocab^-passage); on the unaligned
corpus a chunk is repeat-tail when its tokens and the second half of the chunk before are one run copied from earlier
in the document, repeat-head when it holds any other copied token (`copy_runs`):
    fresh        a chunk of a passage seen for the first time: nothing can predict it beyond the unigram
    repeat-head  the first chunk of a repeated passage: its query chunk is the passage before, which does not identify
                 the source, so chunk retrieval cannot predict it (in-context copying can, after its first tokens)
    repeat-tail  the later chunks of a repeated passage: their query chunk is itself a copy of the source's chunk
                 before, so a retriever that finds it hands CCA exactly the tokens to copy
The copy advantage of a model is loss(fresh) - loss(repeat-tail) in nats.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from rpt.data.documents import Corpus, Document, Skips

SETTINGS = {
    "copy-near": {"min_distance": 1, "max_distance": 1},
    "copy-far": {"min_distance": 6, "max_distance": 12},
}
_SHORT = {"p": "p_repeat", "distance": "distance"}
CLASSES = ("fresh", "repeat-head", "repeat-tail")


@dataclass(frozen=True)
class CopySpec:
    """Parameters of the copy corpus (see the module docstring)."""

    setting: str = "copy-far"
    docs: int = 4000  # training documents (each seen once by a run of <= docs / batch_size updates)
    eval_docs: int = 64  # validation and test documents each
    vocab: int = 256  # words
    passage: int = 128  # words (= tokens) per passage (the shortest, with passage_max)
    passage_max: int = 0  # > passage: each fresh passage's length uniform in passage..passage_max (unaligned)
    passages: int = 16  # passages per document (16 x 128 = 2,048 tokens)
    min_distance: int = 6  # passages back
    max_distance: int = 12
    p_repeat: float = 0.5
    seed: int = 0
    words: str = "ids"  # ids: w<id>, one token per word (own tokenizer) | text: pseudo-words, for a BPE (module doc)

    def validate(self) -> None:
        if self.vocab < 2 or self.passage < 1 or self.passages < 2 or self.docs < 1 or self.eval_docs < 1:
            raise ValueError(f"synthetic:{self.setting}: vocab >= 2, passage >= 1, passages >= 2, docs >= 1 and "
                             f"eval_docs >= 1 are required")
        if not 1 <= self.min_distance <= self.max_distance < self.passages:
            raise ValueError(f"synthetic:{self.setting}: need 1 <= distance min <= max < passages ({self.passages}), "
                             f"got {self.min_distance}-{self.max_distance}")
        if self.passage_max and self.passage_max < self.passage:
            raise ValueError(f"synthetic:{self.setting}: passage=LO-HI needs LO <= HI, got {self.passage}-{self.passage_max}")
        if not 0.0 <= self.p_repeat <= 1.0:
            raise ValueError(f"synthetic:{self.setting}: p must lie in [0, 1], got {self.p_repeat}")
        if self.words not in ("ids", "text"):
            raise ValueError(f"synthetic:{self.setting}: words must be ids or text, got {self.words!r}")

    @property
    def spec(self) -> str:
        default = CopySpec(setting=self.setting, **SETTINGS[self.setting])
        own = [f.name for f in fields(self) if f.name not in ("setting", "min_distance", "max_distance", "passage",
                                                               "passage_max")]
        diff = [f"{n}={getattr(self, n)}" for n in own if getattr(self, n) != getattr(default, n)]
        if self.variable:
            diff.insert(2, f"passage={self.passage}-{self.passage_max}")
        elif self.passage != default.passage:
            diff.insert(2, f"passage={self.passage}")
        if (self.min_distance, self.max_distance) != (default.min_distance, default.max_distance):
            diff.append(f"distance={self.min_distance}-{self.max_distance}")
        return f"synthetic:{self.setting}" + ("?" + "&".join(diff) if diff else "")

    @property
    def variable(self) -> bool:
        """True when passage lengths vary (passage=LO-HI with LO < HI)."""
        return self.passage_max > self.passage

    def aligned(self, chunk_size: int) -> bool:
        """True when every passage is whole chunks: repeats sit on the chunk grid, as their sources do."""
        return self.words == "ids" and not self.variable and self.passage % chunk_size == 0


def parse_spec(spec: str) -> CopySpec:
    """``synthetic:copy-far?docs=100&distance=6-12`` -> CopySpec (a ValueError names the bad part)."""
    body = spec[len("synthetic:"):]
    name, _, query = body.partition("?")
    if name not in SETTINGS:
        raise ValueError(f"corpus {spec!r}: unknown synthetic corpus {name!r}; choose from "
                         f"{', '.join('synthetic:' + s for s in SETTINGS)}")
    kw: dict[str, Any] = {"setting": name, **SETTINGS[name]}
    types = {f.name: f.type for f in fields(CopySpec)}
    for part in filter(None, query.split("&")):
        key, sep, value = part.partition("=")
        key = _SHORT.get(key, key)
        try:
            if not sep:
                raise ValueError
            if key == "distance":
                lo, _, hi = value.partition("-")
                kw["min_distance"], kw["max_distance"] = int(lo), int(hi or lo)
            elif key == "passage":
                lo, _, hi = value.partition("-")
                kw["passage"], kw["passage_max"] = int(lo), (int(hi) if hi else 0)
            elif key == "words":
                if value not in ("ids", "text"):
                    raise ValueError
                kw["words"] = value
            elif key in types and key not in ("setting", "min_distance", "max_distance"):
                kw[key] = float(value) if types[key] in (float, "float") else int(value)
            else:
                raise KeyError(key)
        except KeyError:
            raise ValueError(f"corpus {spec!r}: unknown parameter {key!r}; use docs, eval_docs, vocab, "
                             f"passage=N or LO-HI, passages, distance=MIN-MAX, p, seed, words=ids|text") from None
        except ValueError:
            raise ValueError(f"corpus {spec!r}: bad value in {part!r}") from None
    out = CopySpec(**kw)
    out.validate()
    return out


def copy_document(rng: np.random.Generator, s: CopySpec) -> np.ndarray:
    """Word ids [passages * passage] of one document.

    A repeat copies a passage whose NEAREST earlier occurrence is d in [min_distance, max_distance] places back: a
    passage that two later passages both copy would otherwise stand one place from its second copy, inside xl's reach.
    """
    out: list[np.ndarray] = []
    origin = np.arange(s.passages)  # the first occurrence of each passage's words
    for i in range(s.passages):
        if i >= s.min_distance and rng.random() < s.p_repeat:
            ds = [d for d in range(s.min_distance, min(s.max_distance, i) + 1)
                  if not (origin[i - d + 1 : i] == origin[i - d]).any()]
            if ds:
                d = ds[int(rng.integers(len(ds)))]
                out.append(out[i - d])
                origin[i] = origin[i - d]
                continue
        n = int(rng.integers(s.passage, s.passage_max + 1)) if s.variable else s.passage
        out.append(rng.integers(0, s.vocab, n))
    return np.concatenate(out).astype(np.int64)


def pseudo_words(n: int) -> list[str]:
    """`n` distinct lowercase pseudo-words of 3-8 letters, the same for every corpus (word id i is the i-th)."""
    rng = np.random.default_rng(20240613)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        w = "".join(letters[rng.integers(0, 26, int(rng.integers(3, 9)))])
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


class CopyCorpus(Corpus):
    """The synthetic copy corpus as a `Corpus` (texts of space-separated words) with its word-level tokenizer."""

    def __init__(self, spec: CopySpec) -> None:
        self.params = spec
        self.spec = spec.spec

    def identity(self) -> dict[str, Any]:
        return {"spec": self.spec, "synthetic": asdict(self.params)}

    def word_ids(self, split: str) -> Iterator[np.ndarray]:
        split = self._check_split(split)
        n = self.params.docs if split == "train" else self.params.eval_docs
        rng = np.random.default_rng([self.params.seed, ("train", "validation", "test").index(split), 7])
        for _ in range(n):
            yield copy_document(rng, self.params)

    def documents(self, split: str, skips: Skips | None = None) -> Iterator[Document]:
        name = self._check_split(split)
        words = pseudo_words(self.params.vocab) if self.params.words == "text" else None
        for i, ids in enumerate(self.word_ids(split)):
            text = " ".join(words[w] for w in ids.tolist()) if words else " ".join(f"w{w}" for w in ids.tolist())
            yield Document(f"{name}-{i:06d}", text)

    def tokenizer(self):
        """A word-level tokenizer: one token per word (ids 0 ... vocab-1 are w0 ...), then <unk>, <|endoftext|>."""
        if self.params.words == "text":
            raise ValueError(f"corpus {self.spec!r} (words=text) has no tokenizer of its own: give it a trained one "
                             "as the tokenizer, e.g. bpe:512")
        import tokenizers
        from tokenizers import decoders, models, pre_tokenizers

        from rpt.data.tokenizer import EOS, Tokenizer

        vocab = {f"w{i}": i for i in range(self.params.vocab)}
        vocab["<unk>"], vocab[EOS] = self.params.vocab, self.params.vocab + 1
        tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.add_special_tokens([EOS])
        tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
        return Tokenizer(tok, f"words:{self.params.vocab}")


RUN_NGRAM = 8  # words: an 8-word run of random words from 256 recurs by chance with probability ~256^-8 per pair


def copy_runs(tokens: np.ndarray, n: int = RUN_NGRAM) -> np.ndarray:
    """[T] for each token the position of the earlier token it copies, or -1: token i copies j when an n-word window
    holding i occurred first at a window holding j at the same place (the first occurrence: a copy of a copy points to
    the original). Consecutive tokens of one copied run point to consecutive positions."""
    tokens = np.asarray(tokens, dtype=np.int64)
    src = np.full(len(tokens), -1, dtype=np.int64)
    first: dict[bytes, int] = {}
    for i in range(len(tokens) - n + 1):
        j = first.setdefault(tokens[i : i + n].tobytes(), i)
        if j != i:
            window = src[i : i + n]
            window[window < 0] = j + np.arange(n)[window < 0]
    return src


def run_classes(tokens: np.ndarray, chunk_size: int) -> np.ndarray:
    """Per chunk, its class index into CLASSES from copied runs (`copy_runs`), for passages at any offset to the chunk
    grid: repeat-tail when the chunk and the second half of the chunk before are one copied run (the query chunk holds
    at least half a chunk of the copy, so retrieval can find the source, and every token to predict is in it);
    repeat-head when the chunk holds any other copied token; fresh otherwise. -1 for a partial last chunk."""
    M = chunk_size
    src = copy_runs(tokens)
    n_chunks = len(src) // M
    out = np.full(n_chunks, -1, dtype=np.int64)
    for c in range(n_chunks):
        own = src[c * M : (c + 1) * M]
        run = src[max(0, c * M - M // 2) : (c + 1) * M]
        tail = c > 0 and (run >= 0).all() and (np.diff(run) == 1).all()
        out[c] = 2 if tail else (1 if (own >= 0).any() else 0)
    return out


def copy_classes(tokens: np.ndarray, passage: int, chunk_size: int) -> np.ndarray:
    """Per chunk of `tokens` (a copy-corpus document), its class index into CLASSES; -1 for a partial last chunk.

    Passages must be whole chunks (passage % chunk_size == 0); use `run_classes` for the unaligned corpus."""
    if passage % chunk_size:
        raise ValueError(f"passage length {passage} is not a multiple of the chunk size {chunk_size}: use run_classes")
    tokens = np.asarray(tokens)
    n_chunks = len(tokens) // chunk_size
    out = np.full(n_chunks, -1, dtype=np.int64)
    seen: set[bytes] = set()
    per = passage // chunk_size
    for p in range(len(tokens) // passage):
        words = tokens[p * passage : (p + 1) * passage]
        key = words.tobytes()
        repeat = key in seen
        seen.add(key)
        for c in range(per):
            out[p * per + c] = 0 if not repeat else (1 if c == 0 else 2)
    return out
