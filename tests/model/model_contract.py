"""Checks every model of the registry must pass, shared by the baselines' test files (rpt/model/registry.py)."""

import torch
import torch.nn.functional as F

from rpt.training.losses import lm_loss


def step_in_pieces(model, x, sizes, cache=None):
    """Feed x [B, T] through `model.step` in pieces of the given sizes (the rest in one last piece) -> (logits, cache)."""
    cache = model.new_cache() if cache is None else cache
    parts, i = [], 0
    for n in sizes:
        if i >= x.shape[1]:
            break
        parts.append(model.step(x[:, i : i + n], cache).logits)
        i += n
    if i < x.shape[1]:
        parts.append(model.step(x[:, i:], cache).logits)
    return torch.cat(parts, 1), cache


def assert_every_parameter_gets_a_gradient(model, x):
    V = model.cfg.vocab_size
    out = model(x)
    F.cross_entropy(out.logits[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1)).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not missing, missing
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def assert_chunked_loss_equals_full_logits(model, T: int):
    """forward(loss_chunk=8) gives the full-logit loss and every parameter's gradient, with a padded row."""
    x = torch.randint(0, model.cfg.vocab_size, (2, T))
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[1, T - 70 :] = False  # a padded row
    ref = lm_loss(model(x).logits, x, mask)
    ref.total.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    out = model(x, loss_chunk=8, loss_mask=mask)
    assert out.logits is None and out.lm.count == ref.count
    torch.testing.assert_close(out.lm.total, ref.total, rtol=1e-5, atol=1e-4)
    out.lm.total.backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], rtol=1e-4, atol=1e-5, msg=n)
