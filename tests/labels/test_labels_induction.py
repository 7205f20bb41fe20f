"""The induction scorer (a copying LM with no parameters) against a loop-by-loop transcription of its definition, and
as `rpt label --scorer induction`: on the copy corpus its labels rank a repeat's source first."""

import math

import numpy as np
import pytest
import torch

from rpt.labels.scorer import InductionScorer, load_scorer
from rpt.utils import ArgumentError


def reference(seq: list[int], vocab: int, order: int, eps: float) -> list[float]:
    """log P(seq[i+1] | seq[:i+1]) for every i, written from the docstring's formula one position at a time."""
    out = []
    for i in range(len(seq) - 1):
        p = 1 / vocab
        for n in range(order, 0, -1):  # the longest suffix with an earlier match decides
            if i - n + 1 < 0:
                continue
            suffix = seq[i - n + 1 : i + 1]
            starts = [j for j in range(n - 1, i) if seq[j - n + 1 : j + 1] == suffix]
            if starts:
                hits = sum(seq[j + 1] == seq[i + 1] for j in starts)
                p = (1 - eps) * hits / len(starts) + eps / vocab
                break
        out.append(math.log(p))
    return out


@pytest.mark.parametrize("order,eps", [(1, 0.5), (3, 0.1), (4, 0.05)])
def test_next_token_logprobs_equal_the_definition_on_ragged_batches(order, eps):
    rng = np.random.default_rng(order)
    seqs = [list(rng.integers(0, 5, size=n)) for n in (23, 9, 31, 2)]  # a small vocabulary: many partial matches
    seqs.append([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 0, 1, 2, 3])  # a repeat, then a divergence
    scorer = InductionScorer(vocab_size=7, order=order, eps=eps)
    width = max(map(len, seqs))
    left = torch.zeros(len(seqs), width, dtype=torch.long)  # left-padded, as target_logprobs batches
    right = torch.zeros_like(left)
    for r, s in enumerate(seqs):
        left[r, width - len(s) :] = right[r, : len(s)] = torch.tensor(s)
    pos = torch.arange(width)
    lengths = torch.tensor([len(s) for s in seqs])
    lp_left = scorer.next_token_logprobs(left, pos >= width - lengths[:, None])
    lp_right = scorer.next_token_logprobs(right, pos < lengths[:, None])
    tail = scorer.next_token_logprobs(left, pos >= width - lengths[:, None], last=5)  # only the last positions
    for r, s in enumerate(seqs):
        ref = reference(s, 7, order, eps)
        np.testing.assert_allclose(lp_left[r, width - len(s) :].numpy(), ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lp_right[r, : len(s) - 1].numpy(), ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(tail[r, 5 - min(5, len(s) - 1) :].numpy(), ref[-5:], rtol=1e-5, atol=1e-6)


def test_target_logprobs_score_the_copy_of_a_candidate():
    scorer = InductionScorer(vocab_size=256, order=3, eps=0.1)
    rng = np.random.default_rng(0)
    source, other, query = (list(rng.integers(0, 256, size=8)) for _ in range(3))
    target = source[4:]  # the query ends with source's first half: the target is its second half
    query = query[:4] + source[:4]
    with_source, without = scorer.target_logprobs([source + query, other + query], [target, target])
    assert with_source.shape == (4,) and np.all(with_source > math.log(0.9))  # every token copied
    np.testing.assert_allclose(without, np.log(1 / 256), rtol=1e-6)  # nothing to copy: uniform


def test_load_scorer_needs_the_store_vocabulary_and_names_the_argument():
    assert isinstance(load_scorer("induction", store_tokenizer={"vocab_size": 300}), InductionScorer)
    with pytest.raises(ArgumentError) as e:
        load_scorer("induction")
    assert e.value.for_cli().startswith("--scorer induction: needs the store's vocabulary")


def test_rpt_label_with_the_induction_scorer_finds_every_repeat_source(tmp_path):
    from rpt.cli import main
    from rpt.data.synthetic import copy_classes
    from rpt.eval.perplexity import oracle_neighbors
    from rpt.labels.store import LabelStore
    from rpt.training.data import open_store

    store, labels = tmp_path / "store", tmp_path / "gold"
    spec = "synthetic:copy-far?docs=2&eval_docs=3&passages=8&distance=2-4&p=1"  # 128-word passages
    assert main(["prepare", "--corpus", spec, "--out", str(store), "--no-progress"]) == 0
    assert main(["label", "--store", str(store), "--split", "test", "--kind", "sem", "--span", "doc", "--segment-len",
                 "64", "--candidates", "all", "--scorer", "induction", "--out", str(labels), "--no-progress"]) == 0
    test, gold = open_store(store, "test"), LabelStore.open(labels)
    hits = tails = 0
    for d in range(len(test)):
        toks = np.asarray(test.document(d))
        chunks = toks[: len(toks) // 64 * 64].reshape(-1, 64)
        rows = gold.rows(d)
        best = oracle_neighbors(rows.candidates, rows.target, 1)[:, 0]
        for t in np.nonzero(copy_classes(toks, 128, 64) == 2)[0]:  # chunks whose source an earlier chunk continues
            j = best[t - 1]
            tails += 1
            hits += int(0 <= j < len(chunks) - 1 and np.array_equal(chunks[j + 1], chunks[t]))
    assert tails >= 6 and hits == tails  # the exhaustive gold of a copier: the source's continuation, every time


def test_every_token_id_scorer_refuses_a_target_without_context():
    from rpt.labels.scorer import CallableScorer

    def forward(ids, mask):
        return torch.zeros(*ids.shape, 8)

    for scorer in (InductionScorer(vocab_size=8), CallableScorer(forward, "zeros")):
        with pytest.raises(ValueError, match="non-empty context"):
            scorer.target_logprobs([[1, 2], []], [[3], [4]])
    # with a prefix (a BOS) an empty context is fine: the prefix is the context
    assert len(CallableScorer(forward, "zeros", prefix=[0]).target_logprobs([[]], [[4]])[0]) == 1
