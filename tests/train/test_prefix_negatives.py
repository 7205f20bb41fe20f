"""Negatives from beyond the span (train.prefix_negatives): the document's tokens before a training sequence, their
chunks scored by every query chunk as extra non-candidates of the ranking loss."""

import json
from pathlib import Path

import pytest
import torch
from train_helpers import make_labels, tiny_config

from rpt.chunks import retrievable_mask
from rpt.config import ConfigError, RPTConfig
from rpt.model.rpt import RPT
from rpt.training.data import PAD_ID, SequenceDataset, open_store
from rpt.training.loop import prepare, train
from rpt.training.losses import count_pairs


def test_the_prefix_is_the_documents_tokens_before_the_sequence_right_aligned(corpus):
    ds = SequenceDataset(open_store(corpus["root"]), 64, 8, 16, prefix_len=48)
    doc0 = ds.store.document(0)
    rows = [tuple(int(v) for v in r) for r in ds.index]
    first, second, third = (rows.index((0, s, n)) for s, n in ((0, 64), (64, 64), (128, 32)))
    ids, mask = ds.prefix(first)  # a document's first sequence has nothing before it
    assert not mask.any() and (ids == PAD_ID).all()
    ids, mask = ds.prefix(second)  # 64 tokens before it, of which the last 48
    assert mask.all() and ids.tolist() == doc0[16:64].tolist()
    ids, mask = ds.prefix(third)
    assert ids.tolist() == doc0[80:128].tolist()
    batch = ds.collate([first, second])
    assert batch.prefix_ids.shape == (2, 48) and batch.prefix_mask[1].all() and not batch.prefix_mask[0].any()
    with pytest.raises(ValueError, match="multiple of segment_len"):
        SequenceDataset(open_store(corpus["root"]), 64, 8, 16, prefix_len=40)


def test_the_retrievable_rule_holds_across_the_sequence_start():
    """Columns -Cp..-1 of the extended mask are the rule applied to the chunks just before the sequence: the same as
    the mask of one longer sequence that holds both (whole segments before chunk 0)."""
    C, Cp, M, S = 12, 6, 8, 16
    whole = retrievable_mask(Cp + C, M, S)
    assert torch.equal(retrievable_mask(C, M, S, n_before=Cp), whole[Cp:])
    assert torch.equal(retrievable_mask(C, M, S, n_before=0), retrievable_mask(C, M, S))


def _model(seed: int = 0) -> RPT:
    cfg = tiny_config(Path("unused"))
    return RPT(cfg.model, seed=seed).eval()


def test_prefix_scores_are_the_scores_of_one_longer_sequence():
    """With the queries fixed (a constant projection), the score of a prefix chunk is its key, and its key depends
    only on tokens up to its own end: the prefix scores equal the scores of the same chunks in one forward over
    prefix + sequence, entry for entry, and are -inf exactly where that sequence's retrievable rule says so."""
    torch.manual_seed(0)
    model = _model()
    model.retriever.queries = lambda pooled: torch.ones_like(pooled)
    P, T = 48, 64
    ids = torch.randint(1, 64, (2, P + T))
    out = model(ids[:, P:], prefix_ids=ids[:, :P], prefix_mask=torch.ones(2, P, dtype=torch.bool))
    joint = model(ids)
    Cp, C = P // 8, T // 8
    want = joint.retrieval_scores[:, Cp:, :Cp]
    assert out.prefix_scores.shape == (2, C, Cp)
    assert torch.equal(torch.isfinite(out.prefix_scores), torch.isfinite(want))
    assert torch.isfinite(want).any()
    fin = torch.isfinite(want)
    torch.testing.assert_close(out.prefix_scores[fin], want[fin], rtol=1e-5, atol=1e-5)
    # a prefix of 32 real tokens (right-aligned after 16 of padding) scores as the sequence that starts 32 tokens back
    mask = torch.zeros(2, P, dtype=torch.bool)
    mask[:, 16:] = True
    part = model(ids[:, P:], prefix_ids=ids[:, :P], prefix_mask=mask).prefix_scores
    want = model(ids[:, 16:]).retrieval_scores[:, 4:, :4]
    assert torch.isinf(part[..., :2]).all() and torch.equal(torch.isfinite(part[..., 2:]), torch.isfinite(want))
    fin = torch.isfinite(want)
    torch.testing.assert_close(part[..., 2:][fin], want[fin], rtol=1e-5, atol=1e-5)


def test_a_partial_prefix_masks_its_padding_and_no_gradient_reaches_its_states():
    torch.manual_seed(1)
    model = _model().train()
    P, T = 48, 64
    seq = torch.randint(1, 60, (2, T))
    prefix = torch.full((2, P), 63)  # token 63 appears only in the prefix
    mask = torch.zeros(2, P, dtype=torch.bool)
    mask[0, 16:] = True  # 32 real tokens, right-aligned; sequence 1 has no prefix
    out = model(seq, prefix_ids=prefix, prefix_mask=mask)
    s = out.prefix_scores
    assert torch.isinf(s[1]).all() and torch.isinf(s[0, :, :2]).all()  # padding chunks are never retrievable
    assert torch.isfinite(s[0, -1, 2:4]).all()  # the last query chunk may retrieve the real prefix chunks
    s[torch.isfinite(s)].sum().backward()
    assert model.retriever.k_proj.weight.grad.abs().sum() > 0  # the key projection learns from the prefix's keys
    assert model.embed.weight.grad[63].abs().sum() == 0  # the prefix's states are computed without gradient
    with pytest.raises(ValueError, match="whole segments"):
        bad = torch.zeros(2, P, dtype=torch.bool)
        bad[:, 40:] = True
        model(seq, prefix_ids=prefix, prefix_mask=bad)


def test_prepare_adds_the_prefix_chunks_to_every_pool_as_non_candidates(corpus):
    """Each positive of a query gains one pair per prefix chunk that query may retrieve; no prefix chunk is a
    positive, and a sequence whose document starts with it gains nothing."""
    labels = make_labels(corpus["lengths"], 64, 8, 16)
    cfg = tiny_config(corpus["tmp"], variant="rpt-sem")
    plain = SequenceDataset(open_store(corpus["root"]), 64, 8, 16, labels)
    ext = SequenceDataset(open_store(corpus["root"]), 64, 8, 16, labels, prefix_len=32)
    idx = [1, 0]  # doc 0's second sequence (a full prefix) and its first (none)
    assert int(plain.index[1][1]) == 64 and int(plain.index[0][1]) == 0
    a = prepare(plain.collate(idx), cfg.model, 1.0, 0, torch.device("cpu"))
    b = prepare(ext.collate(idx), cfg.model, 1.0, 0, torch.device("cpu"))
    assert b.relevance.shape == (2, 8, 4 + 8) and not b.positive[..., :4].any()
    assert torch.equal(b.positive[..., 4:], a.positive) and set(b.model_kwargs) >= {"prefix_ids", "prefix_mask"}
    allowed = retrievable_mask(8, 8, 16, n_before=4)[:, :4].sum(-1)  # prefix chunks each query may retrieve
    n_pos = (a.positive & a.retrievable).sum(-1)  # [2, 8]
    extra = count_pairs(b.relevance, b.positive, b.retrievable) - count_pairs(a.relevance, a.positive, a.retrievable)
    assert extra.item() == (n_pos[0] * allowed).sum().item() > 0  # sequence 0 only: sequence 1 has no prefix


def test_training_with_prefix_negatives_logs_larger_pools(corpus):
    """A short rpt-sem run with 32 tokens of prefix: more ranking pairs per update than the same run without, and
    the same LM loss at the first update (the prefix changes only the ranking loss)."""
    def run(prefix: int, name: str) -> list[dict]:
        cfg = tiny_config(corpus["tmp"] / name, steps=2, prefix_negatives=prefix)
        train(cfg, corpus["root"], corpus["labels"], progress=False)
        return [json.loads(x) for x in (corpus["tmp"] / name / "run" / "log.jsonl").read_text().splitlines()]

    with_prefix, without = run(32, "with"), run(0, "without")
    assert sum(r["ret_pairs"] for r in with_prefix) > sum(r["ret_pairs"] for r in without)
    assert with_prefix[0]["lm_loss"] == pytest.approx(without[0]["lm_loss"], abs=1e-6)


def test_prefix_negatives_must_be_whole_segments():
    with pytest.raises(ConfigError, match="prefix_negatives"):
        RPTConfig.from_yaml("preset: tiny\ntrain:\n  prefix_negatives: 100\n")
