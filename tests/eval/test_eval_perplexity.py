"""Perplexity with document memory: equal to a plain full forward on a short document, reset at document boundaries,
valid neighbours from every source, BM25 that never sees the target, oracle = the scorer's best positives."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from eval_helpers import M, S, doc_tokens, make_model, make_store, word_tokenizer, write_doc_labels

from rpt.chunks import last_retrievable
from rpt.data.store import TokenStore
from rpt.eval.perplexity import bm25_neighbors, check_source, default_source, evaluate, evaluate_document, oracle_neighbors, shard
from rpt.labels.bm25 import bm25_candidates
from rpt.labels.store import LabelStore
from rpt.model.memory import TorchMemory
from rpt.utils import UserError


def full_forward_nll(model, toks: np.ndarray, neighbor_ids=None) -> tuple[float, int]:
    x = torch.as_tensor(toks, dtype=torch.long)[None]
    nb = None if neighbor_ids is None else torch.as_tensor(neighbor_ids)[None]
    with torch.no_grad():
        logits = model(x, neighbor_ids=nb).logits[0]
    return float(F.cross_entropy(logits[:-1], x[0, 1:], reduction="sum")), x.shape[1] - 1


@pytest.mark.parametrize("variant", ["rpt-sem", "xl", "retro"])
def test_short_document_equals_a_plain_full_forward(variant):
    """A document that fits in one training sequence: segment-by-segment evaluation with the document memory gives
    exp(mean NLL) of model(input_ids) (retro: both fed the same BM25 neighbours)."""
    model = make_model(variant)
    toks = doc_tokens(12 * M + 3, seed=2)  # 12 full chunks and a ragged end, 7 segments
    nb = bm25_neighbors(toks, M, S, 2) if variant == "retro" else None
    ev = evaluate_document(model, toks, neighbor_ids=nb, memory=TorchMemory)
    ref, n = full_forward_nll(model, toks, nb)
    assert ev.n_targets == n == len(toks) - 1
    assert math.isclose(math.exp(ev.nll_sum / ev.n_targets), math.exp(ref / n), rel_tol=1e-5)
    assert ev.chunk_tokens.sum() == n and ev.chunk_tokens[0] == M - 1  # token 0 is never predicted
    if variant == "rpt-sem":
        with torch.no_grad():
            full_ids = model(torch.as_tensor(toks)[None]).neighbor_ids[0].numpy()
        np.testing.assert_array_equal(ev.neighbors, full_ids[: len(ev.neighbors)])


def test_neighbours_at_inference_k_override():
    model = make_model("rpt-sem")
    toks = doc_tokens(20 * M, seed=4)
    for K in (2, 3, 4):
        ev = evaluate_document(model, toks, n_neighbors=K, memory=TorchMemory)
        assert ev.neighbors.shape == (20, K)
        assert (ev.neighbors[12] >= 0).all()  # chunk 12 has chunks 0..8 to choose from


def test_memory_and_caches_reset_at_document_boundaries(tmp_path):
    """Evaluating document A then B gives B exactly what B alone gives; carrying A's cache into B would not."""
    model = make_model("rpt-sem")
    store = TokenStore.open(make_store(tmp_path / "s", [17 * M + 5, 21 * M + 2]))
    both = evaluate(model, store, [0, 1], memory=TorchMemory, per_chunk=True)["documents"]
    alone = evaluate(model, store, [1], memory=TorchMemory, per_chunk=True)["documents"]
    assert both[1]["nll_sum"] == alone[0]["nll_sum"] and both[1]["chunks"] == alone[0]["chunks"]
    assert both[1]["memory_bytes"] == alone[0]["memory_bytes"]
    # the test has teeth: one cache across both documents changes B's NLL and lets B retrieve from A
    a, b = (torch.as_tensor(np.asarray(store.document(d), dtype=np.int64))[None] for d in (0, 1))
    cache = model.new_cache(TorchMemory)
    model.step(a, cache)
    carried = model.step(b, cache)
    nll = F.cross_entropy(carried.logits[0, :-1], b[0, 1:], reduction="sum")
    assert not math.isclose(float(nll), both[1]["nll_sum"], rel_tol=1e-6)


def _assert_retrievable(ids: np.ndarray) -> None:
    lim = last_retrievable(np.arange(len(ids)), M, S)
    assert ((ids == -1) | ((ids >= 0) & (ids <= lim[:, None]))).all()


def test_bm25_source_neighbours_are_bm25_of_the_query_chunk_and_retrievable():
    model = make_model("retro")
    toks = doc_tokens(26 * M, seed=5)
    nb = bm25_neighbors(toks, M, S, 2)
    ev = evaluate_document(model, toks, neighbor_ids=nb, memory=TorchMemory)
    np.testing.assert_array_equal(ev.neighbors, nb)  # nothing dropped: BM25 only offers retrievable chunks
    assert (ev.neighbors >= 0).sum() > 20
    _assert_retrievable(ev.neighbors)


def test_bm25_never_sees_the_target_or_later_chunks():
    """Causal statistics: changing chunks i+1.. changes no neighbour of query chunk i (the query is c_i alone)."""
    toks = doc_tokens(26 * M, seed=6)
    ref = bm25_neighbors(toks, M, S, 4)
    rng = np.random.default_rng(0)
    for i in (6, 11, 18, 24):
        changed = toks.copy()
        changed[(i + 1) * M :] = rng.integers(1, 64, size=len(toks) - (i + 1) * M)
        np.testing.assert_array_equal(bm25_neighbors(changed, M, S, 4)[: i + 1], ref[: i + 1])


def test_bm25_document_statistics_are_bm25_candidates_with_the_chunk_query():
    toks = doc_tokens(26 * M, seed=7)
    ids, _ = bm25_candidates(toks, M, S, k=3, query="chunk")
    np.testing.assert_array_equal(bm25_neighbors(toks, M, S, 3, statistics="document"), ids)
    _assert_retrievable(bm25_neighbors(toks, M, S, 3))


def test_oracle_neighbours_hand_case():
    cand = np.array([[4, 2, 7, -1], [3, 1, -1, -1], [-1, -1, -1, -1]])
    target = np.array([[0.5, 2.0, -1.0, np.nan], [-0.3, -0.1, np.nan, np.nan], [np.nan] * 4], dtype=np.float32)
    # the default: the scorer's top k of the scored candidates, positives first; nothing where nothing was scored
    np.testing.assert_array_equal(oracle_neighbors(cand, target, 2), [[2, 4], [1, 3], [-1, -1]])
    np.testing.assert_array_equal(oracle_neighbors(cand, target, 6)[0], [2, 4, 7, -1, -1, -1])
    # only the positives (s_t > 0): fewer than k where fewer exist
    np.testing.assert_array_equal(oracle_neighbors(cand, target, 2, "positives"), [[2, 4], [-1, -1], [-1, -1]])
    np.testing.assert_array_equal(oracle_neighbors(cand, target, 6, "positives")[0], [2, 4, -1, -1, -1, -1])
    with pytest.raises(UserError, match="oracle"):
        oracle_neighbors(cand, target, 2, "best")


def test_oracle_source_feeds_the_scorer_best_candidates(tmp_path):
    model = make_model("rpt-sem")
    tok = word_tokenizer()
    lengths = [26 * M + 3]
    store = TokenStore.open(make_store(tmp_path / "s", lengths, tok))
    labels = LabelStore.open(write_doc_labels(tmp_path / "labels", lengths, tok.identity))
    rows = labels.rows(0)
    expected = oracle_neighbors(rows.candidates, rows.target, 2)
    out = evaluate(model, store, [0], source="oracle", labels=labels, memory=TorchMemory, per_chunk=True)
    used = np.asarray(out["documents"][0]["chunks"]["neighbors"])
    np.testing.assert_array_equal(used, expected)
    assert (used >= 0).sum() > 10
    _assert_retrievable(used)
    # every query chunk with K scored candidates gets K neighbours; with "positives" those without enough positives
    # get fewer, and the rest the same
    scored = (np.isfinite(rows.target) & (rows.candidates >= 0)).sum(1)
    assert (used[scored >= 2] >= 0).all()
    pos = evaluate(model, store, [0], source="oracle", labels=labels, memory=TorchMemory, per_chunk=True,
                   oracle="positives")
    used_pos = np.asarray(pos["documents"][0]["chunks"]["neighbors"])
    np.testing.assert_array_equal(used_pos, oracle_neighbors(rows.candidates, rows.target, 2, "positives"))
    few = ((rows.target > 0) & (rows.candidates >= 0)).sum(1) < 2
    assert few.any() and (used_pos[few] < 0).any() and (used_pos[~few] == used[~few]).all()
    t = np.where(np.isnan(rows.target), -np.inf, rows.target)
    for i, row in enumerate(used_pos):  # with "positives", each used neighbour is a positive
        for j in row[row >= 0]:
            assert t[i][list(rows.candidates[i]).index(j)] > 0
    for i, row in enumerate(used):  # by default, the best scored: none of the unused scores above a used one
        st = [t[i][list(rows.candidates[i]).index(j)] for j in row[row >= 0]]
        rest = [x for j, x in zip(rows.candidates[i], t[i], strict=True) if j >= 0 and j not in row]
        assert st == sorted(st, reverse=True) and (not st or not rest or min(st) >= max(rest))


def test_none_source_gives_empty_neighbours_and_differs_from_model(tmp_path):
    model = make_model("rpt-sem")
    store = TokenStore.open(make_store(tmp_path / "s", [20 * M]))
    none = evaluate(model, store, [0], source="none", memory=TorchMemory, per_chunk=True)["documents"][0]
    own = evaluate(model, store, [0], source="model", memory=TorchMemory)["documents"][0]
    assert (np.asarray(none["chunks"]["neighbors"]) == -1).all()
    assert none["nll_sum"] != own["nll_sum"]


def test_sources_per_variant():
    variants = ("xl", "retro", "rpt-lex", "rpt-sem", "memorizing", "block-recurrent", "griffin")
    assert [default_source(v) for v in variants] == ["none", "bm25", "model", "model", "none", "none", "none"]
    with pytest.raises(UserError, match="xl has no chunked cross-attention"):
        check_source("xl", "bm25")
    for v in ("memorizing", "block-recurrent", "griffin"):  # the baselines read no neighbours
        with pytest.raises(UserError, match=f"{v} has no chunked cross-attention"):
            check_source(v, "dpr")
    with pytest.raises(UserError, match="retro has no retriever"):
        check_source("retro", "model")
    check_source("rpt-sem", "dpr")  # a DPR-style retriever's neighbours (--retriever) for any variant with CCA
    with pytest.raises(UserError, match="must be one of"):
        check_source("rpt-sem", "colbert")


def test_shards_cover_every_document_once():
    docs = list(range(11))
    parts = [shard(docs, r, 3) for r in range(3)]
    assert sorted(d for p in parts for d in p) == docs and parts[0] == [0, 3, 6, 9]


def test_metrics_and_overlap_sums(tmp_path):
    """--metrics: the model's own top-20 and BM25's (query c_q) scored against the labels, side by side."""
    model = make_model("rpt-sem")
    tok = word_tokenizer()
    lengths = [26 * M, 18 * M + 4]
    store = TokenStore.open(make_store(tmp_path / "s", lengths, tok))
    labels = LabelStore.open(write_doc_labels(tmp_path / "labels", lengths, tok.identity))
    out = evaluate(model, store, [0, 1], labels=labels, memory=TorchMemory, with_metrics=True)
    sums = out["sums"]
    n_pos = sum(int((np.nan_to_num(labels.rows(d).target, nan=-1) > 0).any(1).sum()) for d in (0, 1))
    # each document carries its own metric sums (python -m lab compare's per-document intervals): they add up to the totals
    for name in ("model", "bm25", "recency", "random", "oracle"):
        for key in ("precision@2", "recall@10", "ndcg@20", "n_queries"):
            per_doc = [d["metrics"][name][key] for d in out["documents"]]
            assert len(per_doc) == 2 and sum(per_doc) == pytest.approx(sums[f"metrics.{name}.{key}"])
    for name in ("model", "bm25"):
        assert sums[f"metrics.{name}.n_queries"] == n_pos > 0
        for key in ("precision@2", "recall@10", "ndcg@20"):
            assert 0 <= sums[f"metrics.{name}.{key}"] <= n_pos
        assert sums[f"overlap.{name}.n"] > 0
        assert 0 <= sums[f"overlap.{name}.query"] <= M * sums[f"overlap.{name}.n"]
    with pytest.raises(UserError, match=r"with_metrics: needs labels=\.\.\."):
        evaluate(model, store, [0], with_metrics=True)


def test_bf16_autocast_is_close_to_fp32():
    model = make_model("rpt-sem")
    toks = doc_tokens(12 * M, seed=8)
    a = evaluate_document(model, toks, memory=TorchMemory)
    b = evaluate_document(model, toks, memory=TorchMemory, autocast_dtype=torch.bfloat16)
    assert b.n_targets == a.n_targets and math.isfinite(b.nll_sum)
    assert b.nll_sum == pytest.approx(a.nll_sum, rel=2e-2)


@pytest.mark.gpu
def test_gpu_evaluation_equals_cpu():
    """On a GPU: the torch memory (auto) and the Faiss memory (CPU index, CUDA queries) give the CPU result."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from rpt.model.memory import FaissMemory, make_memory

    model = make_model("rpt-sem")
    toks = doc_tokens(30 * M + 5, seed=9)
    ref = evaluate_document(model, toks, memory=TorchMemory, retrieve_k=6)
    gpu = model.cuda()
    assert make_memory("auto", "cuda") is TorchMemory
    for mem in (TorchMemory, FaissMemory):
        ev = evaluate_document(gpu, toks, memory=mem, retrieve_k=6)
        np.testing.assert_array_equal(ev.neighbors, ref.neighbors)
        np.testing.assert_allclose(ev.chunk_nll, ref.chunk_nll, rtol=1e-4, atol=1e-4)
