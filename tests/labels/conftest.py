"""Fixtures for the label-pipeline tests (helpers in labels_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from labels_helpers import hf_tokenizer, json_package_text, tiny_lm, train_bpe
from tokenizers import Tokenizer


@pytest.fixture(scope="session")
def bpe() -> Tokenizer:
    """The store tokenizer: a byte-level BPE with 400 tokens trained on the json package."""
    return train_bpe(json_package_text(), 400)


@pytest.fixture(scope="session")
def bpe_other() -> Tokenizer:
    """A different tokenizer (300 tokens, trained on a different slice) for the scorer."""
    return train_bpe(json_package_text()[::-1][:30000][::-1], 300)


@pytest.fixture(scope="session")
def scorer_dir(tmp_path_factory, bpe_other) -> Path:
    """A tiny Llama with its own tokenizer, saved with save_pretrained (loaded by path like any HF model)."""
    path = tmp_path_factory.mktemp("tiny_scorer")
    tiny_lm(bpe_other.get_vocab_size()).save_pretrained(path)
    hf_tokenizer(bpe_other).save_pretrained(path)
    return path
