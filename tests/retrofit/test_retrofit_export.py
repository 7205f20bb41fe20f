"""A retrofit run exported with `rpt export`: the folder holds the new parts and names the backbone, loads with
AutoModelForCausalLM after `import rpt` with the run's function (the backbone's weights from its path), and generates
with retrieval; `rpt generate --show-retrieval` shows what a retrofit run retrieved."""

from __future__ import annotations

import json

import torch
from retrofit_helpers import TEXT


def test_export_loads_with_auto_classes_and_generates_with_retrieval(retrofit_run, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    import rpt
    from rpt.cli import main

    store, run = retrofit_run
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "rpt" and config["backbone"] == str(run.parent / "llama")
    card = (tmp_path / "hf" / "README.md").read_text()
    assert str(run.parent / "llama") in card and "licence" in card
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    ours = rpt.load(run, device="cpu").model.eval()
    x = torch.tensor([list(range(3, 67))])
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, ours(x).logits, rtol=1e-5, atol=1e-5)
    prompt = torch.tensor([rpt.load(run, device="cpu").tokenizer.encode(TEXT)[:120]])
    out = hf.generate(prompt, max_new_tokens=12, do_sample=False)
    assert out.shape == (1, 132)

    assert main(["generate", "--checkpoint", str(run), "--prompt", TEXT[:600], "--max-new-tokens", "8",
                 "--show-retrieval", "--device", "cpu"]) == 0
    assert "its neighbours for chunk" in capsys.readouterr().err
