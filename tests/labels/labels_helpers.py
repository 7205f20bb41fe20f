"""Helpers for the label-pipeline tests: real stdlib text, tiny BPEs trained here, tiny token stores, tiny HF models.

Everything is built locally (no download) and kept small: documents of tens of chunks, models of width 32.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from rpt.data.store import StoreWriter, TokenStore


def json_package_text() -> str:
    """The source of Python's json package: real code, ~48K characters, on every machine."""
    root = Path(json.__file__).parent
    return "".join(p.read_text(encoding="utf-8") for p in sorted(root.glob("*.py")))


def train_bpe(text: str, vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text[i : i + 2000] for i in range(0, len(text), 2000)], trainer)
    return tok


def identity(tok: Tokenizer, name: str) -> dict:
    return {"name": name, "hash": hashlib.sha256(tok.to_str().encode()).hexdigest(), "vocab_size": tok.get_vocab_size()}


def make_store(root: Path, tok: Tokenizer, texts: list[str], chunk_size: int, split: str = "train",
               name: str = "bpe") -> TokenStore:
    """A token store at root/<split> with root/tokenizer.json, as `rpt prepare` lays it out."""
    root.mkdir(parents=True, exist_ok=True)
    tok.save(str(root / "tokenizer.json"))
    writer = StoreWriter(root / split, identity(tok, name), chunk_size)
    for i, text in enumerate(texts):
        writer.add(f"doc{i}", tok.encode(text).ids)
    writer.close()
    return TokenStore.open(root / split)


def doc_texts(n_docs: int, chars: int, seed: int = 0) -> list[str]:
    """Slices of the json package source of about `chars` characters each (tens of chunks)."""
    text = json_package_text()
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(text) - chars, n_docs)
    return [text[s : s + chars + 37 * i] for i, s in enumerate(starts)]


def hf_tokenizer(tok: Tokenizer):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tok.to_str()), eos_token=None)


def tiny_lm(vocab_size: int, arch: str = "llama", seed: int = 0) -> torch.nn.Module:
    """A random-init causal LM of width 32 (no download)."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    if arch == "llama":
        cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
        model = LlamaForCausalLM(cfg)
    else:
        cfg = GPTNeoXConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, max_position_embeddings=1024)
        model = GPTNeoXForCausalLM(cfg)
    return model.eval()
