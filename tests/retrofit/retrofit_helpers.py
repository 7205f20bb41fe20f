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


TEXT = ("def add(a, b):\n    return a + b\n\nclass Point:\n    def __init__(self, x, y):\n        self.x = x\n"
        "        self.y = y\n\n    def norm(self):\n        return (self.x ** 2 + self.y ** 2) ** 0.5\n") * 6


def byte_bpe(vocab: int = 300):
    """A byte-level BPE trained on TEXT that puts BOS (id 1) before every text, as Llama's tokenizers do."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<pad>", "<s>", "</s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def small_retrofit_run(tmp_path: Path) -> tuple[Path, Path]:
    """A retrofit of a tiny random Llama with its own tokenizer (`byte_bpe`): a token store of three documents and
    an rpt-lex run of two updates; returns (store, run)."""
    import rpt

    tok = byte_bpe()
    backbone = tmp_path / "llama"
    tiny_llama(vocab=len(tok)).save_pretrained(backbone)
    tok.save_pretrained(backbone)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for n in range(3):
        (corpus / f"m{n}.py").write_text(f"# {n}\n" + TEXT)
    store = tmp_path / "store"
    rpt.prepare(corpus, store, tokenizer=str(backbone), chunk_size=8, splits=["train"])
    labels = rpt.label(store, "train", kind="lex", span=64, segment_len=16, k=4)
    run = tmp_path / "run"
    rpt.train("tiny", store, run, labels=labels, backbone=str(backbone), variant="rpt-lex", steps=2,
              **{"model.chunk_size": 8, "model.segment_len": 16, "data.seq_len": 64,
                 "model.dropout": 0.0, "model.cca_layers": [2, 3], "train.warmup_steps": 1,
                 "train.alpha_ramp_steps": 1, "batch_size": 2})
    return store, run
