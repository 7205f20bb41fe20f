"""`rpt <verb>`: each verb is a module in rpt/commands that parses its arguments and calls one library function."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from dataclasses import dataclass

from rpt.utils import UserError
from rpt.version import __version__

DESCRIPTION = ("Retrieval-Pretrained Transformer: prepare, label, train, evaluate and generate with a long-document LM "
               "that retrieves from itself.")


@dataclass(frozen=True)
class Program:
    """A command with verbs: `prog <verb> ...`, one module per verb in the package `commands` (each defines HELP, ORDER,
    add_arguments(parser) and run(args) -> int; the CLI discovers them). The experiments of lab/ are a second one."""

    prog: str
    commands: str
    description: str


RPT = Program("rpt", "rpt.commands", DESCRIPTION)


def _verbs(program: Program = RPT) -> list:
    package = importlib.import_module(program.commands)
    mods = [importlib.import_module(f"{program.commands}.{m.name}") for m in pkgutil.iter_modules(package.__path__)]
    return sorted((m for m in mods if hasattr(m, "run")), key=lambda m: (getattr(m, "ORDER", 100), m.__name__))


def verb_name(mod) -> str:
    return mod.__name__.rsplit(".", 1)[1]


def build_parser(program: Program = RPT) -> argparse.ArgumentParser:
    """`prog` and its verbs, each with its own --help."""
    import shutil
    import textwrap

    width = max(shutil.get_terminal_size().columns - 2, 40)  # argparse's own width
    parser = argparse.ArgumentParser(prog=program.prog, description=textwrap.fill(program.description, width),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"rpt {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="<verb>", title="verbs",
                                description=f"`{program.prog} <verb> --help` lists a verb's options")
    for mod in _verbs(program):
        p = sub.add_parser(verb_name(mod), description=mod.HELP, help=mod.HELP)
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


def command_line(argv: list[str], prog: str = "rpt") -> str:
    """`prog <argv>` as a shell line, quoted where needed."""
    import shlex

    return f"{prog} " + " ".join(shlex.quote(a) for a in argv)


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


def main(argv: list[str] | None = None, program: Program = RPT) -> int:
    import rpt.utils
    from rpt.config import ConfigError

    _one_line_warnings()
    parser = build_parser(program)
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
        print(f"{program.prog} {args.verb}: error: {rpt.utils.cli_message(e, flags)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        said = str(e) or getattr(sys.modules.get(args._run.__module__), "INTERRUPTED", "")
        print(f"{program.prog} {args.verb}: interrupted" + (f": {said}" if said else ""), file=sys.stderr)
        return 130
    except BrokenPipeError:  # `rpt ... | head`: the reader is gone; nothing more to say
        _quiet_stdout()
        return 0


if __name__ == "__main__":
    sys.exit(main())
