"""One module per `rpt` verb. Each defines HELP (one line), ORDER (position in `rpt --help`),
`add_arguments(parser)` and `run(args) -> int`; GROUP = "develop" lists it apart, among the experiments that check
and measure the code (rpt/experiments/), after the verbs of the pipeline. The CLI discovers them, so a verb exists
exactly when its module does."""
