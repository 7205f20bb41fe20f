"""Tiny randomly initialised Llama backbones for the retrofit tests (built here: nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import torch

from rpt.config import ModelConfig

VOCAB, WIDTH, LAYERS, HEADS, KV_HEADS = 256, 64, 4, 4, 2


def tiny_llama(seed: int = 0, tied: bool = True, layers: int = LAYERS, vocab: int = VOCAB):
    """A LlamaForCausalLM of width 64, 4 query and 2 key/value heads (grouped-query attention), random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=WIDTH, intermediate_size=2 * WIDTH, num_hidden_layers=layers,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=4096,
                      tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


def save_tiny_llama(folder: Path, seed: int = 0, tied: bool = True) -> Path:
    """tiny_llama written as a Hugging Face folder (config.json + model.safetensors)."""
    tiny_llama(seed, tied).save_pretrained(folder)
    return folder


def retrofit_config(variant: str = "rpt-sem", backbone: str = "tiny", **model) -> ModelConfig:
    """A ModelConfig describing tiny_llama: chunks of 8, segments of 16 (window 17..32 tokens), CCA in layers 2, 3."""
    fields = {"variant": variant, "vocab_size": VOCAB, "d_model": WIDTH, "n_layers": LAYERS, "n_heads": HEADS,
              "mlp_hidden": 2 * WIDTH, "chunk_size": 8, "segment_len": 16, "cca_layers": [2, 3], "n_neighbors": 2,
              "dropout": 0.0, "backbone": backbone, **model}
    return ModelConfig(**fields)


def perturb_new_parts(model, seed: int = 1, std: float = 0.2) -> None:
    """Give CCA's zero output projections (and the gate) random values, so that neighbours change the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.new_parameters():
            if name.endswith(("cca.attn.out.weight", "gate.w")):
                p.copy_(torch.randn(p.shape, generator=g) * std)
