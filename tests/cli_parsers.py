"""One entry for the commands the scripts print: `rpt` verbs and the experiments' verbs (`python -m lab`), parsed or
run by the program each belongs to. The scripts' dry runs record both under one stand-in (RPT and LAB set to it)."""

from __future__ import annotations

import argparse

from lab.cli import LAB
from lab.cli import main as lab_main
from rpt.cli import _verbs, verb_name
from rpt.cli import build_parser as rpt_parser
from rpt.cli import main as rpt_main

LAB_VERBS = {verb_name(m) for m in _verbs(LAB)}


class _Both:
    def __init__(self) -> None:
        self.rpt, self.lab = rpt_parser(), rpt_parser(LAB)

    def parse_args(self, argv: list[str]) -> argparse.Namespace:
        return (self.lab if argv and argv[0] in LAB_VERBS else self.rpt).parse_args(argv)


def build_parser() -> _Both:
    return _Both()


def main(argv: list[str]) -> int:
    return (lab_main if argv and argv[0] in LAB_VERBS else rpt_main)(argv)
