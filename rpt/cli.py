"""`rpt <verb>`: each verb is a module in rpt/commands that parses its arguments and calls one library function."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import rpt.commands
from rpt.utils import UserError  # noqa: F401  (re-exported: verbs raise rpt.cli.UserError)


def _verbs() -> list:
    mods = [importlib.import_module(f"rpt.commands.{m.name}") for m in pkgutil.iter_modules(rpt.commands.__path__)]
    return sorted((m for m in mods if hasattr(m, "run")), key=lambda m: (getattr(m, "ORDER", 100), m.__name__))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rpt", description="Retrieval-Pretrained Transformer: prepare, label, train, "
                                     "evaluate and generate with a long-document LM that retrieves from itself.")
    parser.add_argument("--version", action="version", version=f"rpt {rpt.__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="<verb>")
    for mod in _verbs():
        name = mod.__name__.rsplit(".", 1)[1]
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
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
        return int(args._run(args) or 0)
    except (UserError, ConfigError, rpt.utils.MissingDependency, FileNotFoundError, ValueError) as e:
        # ValueError/FileNotFoundError from our own checks carry messages naming the file or argument; an
        # ArgumentError names the verb's flag (its module's FLAGS: argument -> flag where they differ)
        flags = getattr(sys.modules.get(args._run.__module__), "FLAGS", None)
        print(f"rpt {args.verb}: error: {rpt.utils.cli_message(e, flags)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"rpt {args.verb}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
