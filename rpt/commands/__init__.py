"""One module per `rpt` verb. Each defines HELP (one line), ORDER (position in `rpt --help`), `add_arguments(parser)`
and `run(args) -> int`. The CLI discovers them, so a verb exists exactly when its module does. The experiments are
verbs of their own program, `python -m lab` (lab/commands/, beside the library)."""
