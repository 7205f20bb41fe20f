"""`rpt <verb>`: each verb is a module in rpt/commands that parses its arguments and calls one library function."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import rpt.commands
from rpt.utils import UserError

DESCRIPTION = ("Retrieval-Pretrained Transformer: prepare, label, train, evaluate and generate with a long-document LM "
               "that retrieves from itself.")
DEVELOP_TITLE = "experiments that check and measure the code (rpt/experiments/)"


def _verbs() -> list:
    mods = [importlib.import_module(f"rpt.commands.{m.name}") for m in pkgutil.iter_modules(rpt.commands.__path__)]
    return sorted((m for m in mods if hasattr(m, "run")), key=lambda m: (getattr(m, "ORDER", 100), m.__name__))


def verb_name(mod) -> str:
    return mod.__name__.rsplit(".", 1)[1]


def is_develop(mod) -> bool:
    """A verb listed apart in `rpt --help` (GROUP = "develop"): an experiment, not a step of the pipeline."""
    return getattr(mod, "GROUP", "use") == "develop"


def _listing(mods: list, name_width: int, width: int) -> str:
    """Verbs and their HELP as argparse lists subcommands: four spaces, the name padded to `name_width` + 2, the help
    wrapped beside it."""
    import textwrap

    column = 4 + name_width + 2
    lines = []
    for m in mods:
        text = textwrap.wrap(m.HELP, max(width - column, 20))
        lines.append(f"    {verb_name(m):<{column - 4}}{text[0]}")
        lines += [" " * column + line for line in text[1:]]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """`rpt`: the pipeline's verbs in the usual list; the experiments (GROUP = "develop") in a list of their own
    after it, so a user sees the verbs of the pipeline first. Every verb parses and has --help alike."""
    import shutil
    import textwrap

    verbs = _verbs()
    width = max(shutil.get_terminal_size().columns - 2, 40)  # argparse's own width
    develop = [m for m in verbs if is_develop(m)]
    name_width = max(len(verb_name(m)) for m in verbs)  # one column for both lists
    epilog = f"{DEVELOP_TITLE}:\n{_listing(develop, name_width, width)}" if develop else None
    # the description is wrapped here: the raw formatter keeps the epilog's columns as they are
    parser = argparse.ArgumentParser(prog="rpt", description=textwrap.fill(DESCRIPTION, width), epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"rpt {rpt.__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="<verb>", title="the pipeline",
                                description="`rpt <verb> --help` lists a verb's options" + (
                                    "; the experiments follow below" if develop else ""))
    for mod in verbs:
        name = verb_name(mod)
        # an experiment gets no help= here: argparse then leaves it out of the pipeline's list (the epilog lists it)
        extra = {} if is_develop(mod) else {"help": mod.HELP}
        p = sub.add_parser(name, description=mod.HELP, **extra)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def _one_line_warnings() -> None:
    """Our own warnings (rpt.utils.RPTWarning) print as `rpt: warning: ...`, without the source line of the warn call."""
    import warnings

    from rpt.utils import RPTWarning

    plain = warnings.formatwarning
    if getattr(plain, "_rpt", False):
        return

    def fmt(message, category, filename, lineno, line=None):
        if issubclass(category, RPTWarning):
            return f"rpt: warning: {message}\n"
        return plain(message, category, filename, lineno, line)

    fmt._rpt = True  # type: ignore[attr-defined]
    warnings.formatwarning = fmt


def command_line(argv: list[str]) -> str:
    """`rpt <argv>` as a shell line, quoted where needed."""
    import shlex

    return "rpt " + " ".join(shlex.quote(a) for a in argv)


def run_verb(argv: list[str], log: list[str] | None = None) -> int:
    """Run `rpt <argv>` in this process, printing the command first (and appending it to `log`); returns the exit
    code. Ctrl-C inside the verb stops the caller too."""
    line = command_line(argv)
    print(f"\n$ {line}", flush=True)
    if log is not None:
        log.append(line)
    code = main(argv)
    if code == 130:
        raise KeyboardInterrupt
    return code


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush to a closed pipe raises nothing."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    import rpt.utils
    from rpt.config import ConfigError

    _one_line_warnings()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return 2
    try:
        if (getattr(args, "threads", None) or 0) < 0:  # every verb with --threads; 0 or absent = torch's choice
            raise UserError(f"--threads must be a number of CPU threads (0: torch's choice), not {args.threads}")
        code = int(args._run(args) or 0)
        sys.stdout.flush()  # here, where a closed pipe can still be told apart
        return code
    except (UserError, ConfigError, rpt.utils.MissingDependency, FileNotFoundError, ValueError) as e:
        # ValueError/FileNotFoundError from our own checks carry messages naming the file or argument; an
        # ArgumentError names the verb's flag (its module's FLAGS: argument -> flag where they differ)
        flags = getattr(sys.modules.get(args._run.__module__), "FLAGS", None)
        print(f"rpt {args.verb}: error: {rpt.utils.cli_message(e, flags)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        said = str(e) or getattr(sys.modules.get(args._run.__module__), "INTERRUPTED", "")
        print(f"rpt {args.verb}: interrupted" + (f": {said}" if said else ""), file=sys.stderr)
        return 130
    except BrokenPipeError:  # `rpt ... | head`: the reader is gone; nothing more to say
        _quiet_stdout()
        return 0


if __name__ == "__main__":
    sys.exit(main())
