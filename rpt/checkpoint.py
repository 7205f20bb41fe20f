"""Checkpoints that resume exactly: weights, optimiser, step, RNG states, data position and the config.

Layout of ``<out_dir>/checkpoints/step_<step:08d>/`` (written as ``.step_<step>.tmp`` and renamed into place, so a
folder without the dot is always complete)::

    model.safetensors  weights; tensors shared by several names (the tied embedding) are stored once and the other
                       names are listed in the metadata key "aliases" (JSON {alias: stored name})
    optimizer.pt       optimizer.state_dict()  (torch.save; loads with weights_only=True)
    rng.pt             per-rank RNG states: python `random`, numpy, torch CPU, torch CUDA
    state.json         {"step", "data", "world_size", "metrics", "rpt_version", "environments", "files"}; "step" =
                       updates done; "environments" = where the updates ran: [{"from_step", **rpt.utils.environment()}],
                       one entry per stretch run in one environment (a run resumed elsewhere, or at another thread
                       count, adds one); "files" = {name: {"bytes", "sha256"}} of the four other files
    config.yaml        the full RPTConfig of the run

`latest(out_dir)` finds the newest complete checkpoint; `latest_intact` the newest whose files still match their
recorded sizes and sha256 (a damaged newer one is reported with a warning and skipped, never silently used: a disk that
filled up, a copy cut short, a file edited by hand); `prune` keeps the last k. Every reader (training's resume, eval,
generate, explore, the checkpoint scorer) goes through this module, so none of them can load an unverified file.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import random
import re
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from rpt.config import RPTConfig
from rpt.utils import RPTWarning, UserError, error_line, write_failure, write_json_atomic

_STEP_DIR = re.compile(r"^step_(\d+)$")
CHECKED_FILES = ("model.safetensors", "optimizer.pt", "rng.pt", "config.yaml")
MODEL_FILES = ("model.safetensors", "config.yaml")  # what loading a model for eval / generate / scoring reads


class DamagedCheckpoint(UserError):
    """A checkpoint file that is missing, cut short, altered, or cannot be parsed."""


def checkpoint_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def step_path(out_dir: str | Path, step: int) -> Path:
    return checkpoint_dir(out_dir) / f"step_{step:08d}"


def list_checkpoints(out_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = checkpoint_dir(out_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and (p / "state.json").exists()]
    return [p for _, p in sorted(found)]


def latest(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder under `out_dir`, or None."""
    cps = list_checkpoints(out_dir)
    return cps[-1] if cps else None


def latest_intact(out_dir: str | Path, files: tuple[str, ...] = CHECKED_FILES) -> Path | None:
    """The newest checkpoint under `out_dir` whose `files` pass `verify`, or None when the run has no checkpoint.

    A damaged newer checkpoint is skipped with an RPTWarning naming it and what is wrong; when every checkpoint is
    damaged this raises DamagedCheckpoint rather than pretend the run has none (which would restart it from scratch).
    """
    cps = list_checkpoints(out_dir)
    problems = []
    for p in reversed(cps):
        try:
            verify(p, files)
        except DamagedCheckpoint as e:
            warnings.warn(f"damaged checkpoint skipped: {e}", RPTWarning, stacklevel=2)
            problems.append(str(e))
            continue
        return p
    if cps:
        raise DamagedCheckpoint(f"every checkpoint of {out_dir} is damaged (newest: {problems[0]}); restore one, or move "
                                f"{checkpoint_dir(out_dir)} away to start the run over")
    return None


# --------------------------------------------------------------------------------------------------------------
# integrity: sizes and sha256 recorded at save time, checked before any read


def sha256_file(path: str | Path, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


@functools.lru_cache(maxsize=64)
def _cached_sha256(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file, once per (path, size, mtime): eval resolves the same checkpoint several times."""
    return sha256_file(path)


def file_records(folder: Path, files: tuple[str, ...] = CHECKED_FILES) -> dict[str, dict[str, Any]]:
    """{name: {"bytes", "sha256"}} of the `files` present in `folder` (what state.json records)."""
    return {n: {"bytes": (folder / n).stat().st_size, "sha256": sha256_file(folder / n)} for n in files
            if (folder / n).is_file()}


def read_state(folder: Path) -> dict[str, Any]:
    """state.json of a checkpoint folder ({} when absent: a bare model.safetensors folder), or DamagedCheckpoint."""
    path = folder / "state.json"
    if not path.exists():
        return {}
    try:
        state = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DamagedCheckpoint(f"{path} cannot be read ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict):
        raise DamagedCheckpoint(f"{path} is not a JSON object")
    return state


def verify(folder: str | Path, files: tuple[str, ...] = CHECKED_FILES) -> None:
    """Check that each of `files` exists and matches the size and sha256 recorded in state.json.

    Checkpoints written before checksums were recorded have no "files" entry: they are checked for presence only, and
    a file that then fails to parse is reported by the reader (`read_weights`, `load`) as DamagedCheckpoint too.
    """
    folder = Path(folder)
    recorded = read_state(folder).get("files") or {}
    for name in files:
        path = folder / name
        if not path.is_file():
            raise DamagedCheckpoint(f"{path} is missing")
        rec = recorded.get(name)
        if rec is None:
            continue
        st = path.stat()
        size = st.st_size
        if size != rec["bytes"]:
            raise DamagedCheckpoint(f"{path} has {size:,} bytes where its checkpoint recorded {rec['bytes']:,} "
                                    "(cut short or overwritten)")
        if _cached_sha256(str(path), size, st.st_mtime_ns) != rec["sha256"]:
            raise DamagedCheckpoint(f"{path} does not match the sha256 its checkpoint recorded (the file was altered)")


def prune(out_dir: str | Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` checkpoints (keep_last <= 0 keeps everything)."""
    for left in checkpoint_dir(out_dir).glob(".step_*.old"):  # what a process killed while pruning left out of sight
        shutil.rmtree(left, ignore_errors=True)
    if keep_last <= 0:
        return
    for p in list_checkpoints(out_dir)[:-keep_last]:
        # renamed out of sight first: a reader listing the run meanwhile never meets a half-deleted checkpoint
        gone = p.with_name(f".{p.name}.old")
        try:
            os.replace(p, gone)
        except OSError:
            continue
        shutil.rmtree(gone, ignore_errors=True)


# --------------------------------------------------------------------------------------------------------------
# weights


def _dedup(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Store each shared tensor once: returns (tensors to save, {alias: stored name})."""
    seen: dict[tuple, str] = {}
    keep: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype, t.device)
        if t.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        keep[name] = t.detach().contiguous()
    return keep, aliases


def save_weights(state: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    tensors, aliases = _dedup(state)
    save_file({k: v.cpu() for k, v in tensors.items()}, str(path), metadata={"aliases": json.dumps(aliases), **(metadata or {})})


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """A full state dict from model.safetensors, aliases expanded."""
    from safetensors import safe_open

    try:
        state = load_file(str(path))
        with safe_open(str(path), framework="pt") as f:
            aliases = json.loads((f.metadata() or {}).get("aliases", "{}"))
    except FileNotFoundError:
        raise DamagedCheckpoint(f"{path} is missing") from None
    except Exception as e:  # safetensors' SafetensorError, a torn header (JSON), an OS error
        raise DamagedCheckpoint(f"{path} cannot be read as safetensors ({error_line(e)})") from None
    for alias, name in aliases.items():
        state[alias] = state[name]
    return state


def _torch_load(path: Path, map_location: str | torch.device = "cpu") -> Any:
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise DamagedCheckpoint(f"{path} is missing") from None
    except Exception as e:  # PytorchStreamReader errors on a torn zip, unpickling errors
        raise DamagedCheckpoint(f"{path} cannot be read ({error_line(e)})") from None


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Load a checkpoint's weights into `model` (strict). `path` is model.safetensors or its checkpoint folder."""
    path = Path(path)
    if path.is_dir():
        path = path / "model.safetensors"
    model.load_state_dict(read_weights(path), strict=True)


@dataclass
class WeightInit:
    """What `load_matching` did: the checkpoint folder read (and its step, None for a bare weights folder), and the
    names of the model's tensors it loaded, those it left as built (not in the checkpoint), and the checkpoint's
    tensors the model has no place for."""

    checkpoint: Path
    step: int | None
    loaded: list[str]
    initialised: list[str]
    dropped: list[str]

    def summary(self) -> str:
        """One line: the source and how many tensors were loaded, initialised and dropped, by module."""
        step = f" (step {self.step})" if self.step is not None else ""
        parts = [f"loaded {len(self.loaded)} tensors"]
        for what, names in (("newly initialised", self.initialised), ("dropped", self.dropped)):
            parts.append(f"{what} {len(names)}" + (f" ({', '.join(module_names(names))})" if names else ""))
        return f"weights from {self.checkpoint}{step}: " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint": str(self.checkpoint), "step": self.step, "loaded": self.loaded,
                "initialised": self.initialised, "dropped": self.dropped}


def module_names(names: list[str], limit: int = 8) -> list[str]:
    """Tensor names grouped by the module holding them, layer numbers folded: layers.2.cca.q.weight, layers.3.cca.out.weight
    -> layers.*.cca; at most `limit`, then how many more."""
    groups: list[str] = []
    for n in names:
        parts = re.sub(r"\.\d+(?=\.|$)", ".*", n).split(".")
        g = ".".join(parts[:3] if parts[0] == "layers" else parts[:1])
        if g not in groups:
            groups.append(g)
    return groups[:limit] + ([f"{len(groups) - limit} more"] if len(groups) > limit else [])


def load_matching(model: nn.Module, path: str | Path) -> WeightInit:
    """Load into `model` the tensors of a checkpoint (`resolve_checkpoint`: a run folder, a checkpoint folder or its
    model.safetensors) that it has under the same name with the same shape: a model started from another's weights,
    e.g. rpt-sem from an xl run (its retriever, chunk encoder, CCA and gate are not in xl: they keep their
    initialisation) or the same variant trained further. Only the weights are read, never the optimiser or RNG.

    A UserError when a name both hold has another shape in each (every such name listed, up to five: models of another
    width, vocabulary or head layout), or when no name matches (not a checkpoint of a model like this one)."""
    folder = resolve_checkpoint(path)
    source = read_weights(folder / "model.safetensors")
    own = model.state_dict()
    clash = [f"{k} {tuple(source[k].shape)} there, {tuple(own[k].shape)} here" for k in own
             if k in source and source[k].shape != own[k].shape]
    if clash:
        more = f"; and {len(clash) - 5} more" if len(clash) > 5 else ""
        n = f"{len(clash)} weights have" if len(clash) > 1 else "1 weight has"
        raise UserError(f"{folder}: {n} another shape than in this model: {'; '.join(clash[:5])}"
                        f"{more}. Start from a checkpoint of a model of the same width, vocabulary and heads")
    loaded = [k for k in own if k in source]
    if not loaded:
        raise UserError(f"{folder}: none of its {len(source)} weights ({', '.join(module_names(sorted(source), 4))}) is "
                        f"named as one of this model's ({', '.join(module_names(list(own), 4))}): not a checkpoint of a "
                        "model like this one")
    missing, unexpected = model.load_state_dict({k: source[k] for k in loaded}, strict=False)
    assert not unexpected, unexpected
    state = read_state(folder)
    return WeightInit(checkpoint=folder, step=int(state["step"]) if "step" in state else None, loaded=loaded,
                      initialised=list(missing), dropped=[k for k in source if k not in own])


# --------------------------------------------------------------------------------------------------------------
# RNG


def rng_state() -> dict[str, Any]:
    """This process's RNG states, in types that torch.load(weights_only=True) accepts."""
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), int(np_state[2]), int(np_state[3]),
                  float(np_state[4])),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_to_tuples(state["python"]))
    name, key, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, key.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _to_tuples(x: Any) -> Any:
    return tuple(_to_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


# --------------------------------------------------------------------------------------------------------------
# whole checkpoints


@dataclass
class Checkpoint:
    path: Path
    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    rng: list[dict[str, Any]]  # one per rank of the run that wrote it
    data: dict[str, Any]
    metrics: dict[str, Any]
    config: RPTConfig
    environments: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # where its updates ran (see above)


def save(out_dir: str | Path, step: int, model_state: dict[str, torch.Tensor], optimizer_state: dict[str, Any],
         cfg: RPTConfig, rng: list[dict[str, Any]], data: dict[str, Any], metrics: dict[str, Any] | None = None,
         keep_last: int = 0, environments: list[dict[str, Any]] | None = None) -> Path:
    """Write a checkpoint atomically (rank 0 only), then prune old ones. Returns the final folder.

    environments: where the updates up to `step` ran ([{"from_step", **rpt.utils.environment()}], oldest first)."""
    from rpt.version import __version__

    final = step_path(out_dir, step)
    tmp = final.with_name(f".{final.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    writing = tmp
    try:
        tmp.mkdir(parents=True)
        writing = tmp / "model.safetensors"
        save_weights(model_state, writing, metadata={"step": str(step)})
        writing = tmp / "optimizer.pt"
        torch.save(optimizer_state, writing)
        writing = tmp / "rng.pt"
        torch.save(rng, writing)
        writing = tmp / "config.yaml"
        cfg.to_yaml(writing)
        writing = tmp / "state.json"
        write_json_atomic(writing, {"step": step, "data": data, "world_size": len(rng), "metrics": metrics or {},
                                    "rpt_version": __version__, "environments": environments or [],
                                    "files": file_records(tmp)})
    except Exception as e:  # a full disk: OSError, or the writer's own error around it (safetensors, torch)
        shutil.rmtree(tmp, ignore_errors=True)  # a half-written folder would only take more space
        if not isinstance(e, (OSError, RuntimeError)) and "SafetensorError" not in type(e).__name__:
            raise
        good = latest(out_dir)
        intact = (f"the last complete checkpoint is step {int(_STEP_DIR.match(good.name).group(1))} ({good})"
                  if good is not None else "no checkpoint of this run was complete yet")
        raise write_failure(writing, e, intact) from None
    if final.exists():  # the same step saved again (a resumed run that re-reached it): replace it
        old = final.with_name(f".{final.name}.old")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    prune(out_dir, keep_last)
    return final


def load(path: str | Path, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Read a checkpoint folder written by `save`."""
    path = Path(path)
    if not (path / "state.json").exists():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no state.json)")
    verify(path)
    state = read_state(path)
    return Checkpoint(
        path=path,
        step=int(state["step"]),
        model=read_weights(path / "model.safetensors"),
        optimizer=_torch_load(path / "optimizer.pt", map_location),
        rng=_torch_load(path / "rng.pt"),
        data=state["data"],
        metrics=state.get("metrics", {}),
        config=RPTConfig.from_yaml(path / "config.yaml", recorded=True),
        environments=list(state.get("environments", [])),
    )


# ---------------------------------------------------------------------------------------------------------------
# loading a trained model (eval, generate, explore, scorer)


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint step folder from: the folder itself, its model.safetensors, or a run folder (its newest intact step).

    A folder named explicitly must be intact (DamagedCheckpoint otherwise: the user asked for that one); from a run
    folder a damaged newest checkpoint is skipped with a warning and the previous intact one is used."""
    p = Path(path)
    if p.is_file() and p.name == "model.safetensors":
        p = p.parent
    if (p / "model.safetensors").is_file() or (p / "state.json").is_file():
        verify(p, MODEL_FILES if (p / "state.json").is_file() else ("model.safetensors",))
        return p
    if p.is_dir() and (newest := latest_intact(p, MODEL_FILES)) is not None:
        return newest
    if not p.exists():
        raise UserError(f"no checkpoint at {path}: {missing_checkpoint(p)}")
    raise UserError(f"no checkpoint at {path}: expected a checkpoint folder holding model.safetensors, or a run folder "
                    "with checkpoints/step_*/")


def missing_checkpoint(path: str | Path) -> str:
    """Why `path` names no checkpoint, with the checkpoints that exist near it (a mistyped step, say)."""
    p = Path(path)
    for run in (p.parent.parent, p.parent):
        found = [c.name for c in list_checkpoints(run)] if run != p else []
        if found:
            shown = ", ".join(found[-5:])
            return (f"no such file or folder; the checkpoints of {run} are {shown} (its folder {run} reads the "
                    "newest)")
    return "no such file or folder"


def checkpoint_config(folder: Path) -> RPTConfig:
    for cand in (folder / "config.yaml", folder.parent.parent / "config.yaml"):
        if cand.is_file():
            return RPTConfig.from_yaml(cand, recorded=True)
    raise UserError(f"checkpoint {folder} has no config.yaml")


def load_model(path: str | Path, device: torch.device | str = "cpu",
               memory_tokens: int | None = None) -> tuple[torch.nn.Module, RPTConfig]:
    """(model in eval mode on `device`, its config) from a checkpoint (see `resolve_checkpoint`). Reads only the
    weights and the config, never the optimiser state. `memory_tokens` (memorizing only) builds the model with a kNN
    memory of that size instead of the trained one (no weight depends on it); the returned config stays the
    checkpoint's, so it still says what the model was trained with, and `model.cfg` holds the size used."""
    for attempt in range(_READ_TRIES):
        try:
            return _load_model(path, device, memory_tokens)
        except (FileNotFoundError, DamagedCheckpoint):
            # a run being trained rotates its checkpoints: the newest may be replaced while it is read; read the run
            # again (a checkpoint named explicitly is not retried: that one is what the caller asked for)
            if attempt == _READ_TRIES - 1 or not _is_run(path):
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


_READ_TRIES = 5


def _is_run(path: str | Path) -> bool:
    return checkpoint_dir(path).is_dir()


def _load_model(path: str | Path, device: torch.device | str,
                memory_tokens: int | None) -> tuple[torch.nn.Module, RPTConfig]:
    from rpt.model.registry import build_model

    folder = resolve_checkpoint(path)
    cfg = checkpoint_config(folder)
    mcfg = cfg.model
    if memory_tokens is not None:
        if mcfg.variant != "memorizing":
            raise UserError(f"memory_tokens is for the memorizing variant; checkpoint {folder} is {mcfg.variant}")
        mcfg = dataclasses.replace(mcfg, memorizing=dataclasses.replace(mcfg.memorizing, tokens=memory_tokens))
        mcfg.validate()
    model = build_model(mcfg)
    try:
        load_weights(model, folder)
    except RuntimeError as e:
        raise UserError(f"checkpoint {folder}: weights do not match its config.yaml: {str(e).splitlines()[0]}") from e
    return model.to(device).eval(), cfg


def checkpoint_tokenizer(path: str | Path, cfg: RPTConfig | None = None) -> dict[str, Any] | None:
    """The tokenizer identity ({name, hash, vocab_size}) a checkpoint was trained with, or None when it cannot tell.

    Looked up, in order: tokenizer.json in the checkpoint folder or its run folder, a "tokenizer" entry of state.json,
    then tokenizer.json of the token store the run trained on (config data.store), if that still exists.
    """
    from rpt.data.tokenizer import Tokenizer

    folder = resolve_checkpoint(path)
    for cand in (folder / "tokenizer.json", folder.parent.parent / "tokenizer.json"):
        if cand.is_file():
            return Tokenizer.from_file(cand).identity
    state = folder / "state.json"
    if state.is_file():
        tok = json.loads(state.read_text()).get("tokenizer")
        if isinstance(tok, dict) and tok.get("hash"):
            return tok
    if cfg is not None and (Path(cfg.data.store) / "tokenizer.json").is_file():
        return Tokenizer.from_file(Path(cfg.data.store) / "tokenizer.json").identity
    return None
