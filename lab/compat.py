"""Reading results that earlier versions of rpt recorded (docs/data/*.json, old run folders): fields renamed or moved
since, and fields whose default changed since (a run recorded before such a field existed ran with its former default)."""

from __future__ import annotations

from typing import Any

from rpt.config import MOVED, ConfigError, upgrade_config

# Fields whose default changed: a config recorded before the field existed ran with the former default
FORMER_DEFAULTS = {"model.cca.qk_init": "random", "model.cca.ov_init": "random", "model.cca.qk_match_std": 0.1}

# fields under another name in configs written by earlier versions of rpt: old dotted key -> current one; the flat
# model keys that moved into nested sections (model.cca_rel_bias -> model.cca.rel_bias, rpt.config.MOVED) are read by
# rpt.config.upgrade_config
RENAMED = {"train.neighbour_lr_scale": "train.neighbor_lr_scale", **MOVED}


def with_current_names(config: dict[str, Any]) -> dict[str, Any]:
    """A config (nested dict) with each field of RENAMED under its current name (both given: an error; the former
    data.chunk_size, which had to equal model.chunk_size, is dropped)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in config.items()}
    for old, new in RENAMED.items():
        if old in MOVED:
            continue
        (section, name), (_, current) = old.split("."), new.split(".")
        part = out.get(section)
        if isinstance(part, dict) and name in part:
            if current in part:
                raise ConfigError(f"{old} and {new} are one field (its former and current name): give {new} only")
            part[current] = part.pop(name)
    return upgrade_config(out)


def with_former_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """A recorded config (nested dict) with each field of FORMER_DEFAULTS it lacks set to that former default, and
    each renamed field under its current name."""
    out = with_current_names(config)
    for key, value in FORMER_DEFAULTS.items():
        section, *path, name = key.split(".")
        part = out.get(section)
        if not isinstance(part, dict):
            continue
        for step in path:
            part = part.setdefault(step, {})
        part.setdefault(name, value)
    return out
