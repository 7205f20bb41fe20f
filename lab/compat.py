"""Reading results that earlier versions of rpt recorded (docs/data/*.json, old run folders): fields renamed since,
and fields whose default changed since (a run recorded before such a field existed ran with its former default)."""

from __future__ import annotations

from typing import Any

from rpt.config import ConfigError

# Fields whose default changed: a config recorded before the field existed ran with the former default
FORMER_DEFAULTS = {"model.cca_qk_init": "random", "model.cca_ov_init": "random", "model.cca_qk_match_std": 0.1}

# fields under another name in configs written by earlier versions of rpt: old dotted key -> current one
RENAMED = {"train.neighbour_lr_scale": "train.neighbor_lr_scale"}


def with_current_names(config: dict[str, Any]) -> dict[str, Any]:
    """A config (nested dict) with each field of RENAMED under its current name (both given: an error)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in config.items()}
    for old, new in RENAMED.items():
        (section, name), (_, current) = old.split("."), new.split(".")
        part = out.get(section)
        if isinstance(part, dict) and name in part:
            if current in part:
                raise ConfigError(f"{old} and {new} are one field (its former and current name): give {new} only")
            part[current] = part.pop(name)
    return out


def with_former_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """A recorded config (nested dict) with each field of FORMER_DEFAULTS it lacks set to that former default, and
    each renamed field under its current name."""
    out = with_current_names(config)
    for key, value in FORMER_DEFAULTS.items():
        section, name = key.split(".")
        if isinstance(out.get(section), dict):
            out[section].setdefault(name, value)
    return out
