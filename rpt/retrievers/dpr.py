"""The DPR-style retriever of the Table 4 ablation (§5, App. C "DPR-style retriever training details").

What the paper does: a BERT-base dual encoder trained with DPR's recipe (contrastive loss, in-batch negatives plus
one hard negative per query), where for every query chunk c_q the positive is the chunk BM25 ranks first and the hard
negative the chunk BM25 ranks fifth, on 16x more examples than DPR's recipe. At evaluation it replaces the retriever
each CCA model was trained with (retro's BM25, rpt-lex's and rpt-sem's own retriever).

What we do:
- Training data (`mine_pairs`): every document of a store's train split; for each query chunk c_q, BM25's ranking of
  the chunks retrievable for c_q (`rpt.labels.bm25.bm25_neighbors`: query c_q only, causal statistics, the rule of
  `rpt.chunks`), positive = rank 1, hard negative = rank 5; a query with fewer than five ranked chunks is skipped.
- Model (`DPREncoder`, `DPRRetriever`): BERT-base cannot be had offline and its WordPiece ids are not our store's ids,
  so each encoder is a small bidirectional transformer trained from scratch on the corpus's own token ids: token
  embedding, `n_layers` pre-norm layers (RMSNorm, bidirectional attention with rotary positions over one chunk,
  SwiGLU), a final RMSNorm, mean pooling over the chunk's tokens, a linear projection to `proj_dim`, L2 normalisation.
  Defaults (`DPRConfig`): d_model 256, 4 layers, 4 heads, SwiGLU 688, projection 128: 3.2M parameters per encoder
  plus vocab x 256 for its embedding (about 5.3M with an 8K vocabulary; BERT-base has 110M).
- Two encoders, as DPR: a query encoder for c_q and a passage encoder for candidate chunks (`shared=False`, the
  default). The roles differ: a passage is retrieved for the continuation it brings, the query is the text just
  read, and DPR's separate towers let the model learn that asymmetry. `shared=True` ties them (one encoder, half the
  parameters) for small corpora. Untrained, two independent random towers rank the positive above the hard negative
  about half the time (chance); one shared random tower already ranks by token overlap (~75% on the test corpus).
- Amount of training: App. C trains on 16x the examples of DPR's recipe. DPR's NQ training set has 58,880 questions,
  so about 0.94M (query, positive, hard negative) examples, e.g. steps=7360 at batch_size=128; pairs repeat over
  epochs when the corpus gives fewer.
- Loss (`train_dpr`): DPR's InfoNCE over [positives of the batch ++ hard negatives of the batch] (2B passages per B
  queries) on cosine similarities divided by a temperature (0.05; the embeddings are L2-normalised), AdamW, linear
  warm-up then linear decay (DPR's schedule), gradient clipping at 2.0 (DPR's). In-batch passages that are the same
  chunk as a query's positive or as the query itself are masked out of its softmax (false negatives).
- `hf:NAME` loads a Hugging Face encoder (a hub name or a local folder) with `transformers.AutoModel`, mean-pooled and
  L2-normalised, one model for queries and passages. It reads the STORE'S token ids directly, so it needs a store
  prepared with the encoder's own tokenizer (`rpt prepare --tokenizer NAME`): `check_store` refuses any other (the
  manifest's tokenizer name must be NAME, or the tokenizer's hash must equal the encoder tokenizer's). Our stores are
  usually our own BPE, which no hub encoder reads.

At evaluation (`dpr_neighbors`): for each query chunk, the top-k chunks retrievable for it (`rpt.chunks`) by inner
product of its query embedding with the passage embeddings of the document so far: the contract of
`bm25_neighbors` ([C, k] document-absolute ids, best first, -1 where fewer than k chunks are retrievable), so it feeds
`evaluate_document(neighbor_ids=...)` exactly as the bm25 source does. Unlike BM25, every retrievable chunk is a
candidate (a dense score is never "no match"), so -1 appears only where fewer than k chunks are retrievable.

Folder layout written by `DPRRetriever.save` / `train_dpr` (written as ``.<name>.partial`` and renamed into place, so
a folder under its own name is always complete)::

    model.safetensors   weights (a tied passage encoder is stored once, its names listed as aliases)
    dpr.json            {"format_version", "config": DPRConfig, "tokenizer": the store's tokenizer identity,
                         "training": what train_dpr did and its metrics, "files": {name: {"bytes", "sha256"}}}
    train_log.jsonl     (train_dpr) one line per `log_every` steps: step, loss, in-batch and hard-negative accuracy
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rpt.chunks import chunks_per_segment, last_retrievable
from rpt.model.layers import Attention, RMSNorm, SwiGLU, init_weights, rotary_cos_sin
from rpt.outputs import Owner, claim_folder, mark_folder
from rpt.utils import MissingDependency, UserError, error_line, require, resolve_device, write_json_atomic

FORMAT_VERSION = 1
CONFIG_FILE = "dpr.json"
WEIGHTS_FILE = "model.safetensors"
LOG_FILE = "train_log.jsonl"
HF_PREFIX = "hf:"
POSITIVE_RANK = 1  # BM25's rank of the positive (App. C)
NEGATIVE_RANK = 5  # BM25's rank of the hard negative (App. C)
TRAIN_HINT = "train one with `rpt dpr` (rpt.retrievers.dpr.train_dpr)"
HF_ACCEPTED = "hf:<Hugging Face encoder folder>, or hf:<Hugging Face name> in the local cache (any name with network)"

Which = Literal["query", "passage"]


# --------------------------------------------------------------------------------------------------------------
# configuration


@dataclass
class DPRConfig:
    """The dual encoder. vocab_size and chunk_size come from the token store it is trained on."""

    vocab_size: int
    chunk_size: int = 64
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    mlp_hidden: int = 688
    proj_dim: int = 128
    shared: bool = False  # one encoder for queries and passages (False: two, as DPR)
    temperature: float = 0.05  # InfoNCE temperature on cosine similarities
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    dropout: float = 0.0
    init_std: float = 0.02

    def validate(self) -> DPRConfig:
        for name in ("vocab_size", "chunk_size", "d_model", "n_layers", "n_heads", "mlp_hidden", "proj_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UserError(f"DPR config {name} must be a positive integer, not {v!r}")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise UserError(f"DPR config d_model={self.d_model} must split into n_heads={self.n_heads} heads of even "
                            "size (rotary positions)")
        if not self.temperature > 0:
            raise UserError(f"DPR config temperature must be > 0, not {self.temperature}")
        if not 0.0 <= self.dropout < 1.0:
            raise UserError(f"DPR config dropout must be in [0, 1), not {self.dropout}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DPRConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UserError(f"DPR config: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        try:
            return cls(**d).validate()
        except TypeError as e:
            raise UserError(f"DPR config: {e}") from None


# --------------------------------------------------------------------------------------------------------------
# the model


class EncoderLayer(nn.Module):
    """Pre-norm bidirectional transformer layer over the tokens of one chunk (rotary positions, SwiGLU)."""

    def __init__(self, cfg: DPRConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.mlp_hidden, cfg.dropout)

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rotary=rotary)
        return x + self.mlp(self.mlp_norm(x))


class DPREncoder(nn.Module):
    """Token ids of chunks [N, M] -> L2-normalised embeddings [N, proj_dim] (mean pooling over the M tokens)."""

    def __init__(self, cfg: DPRConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.proj = nn.Linear(cfg.d_model, cfg.proj_dim, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)  # [N, M, D]
        rot = rotary_cos_sin(torch.arange(ids.shape[1], device=ids.device), self.cfg.d_model // self.cfg.n_heads,
                             self.cfg.rope_base)
        for layer in self.layers:
            x = layer(x, rot)
        pooled = self.norm(x).mean(dim=1)  # [N, D]
        return F.normalize(self.proj(pooled).float(), dim=-1)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


# What a DPR retriever folder holds (rpt.outputs)
OWNER = Owner("dpr", (CONFIG_FILE, WEIGHTS_FILE, LOG_FILE, ".*.tmp"), lambda f: (f / CONFIG_FILE).is_file())


def _publish(tmp: Path, final: Path) -> None:
    """Rename a finished temporary folder into place; an existing folder is moved aside first, then deleted."""
    if final.exists():
        old = final.with_name(f".{final.name}.old")
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def _check_replaceable(folder: Path, overwrite: bool, inputs: dict[str, Any] | None = None) -> None:
    """Refuse to write anywhere but a new or empty folder or a DPR retriever folder (that one only when asked), and
    never over an input (rpt.outputs)."""
    if claim_folder(folder, OWNER, arg="out_dir", inputs=inputs or {}) and not overwrite:
        raise UserError(f"{folder} already holds a DPR retriever: choose another folder, or overwrite it")


class ChunkRetriever(nn.Module):
    """What evaluation needs from a dense chunk retriever: query and passage embeddings of token-id chunks, and a check
    that a token store can be read with it. `DPRRetriever` (ours) and `HFRetriever` (hf:NAME) implement it."""

    name: str

    def encode_queries(self, ids: torch.Tensor) -> torch.Tensor:  # [N, M] -> [N, P]
        raise NotImplementedError

    def encode_passages(self, ids: torch.Tensor) -> torch.Tensor:  # [N, M] -> [N, P]
        raise NotImplementedError

    def check_store(self, store) -> None:
        """UserError unless `store` (a TokenStore) is tokenized with what this retriever reads."""
        raise NotImplementedError

    def check_chunks(self, chunk_size: int, max_token: int) -> None:
        """UserError unless chunks of `chunk_size` tokens with ids up to `max_token` can be encoded."""
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @torch.no_grad()
    def embed(self, chunks: np.ndarray, which: Which, batch_size: int = 1024) -> torch.Tensor:
        """Embeddings float32 [N, P] of chunks int [N, M] (on this retriever's device), in eval mode, in fixed batches."""
        encode = self.encode_queries if which == "query" else self.encode_passages
        was = self.training
        self.eval()
        try:
            out = [encode(torch.as_tensor(np.asarray(chunks[s : s + batch_size], dtype=np.int64), device=self.device))
                   for s in range(0, len(chunks), batch_size)]
        finally:
            self.train(was)
        return torch.cat(out).float() if out else torch.zeros(0, 0, device=self.device)


class DPRRetriever(ChunkRetriever):
    """The dual encoder: `query_encoder` and `passage_encoder` (the same module when cfg.shared).

    `meta` is what dpr.json holds besides the config (tokenizer identity, training record).
    """

    def __init__(self, cfg: DPRConfig, meta: dict[str, Any] | None = None, seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg.validate()
        self.query_encoder = DPREncoder(cfg)
        self.passage_encoder = self.query_encoder if cfg.shared else DPREncoder(cfg)
        init_weights(self, cfg.init_std, cfg.n_layers, seed)
        self.meta: dict[str, Any] = dict(meta or {})
        self.name = "dpr"

    def encode_queries(self, ids: torch.Tensor) -> torch.Tensor:
        return self.query_encoder(ids)

    def encode_passages(self, ids: torch.Tensor) -> torch.Tensor:
        return self.passage_encoder(ids)

    def n_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # -- checks ---------------------------------------------------------------------------------------------------
    def check_chunks(self, chunk_size: int, max_token: int) -> None:
        if chunk_size != self.cfg.chunk_size:
            raise UserError(f"DPR retriever {self.name} was trained on chunks of {self.cfg.chunk_size} tokens, the model "
                            f"evaluated uses chunks of {chunk_size}")
        if max_token >= self.cfg.vocab_size:
            raise UserError(f"DPR retriever {self.name}: token id {max_token} is outside its vocabulary of "
                            f"{self.cfg.vocab_size} (a store of another tokenizer?)")

    def check_store(self, store) -> None:
        want = self.meta.get("tokenizer") or {}
        have = store.tokenizer_id
        if want.get("hash") and want.get("hash") != have.get("hash"):
            raise UserError(f"DPR retriever {self.name} was trained on a store tokenized with {want.get('name')} "
                            f"(hash {str(want.get('hash'))[:12]}), {store.path} is tokenized with {have.get('name')} "
                            f"(hash {str(have.get('hash'))[:12]}): train a retriever on this corpus")
        if store.chunk_size != self.cfg.chunk_size:
            raise UserError(f"DPR retriever {self.name} was trained on chunks of {self.cfg.chunk_size} tokens, "
                            f"{store.path} has chunk_size {store.chunk_size}")

    # -- files ----------------------------------------------------------------------------------------------------
    def _write(self, folder: Path) -> None:
        """model.safetensors then dpr.json (with the weights' size and sha256) into an existing folder."""
        from rpt.checkpoint import save_weights

        weights = folder / WEIGHTS_FILE
        save_weights(self.state_dict(), weights, metadata={"format": "rpt-dpr", "config": json.dumps(self.cfg.to_dict())})
        meta = {k: v for k, v in self.meta.items() if k not in ("format_version", "config", "files")}
        write_json_atomic(folder / CONFIG_FILE, {
            "format_version": FORMAT_VERSION, "config": self.cfg.to_dict(), **meta,
            "files": {WEIGHTS_FILE: {"bytes": weights.stat().st_size, "sha256": _sha256(weights)}}})

    def save(self, folder: str | Path, overwrite: bool = True) -> Path:
        """Write the retriever to `folder` atomically (a temporary sibling renamed into place). An existing DPR folder
        is replaced when `overwrite`; any other non-empty folder is refused."""
        folder = Path(folder)
        _check_replaceable(folder, overwrite)
        tmp = folder.with_name(f".{folder.name}.partial")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        self._write(tmp)
        mark_folder(tmp, OWNER)
        _publish(tmp, folder)
        self.name = str(folder)
        return folder

    @classmethod
    def load(cls, spec: str | Path, device: str | torch.device = "cpu") -> ChunkRetriever:
        """A retriever folder written by `save` / `train_dpr`, or ``hf:NAME`` (see `HFRetriever.load`), in eval mode
        on `device`. Anything that cannot be loaded is one UserError naming it."""
        if str(spec).startswith(HF_PREFIX):
            return HFRetriever.load(str(spec)[len(HF_PREFIX):], device)
        folder = Path(spec).expanduser()
        what = f"no DPR retriever at {folder}"
        if not folder.is_dir():
            raise UserError(f"{what}: not a folder ({TRAIN_HINT}, or use hf:<encoder>)")
        cpath = folder / CONFIG_FILE
        if not cpath.is_file():
            partial = folder.with_name(f".{folder.name}.partial")
            hint = f"; {partial} is an interrupted training run" if partial.exists() else ""
            raise UserError(f"{what}: {cpath.name} is missing{hint} ({TRAIN_HINT})")
        try:
            meta = json.loads(cpath.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UserError(f"{what}: {cpath} cannot be read ({error_line(e)})") from None
        if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
            raise UserError(f"{what}: {cpath} holds no DPR config")
        if meta.get("format_version") != FORMAT_VERSION:
            raise UserError(f"{what}: {cpath} has format_version {meta.get('format_version')}, this version reads "
                            f"{FORMAT_VERSION}")
        try:
            cfg = DPRConfig.from_dict(meta["config"])
        except UserError as e:
            raise UserError(f"{what}: {cpath}: {e}") from None
        wpath = folder / WEIGHTS_FILE
        if not wpath.is_file():
            raise UserError(f"{what}: {wpath.name} is missing")
        rec = (meta.get("files") or {}).get(WEIGHTS_FILE)
        if rec and (wpath.stat().st_size != rec.get("bytes") or _sha256(wpath) != rec.get("sha256")):
            raise UserError(f"{what}: {wpath} does not match the size and sha256 recorded in {cpath.name} (cut short or "
                            "altered)")
        from rpt.checkpoint import read_weights

        try:
            state = read_weights(wpath)
        except UserError as e:
            raise UserError(f"{what}: {e}") from None
        model = cls(cfg, meta)
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise UserError(f"{what}: {wpath.name} does not match its config ({str(e).splitlines()[0]})") from None
        model.name = str(folder)
        return model.to(device).eval()


def load_retriever(spec: str | Path, device: str | torch.device = "cpu") -> ChunkRetriever:
    """`DPRRetriever.load`: a retriever folder or ``hf:NAME``."""
    return DPRRetriever.load(spec, device)


# --------------------------------------------------------------------------------------------------------------
# Hugging Face encoders


class HFRetriever(ChunkRetriever):
    """A Hugging Face encoder (``hf:NAME``) for queries and passages alike: mean pooling over the chunk's tokens (and
    the tokenizer's special tokens, e.g. [CLS] ... [SEP], added around them), L2-normalised.

    It reads the store's token ids as they are, so the store must be tokenized with the encoder's tokenizer
    (`check_store`). Our stores are usually our own BPE: then train a `DPRRetriever` instead.
    """

    def __init__(self, model: nn.Module, tokenizer, hf_name: str) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.hf_name = hf_name
        self.name = f"{HF_PREFIX}{hf_name}"

    @classmethod
    def load(cls, name: str, device: str | torch.device = "cpu") -> HFRetriever:
        """Load `name` (a local folder or a hub name) lazily with transformers; UserError when it cannot be loaded.
        Offline (no hub, or HF_HUB_OFFLINE=1), a hub name must be in the local cache."""
        from rpt.data import hub

        flag = f"retriever {HF_PREFIX}{name}"
        if not name.strip():
            raise UserError(f"retriever {HF_PREFIX}: give an encoder name or folder after {HF_PREFIX}; accepted: "
                            f"{HF_ACCEPTED}")
        path = Path(name).expanduser()
        online = False
        if not path.exists():
            if hub.looks_like_path(name):
                raise UserError(f"{flag}: no such folder ({path} does not exist); accepted: {HF_ACCEPTED}")
            online = hub.hub_online()
            if not online and not hub.in_cache(name, ("config.json",)):
                raise UserError(f"{flag}: not a local folder, not in the local Hugging Face cache ({hub.hub_cache_dir()})"
                                f", and {hub.why_offline()}; accepted: {HF_ACCEPTED}")
        source = str(path) if path.exists() else name
        try:
            transformers = require("transformers", "hf: retrievers")
            tokenizer = transformers.AutoTokenizer.from_pretrained(source, local_files_only=not online,
                                                                   trust_remote_code=False)
            model = transformers.AutoModel.from_pretrained(source, local_files_only=not online, trust_remote_code=False)
        except MissingDependency as e:
            raise UserError(f"{flag}: {e}") from None
        except Exception as e:  # OSError (no config.json), ValueError (not an encoder), hub errors
            raise UserError(f"{flag}: cannot be loaded ({error_line(e)}); accepted: {HF_ACCEPTED}") from None
        return cls(model, tokenizer, name).to(device).eval()

    def _encode(self, ids: torch.Tensor) -> torch.Tensor:
        rows = [self.tokenizer.build_inputs_with_special_tokens(r) for r in ids.tolist()]
        x = torch.tensor(rows, dtype=torch.long, device=ids.device)  # every chunk has M tokens: no padding
        hidden = self.model(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state  # [N, M', D]
        return F.normalize(hidden.float().mean(dim=1), dim=-1)

    encode_queries = _encode
    encode_passages = _encode

    def check_chunks(self, chunk_size: int, max_token: int) -> None:
        cfg = getattr(self.model, "config", None)
        vocab = getattr(cfg, "vocab_size", None)
        if vocab is not None and max_token >= vocab:
            raise UserError(f"{self.name}: token id {max_token} is outside the encoder's vocabulary of {vocab} (the "
                            "store must be tokenized with the encoder's tokenizer)")
        limit = getattr(cfg, "max_position_embeddings", None)
        n = len(self.tokenizer.build_inputs_with_special_tokens([0] * chunk_size))
        if limit is not None and n > limit:
            raise UserError(f"{self.name}: a chunk of {chunk_size} tokens ({n} with special tokens) is longer than the "
                            f"encoder's {limit} positions")

    def check_store(self, store) -> None:
        have = store.tokenizer_id
        if have.get("name") == self.hf_name:
            return
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None and hashlib.sha256(backend.to_str().encode()).hexdigest() == have.get("hash"):
            return
        raise UserError(f"{self.name} reads the store's token ids with its own vocabulary, but {store.path} was "
                        f"tokenized with {have.get('name')}, not {self.hf_name}: prepare the corpus with "
                        f"`rpt prepare --tokenizer {self.hf_name}`, or train a DPR retriever on this store")

    def save(self, folder: str | Path, overwrite: bool = True) -> Path:
        raise UserError(f"{self.name} is loaded by its name; there is nothing of ours to save")


# --------------------------------------------------------------------------------------------------------------
# neighbours at evaluation


def dpr_neighbors(retriever: ChunkRetriever, tokens: np.ndarray, chunk_size: int, segment_len: int, k: int,
                  batch_size: int = 1024) -> np.ndarray:
    """Inference-time neighbours [C, k] of one document, as `rpt.labels.bm25.bm25_neighbors`: for each query chunk
    c_q, the k chunks retrievable for it (rpt.chunks: nothing at or after its rule's limit) with the largest inner
    product <query_encoder(c_q), passage_encoder(c)>; document-absolute ids int64, best first, -1 where fewer than k
    chunks are retrievable. C = len(tokens) // chunk_size (a trailing partial chunk is dropped).

    Queries are scored one segment at a time against the passages retrievable for that segment, so memory stays
    O(chunks per segment x C). Deterministic for a given retriever, device and batch_size."""
    from rpt.model.retriever import top_k

    tokens = np.asarray(tokens)
    cps = chunks_per_segment(chunk_size, segment_len)
    C = len(tokens) // chunk_size
    ids = np.full((C, k), -1, np.int64)
    if C == 0 or k <= 0:
        return ids
    chunks = tokens[: C * chunk_size].reshape(C, chunk_size)
    retriever.check_chunks(chunk_size, int(chunks.max()))
    first = 2 * cps  # before segment 2 nothing is retrievable
    n_passages = int(last_retrievable(C - 1, chunk_size, segment_len)) + 1  # the last query's retrievable set
    if C <= first or n_passages <= 0:
        return ids
    q = retriever.embed(chunks[first:], "query", batch_size)  # [C - first, P]
    p = retriever.embed(chunks[:n_passages], "passage", batch_size)  # [n_passages, P]
    for s0 in range(first, C, cps):  # a segment's chunks share one retrievable set 0..limit
        limit = int(last_retrievable(s0, chunk_size, segment_len))
        if limit < 0:
            continue
        s1 = min(s0 + cps, C)
        scores = q[s0 - first : s1 - first] @ p[: limit + 1].T  # [<=cps, limit+1]
        ids[s0:s1] = top_k(scores, k)[0].cpu().numpy()
    return ids


# --------------------------------------------------------------------------------------------------------------
# training data


@dataclass
class TrainingPairs:
    """(query, positive, hard negative) chunks of one store: document index and document-relative chunk indices [N]."""

    doc: np.ndarray
    query: np.ndarray
    positive: np.ndarray
    negative: np.ndarray
    chunk_size: int
    segment_len: int
    n_documents: int = 0  # documents mined
    n_queries: int = 0  # query chunks that had anything retrievable
    info: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.doc)

    def starts(self, offsets: np.ndarray) -> np.ndarray:
        """Absolute token offsets [N, 3] of (query, positive, negative) in the store's flat token array."""
        base = np.asarray(offsets, dtype=np.int64)[self.doc][:, None]
        return base + np.stack([self.query, self.positive, self.negative], 1).astype(np.int64) * self.chunk_size


def mine_pairs(store, segment_len: int, *, max_documents: int = 0, seed: int = 0, progress: bool = False) -> TrainingPairs:
    """App. C's training examples: for every document of `store` (a TokenStore) and every query chunk c_q, BM25's
    ranking of the chunks retrievable for c_q (`bm25_neighbors`: c_q only, causal statistics); the positive is rank 1,
    the hard negative rank 5. Queries with fewer than five ranked chunks are skipped.

    max_documents > 0 mines a subset of that many documents, drawn with `seed` (then sorted); 0 = all. The result is
    deterministic given the store, segment_len, max_documents and seed."""
    from tqdm.auto import tqdm

    from rpt.labels.bm25 import bm25_neighbors

    M = store.chunk_size
    chunks_per_segment(M, segment_len)
    n_docs = len(store)
    docs = np.arange(n_docs)
    if 0 < max_documents < n_docs:
        docs = np.sort(np.random.default_rng(seed).permutation(n_docs)[:max_documents])
    parts: list[tuple[np.ndarray, ...]] = []
    n_queries = 0
    for d in tqdm(docs, desc="dpr pairs", unit="doc", disable=not progress):
        tokens = np.asarray(store.document(int(d)))
        if len(tokens) // M == 0:
            continue
        ranked = bm25_neighbors(tokens, M, segment_len, k=NEGATIVE_RANK)  # [C, 5]
        n_queries += int((ranked[:, 0] >= 0).sum())
        q = np.nonzero((ranked[:, POSITIVE_RANK - 1] >= 0) & (ranked[:, NEGATIVE_RANK - 1] >= 0))[0]
        if len(q):
            parts.append((np.full(len(q), d), q, ranked[q, POSITIVE_RANK - 1], ranked[q, NEGATIVE_RANK - 1]))
    cols = [np.concatenate([p[i] for p in parts]).astype(np.int64) if parts else np.zeros(0, np.int64) for i in range(4)]
    return TrainingPairs(*cols, chunk_size=M, segment_len=segment_len, n_documents=len(docs), n_queries=n_queries)


# --------------------------------------------------------------------------------------------------------------
# training


@dataclass
class DPRTrainResult:
    path: Path  # the published retriever folder
    retriever: DPRRetriever  # in eval mode, on the training device
    metrics: dict[str, Any]


def _gather(tokens: np.ndarray, starts: np.ndarray, chunk_size: int, device: torch.device) -> torch.Tensor:
    """Chunks [len(starts), M] from the flat token array (memmapped) at absolute offsets `starts`."""
    idx = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(chunk_size)
    return torch.as_tensor(np.asarray(tokens[idx], dtype=np.int64), device=device)


def contrastive_step(model: DPRRetriever, q_ids: torch.Tensor, pos_ids: torch.Tensor, neg_ids: torch.Tensor,
                     starts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DPR's loss on one batch: B queries against [B positives ++ B hard negatives].

    starts: absolute offsets [B, 3] of (query, positive, negative) to mask false negatives: an in-batch passage that
    is the same chunk as query i's positive (other than its own column) or as query i itself. Returns (loss,
    in-batch accuracy: the positive is the arg-max over all 2B passages, hard accuracy: positive scores above the
    query's own hard negative)."""
    B = q_ids.shape[0]
    q = model.encode_queries(q_ids)  # [B, P]
    p = model.encode_passages(torch.cat([pos_ids, neg_ids]))  # [2B, P]
    logits = (q @ p.T) / model.cfg.temperature  # [B, 2B]
    target = torch.arange(B, device=logits.device)
    if starts is not None:
        passage = torch.cat([starts[:, 1], starts[:, 2]])  # [2B]
        false_neg = (passage[None, :] == starts[:, 1:2]) | (passage[None, :] == starts[:, 0:1])
        false_neg[target, target] = False
        logits = logits.masked_fill(false_neg, float("-inf"))
    loss = F.cross_entropy(logits, target)
    with torch.no_grad():
        in_batch = (logits.argmax(dim=1) == target).float().mean()
        hard = (logits[target, target] > logits[target, B + target]).float().mean()
    return loss, in_batch, hard


@torch.no_grad()
def pair_accuracy(retriever: ChunkRetriever, tokens: np.ndarray, starts: np.ndarray, chunk_size: int,
                  batch_size: int = 1024) -> float:
    """Fraction of (query, positive, negative) triples [N, 3] (absolute offsets) whose positive scores above the hard
    negative: 0.5 is chance."""
    if len(starts) == 0:
        return float("nan")
    wins = 0.0
    for s in range(0, len(starts), batch_size):
        b = starts[s : s + batch_size]
        q, pos, neg = (retriever.embed(np.asarray(tokens[b[:, j, None] + np.arange(chunk_size)]), w, batch_size)
                       for j, w in ((0, "query"), (1, "passage"), (2, "passage")))
        wins += float(((q * pos).sum(1) > (q * neg).sum(1)).sum())
    return wins / len(starts)


def _open_store(store, split: str):
    from rpt.data.store import TokenStore, open_split

    if isinstance(store, TokenStore):
        return store
    return open_split(store, split)


def _store_vocab(store) -> int:
    """The tokenizer's vocabulary size from the manifest (else the largest token id + 1, one pass over the store)."""
    v = int(store.tokenizer_id.get("vocab_size") or 0)
    return v if v > 0 else (int(store.tokens.max()) + 1 if len(store.tokens) else 1)


def train_dpr(store, out_dir: str | Path, *, steps: int = 2000, batch_size: int = 64, lr: float = 3e-4, seed: int = 0,
              split: str = "train", segment_len: int = 1024, config: DPRConfig | dict[str, Any] | None = None,
              weight_decay: float = 0.01, warmup_steps: int | None = None, grad_clip: float = 2.0,
              max_documents: int = 0, heldout: int = 1000, log_every: int = 50, device: str | torch.device = "auto",
              progress: bool = True, overwrite: bool = False, pairs: TrainingPairs | None = None) -> DPRTrainResult:
    """Train a DPR-style retriever on a store's `split` (App. C) and write it to `out_dir`.

    store: an `rpt prepare` root (its `split` folder is used), a store folder, or a TokenStore. segment_len: the
    retrievable rule used to mine pairs (the LM's model.segment_len). config: a DPRConfig, or a dict of DPRConfig
    fields overriding the defaults (vocab_size and chunk_size come from the store). Pairs (`mine_pairs`, or `pairs`
    given) are shuffled with `seed`; `heldout` of them (at most a tenth) are kept out of training and scored at the end
    (hard-negative accuracy, 0.5 = chance). Each step samples `batch_size` training pairs without replacement (a new
    permutation per epoch); AdamW with linear warm-up (`warmup_steps`, default min(1000, steps // 10)) and linear decay
    to 0. Everything is written to ``.<out_dir>.partial`` (the log too, as it grows) and renamed to `out_dir` only when
    complete; an existing `out_dir` is refused unless `overwrite` (and only a DPR folder is ever replaced).
    """
    from tqdm.auto import tqdm

    from rpt.version import __version__

    out = Path(out_dir)
    if steps < 1 or batch_size < 2 or not lr > 0 or log_every < 1 or heldout < 0 or grad_clip < 0:
        raise UserError(f"train_dpr: need steps >= 1, batch_size >= 2, lr > 0, log_every >= 1, heldout >= 0 and "
                        f"grad_clip >= 0 (got {steps}, {batch_size}, {lr}, {log_every}, {heldout}, {grad_clip})")
    _check_replaceable(out, overwrite, {"store": store})
    tokens_store = _open_store(store, split)
    M = tokens_store.chunk_size
    try:
        chunks_per_segment(M, segment_len)
    except ValueError as e:
        raise UserError(f"train_dpr: {e}") from None
    base = {"vocab_size": _store_vocab(tokens_store), "chunk_size": M}
    if isinstance(config, DPRConfig):
        cfg = DPRConfig.from_dict(config.to_dict())
        if cfg.vocab_size < base["vocab_size"] or cfg.chunk_size != M:
            raise UserError(f"train_dpr: config vocab_size {cfg.vocab_size} / chunk_size {cfg.chunk_size} do not fit the "
                            f"store ({base['vocab_size']} token ids, chunks of {M})")
    else:
        extra = dict(config or {})
        for key in ("vocab_size", "chunk_size"):
            if key in extra and extra[key] != base[key]:
                raise UserError(f"train_dpr: {key} comes from the store ({base[key]}), not {extra[key]}")
        cfg = DPRConfig.from_dict({**extra, **base})
    t0 = time.perf_counter()
    if pairs is None:
        pairs = mine_pairs(tokens_store, segment_len, max_documents=max_documents, seed=seed, progress=progress)
    elif pairs.chunk_size != M:
        raise UserError(f"train_dpr: pairs were mined with chunks of {pairs.chunk_size}, the store has {M}")
    if len(pairs) < 2:
        raise UserError(f"train_dpr: {tokens_store.path} gives {len(pairs)} training pair(s): a query needs at least "
                        f"{NEGATIVE_RANK} retrievable chunks sharing a token with it (documents of at least "
                        f"{2 * segment_len // M + NEGATIVE_RANK + 1} chunks)")
    rng = np.random.default_rng(seed)
    starts = pairs.starts(tokens_store.offsets)[rng.permutation(len(pairs))]  # [N, 3] shuffled
    n_held = min(heldout, len(starts) // 10)
    held, train = starts[:n_held], starts[n_held:]
    dev = resolve_device(device)
    B = min(batch_size, len(train))
    warm = min(1000, steps // 10) if warmup_steps is None else max(0, int(warmup_steps))

    def lr_factor(step: int) -> float:  # step = updates done before this one
        if step < warm:
            return (step + 1) / (warm + 1)
        return max(0.0, (steps - step) / max(1, steps - warm))

    tmp = out.with_name(f".{out.name}.partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    tokens = tokens_store.tokens
    cuda = [dev.index if dev.index is not None else torch.cuda.current_device()] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)  # dropout (the weights are drawn from keyed generators)
        model = DPRRetriever(cfg, seed=seed).to(dev).train()
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
        order, pos = rng.permutation(len(train)), 0
        window = torch.zeros(3, dtype=torch.float64, device=dev)
        n_window = 0
        last: dict[str, Any] = {}
        bar = tqdm(total=steps, desc="dpr", unit="step", disable=not progress, dynamic_ncols=True)
        with open(tmp / LOG_FILE, "w") as log:
            for step in range(steps):
                if pos + B > len(order):
                    order, pos = rng.permutation(len(train)), 0
                batch = train[order[pos : pos + B]]
                pos += B
                q_ids, p_ids, n_ids = (_gather(tokens, batch[:, j], M, dev) for j in range(3))
                loss, in_batch, hard = contrastive_step(model, q_ids, p_ids, n_ids, torch.as_tensor(batch, device=dev))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
                opt.step()
                sched.step()
                window += torch.stack([loss.detach(), in_batch, hard]).double()
                n_window += 1
                bar.update(1)
                if (step + 1) % log_every == 0 or step + 1 == steps:
                    m = (window / n_window).tolist()
                    last = {"step": step + 1, "loss": m[0], "in_batch_acc": m[1], "hard_acc": m[2],
                            "lr": opt.param_groups[0]["lr"], "examples": (step + 1) * B,
                            "seconds": round(time.perf_counter() - t0, 3)}
                    log.write(json.dumps(last) + "\n")
                    log.flush()
                    bar.set_postfix(loss=f"{m[0]:.3f}", acc=f"{m[1]:.3f}")
                    window.zero_()
                    n_window = 0
        bar.close()
    model.eval()
    metrics = {"final": last, "heldout_pairs": n_held,
               "heldout_hard_acc": pair_accuracy(model, tokens, held, M) if n_held else None}
    model.meta = {
        "tokenizer": tokens_store.tokenizer_id,
        "training": {"store": str(tokens_store.path), "segment_len": segment_len, "positive_rank": POSITIVE_RANK,
                     "negative_rank": NEGATIVE_RANK, "steps": steps, "batch_size": B, "lr": lr, "seed": seed,
                     "weight_decay": weight_decay, "warmup_steps": warm, "grad_clip": grad_clip,
                     "max_documents": max_documents, "n_documents": pairs.n_documents, "n_queries": pairs.n_queries,
                     "n_pairs": len(pairs), "n_train_pairs": len(train), "device": str(dev),
                     "n_parameters": model.n_parameters(), "seconds": round(time.perf_counter() - t0, 3),
                     "rpt_version": __version__, "metrics": metrics}}
    state_device = model.device
    model.to("cpu")._write(tmp)
    mark_folder(tmp, OWNER)
    model.to(state_device)
    _publish(tmp, out)
    model.name = str(out)
    return DPRTrainResult(path=out, retriever=model, metrics=metrics)


def describe(retriever: ChunkRetriever) -> str:
    """One line for logs and result files."""
    if isinstance(retriever, DPRRetriever):
        c = retriever.cfg
        return (f"{retriever.name}: DPR dual encoder ({'shared' if c.shared else 'separate'} encoders, {c.n_layers} x "
                f"{c.d_model}, proj {c.proj_dim}, {retriever.n_parameters() / 1e6:.1f}M parameters)")
    return f"{retriever.name}: Hugging Face encoder, mean pooled"


__all__ = ["DPRConfig", "DPREncoder", "DPRRetriever", "DPRTrainResult", "HFRetriever", "TrainingPairs", "ChunkRetriever",
           "contrastive_step", "describe", "dpr_neighbors", "load_retriever", "mine_pairs", "pair_accuracy", "train_dpr"]
