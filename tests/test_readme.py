"""README's pipeline commands run as written, in order, from a fresh folder.

The commands are read from README.md itself (the fenced blocks of "The pipeline, verb by verb"), so an example that
stops fitting the next one (labels of another span or segment, a prompt file that does not exist) fails here. Each runs
through `rpt.cli.main` with flags appended that only make it small (fewer documents, updates, tokens): appended flags
win in argparse, and none of them changes what the command means. Not run here, each covered elsewhere: `torchrun`
(8 GPUs), `rpt demo` (tests/test_demo.py), `rpt copytest` (tests/test_copytest.py), `rpt bench` (minutes of timing).
"""

import re
import shlex
from pathlib import Path

import pytest

from rpt.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
SMALL = {  # verb -> flags appended to make it quick
    "prepare": ["--max-documents", "3"],
    "label": ["--k", "4", "--no-progress"],
    "train": ["--steps", "2", "--no-progress"],
    "eval": ["--max-documents", "1", "--no-progress"],
    "generate": ["--max-new-tokens", "8"],
    "explore": [],
    "compare": [],
    "sweep": ["--steps", "2"],  # after its `--`: a train argument (the last --steps wins)
    "dpr": ["--steps", "2", "--batch-size", "4", "--max-documents", "2", "--heldout", "2", "--no-progress"],
    "export": [],
}
ELSEWHERE = {"demo", "copytest", "bench"}


def pipeline_commands() -> list[str]:
    text = README.read_text()
    section = text[text.index("## The pipeline, verb by verb"):text.index("## Using the model from Python")]
    commands = []
    for block in re.findall(r"```\n(.*?)```", section, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #", 1)[0].strip()
            if line.startswith(("rpt ", "torchrun ")) and not re.match(r"rpt \w+ {2,}", line):  # not the verb list
                commands.append(line)
    return commands


def test_the_pipeline_section_has_every_verb():
    verbs = {shlex.split(c)[1] for c in pipeline_commands() if c.startswith("rpt ")}
    assert set(SMALL) | ELSEWHERE <= verbs


def test_readme_pipeline_commands_run_in_order(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    ran = []
    for line in pipeline_commands():
        argv = shlex.split(line)
        if argv[0] == "torchrun" or argv[1] in ELSEWHERE:
            continue
        verb = argv[1]
        extra = ["--max-documents", "1"] if verb == "label" and "test" in argv else []  # eval and explore read doc 0
        if "--candidates" in argv:  # exhaustive gold scores every (query, earlier chunk) pair: a few queries do here
            extra += ["--query-fraction", "0.02"]
        if verb == "sweep":  # its own flags go before `--` (after it, SMALL's are train arguments); the test split
            extra = ["--max-documents", "1", "--seeds", "0"]  # is labelled for its first document only (above)
            i = argv.index("--")
            argv = [*argv[:i], *extra, *argv[i:]]
            extra = []
        code = main([*argv[1:], *SMALL[verb], *extra])
        out = capsys.readouterr()
        assert code == 0, f"README command failed (exit {code}): {line}\n{out.err[-2000:]}"
        ran.append(verb)
    assert ran.count("label") == 4 and ran.count("train") == 3 and {"prepare", "eval", "generate", "explore"} <= set(ran)
    assert (tmp_path / "explore.html").is_file() and (tmp_path / "sem.json").is_file()


@pytest.mark.parametrize("line", [c for c in pipeline_commands() if c.startswith("rpt ")])
def test_every_readme_command_parses(line):
    """Even the commands not run above name only flags their verb has."""
    from rpt.cli import build_parser

    build_parser().parse_args(shlex.split(line)[1:])
