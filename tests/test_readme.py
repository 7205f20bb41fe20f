"""The documented commands run as written, in order, from a fresh folder: README.md's quickstart on a JSONL corpus,
and docs/cli.md's worked example of every verb.

The commands are read from the files themselves (their bare fenced blocks), so an example that stops fitting the next
one (labels of another span or segment, a prompt file that does not exist) fails here. Each runs
through `rpt.cli.main` with flags appended that only make it small (fewer documents, updates, tokens): appended flags
win in argparse, and none of them changes what the command means. docs/cli.md's `--corpus stdlib` reads a few short
modules of the same standard library (`stdlib:<names>`): every later command reads test document 0, and
the full library's (enum, 38k tokens) would make this test take minutes. Not run here, each covered elsewhere: `torchrun`
(8 GPUs), `python -m lab demo` (tests/lab/test_demo.py), `python -m lab copytest` (tests/lab/test_copytest.py), `python -m lab
bench` (minutes of timing).
"""

import re
import shlex
from pathlib import Path

import pytest
from cli_parsers import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CLI = ROOT / "docs" / "cli.md"
SMALL = {  # verb -> flags appended to make it quick
    "configs": [],
    "prepare": ["--max-documents", "3"],
    "label": ["--k", "2", "--no-progress"],
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
# docs/cli.md's stdlib as a few short modules: two train, three validation, three test (split_of fixes each one's split)
SHORT_STDLIB = "stdlib:__future__,_compat_pickle,_py_abc,_sitebuiltins,_weakrefset,fnmatch,hmac,sched"


def commands_in(section: str) -> list[str]:
    """The command lines of a page's code blocks; an experiment's `python -m lab <verb> ...` as `lab <verb> ...`."""
    commands = []
    for block in re.findall(r"```\n(.*?)```", section, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #", 1)[0].strip()
            line = "lab " + line[len("python -m lab "):] if line.startswith("python -m lab ") else line
            if line.startswith(("rpt ", "lab ", "torchrun ")) and not re.match(r"(rpt|lab) \w+ {2,}", line):
                commands.append(line)  # not the verb list
    return commands


def pipeline_commands() -> list[str]:
    """docs/cli.md's commands, every verb."""
    return commands_in(CLI.read_text())


def quickstart_commands() -> list[str]:
    text = README.read_text()
    return commands_in(text[text.index("## Quickstart"):text.index("## Python API")])


def write_corpus(path: Path) -> None:
    """A corpus.jsonl of long documents (the standard library's own source), with every split the quickstart reads."""
    import json
    import os

    names = ["decoder.py", "encoder.py", "scanner.py", "__init__.py", "tool.py"]
    folder = Path(json.__file__).parent
    splits = ["train", "train", "train", "validation", "test"]
    with open(path, "w") as f:
        for name, split in zip(names, splits, strict=True):
            text = (folder / name).read_text() + "\n" + (Path(os.__file__)).read_text()[:20000]
            f.write(json.dumps({"id": name, "split": split, "text": text}) + "\n")


def test_readme_quickstart_runs_in_order(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_corpus(tmp_path / "corpus.jsonl")
    (tmp_path / "prompt.txt").write_text(Path(shlex.__file__).read_text()[:4000])  # a long passage: retrieval shows
    lines = quickstart_commands()
    verbs = [shlex.split(c)[1] for c in lines]
    assert verbs == ["prepare", "label", "train", "eval", "generate"], verbs
    for line in lines:
        argv = shlex.split(line)
        code = main([*argv[1:], *SMALL[argv[1]]])
        out = capsys.readouterr()
        assert code == 0, f"README command failed (exit {code}): {line}\n{out.err[-2000:]}"
    assert (tmp_path / "mine.json").is_file()


def test_every_readme_command_is_tested():
    """Every `rpt` command in README.md is the quickstart's (run above) or the demo (tests/lab/test_demo.py)."""
    text = README.read_text()
    allowed = set(quickstart_commands()) | {"lab demo"}
    found = {c for c in commands_in(text)}
    assert found <= allowed, found - allowed


def test_the_pipeline_section_has_every_verb():
    verbs = {shlex.split(c)[1] for c in pipeline_commands() if c.startswith(("rpt ", "lab "))}
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
        if verb == "prepare":
            assert argv[argv.index("--corpus") + 1] == "stdlib", line
            extra = ["--corpus", SHORT_STDLIB]
        if verb == "sweep":  # its own flags go before `--` (after it, SMALL's are train arguments); the test split
            extra = ["--max-documents", "1", "--seeds", "0"]  # is labelled for its first document only (above)
            extra += ["--dry-run"]  # its plan: every run and evaluation it would make (tests/lab/test_sweep.py runs them)
            i = argv.index("--")
            argv = [*argv[:i], *extra, *argv[i:]]
            extra = []
        code = main([*argv[1:], *SMALL[verb], *extra])
        out = capsys.readouterr()
        assert code == 0, f"docs/cli.md command failed (exit {code}): {line}\n{out.err[-2000:]}"
        ran.append(verb)
    assert ran.count("label") == 4 and ran.count("train") == 3 and {"prepare", "eval", "generate", "explore"} <= set(ran)
    assert (tmp_path / "explore.html").is_file() and (tmp_path / "sem.json").is_file()


@pytest.mark.parametrize("line", [c for c in pipeline_commands() + quickstart_commands()
                                  if c.startswith(("rpt ", "lab "))])
def test_every_readme_command_parses(line):
    """Even the commands not run above name only flags their verb has."""
    build_parser().parse_args(shlex.split(line)[1:])


def test_readme_python_example_runs_as_written(tmp_path, monkeypatch):
    """The README's Python API block, run as written in a folder holding `my_docs/` (a few long text files); as with
    the commands above, only its size is made small: rpt.train gets the block's arguments with steps=2."""
    import json

    import rpt

    train = rpt.train
    monkeypatch.setattr(rpt, "train", lambda *args, **kw: train(*args, **{**kw, "steps": 2}))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_docs").mkdir()
    folder = Path(json.__file__).parent
    for name in ("decoder.py", "encoder.py", "scanner.py", "__init__.py", "tool.py", "../os.py", "../ast.py"):
        (tmp_path / "my_docs" / f"{Path(name).stem}.txt").write_text((folder / name).read_text())
    text = README.read_text()
    section = text[text.index("## Python API"):text.index("## Results")]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    exec(compile(code, "README.md (Python API)", "exec"), {"__name__": "readme"})
    assert (tmp_path / "runs" / "mine" / "config.yaml").is_file() and (tmp_path / "exported" / "mine").is_dir()
