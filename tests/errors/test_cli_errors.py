"""Bad command lines and input files of eval, generate, explore, train, demo and copytest: each is refused
before any work, in one line `rpt <verb>: error: ...` naming the flag or file, with exit code 2 and no file written;
numbers in config files and --set are read in any common notation; every option has help text."""

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "eval"))
from cli_parsers import LAB_VERBS, main  # noqa: E402
from eval_helpers import M, make_model, make_root, save_checkpoint, tiny_config, word_tokenizer  # noqa: E402

from lab.cli import LAB  # noqa: E402
from rpt.cli import build_parser  # noqa: E402
from rpt.config import MAX_NEIGHBORS, ConfigError, RPTConfig  # noqa: E402

LENGTHS = [26 * M + 3, 18 * M]
PROMPT = " ".join(f"w{i % 60 + 1}" for i in range(40))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny store (tokenizer beside it) and an rpt-sem checkpoint trained with the same tokenizer."""
    tmp = tmp_path_factory.mktemp("cli-errors")
    tok = word_tokenizer()
    root = make_root(tmp / "store", LENGTHS, tokenizer=tok)
    ckpt = save_checkpoint(tmp / "run", make_model("rpt-sem"), tiny_config("rpt-sem"), tokenizer=tok)
    return {"root": root, "ckpt": ckpt, "tok": tok}


def base_args(verb: str, s: dict, tmp: Path) -> list:
    """A command line of `verb` that works on the tiny setup (writing under tmp/out)."""
    if verb == "eval":
        return ["--checkpoint", s["ckpt"], "--store", s["root"], "--max-documents", 1, "--out", tmp / "out" / "r.json",
                "--no-progress"]
    if verb == "generate":
        return ["--checkpoint", s["ckpt"], "--prompt", PROMPT, "--max-new-tokens", 2, "--json", tmp / "out.json"]
    return ["--checkpoint", s["ckpt"], "--store", s["root"], "--doc", 0, "--out", tmp / "out" / "x.html"]


def fails(capsys, verb: str, *args, says: tuple = ()) -> str:
    """Run `rpt verb args`: exit 2 and exactly one line on stderr, `rpt verb: error: ...`, holding every string of
    `says`. Returns that line."""
    code = main([verb, *map(str, args)])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog(verb)} {verb}: error: "), err
    for text in says:
        assert str(text) in lines[0]
    return lines[0]


def written(tmp: Path) -> list[Path]:
    return [p for p in tmp.rglob("*") if p.is_file()]


# ------------------------------------------------------------------------------------------------------------------
# 1. K at inference: one range for eval, generate and explore


@pytest.mark.parametrize("verb, k", [("eval", 1000), ("eval", MAX_NEIGHBORS + 1), ("generate", 1000), ("generate", 0),
                                     ("explore", 0), ("explore", 1000)])
def test_neighbors_outside_the_documented_range(setup, tmp_path, capsys, verb, k):
    fails(capsys, verb, *base_args(verb, setup, tmp_path), "--neighbors", k,
          says=("--neighbors", ">= 1", f"<= {MAX_NEIGHBORS}", f"not {k}"))
    assert written(tmp_path) == []


def test_neighbors_help_states_the_range_and_its_top_is_accepted(setup, tmp_path, capsys):
    sub = _verbs()
    for verb in ("eval", "generate", "explore"):
        (action,) = [a for a in sub[verb]._actions if "--neighbors" in a.option_strings]
        assert f"1..{MAX_NEIGHBORS}" in action.help, verb
    assert main(["generate", *map(str, base_args("generate", setup, tmp_path)), "--neighbors", str(MAX_NEIGHBORS)]) == 0
    capsys.readouterr()


# ------------------------------------------------------------------------------------------------------------------
# 2. sampling numbers of generate


@pytest.mark.parametrize("flag, value", [("--temperature", "nan"), ("--temperature", "inf"), ("--temperature", "-1"),
                                         ("--top-p", "nan"), ("--top-p", "1.5"), ("--top-k", "-1"),
                                         ("--max-new-tokens", "-1"), ("--retrieve-k", "0")])
def test_generate_sampling_numbers(setup, tmp_path, capsys, flag, value):
    fails(capsys, "generate", *base_args("generate", setup, tmp_path), flag, value, says=(f"{flag} {value}",))
    assert written(tmp_path) == []


# ------------------------------------------------------------------------------------------------------------------
# 3. explore --chunks that select no query chunk


@pytest.mark.parametrize("spec", ["50:10", "5:5", "-1:3", "25:", "30:40"])
def test_explore_chunks_selecting_nothing(setup, tmp_path, capsys, spec):
    # document 0 has 26 chunks: query chunks 0..24 (the last chunk is only a target)
    fails(capsys, "explore", *base_args("explore", setup, tmp_path), f"--chunks={spec}", says=(f"--chunks {spec!r}",))
    assert written(tmp_path) == []


# ------------------------------------------------------------------------------------------------------------------
# 4. text files that are not UTF-8


@pytest.mark.parametrize("verb, flag", [("generate", "--prompt-file"), ("explore", "--text")])
def test_non_utf8_text_file_is_named(setup, tmp_path, capsys, verb, flag):
    path = tmp_path / "latin1.txt"
    path.write_bytes(" ".join(["w1 w2 w3"] * 40).encode() + b" caf\xe9 w4\n")
    args = ["--checkpoint", setup["ckpt"], flag, path]
    args += ["--out", tmp_path / "x.html"] if verb == "explore" else []
    fails(capsys, verb, *args, says=(f"{flag} {path}", "UTF-8"))
    assert written(tmp_path) == [path]


# ------------------------------------------------------------------------------------------------------------------
# 5. eval --baseline / --compare files that are not result JSONs


@pytest.fixture(scope="module")
def plain_result(setup, tmp_path_factory):
    """A real result of `rpt eval`, made without --per-chunk."""
    out = tmp_path_factory.mktemp("result") / "plain.json"
    assert main(["eval", "--checkpoint", str(setup["ckpt"]), "--store", str(setup["root"]), "--max-documents", "1",
                 "--source", "none", "--out", str(out), "--no-progress"]) == 0
    return out


@pytest.mark.parametrize("flag", ["--baseline", "--compare"])
@pytest.mark.parametrize("content, says", [(b"{not json", "not a JSON file"), (b"\xff\xfe{}", "not a JSON file"),
                                           (b'{"a": 1}', "not a result of `rpt eval`"),
                                           (b"[1, 2]", "not a result of `rpt eval`")])
def test_eval_result_files_are_checked_first(setup, tmp_path, capsys, flag, content, says):
    path = tmp_path / "other.json"
    path.write_bytes(content)
    fails(capsys, "eval", *base_args("eval", setup, tmp_path), flag, path, says=(f"{flag} {path}", says))
    assert written(tmp_path) == [path]


def test_eval_baseline_without_per_chunk_data(setup, plain_result, tmp_path, capsys):
    fails(capsys, "eval", *base_args("eval", setup, tmp_path), "--baseline", plain_result,
          says=(f"--baseline {plain_result}", "--per-chunk"))
    assert written(tmp_path) == []


def test_eval_plots_without_matplotlib_fail_before_evaluating(setup, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    fails(capsys, "eval", *base_args("eval", setup, tmp_path), "--plots", tmp_path / "plots",
          says=("matplotlib", "--plots", "pip install matplotlib"))
    assert written(tmp_path) == []


# ------------------------------------------------------------------------------------------------------------------
# 6. a tokenizer other than the run's


@pytest.mark.parametrize("verb", ["generate", "explore"])
def test_other_tokenizer_is_refused_unless_allowed(setup, tmp_path, capsys, verb):
    other = word_tokenizer(tag="x")
    path = other.save(tmp_path / "other.json")
    text = tmp_path / "doc.txt"
    text.write_text(" ".join(f"x{i % 60 + 1}" for i in range(300)))
    args = ["--checkpoint", setup["ckpt"], "--tokenizer", path]
    args += ["--prompt", "x1 x2 x3", "--max-new-tokens", 2] if verb == "generate" else ["--text", text, "--out",
                                                                                          tmp_path / "x.html"]
    fails(capsys, verb, *args, says=(other.hash[:12], setup["tok"].hash[:12], "--allow-other-tokenizer"))
    assert main([verb, *map(str, args), "--allow-other-tokenizer"]) == 0
    capsys.readouterr()
    bigger = word_tokenizer(n=100, tag="x")
    bigger.save(path)
    fails(capsys, verb, *args, "--allow-other-tokenizer", says=("has 100 ids", "vocabulary is 64"))


# ------------------------------------------------------------------------------------------------------------------
# 7. numbers in config files and --set


def test_config_numbers_in_any_notation(tmp_path, capsys):
    from rpt.commands.train import config_from_args

    def config(*argv):
        return config_from_args(build_parser().parse_args(["train", *argv]))

    cfg = config("--preset", "tiny", "--set", "model.vocab_size=64", "--set", "train.lr=2e-3", "--set",
                 "train.min_lr_ratio=1E-1", "--set", "train.steps=1e4", "--set", "train.warmup_steps=1_000", "--set",
                 "train.betas=[9e-1, 0.95]", "--set", "model.rope_base=1e4")
    t = cfg.train
    assert (t.lr, t.min_lr_ratio, t.steps, t.warmup_steps, t.betas) == (2e-3, 0.1, 10_000, 1000, [0.9, 0.95])
    assert type(t.steps) is int and type(t.lr) is float and cfg.model.rope_base == 10_000.0
    path = tmp_path / "c.yaml"
    path.write_text("preset: tiny\nmodel:\n  vocab_size: 64\ntrain:\n  lr: 1e-4\n  steps: 2.0e3\n  grad_clip: 5E-1\n")
    cfg = config("--config", str(path))
    assert (cfg.train.lr, cfg.train.steps, cfg.train.grad_clip) == (1e-4, 2000, 0.5)
    assert RPTConfig.from_yaml("train:\n  lr: '3e-3'\n").train.lr == 3e-3
    for text, says in [("train:\n  lr: fast\n", "train.lr must be a number, got str 'fast'"),
                       ("train:\n  lr: nan\n", "train.lr must be a number"),
                       ("train:\n  steps: 1.55e1\n", "train.steps must be int, got float 15.5"),
                       ("model:\n  n_layers: 2.5\n", "model.n_layers must be int")]:
        with pytest.raises(ConfigError, match=says):
            RPTConfig.from_yaml(text)
    fails(capsys, "train", "--preset", "tiny", "--set", "model.vocab_size=64", "--set", "train.lr=2e-3x", "--out",
          tmp_path / "run", says=("train.lr must be a number, got str '2e-3x'",))
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------------------------------------
# 8. the demo's optional packages, checked before any work


def test_demo_lists_missing_optional_packages_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    out = tmp_path / "demo"
    line = fails(capsys, "demo", "--out", out, "--steps", 1, "--near-steps", 1, "--seeds", 0, "--no-progress",
                 says=("matplotlib", "pip install matplotlib"))
    assert "faiss" not in line  # explore falls back to the torch memory
    assert not out.exists()


def test_copytest_checks_set_fields_before_any_work(tmp_path, capsys):
    out = tmp_path / "copy"
    fails(capsys, "copytest", "--out", out, "--steps", 1, "--set", "model.cca_rel_bias_scal=2", "--no-progress",
          says=("model.cca_rel_bias_scal",))
    fails(capsys, "copytest", "--out", out, "--steps", 1, "--set", "cca_rel_bias=false", "--no-progress",
          says=("--set cca_rel_bias=false", "SECTION.KEY=VALUE", "model"))  # the one --set grammar of every verb
    assert not out.exists()


# ------------------------------------------------------------------------------------------------------------------
# 9. help text


def prog(verb: str) -> str:
    return LAB.prog if verb in LAB_VERBS else "rpt"


def _verbs() -> dict[str, argparse.ArgumentParser]:
    found = {}
    for parser in (build_parser(), build_parser(LAB)):
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        found.update(sub.choices)
    return found


def test_every_option_of_every_verb_has_help():
    verbs = _verbs()
    assert {"prepare", "label", "train", "eval", "generate", "explore", "demo", "copytest", "bench"} <= set(verbs)
    missing = [f"{verb} {a.option_strings[0] if a.option_strings else a.dest}" for verb, p in verbs.items()
               for a in p._actions
               if not isinstance(a, argparse._HelpAction) and (not (a.help or "").strip() or a.help == argparse.SUPPRESS)]
    assert missing == []
    (max_docs,) = [a for a in verbs["eval"]._actions if "--max-documents" in a.option_strings]
    assert "0: all" in max_docs.help


@pytest.mark.parametrize("verb", ["train", "eval", "generate", "explore", "bench", "demo", "copytest"])
def test_negative_threads_are_refused_by_every_verb(verb, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    required = {"train": ["--preset", "tiny"], "eval": ["--checkpoint", "x", "--store", "y"],
                "generate": ["--checkpoint", "x", "--prompt", "p"], "explore": ["--checkpoint", "x", "--store", "y"],
                "bench": [], "demo": [], "copytest": []}
    assert main([verb, *required[verb], "--threads", "-1"]) == 2
    err = capsys.readouterr().err
    assert err == f"{prog(verb)} {verb}: error: --threads must be a number of CPU threads (0: torch's choice), not -1\n"
    assert not any(tmp_path.iterdir())
