"""The shared-prefix scorer (rpt/labels/scorer.py) gives HFScorer's target scores with fewer tokens run."""

from __future__ import annotations

import numpy as np
import pytest
from retrofit_helpers import tiny_llama

from rpt.labels.scorer import HFScorer, SharedPrefixScorer, target_scores

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


@pytest.mark.parametrize("batch_size", [3, 64])
def test_shared_prefixes_give_the_unshared_scores(batch_size):
    tok = byte_bpe()
    model = tiny_llama(vocab=len(tok))
    ids = np.asarray(tok(TEXT, add_special_tokens=False)["input_ids"])
    M = 8
    C = len(ids) // M
    chunks = ids[: C * M].reshape(C, M)
    rng = np.random.default_rng(0)
    queries = np.arange(4, min(C - 1, 16))
    cands = np.full((len(queries), 4), -1)
    for r, i in enumerate(queries):
        pick = rng.choice(i - 1, size=min(4, i - 1), replace=False)  # j + 1 < i
        cands[r, : len(pick)] = pick

    def decode(rows):
        return [tok.decode(r) for r in rows]

    plain = HFScorer(model, tok, "tiny", device="cpu", batch_size=batch_size)
    shared = SharedPrefixScorer(model, tok, "tiny", device="cpu", batch_size=batch_size)
    a = target_scores(plain, chunks, queries, cands, 0, decode)
    b = target_scores(shared, chunks, queries, cands, 0, decode)
    np.testing.assert_allclose(b, a, atol=1e-4, rtol=1e-4)
    assert np.isfinite(a[cands >= 0]).all()
    assert shared.tokens_processed + shared.prefix_tokens < 0.8 * plain.tokens_processed
