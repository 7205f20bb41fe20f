"""Training a retrofitted tiny Llama: through `rpt.train` / `rpt train --backbone` (only the new parts change, the
checkpoint names the backbone and holds only them), and a few updates that lower the loss where neighbours help."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from retrofit_helpers import retrofit_config, save_tiny_llama, tiny_llama

from rpt.model.retrofit import RetrofitRPT

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from train_helpers import make_labels, make_store, write_label_store  # noqa: E402

SMALL = {"model.chunk_size": 8, "model.segment_len": 16, "data.seq_len": 64, "model.dropout": 0.0,
         "model.cca_layers": [2, 3], "train.warmup_steps": 1, "train.alpha_ramp_steps": 1, "train.log_every": 1,
         "train.lr": 1e-2, "batch_size": 2}


def corpus(tmp: Path) -> tuple[Path, Path]:
    lengths = [160, 192, 112, 64]
    make_store(tmp / "store" / "train", lengths)
    labels = write_label_store(tmp / "labels", make_labels(lengths, 64, 8, 16))
    return tmp / "store", labels


def test_rpt_train_with_a_backbone_moves_only_the_new_parts(tmp_path):
    import rpt
    from rpt.checkpoint import load_model, read_weights

    backbone = save_tiny_llama(tmp_path / "llama")
    store, labels = corpus(tmp_path)
    result = rpt.train("tiny", store, tmp_path / "run", labels=labels, backbone=str(backbone), variant="rpt-sem",
                       steps=3, **{k: v for k, v in SMALL.items()})
    assert result.step == 3
    saved = read_weights(result.checkpoint / "model.safetensors")
    model, cfg = load_model(result.checkpoint)
    assert cfg.model.backbone == str(backbone) and cfg.model.d_model == 64 and cfg.model.n_layers == 4
    assert set(saved) == {n for n, _ in model.new_parameters()}, "checkpoints hold the new parts only"
    original = tiny_llama()
    ours = dict(model.named_parameters())
    for name, p in original.model.layers.named_parameters():
        torch.testing.assert_close(ours[f"layers.{name.split('.', 1)[0]}.layer.{name.split('.', 1)[1]}"], p, rtol=0, atol=0)
    torch.testing.assert_close(model.embed.weight, original.model.embed_tokens.weight, rtol=0, atol=0)
    assert all(model.layers[i].cca.attn.out.weight.abs().sum() > 0 for i in (2, 3)), "CCA's zero output must train"
    assert saved["retriever.q_proj.weight"].abs().sum() > 0


def test_cli_flag_backbone_sets_the_shape(tmp_path, capsys):
    from rpt.cli import main

    backbone = save_tiny_llama(tmp_path / "llama")
    store, _ = corpus(tmp_path)
    assert main(["train", "--preset", "tiny", "--store", str(store), "--backbone", str(backbone), "--print-config"]) == 0
    text = capsys.readouterr().out
    assert f"backbone: {backbone}" in text and "d_model: 64" in text and "n_layers: 4" in text
    assert "cca_layers:\n  - 2\n" in text  # the default: every third upper layer


def test_a_few_updates_teach_cca_to_read_a_copy_beyond_the_window():
    """A block of 48 random tokens repeated: the second copy lies beyond the 17..32-token window of the first, so only
    retrieval can bring it; with the matching chunks supplied as neighbours, 30 updates of the new parts alone lower
    the loss on the repeated part well below the frozen backbone's."""
    torch.manual_seed(0)
    model = RetrofitRPT(retrofit_config("retro", n_neighbors=1), seed=0, backbone=tiny_llama()).train()
    block = torch.randint(3, 256, (1, 48))
    x = torch.cat([block, block, block[:, :32]], 1)  # [1, 128]: chunk c >= 6 repeats chunk c - 6
    C = x.shape[1] // 8
    ids = torch.full((1, C, 1), -1)
    ids[:, 6:, 0] = torch.arange(C - 6)  # chunk c's neighbour: c - 6 with its continuation c - 5, what chunk c+1 repeats
    mask = torch.zeros_like(x, dtype=torch.bool)
    mask[:, 56:] = True  # targets from the second copy on

    def loss() -> torch.Tensor:
        return model(x, neighbor_ids=ids, labels=x.masked_fill(~mask, -100)).loss

    opt = torch.optim.AdamW([p for _, p in model.new_parameters()], lr=3e-3)
    with torch.no_grad():
        before = float(loss())
    for _ in range(30):
        opt.zero_grad()
        loss().backward()
        opt.step()
    with torch.no_grad():
        after = float(loss())
    assert after < 0.85 * before, (before, after)


def test_the_run_records_the_corpus_and_tokenizer_its_store_was_built_from(retrofit_run):
    """config.yaml's data section, and every checkpoint's config, name what `rpt prepare` built the store from (its
    prepare.json), not the preset's defaults (bpe:2048, stdlib)."""
    import json

    from rpt.config import RPTConfig

    store, run = retrofit_run
    built = json.loads((store / "prepare.json").read_text())
    data = RPTConfig.from_yaml(run / "config.yaml").data
    assert (data.corpus, data.tokenizer) == (built["corpus"]["spec"], built["tokenizer"]["name"])
    assert "llama" in data.tokenizer and data.corpus.endswith("corpus") and data.store == str(store)
    from rpt.checkpoint import checkpoint_config, resolve_checkpoint

    saved = checkpoint_config(resolve_checkpoint(str(run))).data  # what an eval result of the checkpoint records
    assert (saved.corpus, saved.tokenizer) == (data.corpus, data.tokenizer)
