"""Validation loss during training and the best checkpoint (train.val_every)."""

import contextlib
import json

import numpy as np
import pytest
import torch
from train_helpers import make_store, tiny_config

from rpt import checkpoint as ck
from rpt.checkpoint import load_model
from rpt.training.data import SequenceDataset, open_store
from rpt.training.loop import train, validation_loss
from rpt.training.losses import lm_loss


@pytest.fixture
def with_validation(corpus):
    make_store(corpus["root"] / "validation", [128, 96, 64], seed=5)
    return corpus


@pytest.mark.parametrize("variant", ["xl", "retro", "rpt-sem"])
def test_validation_is_logged_and_the_best_checkpoint_kept(with_validation, variant):
    c = with_validation
    cfg = tiny_config(c["tmp"], variant, steps=6, val_every=2, val_sequences=3, checkpoint_every=100)
    train(cfg, c["root"], c["labels"] if variant != "xl" else None, progress=False, memory_check=False)
    run = c["tmp"] / "run"
    rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    vals = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}
    assert sorted(vals) == [2, 4, 6] and all(r["lm_loss"] > 0 for r in rows)  # every row is a training row too
    assert [p.name for p in ck.list_checkpoints(run)] == ["step_00000002", "step_00000004", "step_00000006"]
    best = json.loads((run / "best" / "best.json").read_text())
    assert best["val_loss"] == pytest.approx(min(vals.values())) and vals[best["step"]] == best["val_loss"]
    # the best folder is a checkpoint like any other: it loads, and its validation loss is what the log says
    model, cfg_best = load_model(run / "best", torch.device("cpu"))
    data = SequenceDataset(open_store(c["root"], "validation"), 64, 8, 16)
    again = validation_loss(model, data, cfg_best.model, torch.device("cpu"), _null, 2, 0, _Info(), 3)
    assert again == pytest.approx(best["val_loss"], rel=1e-5)


def test_validation_loss_is_the_lm_loss_of_the_validation_sequences(with_validation):
    c = with_validation
    cfg = tiny_config(c["tmp"], "xl")
    from rpt.model.registry import build_model

    model = build_model(cfg.model, seed=0)
    data = SequenceDataset(open_store(c["root"], "validation"), 64, 8, 16)
    got = validation_loss(model, data, cfg.model, torch.device("cpu"), _null, 2, 0, _Info(), 3)
    assert model.training  # left in train mode
    ids, masks = zip(*(data.tokens(i) for i in range(3)), strict=True)
    x, m = torch.as_tensor(np.stack(ids)), torch.as_tensor(np.stack(masks))
    model.eval()
    with torch.no_grad():
        want = lm_loss(model(x).logits, x, m)
    assert got == pytest.approx((want.total / want.count).item(), rel=1e-6)


def test_validation_needs_a_validation_split(corpus):
    cfg = tiny_config(corpus["tmp"], "xl", val_every=2)
    with pytest.raises(ValueError, match="validation split"):
        train(cfg, corpus["root"], progress=False, memory_check=False)
    with pytest.raises(ValueError, match="val_every must be >= -1"):
        train(tiny_config(corpus["tmp"], "xl", val_every=-2), corpus["root"], progress=False, memory_check=False)


def test_by_default_validation_runs_at_every_checkpoint_when_the_store_has_a_validation_split(corpus):
    cfg = tiny_config(corpus["tmp"], "xl", steps=4, checkpoint_every=2)  # val_every -1: the default
    assert cfg.train.val_every == -1
    result = train(cfg, corpus["root"], progress=False, memory_check=False)  # no validation split: none, no error
    assert result.best is None and not (corpus["tmp"] / "run" / "best").exists()
    make_store(corpus["root"] / "validation", [128, 96, 64], seed=5)
    cfg = tiny_config(corpus["tmp"], "xl", steps=4, checkpoint_every=2, out_dir=str(corpus["tmp"] / "run2"))
    result = train(cfg, corpus["root"], progress=False, memory_check=False)
    rows = [json.loads(line) for line in (corpus["tmp"] / "run2" / "log.jsonl").read_text().splitlines()]
    assert sorted(r["step"] for r in rows if "val_loss" in r) == [2, 4]
    assert result.best is not None and result.best["path"].endswith("best") and result.best["step"] in (2, 4)


class _Info:
    rank, world_size, is_main, enabled = 0, 1, True, False
    device = torch.device("cpu")


def _null():
    return contextlib.nullcontext()
