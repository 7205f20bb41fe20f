"""A retrofit run exported with `rpt export`: the folder holds the new parts and names the backbone, loads with
AutoModelForCausalLM after `import rpt` with the run's function (the backbone's weights from its path), and generates
with retrieval; its own code (configuration_rpt.py, modeling_rpt.py, ...) loads it without rpt and generates rpt's
tokens; `rpt generate --show-retrieval` shows what a retrofit run retrieved."""

from __future__ import annotations

import json

import pytest
import torch
from retrofit_helpers import TEXT


@pytest.fixture(scope="module")
def exported(retrofit_run, tmp_path_factory):
    """(run, the folder `rpt export` wrote)."""
    from rpt.cli import main

    _, run = retrofit_run
    folder = tmp_path_factory.mktemp("retrofit_export") / "hf"
    assert main(["export", str(run), "--out", str(folder)]) == 0
    return run, folder


def rpt_greedy(run, prompt: list[int], n_new: int) -> list[int]:
    """`rpt.generate`'s greedy continuation by the run itself."""
    import rpt
    from rpt.decoding import GenerateConfig, generate

    loaded = rpt.load(run, device="cpu")
    cfg = GenerateConfig(max_new_tokens=n_new, greedy=True, vocab_size=loaded.tokenizer.vocab_size)
    ref = generate(loaded.model, [prompt], cfg)[0]
    assert ref.retrievals  # chunks of 8 tokens: the prompt's later chunks retrieve
    return ref.tokens


def prompt_ids(run) -> list[int]:
    import rpt

    return rpt.load(run, device="cpu").tokenizer.encode(TEXT)[:120]


def test_export_loads_with_auto_classes_and_generates_with_retrieval(exported, capsys):
    from transformers import AutoModelForCausalLM

    import rpt
    from rpt.cli import main

    run, folder = exported
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "rpt" and config["backbone"] == str(run.parent / "llama")
    card = (folder / "README.md").read_text()
    assert str(run.parent / "llama") in card and "licence" in card
    hf = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    ours = rpt.load(run, device="cpu").model.eval()
    x = torch.tensor([list(range(3, 67))])
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, ours(x).logits, rtol=1e-5, atol=1e-5)
    prompt = prompt_ids(run)
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
    assert out[0, 120:].tolist() == rpt_greedy(run, prompt, 12)

    assert main(["generate", "--checkpoint", str(run), "--prompt", TEXT[:600], "--max-new-tokens", "8",
                 "--show-retrieval", "--device", "cpu"]) == 0
    assert "its neighbours for chunk" in capsys.readouterr().err


def test_the_folder_s_own_code_loads_the_retrofit(exported, tmp_path, monkeypatch):
    """The folder's own code (as with trust_remote_code=True, rpt's modules out of reach) rebuilds the retrofit around
    its backbone and generates rpt's tokens."""
    from hf_helpers import load_copy

    run, folder = exported
    code = load_copy(folder, tmp_path, monkeypatch)
    model = code.RPTForCausalLM.from_pretrained(folder)
    assert type(model.model).__module__.endswith(".rpt_model_retrofit")
    prompt = prompt_ids(run)
    out = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
    assert out[0, 120:].tolist() == rpt_greedy(run, prompt, 12)


@pytest.mark.slow
def test_export_loads_and_generates_without_rpt(exported, tmp_path):
    """In a fresh Python where `import rpt` fails: AutoModelForCausalLM.from_pretrained(folder,
    trust_remote_code=True) loads the retrofit (its backbone from the path the folder names) and greedy generate()
    gives `rpt.generate`'s tokens. (A fresh interpreter loading torch and transformers: ~15 s.)"""
    from hf_helpers import generate_without_rpt

    run, folder = exported
    prompt = prompt_ids(run)
    out = generate_without_rpt(folder, prompt, 12, tmp_path)
    assert out["module"].startswith("transformers_modules.") and out["rpt"] == []
    assert out["tokens"] == rpt_greedy(run, prompt, 12)
