"""The Python API (rpt.api): a light `import rpt`, forward(labels=) against a hand computation, RPT refusing the
baselines' variants, errors that name the Python argument (and the CLI's flag), and the example script."""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import rpt
from rpt.config import RPTConfig
from rpt.utils import ArgumentError, argument_error, cli_message

ROOT = Path(__file__).resolve().parents[1]


def _tiny(variant: str):
    mcfg = dataclasses.replace(RPTConfig.from_preset("tiny", variant=variant, vocab_size=97).model, segment_len=32,
                               chunk_size=16)
    mcfg.validate()
    return mcfg


def test_import_rpt_is_light():
    code = ("import sys, rpt; rpt.RPTConfig; heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')]; "
            "assert not heavy, sorted(heavy)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_api_names_resolve():
    import inspect
    import types

    from rpt import api, decoding, model

    assert rpt.load is api.load and rpt.evaluate is api.evaluate and rpt.label is api.label
    assert rpt.generate is api.generate and rpt.train is api.train  # plain functions, not modules made callable
    assert isinstance(rpt.generate, types.FunctionType) and isinstance(rpt.train, types.FunctionType)
    assert "max_new_tokens" in inspect.signature(rpt.generate).parameters
    assert "allow_changes" in inspect.signature(rpt.train).parameters
    import rpt.training.loop as loop

    assert loop.train is not None and decoding.generate is not None and rpt.build_model is model.registry.build_model
    with pytest.raises(AttributeError):
        rpt.no_such_name  # noqa: B018


@pytest.mark.parametrize("variant", ["xl", "rpt-sem", "griffin"])
def test_forward_labels_loss_is_mean_next_token_cross_entropy(variant):
    model = rpt.build_model(_tiny(variant), seed=0).eval()
    x = torch.randint(0, 97, (2, 80))
    with torch.no_grad():
        out = model(x, labels=x)
        logp = torch.log_softmax(out.logits.double(), -1)
        hand = -sum(logp[b, t, x[b, t + 1]] for b in range(2) for t in range(79)) / (2 * 79)
        assert out.loss.shape == () and out.loss.item() == pytest.approx(hand.item(), rel=1e-5)
        # -100 is not scored; the chunked loss (no logits) gives the same mean
        labels = x.clone()
        labels[:, 40:] = -100
        masked = model(x, labels=labels).loss
        hand = -sum(logp[b, t, x[b, t + 1]] for b in range(2) for t in range(39)) / (2 * 39)
        assert masked.item() == pytest.approx(hand.item(), rel=1e-5)
        chunked = model(x, labels=labels, loss_chunk=16)
        assert chunked.logits is None and chunked.loss.item() == pytest.approx(masked.item(), rel=1e-5)
        assert model(x).loss is None
    with pytest.raises(ValueError, match="labels: shape"):
        model(x, labels=x[:, :10])


def test_forward_loss_is_the_training_loss():
    from rpt.training.losses import lm_loss

    model = rpt.build_model(_tiny("rpt-sem"), seed=0).eval()
    x = torch.randint(0, 97, (1, 64))
    with torch.no_grad():
        out = model(x, labels=x)
        ref = F.cross_entropy(out.logits[0, :-1], x[0, 1:])
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-6) == pytest.approx(lm_loss(out.logits, x).mean().item())


@pytest.mark.parametrize("variant", ["griffin", "memorizing", "block-recurrent"])
def test_rpt_class_refuses_the_baselines(variant):
    cfg = _tiny(variant)
    with pytest.raises(ValueError, match=rf"variant '{variant}'.*rpt.build_model"):
        rpt.RPT(cfg)
    assert type(rpt.build_model(cfg, seed=0)).__name__ != "RPT"


def test_argument_error_names_the_argument_or_the_flag():
    e = argument_error("n_neighbors", 9, "must be at most 8; see {labels} and {force=True}", ValueError)
    assert isinstance(e, ValueError) and isinstance(e, ArgumentError)
    assert str(e) == "n_neighbors=9: must be at most 8; see labels=... and force=True"
    assert cli_message(e, {"n_neighbors": "--neighbors"}) == "--neighbors 9: must be at most 8; see --labels and --force"
    assert cli_message(ValueError("plain")) == "plain"


def test_python_callers_see_argument_names(tmp_path, capsys):
    with pytest.raises(ArgumentError, match=r"^path='[^']*nope': no such file or folder"):
        rpt.load(tmp_path / "nope")
    from rpt.api import load_model
    from rpt.hf.export import export

    with pytest.raises(ArgumentError, match=r"^checkpoint='[^']*nope': no such file"):
        load_model(tmp_path / "nope")
    with pytest.raises(ArgumentError, match=r"^path='[^']*nope': no such file"):
        export(tmp_path / "nope", tmp_path / "out")
    # the CLI says its flags for the same errors
    from rpt.cli import main

    assert main(["export", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert f"RUN_OR_CHECKPOINT {tmp_path / 'nope'}: no such file" in capsys.readouterr().err
    assert main(["generate", "--checkpoint", str(tmp_path / "nope"), "--prompt", "x", "--device", "cpu"]) == 2
    assert f"--checkpoint {tmp_path / 'nope'}: no such file" in capsys.readouterr().err


def test_generate_arguments_are_checked_by_name():
    model = rpt.build_model(_tiny("xl"), seed=0)
    with pytest.raises(ArgumentError, match=r"^temperature=-1\.0: must be"):
        rpt.generate(model, "x", temperature=-1.0)
    with pytest.raises(ArgumentError, match=r"^tokenizer: cannot find the tokenizer"):
        rpt.generate(model, "x")
    with pytest.raises(ArgumentError, match=r"^d_model_typo: not a config field"):
        rpt.api.config_key("d_model_typo")
    assert rpt.api.config_key("d_model") == "model.d_model" and rpt.api.config_key("steps") == "train.steps"


def test_generate_stops_at_the_end_of_text_token(tmp_path):
    from rpt.data.tokenizer import Tokenizer

    tok = Tokenizer.train_bpe(["alpha beta gamma delta " * 30], 300, cache_dir=tmp_path)
    assert tok.eos_id is not None and tok.vocab_size <= 300
    model = rpt.build_model(dataclasses.replace(_tiny("xl"), vocab_size=300), seed=0)
    text = rpt.generate(model, "alpha beta", max_new_tokens=5, stop_at_eos=True, tokenizer=tok, greedy=True)
    assert isinstance(text, str)


def test_label_is_a_function_of_the_api(tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "train"))
    from train_helpers import make_store

    from rpt.labels.store import LabelStore

    make_store(tmp_path / "store" / "train", [160, 192, 112])
    path = rpt.label(tmp_path / "store", "train", kind="lex", span=64, segment_len=16, k=2)
    assert path == tmp_path / "store" / "labels" / "train-lex-64"
    assert LabelStore.open(path).manifest["k"] == 2
    with pytest.raises(ArgumentError, match=r"^scorer: needed with kind sem"):
        rpt.label(tmp_path / "store", kind="sem", span=64, segment_len=16)
    with pytest.raises(TypeError, match=r"^k='2': expected int"):
        rpt.label(tmp_path / "store", k="2")


def test_any_variant_is_built_by_name():
    for variant in ("xl", "rpt-sem", "griffin", "memorizing", "block-recurrent"):
        model = rpt.build_model("tiny", variant=variant, vocab_size=97, seed=0)
        assert model.cfg.variant == variant


# Modules that drive the CLI's own workflows (they build command lines, or parse a verb's flags) and may name flags:
# every module of lab/, and these; rpt/config.py resolves the CLI's --config / --preset values.
CLI_DRIVERS = {"rpt/config.py", "rpt/cli.py"}
FLAG = re.compile(r"(?<![\w-])--[a-z]")


def _raise_messages(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and node.exc is not None:
            text = " ".join(c.value for c in ast.walk(node.exc) if isinstance(c, ast.Constant) and isinstance(c.value, str))
            yield node.lineno, re.sub(r"`[^`]*`|\([^()]*\brpt \w+ --[^()]*\)", "", text)  # quoted commands may name flags


def test_library_raise_sites_name_no_flags():
    """Every raise in the library (not rpt/commands, not the CLI drivers) names arguments, not --flags; a command
    to run, in backticks or as "(rpt <verb> --flag)", may."""
    bad = []
    for path in sorted((ROOT / "rpt").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("rpt/commands/", "lab/")) or rel in CLI_DRIVERS:
            continue
        bad += [f"{rel}:{line}: {text[:100]}" for line, text in _raise_messages(path) if FLAG.search(text)]
    assert not bad, "raise sites naming CLI flags:\n" + "\n".join(bad)


def test_example_runs(tmp_path, monkeypatch, capsys):
    """examples/python_api.py run as a script (`__main__`, its work folder as argument), in this process: a fresh
    process would only add torch's import (a fresh `import rpt`: tests/test_hf.py)."""
    import runpy

    monkeypatch.setenv("RPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [str(ROOT / "examples" / "python_api.py"), str(tmp_path / "work")])
    runpy.run_path(sys.argv[0], run_name="__main__")
    out = capsys.readouterr().out
    assert "perplexity" in out and "transformers:" in out
