import math

import pytest
import torch
from torch import nn

from rpt.config import TrainConfig
from rpt.training.optim import AdaBelief, build_optimizer, clip_gradients, parameter_groups


def test_adabelief_two_steps_by_hand():
    p = nn.Parameter(torch.tensor([1.0]))
    lr, b1, b2, wd, eps = 0.1, 0.9, 0.99, 0.01, 1e-16
    opt = AdaBelief([p], lr=lr, betas=(b1, b2), eps=eps, eps_root=eps, weight_decay=wd)
    # step 1, g = 2:  m = 0.2, s = 0.01 * (2 - 0.2)^2 + eps = 0.0324, m^ = 2, s^ = 3.24, update = 2 / 1.8
    p.grad = torch.tensor([2.0])
    opt.step()
    x1 = 1.0 * (1 - lr * wd) - lr * 2 / 1.8
    assert p.item() == pytest.approx(x1, rel=1e-6)
    # step 2, g = -1:  m = 0.18 - 0.1 = 0.08, s = 0.99 * 0.0324 + 0.01 * (-1.08)^2
    p.grad = torch.tensor([-1.0])
    opt.step()
    m, s = 0.08, 0.99 * 0.0324 + 0.01 * 1.08**2
    x2 = x1 * (1 - lr * wd) - lr * (m / (1 - b1**2)) / (math.sqrt(s / (1 - b2**2)) + eps)
    assert p.item() == pytest.approx(x2, rel=1e-6)


def test_adabelief_state_dict_round_trip_is_exact():
    torch.manual_seed(0)
    a, b = nn.Linear(4, 3), nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    oa, ob = AdaBelief(a.parameters(), lr=1e-2), AdaBelief(b.parameters(), lr=1e-2)
    x = torch.randn(5, 4)
    for opt, mod in ((oa, a), (ob, b)):
        mod(x).pow(2).sum().backward()
        opt.step()
    ob2 = AdaBelief(b.parameters(), lr=1e-2)
    ob2.load_state_dict(ob.state_dict())
    for opt, mod in ((oa, a), (ob2, b)):
        opt.zero_grad()
        mod(x).sin().sum().backward()
        opt.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.gate = nn.Parameter(torch.zeros(4))


def test_no_weight_decay_on_norms_biases_and_vectors():
    m = Tiny()
    names = {id(p): n for n, p in m.named_parameters()}
    decay, plain = parameter_groups(m, 1e-8)
    assert sorted(names[id(p)] for p in decay["params"]) == ["emb.weight", "proj.weight"]
    assert sorted(names[id(p)] for p in plain["params"]) == ["gate", "norm.bias", "norm.weight", "proj.bias"]
    assert decay["weight_decay"] == 1e-8 and plain["weight_decay"] == 0.0


@pytest.mark.parametrize("name", ["adamw", "adabelief"])
def test_build_optimizer(name):
    opt = build_optimizer(Tiny(), TrainConfig(optimizer=name, weight_decay=1e-8, betas=[0.9, 0.95]))
    assert opt.param_groups[0]["betas"] == (0.9, 0.95)
    assert [g["weight_decay"] for g in opt.param_groups] == [1e-8, 0.0]


def test_clip_gradients_returns_the_norm_before_clipping():
    m = nn.Linear(2, 1, bias=False)
    m.weight.grad = torch.tensor([[3.0, 4.0]])
    assert clip_gradients(m, 1.0).item() == pytest.approx(5.0)
    assert torch.linalg.vector_norm(m.weight.grad).item() == pytest.approx(1.0, rel=1e-5)


def test_neighbour_lr_scale_gives_the_neighbour_path_its_own_learning_rate():
    from rpt.config import RPTConfig
    from rpt.model.rpt import RPT
    from rpt.training.optim import neighbor_path, set_lr

    model = RPT(RPTConfig.from_preset("tiny", variant="retro", vocab_size=64).model)
    names = {id(p): n for n, p in model.named_parameters()}
    assert len(parameter_groups(model, 0.1)) == 2  # scale 1: the groups (and checkpoints) of before
    opt = build_optimizer(model, TrainConfig(optimizer="adamw", neighbor_lr_scale=3.0))
    set_lr(opt, 0.01)
    seen = set()
    for g in opt.param_groups:
        for p in g["params"]:
            scaled = neighbor_path(names[id(p)])
            assert g["lr"] == pytest.approx(0.03 if scaled else 0.01), names[id(p)]
            seen.add(scaled)
    assert seen == {True, False}
    assert {n for n in names.values() if neighbor_path(n)} >= {"gate.w", "layers.2.cca.attn.q.weight",
                                                                  "layers.3.cca_norm.weight"}
    assert not any(neighbor_path(n) for n in ("embed.weight", "layers.0.attn.q.weight", "layers.2.mlp.w_gate.weight"))
