"""BM25 candidates for the supervision signal (§3.2): for every query chunk, the top-k retrievable chunks by BM25.

The query of chunk i is the bag of tokens of (c_i, c_{i+1}) (``query="pair"``, the paper's training-time query, which
may read the target because labels are training data) or of c_i alone (``query="chunk"``, RETRO at inference).
Candidates are the chunks j that `rpt.chunks` allows for i (chunk j together with its continuation j+1 lies before
everything i's segment already sees), so every candidate has its continuation inside the span.

BM25 variant (chosen to equal bm25s' default ``method="lucene"`` exactly, and rank_bm25 up to a constant factor):

    score(q, d) = sum over query tokens t, counted with multiplicity, of
                  idf(t) * tf(t, d) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
    idf(t)      = log(1 + (N - df(t) + 0.5) / (df(t) + 0.5))          (Lucene: never negative)
    k1 = 1.5, b = 0.75

- The "documents" are the chunks of one retrieval span (a 16K training sequence, or a whole document at evaluation):
  N, df and avgdl are computed over all chunks of the span, including those after the query. That is how a library
  indexing the span once would score it, and labels are training data. Every chunk has exactly M tokens (a trailing
  partial chunk is dropped), so the length normalisation is 1 and only documents' term counts matter.
- A query token that occurs twice adds its term twice (bm25s and rank_bm25 do the same).
- Without the (k1 + 1) numerator factor (Lucene drops it: it does not change the ranking); rank_bm25's BM25Okapi with
  the Lucene idf gives (k1 + 1) x these scores.
- A chunk sharing no token with the query scores 0 and is not a candidate. Ties are broken towards the later chunk
  (closer to the query), so labels are deterministic.

Everything is vectorised over the span: a sparse chunk x term count matrix T (scipy CSR), the BM25 document weights
W (same sparsity), the query matrix Q (T, or T[i] + T[i+1]), scores Q @ W^T computed in blocks of query rows with only
the columns that block may retrieve (terms found in many chunks through one dense matmul, the rest through the sparse
product), the retrievable mask from `rpt.chunks`, and a per-row top-k by partition. No Python loop runs over chunks.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import scipy.sparse as sp

from rpt.chunks import chunks_per_segment, last_retrievable

Query = Literal["pair", "chunk"]

K1 = 1.5
B = 0.75
# Query rows per score block: the dense block is ROW_BLOCK x (retrievable columns) floats.
ROW_BLOCK = 512
# Terms in more than 1/DENSE_DF_FRACTION of a span's chunks are scored densely (see bm25_candidates).
DENSE_DF_FRACTION = 32


def chunk_term_matrix(tokens: np.ndarray, chunk_size: int) -> sp.csr_matrix:
    """Term counts of each chunk: CSR [C, V'] over the span's own vocabulary (V' = distinct token ids).

    C = len(tokens) // chunk_size; a trailing partial chunk is dropped.
    """
    n_chunks = len(tokens) // chunk_size
    toks = np.asarray(tokens[: n_chunks * chunk_size]).reshape(n_chunks, chunk_size)  # [C, M]
    _, term = np.unique(toks, return_inverse=True)  # compact vocabulary: term ids 0..V'-1
    rows = np.repeat(np.arange(n_chunks, dtype=np.int32), chunk_size)
    n_terms = int(term.max()) + 1 if term.size else 0
    counts = sp.csr_matrix((np.ones(term.size, np.float32), (rows, term.reshape(-1))), shape=(n_chunks, n_terms))
    counts.sum_duplicates()
    return counts


def bm25_weights(counts: sp.csr_matrix, k1: float = K1, b: float = B) -> sp.csr_matrix:
    """BM25 document weights W[d, t] = idf(t) * tf / (tf + k1 * (1 - b + b * |d| / avgdl)), CSR like `counts`."""
    n_docs = counts.shape[0]
    df = np.bincount(counts.indices, minlength=counts.shape[1]).astype(np.float64)
    idf = np.log1p((n_docs - df + 0.5) / (df + 0.5))
    doc_len = np.asarray(counts.sum(axis=1)).ravel().astype(np.float64)
    avgdl = doc_len.mean() if n_docs else 1.0
    norm = k1 * (1.0 - b + b * doc_len / avgdl)  # [C]
    tf = counts.data.astype(np.float64)
    rows = np.repeat(np.arange(n_docs), np.diff(counts.indptr))
    data = idf[counts.indices] * tf / (tf + norm[rows])
    return sp.csr_matrix((data.astype(np.float32), counts.indices.copy(), counts.indptr.copy()), shape=counts.shape)


def query_matrix(counts: sp.csr_matrix, query: Query) -> sp.csr_matrix:
    """Query term counts: row i = counts of c_i ("chunk") or of (c_i, c_{i+1}) ("pair"; the last row is empty)."""
    if query == "chunk":
        return counts
    if query != "pair":
        raise ValueError(f"query must be 'pair' or 'chunk', not {query!r}")
    empty = sp.csr_matrix((1, counts.shape[1]), dtype=counts.dtype)
    pairs = counts[:-1] + counts[1:] if counts.shape[0] > 1 else sp.csr_matrix((0, counts.shape[1]), dtype=counts.dtype)
    return sp.vstack([pairs, empty], format="csr")


def bm25_scores(tokens: np.ndarray, chunk_size: int, query: Query = "pair", k1: float = K1, b: float = B) -> np.ndarray:
    """Dense BM25 of every (query chunk, chunk) pair of a span, unmasked: float32 [C, C]. For small spans and tests;
    `bm25_candidates` computes the same numbers blockwise with the retrievable mask."""
    counts = chunk_term_matrix(tokens, chunk_size)
    return np.asarray((query_matrix(counts, query) @ bm25_weights(counts, k1, b).T).toarray(), dtype=np.float32)


def topk_rows(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k columns of each row among the finite entries, best first; ties go to the larger column index.

    scores: float [R, N] with -inf for "not a candidate". Returns (ids int32 [R, k], -1 where fewer than k candidates;
    values float32 [R, k], NaN there). Vectorised: one argpartition and one comparison pass over the block; only rows
    whose k-th value is tied beyond the k slots are redone with an exact tie rule.
    """
    n_rows, n_cols = scores.shape
    if n_rows == 0 or k == 0:
        return np.full((n_rows, k), -1, np.int32), np.full((n_rows, k), np.nan, np.float32)
    if n_cols > k:
        ids = np.argpartition(scores, n_cols - k, axis=1)[:, n_cols - k:]  # [R, k] the k largest, ties arbitrary
        vals = np.take_along_axis(scores, ids, 1)
        kth = vals.min(axis=1)
        crowded = np.nonzero(np.isfinite(kth) & ((scores >= kth[:, None]).sum(axis=1) > k))[0]
        if len(crowded):  # the k-th value is tied beyond the k slots: keep the largest column indices among the ties
            sub = scores[crowded]
            above = sub > kth[crowded, None]
            tied_from_right = np.cumsum((sub == kth[crowded, None])[:, ::-1], axis=1)[:, ::-1]
            need = k - above.sum(axis=1)
            chosen = above | ((sub == kth[crowded, None]) & (tied_from_right <= need[:, None]))
            ids[crowded] = np.nonzero(chosen)[1].reshape(len(crowded), k)  # exactly k per row
            vals[crowded] = np.take_along_axis(sub, ids[crowded], 1)
    else:
        ids = np.broadcast_to(np.arange(n_cols), (n_rows, n_cols)).copy()
        vals = scores.copy()
        pad = k - n_cols
        ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=-1)
        vals = np.pad(vals, ((0, 0), (0, pad)), constant_values=-np.inf)
    ids = ids.astype(np.int32)
    missing = ~np.isfinite(vals)
    ids[missing] = -1
    vals = vals.astype(np.float32)
    vals[missing] = np.nan
    # Order each row best first, ties by larger column; the -1 fill goes last.
    key_val = np.where(missing, np.inf, -vals.astype(np.float64))
    order = np.lexsort((-ids, key_val), axis=1)
    return np.take_along_axis(ids, order, 1), np.take_along_axis(vals, order, 1)


def bm25_candidates(tokens: np.ndarray, chunk_size: int, segment_len: int, k: int = 20, query: Query = "pair",
                    k1: float = K1, b: float = B, row_block: int = ROW_BLOCK,
                    keep_unmatched: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """BM25 top-k retrievable chunks for every chunk of one retrieval span.

    keep_unmatched: a retrievable chunk that shares no token with the query is a candidate of score 0 (ranked after
    every matching chunk, later chunks first) instead of none; with k at least the largest pool this lists every
    retrievable chunk of each query, BM25's order first (the exhaustive candidates of `rpt label --candidates all`).

    tokens: token ids of the span [L]; chunk i is tokens[i*M:(i+1)*M], C = L // M chunks; segments (and so the
    retrievable rule) are counted from the span's start.
    Returns ids int32 [C, k] (span-relative chunk indices, -1 = none) and scores float32 [C, k] (NaN where none),
    best first. With query="pair" the last chunk has no target and gets no candidates.
    """
    cps = chunks_per_segment(chunk_size, segment_len)
    counts = chunk_term_matrix(tokens, chunk_size)
    n_chunks = counts.shape[0]
    ids = np.full((n_chunks, k), -1, np.int32)
    vals = np.full((n_chunks, k), np.nan, np.float32)
    first_query = 2 * cps  # before segment 2 nothing is retrievable (last_retrievable < 0)
    n_queries = n_chunks - 1 if query == "pair" else n_chunks
    if n_queries <= first_query or k == 0:
        return ids, vals
    weights = bm25_weights(counts, k1, b)
    queries = query_matrix(counts, query)
    # Frequent terms (in more than 1/DENSE_DF_FRACTION of the chunks) would make the sparse product nearly dense and
    # dominate its cost: score them with one dense matmul, the rare rest with the sparse product.
    df = np.bincount(counts.indices, minlength=counts.shape[1])
    frequent = df > max(n_chunks // DENSE_DF_FRACTION, 1)
    w_dense = np.ascontiguousarray(weights[:, frequent].toarray().T)  # [F, C]
    q_dense, q_sparse = queries[:, frequent], queries[:, ~frequent]
    w_sparse_t = weights[:, ~frequent].T.tocsc()  # [V'-F, C]; column slices of CSC are cheap
    for r0 in range(first_query, n_queries, row_block):
        r1 = min(r0 + row_block, n_queries)
        rows = np.arange(r0, r1)
        last = last_retrievable(rows, chunk_size, segment_len)  # [R] largest retrievable column of each row
        n_cols = int(last[-1]) + 1
        block = q_dense[r0:r1].toarray() @ w_dense[:, :n_cols]  # [R, n_cols] BM25 of every (query, chunk) pair
        block += (q_sparse[r0:r1] @ w_sparse_t[:, :n_cols]).toarray()
        if not keep_unmatched:
            block[block <= 0] = -np.inf  # shares no token with the query: not a candidate
        lo = int(last[0]) + 1  # columns < lo are retrievable for every row of the block
        tail = block[:, lo:]
        tail[np.arange(lo, n_cols)[None, :] > last[:, None]] = -np.inf  # the retrievable rule (rpt.chunks)
        ids[r0:r1], vals[r0:r1] = topk_rows(block, k)
    return ids, vals


def bm25_neighbors(tokens: np.ndarray, chunk_size: int, segment_len: int, k: int,
                   statistics: Literal["causal", "document"] = "causal") -> np.ndarray:
    """RETRO's inference-time neighbours [C, k] (evaluation's source "bm25", generation, DPR's training pairs): BM25
    top-k with the query chunk c_q ONLY (never its target) among the
    chunks retrievable for it (rpt.chunks). Document-absolute ids, best first, -1 = none (no shared token).

    statistics="causal" (default): BM25's idf and average length come from the retrievable chunks themselves (the
    index of the document so far), so nothing at or after the query chunk influences its neighbours.
    statistics="document": `bm25_candidates(query="chunk")` over the whole document, whose idf counts
    every chunk of the document, later ones included (the candidates obey the rule, the statistics do not).
    Scores, the Lucene BM25 variant and the tie rule (later chunk first) are bm25_candidates' in both cases.
    """
    tokens = np.asarray(tokens)
    if statistics == "document":
        ids, _ = bm25_candidates(tokens, chunk_size, segment_len, k=k, query="chunk")
        return ids.astype(np.int64)
    if statistics != "causal":
        raise ValueError(f"statistics must be causal or document, not {statistics!r}")
    cps = chunks_per_segment(chunk_size, segment_len)
    counts = chunk_term_matrix(tokens, chunk_size)  # [C, V'] term counts (the vocabulary map carries no statistics)
    C = counts.shape[0]
    ids = np.full((C, k), -1, np.int64)
    for s0 in range(2 * cps, C, cps):  # one segment at a time: its chunks share one retrievable set 0..limit
        limit = int(last_retrievable(s0, chunk_size, segment_len))
        weights = bm25_weights(counts[: limit + 1])  # [limit+1, V'] idf, avgdl over the retrievable chunks only
        scores = (counts[s0 : s0 + cps] @ weights.T).toarray()  # [<=cps, limit+1]
        scores[scores <= 0] = -np.inf  # shares no token with the query: not a candidate
        ids[s0 : s0 + cps] = topk_rows(scores, k)[0]
    return ids


def bm25_neighbors_dense(tokens: np.ndarray, chunk_size: int, segment_len: int, k: int, first: int = 0) -> np.ndarray:
    """`bm25_neighbors` (causal statistics) with NumPy alone, for code that runs without SciPy (the code of an
    exported model, rpt.hf): the same ids. Each score is summed term by term in the order SciPy's sparse product
    sums it (the query chunk's terms in ascending id, in float32), so the two agree float for float and break ties
    alike. Only the query's terms are counted: memory is [retrievable chunks, segment_len].

    first: compute the neighbours of chunks first .. C - 1 only (a generator adding chunks one at a time); returns
    [C - first, k], document-absolute ids, best first, -1 = none."""
    tokens = np.asarray(tokens)
    cps = chunks_per_segment(chunk_size, segment_len)
    n_chunks = len(tokens) // chunk_size
    ids = np.full((max(n_chunks - first, 0), k), -1, np.int64)
    toks = tokens[: n_chunks * chunk_size].reshape(n_chunks, chunk_size)
    for s0 in range(max(2 * cps, first // cps * cps), n_chunks, cps):  # a segment's chunks share one retrievable set
        lo, hi = max(s0, first), min(s0 + cps, n_chunks)
        n_docs = int(last_retrievable(s0, chunk_size, segment_len)) + 1  # chunks 0 .. limit
        if n_docs <= 0 or lo >= hi:  # nothing retrievable yet (segments of one chunk), or no chunk asked for
            continue
        terms = np.unique(toks[lo:hi])  # the queries' terms, ascending
        docs = toks[:n_docs]
        col = np.searchsorted(terms, docs).clip(max=len(terms) - 1)
        hit = terms[col] == docs
        counts = np.zeros((n_docs, len(terms)), np.float64)  # term counts of the retrievable chunks
        np.add.at(counts, (np.nonzero(hit)[0], col[hit]), 1.0)
        # bm25_weights' numbers: idf over the retrievable chunks, every chunk M tokens long
        df = (counts > 0).sum(axis=0).astype(np.float64)
        idf = np.log1p((n_docs - df + 0.5) / (df + 0.5))
        doc_len = np.full(n_docs, float(chunk_size))
        norm = K1 * (1.0 - B + B * doc_len / doc_len.mean())
        weights = (idf[None, :] * counts / (counts + norm[:, None])).astype(np.float32).T  # [T, D]
        # each query's distinct terms (ascending) and counts; padding adds 0 * weight = +0, which changes no sum
        per_row = [np.unique(row, return_counts=True) for row in toks[lo:hi]]
        width = max(len(t) for t, _ in per_row)
        q_col = np.zeros((hi - lo, width), np.int64)
        q_cnt = np.zeros((hi - lo, width), np.float32)
        for r, (t, c) in enumerate(per_row):
            q_col[r, : len(t)] = np.searchsorted(terms, t)
            q_cnt[r, : len(t)] = c
        scores = np.zeros((hi - lo, n_docs), np.float32)
        for j in range(width):
            scores += q_cnt[:, j, None] * weights[q_col[:, j]]
        scores[scores <= 0] = -np.inf  # shares no token with the query: not a candidate
        ids[lo - first : hi - first] = topk_rows(scores, k)[0]
    return ids
