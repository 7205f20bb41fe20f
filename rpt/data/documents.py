"""What every corpus reader gives: documents (id, text) by split, behind one interface (`Corpus`), and the `Skips`
that count the inputs a reader could not turn into documents. The readers are in rpt.data.corpora (files, code
trees, Hugging Face, Debian packages) and rpt.data.synthetic (the copy corpus)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

SPLITS = ("train", "validation", "test")
SPLIT_ALIASES = {"train": "train", "validation": "validation", "valid": "validation", "val": "validation",
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


def normalize_split(name: str) -> str:
    try:
        return SPLIT_ALIASES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown split {name!r}; use one of {', '.join(SPLITS)}") from None


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

    def provenance(self) -> dict[str, Any]:
        """Where the text came from and under which licence, for the store's manifest (not compared on reuse):
        e.g. the Debian packages read, with version and licence. Empty where the spec says it all."""
        return {}

    def _check_split(self, split: str) -> str:
        split = normalize_split(split)
        if split not in self.splits:
            raise ValueError(f"corpus {self.spec!r} has no split {split!r} (it has {', '.join(self.splits)})")
        return split
