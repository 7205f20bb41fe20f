"""Arguments several verbs share, each in one form: `--device`, `--set` and `--config`.

Not a verb: `rpt.cli` lists the modules of this package that define `run`.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

DEVICE_FORM = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
SECTIONS = ("model", "data", "train", "eval")
CONFIG_HELP = ("a run or checkpoint folder (its recorded config.yaml), a YAML config file, or the name of a config "
               "shipped in rpt/configs (e.g. cpu-code, paper-250m-code)")


def device_arg(value: str) -> str:
    if not DEVICE_FORM.match(value):
        raise argparse.ArgumentTypeError(f"{value!r}: auto, cpu, cuda or cuda:N")
    return value


def add_device(p: argparse.ArgumentParser, what: str = "") -> None:
    p.add_argument("--device", type=device_arg, default="auto",
                   help=f"{what + ' ' if what else ''}device: auto | cpu | cuda | cuda:N (default auto: cuda when "
                   "available)")


def add_set(p: argparse.ArgumentParser, sections: tuple[str, ...] = SECTIONS, example: str = "train.tau_max=4") -> None:
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help=f"any config field ({', '.join(s + '.*' for s in sections)}), value in YAML, repeatable: e.g. "
                   f"--set {example} --set model.cca_layers=[2,3]")


def parse_sets(items: list[str], sections: tuple[str, ...] = SECTIONS) -> dict[str, Any]:
    """`--set SECTION.KEY=VALUE` items -> {"section.key": value} (values parsed as YAML); the fields themselves are
    checked when the config is built."""
    from rpt.utils import UserError, load_yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        section, dot, field = key.partition(".")
        if not sep or not dot or not field or section not in sections:
            raise UserError(f"--set {item}: expected SECTION.KEY=VALUE with SECTION one of {', '.join(sections)} "
                            f"(e.g. {sections[0]}.{'cca_layers=[2,3]' if sections[0] == 'model' else 'lr=0.01'})")
        out[key] = load_yaml(value, f"--set {item}")
    return out


def add_config(p: argparse.ArgumentParser, reads: str) -> None:
    p.add_argument("--config", help=f"{CONFIG_HELP}: {reads}")


def config_of(args: argparse.Namespace):
    """The RPTConfig named by --config, or None without one."""
    from rpt.config import ConfigError, load_config
    from rpt.utils import UserError

    if not getattr(args, "config", None):
        return None
    try:
        return load_config(args.config, "--config")
    except ConfigError as e:
        raise UserError(str(e)) from None


def agree(flag: str, given: Any, key: str, from_config: Any) -> Any:
    """The value of an option that a --config also sets: the config's when the flag is absent, the flag's when they
    agree, and an error when they differ (labels and retrievers must match the model they serve)."""
    from rpt.utils import UserError

    if given is None or from_config is None:
        return from_config if given is None else given
    if str(given) != str(from_config):
        raise UserError(f"{flag} {given} differs from the config's {key}={from_config} (--config); drop one of them")
    return given
