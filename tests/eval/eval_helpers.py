"""Shared pieces for the evaluation tests: a tiny model config (chunks of 8, segments of 16), models with every path
made non-trivial, a word-level tokenizer, token stores, whole-document sem labels and checkpoints on disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import yaml
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from rpt import RPT, RPTConfig
from rpt.chunks import last_retrievable
from rpt.data.store import StoreWriter
from rpt.data.tokenizer import Tokenizer
from rpt.labels.store import LabelWriter

V, M, S = 64, 8, 16  # vocabulary, chunk size, segment length: chunk i >= 4 can retrieve (chunks 0 .. i//2*2 - 4)


def tiny_config(variant: str = "rpt-sem", **model) -> RPTConfig:
    doc = {"preset": "tiny",
           "model": {"variant": variant, "vocab_size": V, "chunk_size": M, "segment_len": S, "d_model": 32, "n_heads": 2,
                     "mlp_hidden": 64, "n_neighbors": 2, "dropout": 0.0, **model},
           "data": {"seq_len": 64},
           "train": {"steps": 1, "out_dir": "unused"}}
    return RPTConfig.from_yaml(yaml.safe_dump(doc))


def make_model(variant: str = "rpt-sem", seed: int = 0, **model_kw) -> RPT:
    """A tiny model in eval mode whose gates, null key/values and biases are all away from their initial values."""
    torch.manual_seed(seed)
    model = RPT(tiny_config(variant, **model_kw).model).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() < 2:
                p.add_(torch.randn_like(p) * (2.0 if name.endswith("gate.w") else 0.1))
    return model


def word_tokenizer(n: int = V, tag: str = "w") -> Tokenizer:
    """A word-level tokenizer of n tokens ("<unk>", "w1" ...): a real tokenizer.json with an identity hash."""
    vocab = {"<unk>": 0, **{f"{tag}{i}": i for i in range(1, n)}}
    tok = HFTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return Tokenizer(tok, f"word-{tag}-{n}")


def doc_tokens(n: int, seed: int) -> np.ndarray:
    """A document with repeats (so BM25 and the retriever have something to find)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(1, V, size=23)
    toks = base[np.arange(n) % len(base)]
    return np.where(rng.random(n) < 0.3, rng.integers(1, V, size=n), toks)


def make_store(path: Path, lengths: list[int], tokenizer: Tokenizer | None = None, seed: int = 0) -> Path:
    tok = tokenizer or word_tokenizer()
    with StoreWriter(path, tok.identity, M) as w:
        for d, n in enumerate(lengths):
            w.add(f"doc{d}", doc_tokens(n, seed + d))
        w.close()
    return path


def make_root(root: Path, lengths: list[int], split: str = "test", tokenizer: Tokenizer | None = None) -> Path:
    """An `rpt prepare`-like root: <root>/tokenizer.json and <root>/<split>/."""
    tok = tokenizer or word_tokenizer()
    root.mkdir(parents=True, exist_ok=True)
    tok.save(root / "tokenizer.json")
    make_store(root / split, lengths, tok)
    return root


def write_doc_labels(path: Path, lengths: list[int], tokenizer: dict, span: str = "doc", kind: str = "sem", k: int = 6,
                     segment_len: int = S, seed: int = 0) -> Path:
    """Random whole-document labels: per query chunk up to k distinct retrievable candidates (document-absolute ids,
    the rule counted from the document start), s_t ~ N(0, 1) so about half are positives."""
    rng = np.random.default_rng(seed)
    n_chunks = np.array([n // M for n in lengths])
    config = {"kind": kind, "span": span, "query": "pair", "k": k, "chunk_size": M, "segment_len": segment_len,
              "tokenizer": tokenizer, "scorer": "test"}
    w = LabelWriter(path, config, (0, len(lengths)), n_chunks, k)
    for d, nc in enumerate(n_chunks):
        cands = np.full((nc, k), -1, np.int32)
        bm25 = np.full((nc, k), np.nan, np.float32)
        target = np.full((nc, k), np.nan, np.float32)
        for c in range(nc - 1):  # the last chunk has no target chunk
            last = int(last_retrievable(c, M, segment_len))
            if last < 0:
                continue
            pick = rng.permutation(last + 1)[:k]
            cands[c, : len(pick)] = pick
            bm25[c, : len(pick)] = np.sort(rng.uniform(1, 10, len(pick)))[::-1]
            if kind == "sem":
                target[c, : len(pick)] = rng.normal(size=len(pick))
        w.write(d, cands, bm25, target, {})
    return w.publish({})


def save_checkpoint(run_dir: Path, model: RPT, cfg: RPTConfig, step: int = 7, tokenizer: Tokenizer | None = None) -> Path:
    """A checkpoint written by rpt.checkpoint.save (the training loop's saver); with tokenizer.json beside it."""
    from rpt import checkpoint as ckpt_io
    from rpt.utils import environment

    cfg.model = model.cfg
    cfg.data.store = str(run_dir / "no-store")  # hermetic: never fall back on a store of the working directory
    path = ckpt_io.save(run_dir, step, model.state_dict(), {"state": {}, "param_groups": []}, cfg, [ckpt_io.rng_state()],
                        {"consumed": 0}, environments=[{"from_step": 0, **environment()}])
    if tokenizer is not None:
        tokenizer.save(path / "tokenizer.json")
    return path
