"""`python -m lab compare`: the paper's comparison tables (Tables 2-4 layout) from `rpt eval` results, over seeds
(lab/compare.py)."""

from __future__ import annotations

import argparse

HELP = "tabulate `rpt eval` results like the paper's Tables 2-4: every setting over its seeds (mean ± sd), retrieval " \
       "gain, oracle, retrieval metrics, the paper's figure beside it"
ORDER = 45


def add_arguments(p: argparse.ArgumentParser) -> None:
    from lab.compare import DOMAINS

    p.add_argument("results", nargs="+", metavar="RESULT", help="`rpt eval` result JSONs, or folders searched for them")
    p.add_argument("--paper", choices=DOMAINS, help="add the paper's figures for this dataset (Code for a code corpus)")
    p.add_argument("--step", type=_step, help="only the results of checkpoints at this step, or `final`: each run's "
                   "last (its train.steps; puts xl with 1.5x the updates beside the rest); default: every step, one row each")
    p.add_argument("--against", metavar="TEXT", help="an ablation table: pair every setting with the one whose label "
                   "contains TEXT (e.g. ss_schedule=anneal), per seed, with a 95%% interval over runs and documents")
    p.add_argument("--out", help="also write the table as JSON here")
    p.add_argument("--markdown", help="also write the Markdown tables here")


def _step(text: str) -> int | str:
    if text == "final":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a step number or `final`") from None


def run(args: argparse.Namespace) -> int:
    from lab.compare import compare, load_results, to_markdown
    from rpt.outputs import claim_file
    from rpt.utils import write_json_atomic, write_text_atomic

    for arg in ("out", "markdown"):  # before any work: never over a file of the user's, nor a result being read
        if getattr(args, arg):
            claim_file(getattr(args, arg), "compare", arg=arg, inputs={"results": list(args.results)})
    table = compare(load_results(args.results), args.paper, args.step, args.against)
    text = to_markdown(table)
    print(text)
    if args.out:
        write_json_atomic(args.out, table, "compare")
    if args.markdown:
        write_text_atomic(args.markdown, "<!-- written by rpt (python -m lab compare) -->\n" + text + "\n")
    return 0
