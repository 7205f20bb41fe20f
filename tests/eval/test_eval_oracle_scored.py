"""The oracle is a ceiling only where its gold was scored: with labels, `rpt eval` also reports the perplexity over the
target chunks of the query chunks whose gold was scored, and `python -m lab compare` reports a sampled gold's oracle over those
tokens only, beside no neighbours and the own source on the same tokens."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from eval_helpers import M, make_model, make_store, word_tokenizer, write_doc_labels

from lab.compare import compare, to_markdown
from rpt.config import RPTConfig
from rpt.data.store import TokenStore
from rpt.eval.perplexity import evaluate, oracle_neighbors, scored_queries, scored_sums, summarize
from rpt.labels.store import LabelStore
from rpt.model.memory import TorchMemory


def test_scored_sums_hand_case():
    # 4 query chunks: rows 1 and 3 scored; target chunks are 2 and 4 (the 5th chunk is partial)
    target = np.array([[np.nan, np.nan], [0.5, np.nan], [np.nan, np.nan], [-1.0, 2.0]], dtype=np.float32)
    assert scored_queries(target).tolist() == [False, True, False, True]
    chunk_nll, chunk_tokens = np.array([0.0, 1.0, 2.0, 4.0, 8.0]), np.array([7, 8, 8, 8, 3])
    assert scored_sums(chunk_nll, chunk_tokens, target) == {"nll_sum": 10.0, "n_targets": 11.0}
    # the last query chunk's target chunk beyond the document: nothing
    assert scored_sums(chunk_nll[:4], chunk_tokens[:4], target) == {"nll_sum": 2.0, "n_targets": 8.0}


def _sampled(labels: LabelStore, keep_every: int) -> LabelStore:
    """The same labels with the gold of all but every `keep_every`-th query chunk unscored (as --query-fraction)."""
    target = np.array(labels.target, dtype=np.float32)
    target[np.arange(len(target)) % keep_every != 0] = np.nan
    manifest = {**labels.manifest, "candidates": "all", "query_fraction": 1 / keep_every}
    return LabelStore(Path("<memory>"), np.asarray(labels.candidates), np.asarray(labels.bm25), target,
                      np.asarray(labels.chunk_offsets), manifest)


def test_a_sampled_golds_oracle_is_reported_over_its_scored_chunks(tmp_path):
    model = make_model("rpt-sem")
    tok = word_tokenizer()
    lengths = [30 * M + 3, 24 * M]
    store = TokenStore.open(make_store(tmp_path / "s", lengths, tok))
    labels = _sampled(LabelStore.open(write_doc_labels(tmp_path / "labels", lengths, tok.identity)), 3)
    out = evaluate(model, store, [0, 1], source="oracle", labels=labels, memory=TorchMemory, per_chunk=True)
    for rec in out["documents"]:
        rows = labels.rows(rec["index"])
        used = np.asarray(rec["chunks"]["neighbors"])
        scored = scored_queries(rows.target)
        assert (used[~scored] < 0).all()  # unscored query chunks: the oracle has nothing to give
        np.testing.assert_array_equal(used[scored], oracle_neighbors(rows.candidates, rows.target, 2)[scored])
        nll, toks = np.asarray(rec["chunks"]["nll"]), np.asarray(rec["chunks"]["tokens"])
        idx = np.nonzero(scored)[0] + 1
        idx = idx[idx < len(nll)]
        assert rec["scored"]["nll_sum"] == pytest.approx(nll[idx].sum())
        assert rec["scored"]["n_targets"] == toks[idx].sum() < rec["n_targets"] / 2
    total = summarize(out["sums"], out["documents"], 1.0)["total"]
    sc = total["scored"]
    want = sum(r["scored"]["nll_sum"] for r in out["documents"]) / sum(r["scored"]["n_targets"] for r in out["documents"])
    assert sc["perplexity"] == pytest.approx(math.exp(want)) and 0 < sc["token_share"] < 0.5
    # without labels there is no scored-chunk figure
    plain = evaluate(model, store, [0], source="none", memory=TorchMemory)
    assert "scored" not in plain["documents"][0] and "scored" not in summarize(plain["sums"], plain["documents"], 1.0)["total"]


def _result(source: str, seed: int, ppl: float, scored: float | None, fraction: float | None) -> dict:
    cfg = RPTConfig.from_preset("tiny", variant="rpt-sem")
    cfg.train.seed = seed
    ev = {"source": source, "n_neighbors": 2, "split": "test"}
    total = {"perplexity": ppl}
    if scored is not None:
        ev["query_fraction"] = fraction
        total["scored"] = {"perplexity": scored, "token_share": 0.2}
    return {"config": cfg.to_dict(), "step": 100, "eval": ev, "total": total, "_path": f"{source}-{seed}.json"}


def test_compare_reports_a_sampled_golds_oracle_over_the_scored_tokens_only():
    rs = []
    for seed in (0, 1):
        rs += [_result("model", seed, 100.0, 90.0 + seed, 0.25), _result("none", seed, 104.0, 99.0 + seed, 0.25),
               _result("oracle", seed, 103.0, 80.0 + seed, 0.25)]
    (row,) = compare(rs)["rows"]
    # the whole-document oracle (103) is mostly "no neighbours"; over the scored tokens it is 80.5
    assert row["oracle"][0] == pytest.approx(80.5)
    assert row["oracle_gain"][0] == pytest.approx((99 / 80 + 100 / 81) / 2)
    assert row["oracle_scope"]["own"][0] == pytest.approx(90.5) and row["oracle_scope"]["query_fraction"] == [0.25]
    text = to_markdown(compare(rs))
    assert "| 80.5 ± 0.7¹ |" in text and "over the target chunks of scored query chunks only" in text
    assert "- rpt-sem: 20.0% of tokens; own neighbours 90.5 ± 0.7, no neighbours 99.5 ± 0.7 on the same tokens" in text

    # an exhaustive gold (every query chunk scored): the whole-document oracle, unmarked
    full = [_result(src, 0, ppl, ppl - 1, 1.0) for src, ppl in (("model", 100.0), ("none", 104.0), ("oracle", 95.0))]
    (row,) = compare(full)["rows"]
    assert row["oracle"][0] == 95.0 and "oracle_scope" not in row and "¹" not in to_markdown(compare(full))
