"""Fixtures for the training tests; the helpers themselves live in train_helpers.py."""

from pathlib import Path

import pytest
from train_helpers import make_labels, make_store, write_label_store


@pytest.fixture
def corpus(tmp_path: Path) -> dict:
    """A store whose documents give 2.5, 3, 0 (24 tokens < 2 segments), 1.75 and 1 sequences of 64 tokens, plus sem
    labels on disk."""
    lengths = [160, 192, 24, 112, 64]
    store = make_store(tmp_path / "store" / "train", lengths)
    labels = write_label_store(tmp_path / "labels", make_labels(lengths, 64, 8, 16))
    return {"root": tmp_path / "store", "store": store, "labels": labels, "lengths": lengths, "tmp": tmp_path}
