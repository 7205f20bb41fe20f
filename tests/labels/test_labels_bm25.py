"""BM25 candidates: equal to bm25s (Lucene) and rank_bm25 on a toy corpus and on real code; the retrievable rule."""

import importlib.util
import math

import numpy as np
import pytest
from labels_helpers import json_package_text

from rpt.chunks import last_retrievable, retrievable_mask_np
from rpt.labels.bm25 import bm25_candidates, bm25_scores, topk_rows

K1, B = 1.5, 0.75
# the independent implementations the scores are compared with (the test extra); only the tests that compare need them
needs_references = pytest.mark.skipif(
    importlib.util.find_spec("bm25s") is None or importlib.util.find_spec("rank_bm25") is None,
    reason="bm25s and rank_bm25 not installed (pip install -e .[bench])")


def lucene_okapi(chunks: list[list[int]], k1: float, b: float):
    """rank_bm25's Okapi with the Lucene idf; its scores are then (k1 + 1) x Lucene's."""
    import rank_bm25

    class LuceneOkapi(rank_bm25.BM25Okapi):
        def _calc_idf(self, nd):
            for word, freq in nd.items():
                self.idf[word] = math.log(1 + (self.corpus_size - freq + 0.5) / (freq + 0.5))

    return LuceneOkapi(chunks, k1=k1, b=b)


def chunk_lists(tokens: np.ndarray, m: int) -> list[list[int]]:
    c = len(tokens) // m
    return tokens[: c * m].reshape(c, m).tolist()


def bm25s_index(chunks: list[list[int]]):
    import bm25s

    # bm25s wants token ids 0..V-1: map ours densely (a bijection changes no score).
    vocab = {t: i for i, t in enumerate(sorted({t for c in chunks for t in c}))}
    index = bm25s.BM25(method="lucene", k1=K1, b=B)
    index.index([[vocab[t] for t in c] for c in chunks], show_progress=False)
    return index, vocab


def reference_scores(chunks, query: str) -> tuple[np.ndarray, np.ndarray]:
    """[C, C] scores of every query chunk against every chunk from bm25s and rank_bm25 (rescaled by 1/(k1+1))."""
    index, vocab = bm25s_index(chunks)
    okapi = lucene_okapi(chunks, K1, B)
    c = len(chunks)
    s1, s2 = np.zeros((c, c)), np.zeros((c, c))
    for i in range(c):
        if query == "pair" and i == c - 1:
            continue
        q = chunks[i] + chunks[i + 1] if query == "pair" else chunks[i]
        s1[i] = index.get_scores_from_ids([vocab[t] for t in q])
        s2[i] = okapi.get_scores(q) / (K1 + 1)
    return s1, s2


def assert_same_ranking(ids, vals, ref_row, last, k, tol=1e-5):
    """Our top-k of one row equals the reference's up to float ties: same values, and every reference candidate whose
    score clearly beats our k-th is among ours."""
    ref = ref_row[: last + 1]
    ref_sorted = np.sort(ref[ref > 0])[::-1][:k]
    got = vals[ids >= 0]
    assert len(got) == len(ref_sorted)
    np.testing.assert_allclose(got, ref_sorted, rtol=tol, atol=tol)
    np.testing.assert_allclose(ref[ids[ids >= 0]], got, rtol=tol, atol=tol)
    if len(got):
        clear = np.nonzero(ref > got[-1] + tol * max(1.0, abs(got[-1])))[0]
        assert set(clear) <= set(ids.tolist())


@needs_references
@pytest.mark.parametrize("query", ["pair", "chunk"])
def test_toy_corpus_scores_equal_bm25s_and_rank_bm25(query):
    # 12 chunks of 4 tokens with repeated terms, a term in every chunk (idf still > 0 with Lucene) and rare ones.
    toy = np.array([[1, 2, 3, 1], [4, 5, 6, 9], [1, 1, 1, 2], [7, 8, 9, 9], [2, 3, 4, 9], [10, 11, 1, 9],
                    [3, 3, 2, 9], [12, 13, 14, 9], [1, 4, 7, 9], [5, 5, 5, 9], [2, 6, 8, 9], [15, 1, 2, 9]]).ravel()
    ours = bm25_scores(toy, 4, query)
    s1, s2 = reference_scores(chunk_lists(toy, 4), query)
    np.testing.assert_allclose(ours, s1, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ours, s2, rtol=1e-6, atol=1e-6)
    # Candidates: top-3 of the retrievable prefix (chunk 4, segment_len 8: cps 2).
    ids, vals = bm25_candidates(toy, 4, 8, k=3, query=query)
    for i in range(len(ids)):
        last = last_retrievable(i, 4, 8)
        if last < 0 or (query == "pair" and i == len(ids) - 1):
            assert (ids[i] == -1).all() and np.isnan(vals[i]).all()
            continue
        assert_same_ranking(ids[i], vals[i], s1[i], last, 3)


@pytest.mark.slow  # 4 s; the synthetic cases above compare with the same references
@needs_references
def test_real_document_equals_bm25s_and_rank_bm25(bpe):
    """The json package's source tokenized with a BPE: every query chunk's top-20 equals bm25s' (and rank_bm25's)."""
    tokens = np.array(bpe.encode(json_package_text()[:20000]).ids, dtype=np.int32)
    m, s, k = 16, 64, 20
    ids, vals = bm25_candidates(tokens, m, s, k=k, row_block=64)  # several blocks
    chunks = chunk_lists(tokens, m)
    s1, s2 = reference_scores(chunks, "pair")
    np.testing.assert_allclose(bm25_scores(tokens, m), s1, rtol=1e-5, atol=1e-5)
    checked = 0
    for i in range(len(chunks) - 1):
        last = last_retrievable(i, m, s)
        if last < 0:
            continue
        assert_same_ranking(ids[i], vals[i], s1[i], last, k)
        assert_same_ranking(ids[i], vals[i], s2[i], last, k, tol=1e-4)
        checked += 1
    assert checked > 100


@pytest.mark.parametrize("m,s,n_tok,query", [(4, 8, 400, "pair"), (4, 16, 513, "chunk"), (8, 8, 700, "pair"),
                                             (2, 12, 300, "chunk")])
def test_candidates_obey_the_retrievable_rule(m, s, n_tok, query):
    rng = np.random.default_rng(n_tok)
    tokens = rng.zipf(1.5, n_tok) % 50
    k = 6
    ids, vals = bm25_candidates(tokens, m, s, k=k, query=query, row_block=7)
    c = n_tok // m
    assert ids.shape == (c, k) and ids.dtype == np.int32 and vals.dtype == np.float32
    mask = retrievable_mask_np(c, m, s)
    full = bm25_scores(tokens, m, query)
    for i in range(c):
        row = ids[i][ids[i] >= 0]
        assert ((ids[i] >= 0) == np.isfinite(vals[i])).all()
        assert (ids[i][len(row):] == -1).all()  # the fill comes last
        assert mask[i, row].all()  # the shared rule of rpt.chunks
        assert (row <= last_retrievable(i, m, s)).all()
        assert (row + 1 < i).all() and (row + 1 < c).all()  # the continuation exists, inside the span, before i
        assert len(set(row.tolist())) == len(row)
        assert (np.diff(vals[i][: len(row)]) <= 0).all()
        if query == "pair" and i == c - 1:
            assert len(row) == 0  # no target, no query
            continue
        # Exactly the top-k of the masked full matrix (positive scores only).
        allowed = np.nonzero(mask[i] & (full[i] > 0))[0]
        assert len(row) == min(k, len(allowed))
        np.testing.assert_allclose(vals[i][: len(row)], np.sort(full[i, allowed])[::-1][:k], rtol=1e-5)


def test_ties_go_to_the_later_chunk_and_are_deterministic():
    scores = np.array([[3.0, 1.0, 3.0, 2.0, 3.0, -np.inf], [1.0, 1.0, 1.0, 1.0, -np.inf, -np.inf]])
    ids, vals = topk_rows(scores, 2)
    assert ids.tolist() == [[4, 2], [3, 2]]
    ids, vals = topk_rows(scores, 5)
    assert ids.tolist() == [[4, 2, 0, 3, 1], [3, 2, 1, 0, -1]]
    assert np.isnan(vals[1, 4])
    # Identical chunks score identically; the later one ranks first.
    m, s = 4, 8
    block = [5, 6, 7, 8]
    filler = [11] * 4
    tokens = np.array([1, 2, 3, 4] + block + [9] * 4 + block + [10] * 4 + filler * 4 + [5, 6, 7, 12] + [12] * 4)
    ids, vals = bm25_candidates(tokens, m, s, k=3)
    i = 9  # chunks 0..4 are retrievable; chunks 1 and 3 are identical and the only ones sharing a token
    assert ids[i].tolist() == [3, 1, -1] and vals[i][0] == vals[i][1]


def test_span_shorter_than_two_segments_has_no_candidates():
    ids, vals = bm25_candidates(np.arange(32) % 7, 4, 16, k=5)  # 8 chunks = 2 segments: nothing retrievable
    assert (ids == -1).all() and np.isnan(vals).all()
    ids, _ = bm25_candidates(np.arange(3), 4, 16, k=5)
    assert ids.shape == (0, 5)


def test_numpy_neighbours_equal_the_sparse_ones():
    """bm25_neighbors_dense (NumPy alone, the exported model's copy) gives bm25_neighbors' ids exactly: small
    vocabularies (many tied scores), Zipf-like text, one-chunk segments, and only the chunks from `first` on."""
    from rpt.labels.bm25 import bm25_neighbors, bm25_neighbors_dense

    rng = np.random.default_rng(0)
    for trial in range(60):
        m = int(rng.choice([2, 4, 8, 16]))
        s = m * int(rng.choice([1, 2, 4]))
        vocab = int(rng.choice([3, 20, 500]))
        n = int(rng.integers(0, 30 * s))
        tokens = rng.zipf(1.3, n) % vocab if trial % 2 else rng.integers(0, vocab, n)
        k = int(rng.integers(1, 6))
        ref = bm25_neighbors(tokens, m, s, k)
        first = int(rng.integers(0, len(ref) + 2)) if trial % 3 == 0 else 0
        np.testing.assert_array_equal(bm25_neighbors_dense(tokens, m, s, k, first=first), ref[first:])
