"""The retrofitted model (rpt/model/retrofit.py) on a tiny random Llama: its backbone's function at initialisation,
the sliding window, no leakage through retrieval, step == forward, checkpoints of the new parts only."""

from __future__ import annotations

import pytest
import torch
from retrofit_helpers import perturb_new_parts, retrofit_config, tiny_llama

from rpt.config import CCAConfig
from rpt.model.retrofit import RetrofitRPT

S = 16  # segment length of retrofit_config


def build(variant: str = "rpt-sem", tied: bool = True, seed: int = 0, **model):
    hf = tiny_llama(tied=tied)
    return RetrofitRPT(retrofit_config(variant, **model), seed=seed, backbone=hf).eval(), hf


def bos(x: torch.Tensor, first: int = 1) -> torch.Tensor:
    """x with the BOS token (id 1 in tiny_llama; `first` for labels) put before each row."""
    return torch.cat([torch.full_like(x[:, :1], first), x], 1)


def valid_ids(C: int, K: int = 2) -> torch.Tensor:
    """Neighbour ids [1, C, K] that obey the retrievable rule (chunk 0 and 1 for every chunk of segment >= 2)."""
    ids = torch.full((1, C, K), -1)
    ids[0, 4:, 0], ids[0, 4:, 1] = 0, 1  # cps = 2: chunk i of segment s >= 2 may retrieve j <= 2(s-1) - 2
    return ids


@pytest.mark.parametrize("variant", ["rpt-sem", "retro", "xl"])
@pytest.mark.parametrize("tied", [True, False])
def test_logits_equal_the_backbone_at_initialisation(variant, tied):
    """T = 2S: every token's window holds all earlier tokens and the BOS sink before them, so the retrofitted model
    is its backbone reading BOS + the tokens, exactly."""
    model, hf = build(variant, tied)
    x = torch.randint(3, 256, (2, 2 * S))
    kwargs = {"neighbor_ids": valid_ids(4).expand(2, -1, -1)} if variant == "retro" else {}
    with torch.no_grad():
        ours = model(x, labels=x, **kwargs)
        labels = bos(x, -100)
        labels[:, 1] = -100  # the BOS position's prediction of x[0], which the retrofitted model does not make
        theirs = hf(bos(x), labels=labels)
    torch.testing.assert_close(ours.logits, theirs.logits[:, 1:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=1e-5)


def test_identity_holds_with_neighbours_read_over_long_sequences():
    """At initialisation CCA adds zero even where neighbours exist (8 segments, the model's own retrieval)."""
    model, hf = build()
    x = torch.randint(0, 256, (1, 8 * S))
    with torch.no_grad():
        out = model(x)
        none = model(x, neighbor_ids=torch.full((1, 16, 2), -1))
    assert (out.neighbor_ids >= 0).any()
    torch.testing.assert_close(out.logits, none.logits, atol=1e-6, rtol=1e-6)


def test_the_backbone_attends_within_the_sliding_window():
    """Each layer's attention sees the BOS sink, the previous segment and its own: with one layer, segment 2's logits
    are the backbone's over BOS + tokens S .. 3S - 1 (rotary positions are relative, so the shift of positions changes
    nothing but float rounding), and segment 0 does not reach them. (With more layers the reach grows by a segment per
    layer, as in Transformer-XL.)"""
    hf = tiny_llama(layers=1)
    model = RetrofitRPT(retrofit_config("xl", n_layers=1, cca_layers=[]), seed=0, backbone=hf).eval()
    x = torch.randint(3, 256, (1, 3 * S))
    with torch.no_grad():
        ours = model(x).logits
        window = hf(bos(x[:, S:])).logits[:, 1 + S :]
        start = hf(bos(x[:, : 2 * S])).logits[:, 1:]
    torch.testing.assert_close(ours[:, 2 * S :], window, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours[:, : 2 * S], start, atol=1e-5, rtol=1e-5)
    y = x.clone()
    y[:, :S] = torch.randint(0, 256, (1, S))
    with torch.no_grad():
        torch.testing.assert_close(model(y).logits[:, 2 * S :], ours[:, 2 * S :], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("t", [33, 40, 64, 97, 120])
def test_no_token_at_or_after_t_reaches_a_logit_before_t(t):
    """Through self-attention, the retriever, the neighbours (chunk + continuation), query augmentation, the gate and
    CCA: change every token from t on and no logit before t moves."""
    model, _ = build()
    perturb_new_parts(model)
    x = torch.randint(0, 256, (1, 8 * S))
    y = x.clone()
    y[:, t:] = torch.randint(0, 256, (1, x.shape[1] - t))
    with torch.no_grad():
        a, b = model(x), model(y)
    torch.testing.assert_close(a.logits[:, :t], b.logits[:, :t], atol=1e-6, rtol=1e-6)
    none = model(x, neighbor_ids=torch.full((1, 16, 2), -1))
    assert not torch.allclose(a.logits, none.logits, atol=1e-4), "the neighbours must matter for this test to mean anything"


@pytest.mark.parametrize("piece, query", [(S, "upper"), (5, "upper"), (5, "lower")])
def test_step_with_a_cache_computes_what_forward_computes(piece, query):
    model, _ = build(cca=CCAConfig(query=query))
    perturb_new_parts(model)
    x = torch.randint(0, 256, (1, 6 * S))
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache()
        parts = [model.step(x[:, i : i + piece], cache).logits for i in range(0, x.shape[1], piece)]
    torch.testing.assert_close(torch.cat(parts, 1), full.logits, atol=1e-4, rtol=1e-4)


def test_only_the_new_parts_train_and_checkpoints_hold_only_them():
    model, hf = build()
    new = {n for n, _ in model.new_parameters()}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == new and new
    assert all(n.startswith(("encoder.", "retriever.", "query_aug.", "gate.")) or ".cca" in n for n in new)
    state = model.state_dict()
    assert set(state) == new | {n for n, _ in model.named_buffers() if n in state}
    assert not any(k.startswith(("embed.", "norm.", "lm_head.")) or ".layer." in k for k in state)
    perturb_new_parts(model)
    other = RetrofitRPT(retrofit_config(), seed=5, backbone=hf).eval()
    other.load_state_dict(model.state_dict())
    x = torch.randint(0, 256, (1, 6 * S))
    with torch.no_grad():
        torch.testing.assert_close(other(x).logits, model(x).logits)


def test_a_config_that_does_not_describe_its_backbone_is_refused():
    with pytest.raises(ValueError, match="d_model=32"):
        RetrofitRPT(retrofit_config(d_model=32, n_heads=2), backbone=tiny_llama())


def test_backbones_outside_the_llama_family_are_refused():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_embd=64, n_layer=4, n_head=4))
    with pytest.raises(ValueError, match="gpt2"):
        RetrofitRPT(retrofit_config(), backbone=gpt2)
