"""train.init_from (rpt train --init-from): a new run starts from another run's weights, those whose name and shape
match (rpt.checkpoint.load_matching); never its optimiser, step or RNG; a resumed run ignores it."""

import copy
import json

import pytest
import torch
import yaml
from train_helpers import tiny_config

from rpt import checkpoint as ck
from rpt.cli import main
from rpt.model.registry import build_model
from rpt.training.loop import train
from rpt.utils import UserError


class Recorder:
    """A model factory that keeps the weights the model has at its first forward pass (step 0, after init_from)."""

    def __init__(self) -> None:
        self.state: dict[str, torch.Tensor] | None = None

    def __call__(self, mcfg):
        model = build_model(mcfg)

        def first(module, args):
            if self.state is None:
                self.state = copy.deepcopy(module.state_dict())

        model.register_forward_pre_hook(first)
        return model


def _source(corpus, variant="xl", name="src", **train_fields):
    cfg = tiny_config(corpus["tmp"] / name, variant, steps=2, **train_fields)
    train(cfg, corpus["root"], corpus["labels"] if variant != "xl" else None, progress=False, memory_check=False)
    return corpus["tmp"] / name / "run"


def _logits(model, ids):
    model.eval()
    with torch.no_grad():
        return model(ids).logits


def test_same_variant_reproduces_the_source_at_step_0(corpus):
    src = _source(corpus, "xl")
    rec = Recorder()
    cfg = tiny_config(corpus["tmp"] / "b", "xl", steps=2, seed=7, init_from=str(src))
    result = train(cfg, corpus["root"], None, progress=False, memory_check=False, model_factory=rec)
    source_model, source_cfg = ck.load_model(src)
    started = build_model(cfg.model, seed=0)
    started.load_state_dict(rec.state)
    ids = torch.randint(0, 64, (2, 64), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_logits(started, ids), _logits(source_model, ids), rtol=0, atol=0)
    assert result.init is not None and result.init.checkpoint == ck.latest(src) and result.init.step == 2
    assert result.init.initialised == [] and result.init.dropped == []
    assert result.step == 2  # not the source's step: a new run
    assert ck.load(ck.latest(result.out_dir)).optimizer["state"] != {}  # its own optimiser, trained afresh


def test_xl_to_rpt_sem_loads_every_xl_weight_and_initialises_the_rest(corpus, capsys):
    src = _source(corpus, "xl")
    xl_state = ck.read_weights(ck.latest(src) / "model.safetensors")
    rec = Recorder()
    cfg = tiny_config(corpus["tmp"] / "b", "rpt-sem", steps=2, init_from=str(src))
    result = train(cfg, corpus["root"], corpus["labels"], progress=False, memory_check=False, model_factory=rec)
    init = result.init
    fresh = (torch.manual_seed(cfg.train.seed), build_model(cfg.model))[1].state_dict()  # what the loop builds
    assert sorted(init.loaded) == sorted(xl_state) and init.dropped == []
    assert sorted(init.initialised) == sorted(set(fresh) - set(xl_state)) and init.initialised
    assert {n.split(".")[0] for n in init.initialised} >= {"encoder", "retriever", "layers"}
    for name, value in rec.state.items():
        want = xl_state[name] if name in xl_state else fresh[name]
        torch.testing.assert_close(value, want, rtol=0, atol=0, msg=name)
    # recorded: the config keeps the option, init.json what was read, the run said it
    run = result.out_dir
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["init_from"] == str(src)
    record = json.loads((run / "init.json").read_text())
    assert record["checkpoint"] == str(ck.latest(src)) and record["step"] == 2
    assert sorted(record["loaded"]) == sorted(xl_state)
    out = capsys.readouterr().out
    assert f"weights from {ck.latest(src)} (step 2): loaded {len(xl_state)} tensors; newly initialised" in out
    assert "layers.*.cca" in out and "retriever" in out


def test_rpt_sem_to_xl_drops_the_retrieval_modules(corpus):
    src = _source(corpus, "rpt-sem")
    cfg = tiny_config(corpus["tmp"] / "b", "xl", steps=1, init_from=str(ck.latest(src) / "model.safetensors"))
    init = train(cfg, corpus["root"], None, progress=False, memory_check=False).init
    assert init.initialised == [] and init.dropped and all(not n.startswith(("embed", "norm")) for n in init.dropped)


def test_a_shape_mismatch_is_one_clear_error(corpus):
    src = _source(corpus, "xl")
    cfg = tiny_config(corpus["tmp"] / "b", "xl", model={"d_model": 48}, init_from=str(src))
    with pytest.raises(UserError) as e:
        train(cfg, corpus["root"], None, progress=False, memory_check=False)
    msg = str(e.value)
    assert msg.startswith(f"train.init_from {src}: ") and "another shape" in msg and "\n" not in msg
    assert "embed.weight (64, 32) there, (64, 48) here" in msg
    assert not (corpus["tmp"] / "b" / "run" / "log.jsonl").exists() and ck.latest(corpus["tmp"] / "b" / "run") is None


def test_nothing_matching_and_no_checkpoint_are_refused(corpus):
    other = corpus["tmp"] / "other"
    other.mkdir()
    ck.save_weights({"encoder.layer.weight": torch.zeros(3, 3), "head.bias": torch.zeros(3)}, other / "model.safetensors")
    cfg = tiny_config(corpus["tmp"] / "b", "xl", init_from=str(other))
    with pytest.raises(UserError, match="none of its .* weights .* is named as one of this model's"):
        train(cfg, corpus["root"], None, progress=False, memory_check=False)
    cfg = tiny_config(corpus["tmp"] / "c", "xl", init_from=str(corpus["tmp"] / "nowhere"))
    with pytest.raises(UserError, match="train.init_from .*nowhere: no checkpoint at"):
        train(cfg, corpus["root"], None, progress=False, memory_check=False)


def test_a_resumed_run_ignores_init_from(corpus):
    src = _source(corpus, "xl")
    cfg = tiny_config(corpus["tmp"] / "b", "xl", steps=3, init_from=str(src))
    first = train(cfg, corpus["root"], None, progress=False, memory_check=False, stop_after=1)
    assert first.step == 1 and first.init is not None
    # resuming reads its own checkpoint: an init_from that would be refused is not even opened
    cfg.train.init_from = str(corpus["tmp"] / "nowhere")
    again = train(cfg, corpus["root"], None, progress=False, memory_check=False)
    assert again.step == 3 and again.init is None


def test_the_cli_flag(corpus, capsys):
    src = _source(corpus, "xl")
    base = ["train", "--preset", "tiny", "--variant", "rpt-sem", "--store", str(corpus["root"]), "--labels",
            str(corpus["labels"]), "--steps", "1", "--init-from", str(src), "--no-progress", "--seq-len", "64",
            "--set", "model.chunk_size=8", "--set", "model.segment_len=16"]
    small = ["--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.mlp_hidden=64"]
    out = corpus["tmp"] / "cli"
    assert main([*base, *small, "--out", str(out)]) == 0
    assert "weights from" in capsys.readouterr().out and (out / "init.json").is_file()
    assert main([*base, "--out", str(corpus["tmp"] / "bad")]) == 2  # the tiny preset's width, 64; the source's is 32
    err = capsys.readouterr().err
    assert err.startswith("rpt train: error: train.init_from") and "another shape" in err and err.count("\n") == 1
