"""`rpt configs`: the presets and the configs shipped with rpt, each with what it is; `rpt configs NAME` prints one."""

from __future__ import annotations

import argparse
import re

HELP = "list the presets and shipped configs (what each is for); `rpt configs NAME` prints one as YAML"
ORDER = 5


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help="a preset or shipped config to print (YAML, with its comments)")


def _summary(path) -> str:
    """The first sentence of a config file's header comment."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").strip())
    text = " ".join(lines)
    end = re.search(r"(?<!App)(?<!e\.g)(?<!i\.e)\.(\s|$)", text)  # a sentence's end, not an abbreviation's
    text = text[: end.start() + 1] if end else text
    return text if len(text) <= 110 else text[:107] + "..."


def run(args: argparse.Namespace) -> int:
    from rpt.config import CONFIG_DIR, SIZE_NAMES, shipped_configs
    from rpt.utils import UserError

    names = [*SIZE_NAMES, *shipped_configs()]
    if args.name:
        if args.name not in names:
            raise UserError(f"NAME {args.name}: not a preset or shipped config (one of {', '.join(names)})")
        print((CONFIG_DIR / f"{args.name}.yaml").read_text(), end="")
        return 0
    width = max(len(n) for n in names)
    print("presets (rpt train --preset NAME):")
    for n in SIZE_NAMES:
        print(f"  {n:<{width}}  {_summary(CONFIG_DIR / f'{n}.yaml')}")
    print("configs (rpt train --config NAME; rpt label --config NAME labels for one):")
    for n in shipped_configs():
        print(f"  {n:<{width}}  {_summary(CONFIG_DIR / f'{n}.yaml')}")
    return 0
