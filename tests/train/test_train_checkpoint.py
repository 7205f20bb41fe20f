import random

import numpy as np
import torch
from safetensors import safe_open
from torch import nn
from train_helpers import tiny_config

from rpt import checkpoint as ck


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight  # tied, as in RPT
        self.norm = nn.LayerNorm(4)


def test_tied_weights_are_stored_once_and_restored(tmp_path):
    m = Tied()
    ck.save_weights(m.state_dict(), tmp_path / "model.safetensors")
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        assert sorted(f.keys()) == ["emb.weight", "norm.bias", "norm.weight"]
    m2 = Tied()
    ck.load_weights(m2, tmp_path / "model.safetensors")
    assert torch.equal(m2.emb.weight, m.emb.weight) and m2.head.weight is m2.emb.weight


def test_save_load_round_trip_and_rng(tmp_path):
    cfg = tiny_config(tmp_path)
    m = Tied()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m.emb.weight.sum().backward()
    opt.step()
    random.seed(5)
    np.random.seed(6)
    torch.manual_seed(7)
    rng = ck.rng_state()
    expect = (random.random(), np.random.rand(), torch.rand(2))
    path = ck.save(tmp_path / "run", 12, m.state_dict(), opt.state_dict(), cfg, [rng], {"consumed": 48}, {"lm_loss": 1.5})
    assert path.name == "step_00000012" and (path / "config.yaml").exists()
    cp = ck.load(path)
    assert cp.step == 12 and cp.data == {"consumed": 48} and cp.metrics == {"lm_loss": 1.5} and cp.config == cfg
    opt2 = torch.optim.AdamW(Tied().parameters(), lr=1e-3)
    opt2.load_state_dict(cp.optimizer)
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    ck.set_rng_state(cp.rng[0])
    assert (random.random(), np.random.rand()) == expect[:2] and torch.equal(torch.rand(2), expect[2])


def test_latest_keep_last_and_incomplete_folders(tmp_path):
    cfg = tiny_config(tmp_path)
    m = Tied()
    out = tmp_path / "run"
    assert ck.latest(out) is None
    for step in (2, 4, 6, 8):
        ck.save(out, step, m.state_dict(), {}, cfg, [ck.rng_state()], {}, keep_last=2)
    assert [p.name for p in ck.list_checkpoints(out)] == ["step_00000006", "step_00000008"]
    (ck.checkpoint_dir(out) / ".step_00000010.tmp").mkdir()  # a save killed half-way
    (ck.checkpoint_dir(out) / "step_00000012").mkdir()  # no state.json: not complete
    assert ck.latest(out).name == "step_00000008"
    ck.save(out, 8, m.state_dict(), {}, cfg, [ck.rng_state()], {"again": 1}, keep_last=2)  # re-saving a step replaces it
    assert ck.load(ck.latest(out)).data == {"again": 1}
