"""The verbs of `python -m lab`: one module per verb (HELP, ORDER, add_arguments, run), as in rpt/commands."""
