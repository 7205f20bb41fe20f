"""The DPR-style retriever of the Table 4 ablation (App. C, rpt/retrievers/dpr.py): its training pairs are BM25's rank 1
and rank 5 among the chunks retrievable for the query, its neighbours obey the retrievable rule with bm25_neighbors'
contract, a short training teaches it to rank the positive above the hard negative, and its folders round-trip and
fail with one clear error."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent / "eval"))
from eval_helpers import M, S, V, doc_tokens, make_model, make_store, word_tokenizer  # noqa: E402

from rpt.chunks import last_retrievable, retrievable_mask  # noqa: E402
from rpt.data.store import TokenStore  # noqa: E402
from rpt.eval.perplexity import bm25_neighbors, evaluate_document  # noqa: E402
from rpt.labels.bm25 import bm25_weights, chunk_term_matrix  # noqa: E402
from rpt.outputs import MARK  # noqa: E402
from rpt.retrievers import dpr  # noqa: E402
from rpt.retrievers.dpr import DPRConfig, DPRRetriever, HFRetriever, dpr_neighbors, mine_pairs, train_dpr  # noqa: E402
from rpt.utils import UserError  # noqa: E402

TINY = {"d_model": 32, "n_layers": 1, "n_heads": 2, "mlp_hidden": 64, "proj_dim": 32}


def tiny_retriever(seed: int = 0, **kw) -> DPRRetriever:
    return DPRRetriever(DPRConfig(vocab_size=V, chunk_size=M, **{**TINY, **kw}), seed=seed).eval()


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> TokenStore:
    """10 documents of 50 chunks (chunks of 8, segments of 16): queries from chunk 8 on have five retrievable chunks."""
    return TokenStore.open(make_store(tmp_path_factory.mktemp("dpr") / "train", [400] * 9 + [405]))


@pytest.fixture(scope="module")
def trained(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("dpr-run") / "retriever"
    return train_dpr(store, out, steps=120, batch_size=32, lr=3e-3, seed=0, segment_len=S, config=TINY, log_every=20,
                     progress=False)


# --------------------------------------------------------------------------------------------------------------
# training pairs


def test_pairs_are_bm25_rank1_and_rank5_of_the_retrievable_chunks(store):
    pairs = mine_pairs(store, S)
    assert len(pairs) > 300 and pairs.chunk_size == M and pairs.n_documents == len(store)
    for d in range(len(store)):
        tokens = np.asarray(store.document(d))
        ranked = bm25_neighbors(tokens, M, S, k=5)
        mine = pairs.doc == d
        # every query with five ranked chunks, and no other, gives one pair
        assert pairs.query[mine].tolist() == np.nonzero(ranked[:, 4] >= 0)[0].tolist()
        counts = chunk_term_matrix(tokens, M)
        for q, pos, neg in zip(pairs.query[mine], pairs.positive[mine], pairs.negative[mine], strict=True):
            assert (pos, neg) == (ranked[q, 0], ranked[q, 4]) and pos != neg
            limit = int(last_retrievable(q, M, S))
            assert 0 <= pos <= limit and 0 <= neg <= limit  # both retrievable for the query
            # independently: BM25 of c_q alone with the statistics of the retrievable chunks, ranked by score (ties:
            # the later chunk first), chunks sharing no token left out
            score = (counts[q] @ bm25_weights(counts[: limit + 1]).T).toarray().ravel()
            ranking = [j for j in np.lexsort((-np.arange(limit + 1), -score)) if score[j] > 0]
            assert (ranking[0], ranking[4]) == (pos, neg)
    starts = pairs.starts(store.offsets)  # absolute offsets of (query, positive, negative) in the flat token array
    i = len(pairs) // 2
    d, q = pairs.doc[i], pairs.query[i]
    assert np.array_equal(store.tokens[starts[i, 0] : starts[i, 0] + M], store.document(d)[q * M : (q + 1) * M])
    # deterministic; a seeded subset of documents
    again = mine_pairs(store, S)
    assert all(np.array_equal(getattr(pairs, f), getattr(again, f)) for f in ("doc", "query", "positive", "negative"))
    sub = mine_pairs(store, S, max_documents=3, seed=1)
    assert len(set(sub.doc.tolist())) == 3 and np.array_equal(sub.doc, mine_pairs(store, S, max_documents=3, seed=1).doc)


# --------------------------------------------------------------------------------------------------------------
# neighbours at evaluation


def test_dpr_neighbors_obey_the_retrievable_rule_and_the_bm25_contract():
    r = tiny_retriever()
    tokens = doc_tokens(8 * 37 + 5, seed=3)  # 37 chunks and a partial one (dropped)
    C, k = 37, 4
    ids = dpr_neighbors(r, tokens, M, S, k)
    assert ids.shape == (C, k) and ids.dtype == np.int64
    mask = retrievable_mask(C, M, S).numpy()
    n_allowed = mask.sum(1)
    for i in range(C):
        row = ids[i]
        got = row[row >= 0]
        assert len(got) == min(k, n_allowed[i])  # -1 only where fewer than k chunks are retrievable
        assert np.all(row[len(got):] == -1) and len(set(got.tolist())) == len(got)
        assert mask[i, got].all()  # nothing at or after the rule's limit, ever
    assert np.all(ids[: 2 * (S // M)] == -1) and (ids >= 0).any()
    # best first by inner product of query and passage embeddings (brute force over the whole document)
    chunks = tokens[: C * M].reshape(C, M)
    scores = (r.embed(chunks, "query") @ r.embed(chunks, "passage").T).numpy()
    scores[~mask] = -np.inf
    for i in np.nonzero(n_allowed >= k)[0]:
        assert ids[i].tolist() == np.argsort(-scores[i], kind="stable")[:k].tolist()
    assert np.array_equal(ids, dpr_neighbors(r, tokens, M, S, k))  # deterministic
    assert np.array_equal(dpr_neighbors(r, tokens, M, S, 2, batch_size=5), ids[:, :2])  # batching changes nothing
    # the neighbours feed evaluate_document as the bm25 source does
    ev = evaluate_document(make_model("retro"), tokens, neighbor_ids=ids[:, :2], n_neighbors=2)
    assert np.isfinite(ev.nll_sum) and np.array_equal(ev.neighbors, ids[:, :2])
    with pytest.raises(UserError, match="chunks of 8"):
        dpr_neighbors(r, tokens, 16, 32, k)
    with pytest.raises(UserError, match="outside its vocabulary"):
        dpr_neighbors(r, np.full(8 * 10, V + 3), M, S, k)
    assert dpr_neighbors(r, tokens[:20], M, S, k).shape == (2, k)


# --------------------------------------------------------------------------------------------------------------
# training


def test_training_ranks_the_positive_above_the_hard_negative(store, trained):
    pairs = mine_pairs(store, S)
    starts = pairs.starts(store.offsets)
    untrained = [dpr.pair_accuracy(tiny_retriever(seed=s), store.tokens, starts, M) for s in (0, 1)]
    acc = dpr.pair_accuracy(trained.retriever, store.tokens, starts, M)
    assert all(0.35 < a < 0.65 for a in untrained), untrained  # two independent random towers: chance
    assert acc > 0.85, acc
    # the folder: complete, no partial left, a log with loss and accuracies
    out = trained.path
    assert sorted(p.name for p in out.iterdir() if p.name != MARK) == ["dpr.json", "model.safetensors", "train_log.jsonl"]
    assert not out.with_name(f".{out.name}.partial").exists()
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(20, 121, 20))
    assert log[-1]["loss"] < log[0]["loss"] and {"in_batch_acc", "hard_acc", "lr"} <= set(log[0])
    meta = json.loads((out / "dpr.json").read_text())
    assert meta["config"]["vocab_size"] == V and meta["tokenizer"] == store.tokenizer_id
    assert meta["training"]["n_pairs"] == len(pairs) and meta["training"]["negative_rank"] == 5
    with pytest.raises(UserError, match="already holds a DPR retriever"):
        train_dpr(store, out, steps=1, segment_len=S, config=TINY, progress=False)


def test_an_interrupted_training_leaves_no_retriever_folder(store, tmp_path, monkeypatch):
    calls = []

    def boom(*a, **kw):
        calls.append(1)
        raise KeyboardInterrupt

    monkeypatch.setattr(dpr, "contrastive_step", boom)
    with pytest.raises(KeyboardInterrupt):
        train_dpr(store, tmp_path / "r", steps=5, segment_len=S, config=TINY, progress=False)
    assert calls and not (tmp_path / "r").exists()
    with pytest.raises(UserError, match="no DPR retriever .*interrupted"):
        DPRRetriever.load(tmp_path / "r")


# --------------------------------------------------------------------------------------------------------------
# folders and errors


@pytest.mark.parametrize("shared", [False, True])
def test_save_load_round_trip_gives_identical_embeddings(tmp_path, shared):
    r = tiny_retriever(seed=4, shared=shared)
    r.meta = {"tokenizer": word_tokenizer().identity}
    chunks = doc_tokens(8 * 12, seed=5).reshape(12, M)
    r.save(tmp_path / "r")
    back = DPRRetriever.load(tmp_path / "r")
    assert isinstance(back, DPRRetriever) and back.cfg == r.cfg and back.meta["tokenizer"] == r.meta["tokenizer"]
    assert (back.passage_encoder is back.query_encoder) == shared
    for which in ("query", "passage"):
        assert torch.equal(back.embed(chunks, which), r.embed(chunks, which))
    assert not torch.equal(r.embed(chunks, "query"), r.embed(chunks, "passage")) or shared
    r.save(tmp_path / "r")  # saving again replaces it
    assert DPRRetriever.load(tmp_path / "r").cfg == r.cfg


def test_bad_folders_are_one_clear_error(tmp_path):
    with pytest.raises(UserError, match=f"no DPR retriever at {tmp_path / 'missing'}"):
        DPRRetriever.load(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="empty: dpr.json is missing"):
        DPRRetriever.load(tmp_path / "empty")
    tiny_retriever().save(tmp_path / "r")
    (tmp_path / "r" / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(UserError, match="does not match the size and sha256"):
        DPRRetriever.load(tmp_path / "r")
    (tmp_path / "r" / "dpr.json").write_text("{")
    with pytest.raises(UserError, match="dpr.json cannot be read"):
        DPRRetriever.load(tmp_path / "r")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="did not write"):
        tiny_retriever().save(tmp_path / "other")  # never replaces a folder of something else
    assert (tmp_path / "other" / "notes.txt").exists()


def test_store_checks(store, trained, tmp_path):
    trained.retriever.check_store(store)
    other = TokenStore.open(make_store(tmp_path / "other", [400], tokenizer=word_tokenizer(tag="x")))
    with pytest.raises(UserError, match="trained on a store tokenized with"):
        trained.retriever.check_store(other)
    # hf: encoders read the store's ids: the store must be tokenized with the encoder's own tokenizer
    hf = HFRetriever(nn.Linear(1, 1), SimpleNamespace(), "org/encoder")
    hf.check_store(SimpleNamespace(tokenizer_id={"name": "org/encoder", "hash": "h"}, path=tmp_path))
    with pytest.raises(UserError, match="tokenized with word-w-64, not org/encoder"):
        hf.check_store(store)


def test_hf_encoders_that_cannot_load_are_one_user_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="hf:nobody/no-such-encoder: not a local folder, not in the local Hugging Face"):
        DPRRetriever.load("hf:nobody/no-such-encoder")
    with pytest.raises(UserError, match="no such folder"):
        DPRRetriever.load(f"hf:{tmp_path / 'absent'}")
    with pytest.raises(UserError, match="give an encoder name"):
        DPRRetriever.load("hf:")
    (tmp_path / "not-a-model").mkdir()
    with pytest.raises(UserError, match="cannot be loaded"):
        DPRRetriever.load(f"hf:{tmp_path / 'not-a-model'}")
