"""Activation checkpointing (train.activation_checkpointing): each decoder layer runs under torch.utils.checkpoint in
training; the loss and the gradients are those without it, for every variant the registry builds, and the pre-flight
memory estimate counts the layers' inputs and one recomputed layer instead of every layer's activations."""

import json

import pytest
import torch
from train_helpers import standin_factory, tiny_config

from rpt.config import VARIANTS
from rpt.model.decoder import TiedLM, set_activation_checkpointing
from rpt.model.registry import build_model, model_class
from rpt.training.footprint import estimate_step_memory, saved_tensor_bytes
from rpt.training.loop import train

# rpt-lex's model is rpt-sem's (tests/model/test_model.py::test_rpt_lex_and_rpt_sem_are_one_model): one case for both
MODELS = tuple(v for v in VARIANTS if v != "rpt-lex")


def _loss_and_grads(cfg, checkpointing: bool, seed: int = 0):
    model = build_model(cfg.model, seed=0).train()
    set_activation_checkpointing(model, checkpointing)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.model.vocab_size, (2, cfg.data.seq_len), generator=g)
    C = cfg.data.seq_len // cfg.model.chunk_size
    kwargs = {}
    if cfg.model.variant == "retro":
        kwargs["neighbor_ids"] = torch.randint(0, C, (2, C, cfg.model.n_neighbors), generator=g)
    torch.manual_seed(seed)  # the dropout draws (the checkpointed recomputation replays them)
    out = model(ids, labels=ids, **kwargs)
    loss = out.loss
    if out.retrieval_scores is not None:  # the retriever's gradient flows through the checkpointed lower layers
        s = out.retrieval_scores
        loss = loss + s[torch.isfinite(s)].square().mean()
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("variant", MODELS)
def test_checkpointing_keeps_the_loss_and_the_gradients(tmp_path, variant):
    cfg = tiny_config(tmp_path, variant)  # dropout 0
    plain_loss, plain = _loss_and_grads(cfg, False)
    ckpt_loss, ckpt = _loss_and_grads(cfg, True)
    assert torch.allclose(plain_loss, ckpt_loss, rtol=1e-6, atol=1e-7)
    assert set(plain) == set(ckpt) and len(plain) == sum(1 for _ in build_model(cfg.model, seed=0).parameters())
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], rtol=1e-5, atol=1e-7, msg=name)


def test_checkpointing_replays_dropout(tmp_path):
    cfg = tiny_config(tmp_path, "rpt-sem", model={"dropout": 0.1})
    (a_loss, a), (b_loss, b) = _loss_and_grads(cfg, False, seed=3), _loss_and_grads(cfg, True, seed=3)
    assert torch.allclose(a_loss, b_loss, rtol=1e-6)
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-7, msg=name)


def test_checkpointed_layers_keep_only_their_inputs(tmp_path):
    """Under checkpointing no decoder layer keeps a tensor of its own for backward (saved-tensor hooks); evaluation
    and no-grad forwards are not checkpointed."""
    cfg = tiny_config(tmp_path, "rpt-sem", activation_checkpointing=True)
    plain = saved_tensor_bytes(tiny_config(tmp_path, "rpt-sem"))
    saved = saved_tensor_bytes(cfg)
    assert any(k.startswith("layers.") for k in plain) and not any(k.startswith("layers.") for k in saved)
    model = build_model(cfg.model, seed=0)
    set_activation_checkpointing(model)
    assert isinstance(model, TiedLM) and model.activation_checkpointing
    model.eval()
    ids = torch.randint(0, 64, (1, 64))
    with torch.no_grad():
        assert model(ids).logits.shape == (1, 64, 64)


def test_the_loop_trains_alike_with_checkpointing(corpus):
    c = corpus
    rows = {}
    for on in (False, True):
        cfg = tiny_config(c["tmp"] / str(on), "rpt-sem", steps=3, activation_checkpointing=on)
        train(cfg, c["root"], c["labels"], progress=False, memory_check=False)
        rows[on] = [json.loads(x) for x in (c["tmp"] / str(on) / "run" / "log.jsonl").read_text().splitlines()]
    for a, b in zip(rows[False], rows[True], strict=True):
        for key in ("lm_loss", "ret_loss", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), key


def test_a_model_without_decoder_layers_is_refused(corpus):
    c = corpus
    cfg = tiny_config(c["tmp"], "xl", activation_checkpointing=True)
    with pytest.raises(ValueError, match="activation checkpointing: StandIn"):
        train(cfg, c["root"], None, progress=False, memory_check=False, model_factory=standin_factory)


@pytest.mark.parametrize("variant", ["xl", "rpt-sem"])
def test_the_estimate_counts_layer_inputs_and_one_recomputed_layer(tmp_path, variant):
    """What checkpointing saves in the estimate is what it saves in autograd: without it every layer's saved tensors;
    with it what stays saved (hooks: the layers' inputs and everything outside the layers) plus, at the peak of the
    backward pass, the largest layer's saved tensors again (measured without checkpointing: the trunk's per layer,
    plus CCA's per CCA layer)."""
    plain_cfg = tiny_config(tmp_path, variant)
    ckpt_cfg = tiny_config(tmp_path, variant, activation_checkpointing=True)
    plain, ckpt = saved_tensor_bytes(plain_cfg), saved_tensor_bytes(ckpt_cfg)
    m = plain_cfg.model
    cca = sum(v for k, v in plain.items() if k.startswith("layers.*.cca"))
    trunk = sum(v for k, v in plain.items() if k.startswith("layers.")) - cca
    largest = trunk / m.n_layers + (cca / len(m.cca_layers) if m.uses_retrieval else 0)
    measured_saving = sum(plain.values()) - (sum(ckpt.values()) + largest)
    est_plain, est_ckpt = estimate_step_memory(plain_cfg), estimate_step_memory(ckpt_cfg)
    counted_saving = (est_plain.layers + est_plain.retrieval) - (est_ckpt.layers + est_ckpt.retrieval)
    assert 0.85 < counted_saving / measured_saving < 1.15, (counted_saving, measured_saving)
    assert est_ckpt.total < est_plain.total and est_ckpt.states == est_plain.states
    # the layers term: the n_layers inputs (D per token) and one layer's activations, in fp32 on the CPU
    B, T, D = plain_cfg.train.batch_size, plain_cfg.data.seq_len, m.d_model
    one_layer = T * model_class(variant).attention_layer_elements(m, False)
    assert est_ckpt.layers == 4 * B * (T * m.n_layers * D + one_layer)


@pytest.mark.parametrize("variant", ["memorizing", "block-recurrent", "griffin"])
def test_the_largest_layer_of_a_baseline(tmp_path, variant):
    """The baselines' special layer (the kNN layer, the recurrent layer, Griffin's R blocks) is the one recomputed at
    the peak when it keeps more than an attention layer."""
    cfg = tiny_config(tmp_path, variant)
    cls, m, T = model_class(variant), cfg.model, cfg.data.seq_len
    attention = T * cls.attention_layer_elements(m, False)
    largest = cls.largest_layer_elements(m, T, False)
    assert largest >= attention
    assert cls.checkpointed_layer_elements(m, T, False) < cls.layer_activation_elements(m, T, False)
