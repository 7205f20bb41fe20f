"""`python -m lab <verb>`: the experiments, as verbs (one module per verb in lab/commands/), run from a checkout of
the repository. They drive the library (and `rpt`'s own verbs) to produce and check the documented figures."""

from __future__ import annotations

import sys

from rpt.cli import Program
from rpt.cli import main as run_program

LAB = Program("python -m lab", "lab.commands",
              "The experiments behind rpt's documented figures: the demo, the copy test, sweeps over variants and seeds, "
              "tables in the paper's form, benchmarks. Run from a checkout of the repository.")


def main(argv: list[str] | None = None) -> int:
    return run_program(argv, LAB)


if __name__ == "__main__":
    sys.exit(main())
