"""`rpt --help`: the pipeline's verbs first, in the usual list; the experiments (GROUP = "develop") in a list of
their own after it; every verb, either kind, parses and has its own --help."""

from __future__ import annotations

import pytest

from rpt.cli import _verbs, build_parser, is_develop, main, verb_name

PIPELINE = ["configs", "prepare", "label", "train", "eval", "sweep", "compare", "dpr", "generate", "explore", "export"]
DEVELOP = ["demo", "copytest", "bench"]


def _help(capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def _entries(text: str) -> list[tuple[str, int]]:
    """(verb, column of its help) of each line that starts an entry of a list: four spaces, then a name."""
    out = []
    for line in text.splitlines():
        if line.startswith("    ") and line[4] != " ":
            name = line.split()[0]
            out.append((name, len(line) - len(line[4 + len(name):].lstrip())))
    return out


def _listed(text: str) -> list[str]:
    return [name for name, _ in _entries(text)]


def test_the_verbs_and_their_groups():
    verbs = _verbs()
    assert [verb_name(m) for m in verbs if not is_develop(m)] == PIPELINE
    assert [verb_name(m) for m in verbs if is_develop(m)] == DEVELOP


def test_help_lists_the_pipeline_first_and_the_experiments_apart(capsys, monkeypatch):
    text = _help(capsys, monkeypatch)
    pipeline, _, develop = text.partition("experiments that check and measure the code (rpt/experiments/):")
    assert develop, text
    assert _listed(pipeline.partition("<verb>\n")[2]) == PIPELINE
    assert _listed(develop) == DEVELOP
    flat = "".join(text.split())  # wrapping may break a line at a space or after a hyphen
    for m in _verbs():
        assert verb_name(m) + "".join(m.HELP.split()) in flat


def test_the_columns_of_both_lists_line_up(capsys, monkeypatch):
    text = _help(capsys, monkeypatch)
    assert len({column for _, column in _entries(text)}) == 1, text


@pytest.mark.parametrize("verb", PIPELINE + DEVELOP)
def test_every_verb_has_its_own_help(verb, capsys):
    with pytest.raises(SystemExit) as e:
        main([verb, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: rpt {verb} ")


def test_an_experiment_parses_like_any_verb():
    args = build_parser().parse_args(["bench", "--kernels", "--seq-len", "256"])
    assert args.verb == "bench" and args.kernels and args.seq_len == 256


def test_no_verb_prints_the_help(capsys):
    assert main([]) == 2
    assert "experiments that check and measure the code" in capsys.readouterr().out
