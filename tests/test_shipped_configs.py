"""The configs shipped in rpt/configs (presets and named configs) and the options every verb shares in one form:
`--config` (a run, a file or a shipped name), `--set SECTION.KEY=VALUE`, `--device auto|cpu|cuda|cuda:N`."""

from __future__ import annotations

import argparse
import json

import pytest
import yaml
from cli_parsers import main

from lab.cli import LAB
from rpt.cli import build_parser
from rpt.config import CONFIG_DIR, PRESETS, SIZE_NAMES, ConfigError, RPTConfig, load_config, shipped_configs

SYNTHETIC = "synthetic:copy-far?docs=6&eval_docs=2&passages=8&passage=64&distance=2-4"


def one_error(capsys, *argv) -> str:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    return err[0]


def test_every_shipped_file_is_a_preset_or_a_config_and_loads():
    files = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
    assert set(SIZE_NAMES) <= set(files) and set(files) == set(SIZE_NAMES) | set(shipped_configs())
    for name in PRESETS:  # sizes and their -paper forms
        cfg = RPTConfig.from_preset(name)
        assert cfg.model.n_layers > 0
    for name in shipped_configs():
        cfg = load_config(name)
        assert cfg.data.seq_len % cfg.model.segment_len == 0
        assert "preset" in yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())


def test_presets_keep_their_shapes():
    """The figures in docs/ were measured with these; a preset that changes shape changes every result."""
    shapes = {n: (c.model.d_model, c.model.n_layers, c.model.segment_len, c.data.seq_len, c.data.tokenizer)
              for n in SIZE_NAMES for c in [RPTConfig.from_preset(n)]}
    assert shapes == {"tiny": (64, 4, 128, 1024, "bpe:2048"), "small": (512, 8, 512, 4096, "bpe:16384"),
                      "70m": (512, 6, 1024, 16384, "EleutherAI/gpt-neox-20b"),
                      "250m": (1024, 12, 1024, 16384, "EleutherAI/gpt-neox-20b"),
                      "1b": (2048, 16, 1024, 16384, "EleutherAI/gpt-neox-20b")}
    assert RPTConfig.from_preset("tiny").train.loss_chunk == 0


@pytest.mark.parametrize("domain,tau", [("code", 2), ("pg19", 4), ("arxiv", 8), ("books3", 128)])
def test_paper_configs_hold_appendix_a(domain, tau):
    cfg = load_config(f"paper-250m-{domain}")
    t = cfg.train
    assert (cfg.model.variant, cfg.model.d_model, cfg.model.n_layers, cfg.model.cca.qk_init) == ("rpt-sem", 1024, 12,
                                                                                                  "random")
    assert t.tau_max == tau and t.lr == 5e-3 and t.optimizer == "adabelief" and t.grad_clip == 1.0
    assert t.steps == 500_000 and t.weight_decay == 1e-8 and t.min_lr_ratio == 0.1 and t.ss_fraction == 0.9
    # the authors' code's retrieval-loss weight, not the printed 1e-9 (tests/train/test_shipped_training_settings.py)
    assert (t.alpha_ret, t.alpha_ramp_steps, t.betas, t.warmup_steps) == (0.1, 12_500, [0.9, 0.99], 2000)
    assert cfg.data.seq_len * t.batch_size * t.grad_accum == 2**17  # the paper's tokens per update on one device
    assert cfg.model.dropout == 0.05


def test_config_names_a_file_a_run_or_a_shipped_config(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_00000010").mkdir(parents=True)
    RPTConfig.from_preset("tiny", variant="rpt-lex").to_yaml(run / "config.yaml")
    assert load_config(run).model.variant == "rpt-lex"
    assert load_config(run / "checkpoints" / "step_00000010").model.variant == "rpt-lex"
    assert load_config(run / "config.yaml").model.variant == "rpt-lex"
    with pytest.raises(ConfigError, match="shipped: cpu-code"):
        load_config("no-such-config", "--config")
    with pytest.raises(ConfigError, match="without config.yaml"):
        load_config(tmp_path, "--config")


def test_print_config_resolves_a_shipped_config_with_flags_and_sets(capsys):
    assert main(["train", "--config", "cpu-code", "--variant", "rpt-lex", "--set", "train.tau_max=4",
                 "--vocab-size", "300", "--print-config"]) == 0
    printed = RPTConfig.from_yaml(capsys.readouterr().out)
    assert printed.model.variant == "rpt-lex" and printed.train.tau_max == 4 and printed.data.seq_len == 2048
    assert printed.model.vocab_size == 300 and printed.train.lr == 0.01


def test_print_config_needs_no_store(capsys):
    """The README's `rpt train --config paper-250m-code --print-config` runs before any data exists."""
    assert main(["train", "--config", "paper-250m-code", "--print-config"]) == 0
    printed = RPTConfig.from_yaml(capsys.readouterr().out)
    assert printed.train.tau_max == 2 and printed.data.store == "data/code"


@pytest.mark.parametrize("argv", [["train", "--preset", "tiny", "--set", "lr=0.1"],
                                  ["train", "--preset", "tiny", "--set", "optim.lr=0.1"],
                                  ["bench", "--scale", "--set", "attn_dropout=0"],
                                  ["copytest", "--set", "train.lr=0.1"]])
def test_one_set_grammar(capsys, argv):
    assert "SECTION.KEY=VALUE" in one_error(capsys, *argv)


def _device_verbs() -> dict[str, argparse.ArgumentParser]:
    found = {}
    for parser in (build_parser(), build_parser(LAB)):
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        found.update({n: p for n, p in sub.choices.items() if any("--device" in a.option_strings for a in p._actions)})
    return found


def test_every_device_option_takes_the_same_forms():
    verbs = _device_verbs()
    assert {"train", "eval", "label", "dpr", "generate", "explore", "bench"} <= set(verbs)
    for name, p in verbs.items():
        (act,) = [a for a in p._actions if "--device" in a.option_strings]
        assert act.default == "auto" and act.choices is None, name
        for good in ("auto", "cpu", "cuda", "cuda:1"):
            assert act.type(good) == good
        for bad in ("gpu", "cuda:", "cuda:x", "CPU"):
            with pytest.raises(argparse.ArgumentTypeError):
                act.type(bad)


def test_a_cuda_device_without_a_gpu_is_one_line(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    err = one_error(capsys, "train", "--preset", "tiny", "--vocab-size", "300", "--device", "cuda:0", "--steps", "1",
                    "--out", "/nonexistent/never-written")
    assert "--device cuda:0" in err and "no CUDA device" in err


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("cfgstore") / "store"
    assert main(["prepare", "--corpus", SYNTHETIC, "--tokenizer", "corpus", "--out", str(root), "--no-progress"]) == 0
    return root


def _config(tmp_path, store, seq_len=512, segment_len=64):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({"preset": "tiny", "model": {"segment_len": segment_len},
                                    "data": {"store": str(store), "seq_len": seq_len},
                                    "eval": {"split": "validation", "n_neighbors": 3}}))
    return path


def test_label_takes_segment_span_and_store_from_the_config(tmp_path, store, capsys):
    cfg = _config(tmp_path, store)
    out = tmp_path / "lex"
    assert main(["label", "--config", str(cfg), "--kind", "lex", "--k", "4", "--out", str(out), "--no-progress"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert (m["span"], m["segment_len"]) == (512, 64)
    err = one_error(capsys, "label", "--config", cfg, "--kind", "lex", "--segment-len", 128, "--out", tmp_path / "x")
    assert "--segment-len 128" in err and "model.segment_len=64" in err
    err = one_error(capsys, "label", "--config", cfg, "--kind", "lex", "--span", 1024, "--out", tmp_path / "x")
    assert "--span 1024" in err and "data.seq_len=512" in err
    # evaluation labels of another split take any span
    assert main(["label", "--config", str(cfg), "--split", "test", "--kind", "lex", "--span", "doc", "--k", "4",
                 "--out", str(tmp_path / "doc"), "--no-progress"]) == 0
    assert json.loads((tmp_path / "doc" / "manifest.json").read_text())["span"] == "doc"


def test_dpr_refuses_a_segment_length_its_config_contradicts(tmp_path, store, capsys):
    err = one_error(capsys, "dpr", "--config", _config(tmp_path, store), "--segment-len", 128, "--out", tmp_path / "d")
    assert "model.segment_len=64" in err and not (tmp_path / "d").exists()


def test_eval_config_section_gives_the_defaults_and_flags_win(tmp_path, store):
    from rpt.commands.eval import apply_eval_config

    p = build_parser()
    args = p.parse_args(["eval", "--checkpoint", "x", "--config", str(_config(tmp_path, store))])
    apply_eval_config(args)
    assert (args.split, args.neighbors, args.source, args.memory, args.store) == ("validation", 3, None, "auto",
                                                                                   str(store))
    args = p.parse_args(["eval", "--checkpoint", "x", "--config", str(_config(tmp_path, store)), "--neighbors", "4",
                         "--source", "none", "--store", "elsewhere"])
    apply_eval_config(args)
    assert (args.split, args.neighbors, args.source, args.store) == ("validation", 4, "none", "elsewhere")
    args = p.parse_args(["eval", "--checkpoint", "x", "--store", "s"])
    settings = apply_eval_config(args)  # no config: EvalConfig's defaults
    assert (args.split, args.neighbors, args.source, args.max_documents) == ("test", 2, None, 0)
    assert settings.oracle == "top-k"
    settings = apply_eval_config(p.parse_args(["eval", "--checkpoint", "x", "--store", "s", "--oracle", "positives"]))
    assert settings.oracle == "positives"


def test_a_field_under_its_former_name_is_named_by_the_library_and_read_by_the_lab(tmp_path):
    """One spelling in public names (neighbor): the library names an old key as unknown; the lab, reading results that
    earlier versions recorded, takes it under its current name (lab.compat)."""
    import yaml

    from lab.compat import with_current_names

    old = tmp_path / "old.yaml"
    old.write_text("preset: tiny\ntrain:\n  neighbour_lr_scale: 3\n")
    with pytest.raises(ConfigError, match="unknown config key.*train.neighbour_lr_scale"):
        RPTConfig.from_yaml(old)
    doc = with_current_names(yaml.safe_load(old.read_text()))
    assert RPTConfig.from_yaml(yaml.safe_dump(doc)).train.neighbor_lr_scale == 3
    with pytest.raises(ConfigError, match="give train.neighbor_lr_scale only"):
        with_current_names({"train": {"neighbour_lr_scale": 3, "neighbor_lr_scale": 2}})


def test_one_device_resolver_serves_library_and_cli():
    """rpt.utils.resolve_device: the scorer, the DPR trainer and every verb resolve --device / device= through it."""
    import torch

    from rpt.labels import scorer
    from rpt.retrievers import dpr
    from rpt.utils import ArgumentError, resolve_device

    assert scorer.resolve_device is resolve_device and dpr.resolve_device is resolve_device
    assert resolve_device(torch.device("cpu")) == torch.device("cpu") == resolve_device("cpu")
    with pytest.raises(ArgumentError, match=r"device='gpu': auto, cpu, cuda or cuda:N"):
        resolve_device("gpu")
    if not torch.cuda.is_available():
        assert resolve_device("auto") == resolve_device(None) == torch.device("cpu")
        with pytest.raises(ArgumentError, match=r"device='cuda:1': torch sees no CUDA device here"):
            resolve_device("cuda:1")
