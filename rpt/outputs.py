"""Where a verb writes: one policy for every output path, checked before any work.

Every verb that writes (prepare, label, train, eval, generate, export, dpr, sweep, demo, copytest, ...) asks this
module first, so that nothing a user gave is ever replaced or deleted:

- **The path must be writable**: a parent that is a file, a folder that is read-only, an output folder that is a file
  (or an output file that is a folder) is refused in one line naming the argument, before any work.
- **An output is never an input**: an output folder that is, or holds, one of the command's inputs (the corpus, the
  token store, the run or checkpoint being read) is refused, with or without ``--force``.
- **A folder holds only what its verb wrote**: a verb marks each folder it creates with a small hidden file
  (`MARK`, naming the verb). A folder that holds anything else (files of the user's, the output of another verb, or
  names the verb never writes) is refused, ``--force`` or not; ``--force`` replaces only an output of the same verb.
- **A file is replaced only when rpt wrote it** (`written_by`): result JSON carries ``"written_by": "rpt <verb>"``,
  HTML a generator meta tag, PNG plots a ``Software`` text chunk. Results are written to a temporary sibling and
  renamed into place (`rpt.utils.write_json_atomic`, `write_text_atomic`), so a killed command leaves the old file or
  the new one.

Folders written before the mark existed are recognised by the verb's own signature (e.g. a run folder's
config.yaml and checkpoints/) and by their entries, all of which must be names the verb writes.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rpt.utils import argument_error, write_json_atomic

MARK = ".rpt-output.json"


@dataclass(frozen=True)
class Owner:
    """What a verb writes into its output folder.

    verb: the verb's name ("train"); entries: glob patterns of the top-level names it writes (its hidden temporary
    and lock files included); signature: recognises a folder of this verb that carries no mark (written by an
    earlier version), given that every entry matches `entries`.
    """

    verb: str
    entries: tuple[str, ...]
    signature: Callable[[Path], bool] | None = None

    def owns(self, name: str) -> bool:
        return name == MARK or any(fnmatch.fnmatchcase(name, p) for p in self.entries)


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_writable(path: str | Path, arg: str = "out", *, kind: str = "folder") -> Path:
    """`path` as a Path, after checking that it can be written as a `kind` ("folder" or "file"): no parent of it is
    a file, it is not of the other kind, and the folder it would be made in (or it, if it exists) is writable.

    Raises an ArgumentError (also a ValueError) naming `arg` otherwise."""
    path = Path(path)
    if not str(path) or str(path).strip() != str(path):
        raise argument_error(arg, path, "not a usable path", ValueError)
    base = _nearest_existing(path.parent if kind == "file" else path)
    if base != path and not base.is_dir():
        raise argument_error(arg, path, f"{base} is a file, not a folder", ValueError)
    if path.exists():
        if kind == "folder" and not path.is_dir():
            raise argument_error(arg, path, "is a file, not a folder", ValueError)
        if kind == "file" and path.is_dir():
            raise argument_error(arg, path, "is a folder, not a file", ValueError)
    target = path if (kind == "folder" and path.is_dir()) else base
    if not os.access(target, os.W_OK | os.X_OK):
        raise argument_error(arg, path, f"{target} is not writable", ValueError)
    if kind == "file" and path.exists() and not os.access(path, os.W_OK):
        raise argument_error(arg, path, "is not writable", ValueError)
    return path


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _contains(folder: Path, path: Path) -> bool:
    """`path` is `folder` or lies inside it (real paths)."""
    return folder == path or folder in path.parents


def check_not_input(path: str | Path, arg: str, inputs: Mapping[str, Any],
                    inside_ok: Iterable[str] = ()) -> None:
    """Refuse an output `path` that is one of `inputs` (argument name -> path), holds one, or lies inside an input
    folder (unless that input's name is in `inside_ok`: labels live inside their token store). A value may be a list of
    paths."""
    out = _real(Path(path))
    inside_ok = set(inside_ok)
    pairs = [(name, v) for name, value in inputs.items()
             for v in (value if isinstance(value, (list, tuple)) else [value])]
    for name, value in pairs:
        value = getattr(value, "path", value)  # a TokenStore, a LabelStore: their folder
        if not isinstance(value, (str, os.PathLike)) or str(value) == "":
            continue
        src = _real(Path(value))
        if _contains(out, src):
            what = "is" if out == src else "holds"
            raise argument_error(arg, path, f"{what} {{{name}}} {value}, an input of this command: choose another "
                                 "folder", ValueError)
        if _contains(src, out) and name not in inside_ok and src.is_dir():
            raise argument_error(arg, path, f"lies inside {{{name}}} {value}, an input of this command: choose a "
                                 "folder outside it", ValueError)


def read_mark(folder: Path) -> dict[str, Any] | None:
    try:
        mark = json.loads((folder / MARK).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return mark if isinstance(mark, dict) else None


def _listing(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def claim_folder(path: str | Path, owner: Owner, *, arg: str = "out", inputs: Mapping[str, Any] = {},
                 inside_ok: Iterable[str] = ()) -> bool:
    """Check, before any work, that `owner`'s verb may write the folder `path`; True when it holds an earlier output
    of that verb (to resume, reuse or, with --force, replace), False when it is new or empty.

    Refused in one line (an ArgumentError naming `arg`): an unwritable path (`check_writable`), a folder that is or
    holds an input (`check_not_input`), and a folder holding anything the verb did not write."""
    path = check_writable(path, arg, kind="folder")
    check_not_input(path, arg, inputs, inside_ok)
    if not path.is_dir():
        return False
    try:
        names = sorted(p.name for p in path.iterdir())
    except OSError as e:
        raise argument_error(arg, path, f"cannot be read ({e.strerror or e})", ValueError) from None
    if not names:
        return False
    mark = read_mark(path) if MARK in names else None
    if mark is not None and mark.get("verb") != owner.verb:
        raise argument_error(arg, path, f"holds the output of `rpt {mark.get('verb')}`, not of `rpt {owner.verb}`: "
                             "choose another folder", ValueError)
    foreign = [n for n in names if not owner.owns(n)]
    if mark is None and not foreign and owner.signature is not None and owner.signature(path):
        return True
    if mark is None:
        raise argument_error(arg, path, f"holds files that `rpt {owner.verb}` did not write ({_listing(names)}): "
                             "choose a new or empty folder", ValueError)
    if foreign:
        raise argument_error(arg, path, f"holds files that `rpt {owner.verb}` did not write ({_listing(foreign)}) "
                             "beside its own: move them away or choose another folder", ValueError)
    return True


def mark_folder(folder: str | Path, owner: Owner) -> None:
    """Record in `folder` (created if needed) that `owner`'s verb wrote it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if read_mark(folder) is None:
        from rpt.version import __version__

        write_json_atomic(folder / MARK, {"verb": owner.verb, "rpt": __version__}, verb=owner.verb)


# ---------------------------------------------------------------------------------------------------------------
# Files


def written_by(path: str | Path) -> str | None:
    """The rpt verb that wrote the file `path` ("rpt eval"), or None when it was not written by rpt (or cannot be
    read). JSON: its "written_by" key; HTML: a generator meta tag; PNG: a Software text chunk; markdown: a first-line
    comment."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    if head.startswith(b"\x89PNG"):
        i = head.find(b"Software\x00rpt")
        return "rpt" if i >= 0 else None
    text = head.decode("utf-8", "replace").lstrip("\ufeff").lstrip()
    if text.startswith("{"):
        try:
            obj = json.loads(path.read_text(encoding="utf-8-sig"))
        except (OSError, ValueError, RecursionError):
            return None
        if isinstance(obj, dict) and str(obj.get("written_by", "")).startswith("rpt"):
            return str(obj["written_by"])
        config = obj.get("config") if isinstance(obj, dict) else None
        model = config.get("model") if isinstance(config, dict) else None
        legacy = {"format_version", "checkpoint", "config", "eval", "total"}
        if isinstance(obj, dict) and legacy <= obj.keys() and isinstance(model, dict) and "variant" in model:
            return "rpt eval"  # a result of a version that did not sign its files
        return None
    first = text.split("\n", 1)[0]
    if first.startswith("<!-- written by rpt"):  # markdown: the first line, as `lab compare --markdown` writes it
        return first[len("<!-- written by "):].split(" -->")[0]
    head = text.split("</head>", 1)[0] if text.startswith("<!DOCTYPE html>") else ""
    tag = '<meta name="generator" content="'
    i = head.find(tag)
    if i >= 0 and head[i + len(tag):].startswith("rpt"):
        return head[i + len(tag):].split('"')[0]
    return None


def claim_file(path: str | Path, verb: str, *, arg: str = "out", inputs: Mapping[str, Any] = {}) -> Path:
    """Check, before any work, that `verb` may write the file `path`: writable (`check_writable`), not an input,
    and, if it exists, written by rpt (then it is replaced). Returns it as a Path."""
    path = check_writable(path, arg, kind="file")
    check_not_input(path, arg, inputs, inside_ok=inputs.keys())  # a result may go beside what it was made from
    if path.exists() and written_by(path) is None:
        raise argument_error(arg, path, f"exists and was not written by rpt: `rpt {verb}` replaces only its own "
                             "files; choose another path or move it away", ValueError)
    return path
