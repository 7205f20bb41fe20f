"""`rpt train` end to end on a tiny store, its config composition and its answers to bad input."""

import argparse
import json

import pytest
import yaml
from train_helpers import make_labels, write_label_store

from rpt import checkpoint as ck
from rpt.cli import build_parser, main
from rpt.commands.train import config_from_args

SMALL = ["--set", "model.chunk_size=8", "--set", "model.segment_len=16", "--seq-len", "64",
         "--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.mlp_hidden=64", "--set", "train.log_every=1",
         "--no-progress"]


def parse(*argv) -> argparse.Namespace:
    return build_parser().parse_args(["train", *argv])


def test_flags_and_set_override_the_preset(corpus):
    args = parse("--preset", "tiny", "--variant", "xl", "--store", str(corpus["root"]), "--steps", "7", "--lr", "1e-3",
                 "--set", "train.tau_max=4", "--set", "model.cca_layers=[3]", "--out", "runs/x")
    cfg = config_from_args(args)
    assert cfg.model.variant == "xl" and cfg.train.steps == 7 and cfg.train.lr == 1e-3 and cfg.train.tau_max == 4.0
    assert cfg.model.cca_layers == [3] and cfg.train.out_dir == "runs/x" and cfg.data.store == str(corpus["root"])
    assert cfg.model.vocab_size == 64  # a preset takes the store's vocabulary
    assert cfg.model.d_model == 64  # the rest is the tiny preset


def test_config_file_with_overrides(corpus, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"preset": "tiny", "model": {"vocab_size": 100}, "train": {"steps": 3}}))
    cfg = config_from_args(parse("--config", str(path), "--steps", "5", "--batch-size", "4"))
    assert cfg.train.steps == 5 and cfg.train.batch_size == 4 and cfg.model.vocab_size == 100


def test_end_to_end_train_then_resume(corpus, capsys):
    out = corpus["tmp"] / "cli-run"
    base = ["train", "--preset", "tiny", "--variant", "rpt-sem", "--store", str(corpus["root"]), "--labels",
            str(corpus["labels"]), "--out", str(out), *SMALL]
    assert main([*base, "--steps", "4", "--stop-after", "2"]) == 0
    assert "to step 2" in capsys.readouterr().out
    assert ck.latest(out).name == "step_00000002"
    assert main([*base, "--steps", "4"]) == 0  # resumes
    printed = capsys.readouterr().out
    assert "trained rpt-sem to step 4" in printed and "lm loss" in printed
    log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4]
    assert ck.load(ck.latest(out)).config.model.variant == "rpt-sem"
    assert (out / "config.yaml").exists()


@pytest.mark.parametrize("extra, message", [
    (["--variant", "rpt-sem"], "needs retrieval labels"),
    (["--variant", "xl", "--set", "steps=3"], "SECTION.KEY=VALUE"),
    (["--variant", "xl", "--set", "train.nope=3"], "unknown config key"),
    (["--variant", "xl", "--store", "/nonexistent/store"], "no token store"),
])
def test_bad_input_is_one_clear_line(corpus, capsys, extra, message):
    argv = ["train", "--preset", "tiny", "--store", str(corpus["root"]), "--out", str(corpus["tmp"] / "r"), *SMALL, *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("rpt train: error:") and "Traceback" not in err


def test_mismatched_labels_exit_2(corpus, capsys):
    labels = make_labels(corpus["lengths"], 64, 8, 16, span="doc")
    path = write_label_store(corpus["tmp"] / "doc-labels", labels)
    argv = ["train", "--preset", "tiny", "--variant", "rpt-lex", "--store", str(corpus["root"]), "--labels", str(path),
            "--out", str(corpus["tmp"] / "r"), *SMALL]
    assert main(argv) == 2
    assert "span" in capsys.readouterr().err
