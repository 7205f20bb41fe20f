"""Small corpora built in tmp_path for the data-layer tests."""

import random
from pathlib import Path

import pytest

WORDS = ("the retriever scores chunks of earlier text and the decoder attends to the best neighbours while the "
         "language model predicts the next chunk def return class import self value index token store memory").split()


def prose(seed: int, n_words: int = 400) -> str:
    """Deterministic pseudo-text: enough repetition for a tiny BPE, long enough for several 64-token chunks."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_words // 10):
        lines.append(" ".join(rng.choice(WORDS) for _ in range(10)) + ".")
    return "\n".join(lines) + "\n"


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


@pytest.fixture(name="prose")
def prose_fixture():
    """The `prose(seed, n_words)` text generator, for tests that build their own fixtures."""
    return prose


@pytest.fixture(name="write")
def write_fixture():
    """`write(path, str | bytes)`: create a file and its folders."""
    return write


@pytest.fixture
def texts() -> list[str]:
    return [prose(i) for i in range(8)]


@pytest.fixture
def split_folder(tmp_path: Path) -> Path:
    """train/validation/test folders of text files: 4/2/2 good documents."""
    root = tmp_path / "books"
    for base, (split, n) in enumerate((("train", 4), ("validation", 2), ("test", 2))):
        for i in range(n):
            write(root / split / f"{split}_{i}.txt", prose(100 * base + i))
    return root


@pytest.fixture
def bad_folder(tmp_path: Path) -> Path:
    """One split (train) with one good document and one of each bad kind."""
    root = tmp_path / "bad"
    write(root / "train" / "good.txt", prose(1))
    write(root / "train" / "empty.txt", "  \n\t\n")
    write(root / "train" / "short.txt", "just a few words\n")
    write(root / "train" / "binary.dat", b"\x89PNG\r\n\x1a\n\x00\x00\x00IHDR")
    write(root / "train" / "latin1.txt", "caf\u00e9 cr\u00e8me ".encode("latin-1") * 40)
    return root
