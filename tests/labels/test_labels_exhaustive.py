"""Exhaustive gold (`rpt label --candidates all`): every retrievable chunk of a query is a scored candidate, and
sampled query chunks (--query-fraction) are a fixed draw."""

import numpy as np
import pytest
from labels_helpers import doc_texts, make_store

from rpt.chunks import last_retrievable
from rpt.cli import main
from rpt.labels.pipeline import LabelSpec, label_document, label_split, pool_sizes, sampled_queries, store_decoder
from rpt.labels.scorer import HFScorer, target_scores
from rpt.labels.store import LabelStore

M, S = 8, 16  # 2 chunks per segment


@pytest.fixture(scope="module")
def store(tmp_path_factory, bpe):
    return make_store(tmp_path_factory.mktemp("tok"), bpe, doc_texts(4, 500), M)


@pytest.fixture(scope="module")
def scorer(scorer_dir):
    return HFScorer.from_pretrained(scorer_dir, device="cpu", batch_size=64)


def test_all_candidates_are_every_retrievable_chunk_in_bm25_order(store):
    tokens = np.asarray(store.document(1))
    n = len(tokens) // M
    spec = LabelSpec(kind="lex", span=None, chunk_size=M, segment_len=S, candidates="all")
    cand, bm25, _, _ = label_document(tokens, spec)
    pools = pool_sizes(n, spec)
    assert cand.shape == (n, spec.width(np.array([n]))) and cand.shape[1] == pools[: n - 1].max()
    for i in range(n - 1):  # the last chunk has no target: no candidates (pair queries)
        ids = cand[i][cand[i] >= 0]
        assert sorted(ids) == list(range(pools[i])), i  # each retrievable chunk once, nothing else
        assert pools[i] == max(int(last_retrievable(i, M, S)) + 1, 0)
        b = bm25[i][: len(ids)]
        assert (np.diff(b) <= 0).all()  # BM25's order, the chunks sharing no token (score 0) last
    # BM25's top-k labels are the exhaustive candidates' first k wherever BM25 has k matching chunks
    top4, _, _, _ = label_document(tokens, LabelSpec(kind="lex", span=None, chunk_size=M, segment_len=S, k=4))
    np.testing.assert_array_equal(np.where(top4 >= 0, cand[:, :4], -1), top4)


def test_exhaustive_scores_equal_the_scorer_on_each_pair_and_sampling_is_a_fixed_draw(store, scorer):
    tokens = np.asarray(store.document(0))
    n = len(tokens) // M
    spec = LabelSpec(kind="sem", span=None, chunk_size=M, segment_len=S, candidates="all", query_fraction=0.5)
    cand, _, target, stats = label_document(tokens, spec, scorer, decode=store_decode(store), doc=0)
    keep = sampled_queries(n, 0.5, 0)
    assert 0 < keep.sum() < n and np.array_equal(keep, sampled_queries(n, 0.5, 0))
    assert not np.array_equal(keep, sampled_queries(n, 0.5, 1))  # another document draws other chunks
    scored = np.isfinite(target).any(1)
    assert (scored <= keep).all() and scored.sum() == (keep & (cand >= 0).any(1)).sum()
    assert stats["n_scored"] == int(np.isfinite(target).sum())
    chunks = tokens[: n * M].reshape(n, M)
    rows = np.nonzero(scored)[0][:3]
    direct = target_scores(scorer, chunks, rows, cand[rows], 0, store_decode(store))
    np.testing.assert_allclose(target[rows], direct, rtol=1e-4, atol=1e-4)
    assert np.isfinite(target[rows][cand[rows] >= 0]).all()  # every retrievable chunk of a sampled query is scored


def store_decode(store):
    return store_decoder(store.path.parent / "tokenizer.json")  # make_store lays it out as `rpt prepare`


def test_split_width_manifest_and_old_manifests(store, tmp_path):
    spec = LabelSpec(kind="lex", span=None, chunk_size=M, segment_len=S, candidates="all")
    path = label_split(store, tmp_path / "all", spec, progress=False)
    labels = LabelStore.open(path)
    chunks = store.doc_lengths() // M
    assert labels.k == spec.width(chunks) == max(pool_sizes(int(c), spec)[:-1].max() for c in chunks)
    assert labels.manifest["candidates"] == "all"
    # a label store made with the defaults records neither field, as those made before the fields existed
    plain = LabelSpec(kind="lex", span=None, chunk_size=M, segment_len=S, k=4).manifest()
    assert "candidates" not in plain and "query_fraction" not in plain
    # a span caps the pool at what one span holds
    spanned = LabelSpec(kind="lex", span=64, chunk_size=M, segment_len=S, candidates="all")
    assert spanned.width(chunks) == int(last_retrievable(64 // M - 2, M, S)) + 1


def test_cli_flags_and_bad_values(store, tmp_path, capsys):
    root = store.path.parent
    assert main(["label", "--store", str(root), "--split", store.path.name, "--kind", "lex", "--span", "doc",
                 "--segment-len", str(S), "--candidates", "all", "--out", str(tmp_path / "l"), "--no-progress"]) == 0
    assert "k " in capsys.readouterr().out
    assert LabelStore.open(tmp_path / "l").manifest["candidates"] == "all"
    with pytest.raises(ValueError, match="query_fraction"):
        LabelSpec(query_fraction=0).validate()


def test_gold_signal_benchmark_reads_an_exhaustive_store(store, scorer, tmp_path, benchmark_script):
    mod = benchmark_script("gold_signal")
    sem = LabelSpec(kind="sem", span=None, chunk_size=M, segment_len=S, candidates="all", query_fraction=0.5)
    out = label_split(store, tmp_path / "gold", sem, scorer=scorer, decode=store_decode(store), max_documents=2,
                      progress=False)
    got = mod.gold_signal(str(out))
    t = np.asarray(LabelStore.open(out).target)
    assert got["pairs"] == int(np.isfinite(t).sum()) and got["positive_share"] == pytest.approx((t[np.isfinite(t)] > 0).mean())
    assert -1 <= got["spearman_bm25_mean"] <= 1
    assert mod.rank_correlation(np.arange(5), np.arange(5) * 2.0) == pytest.approx(1.0)
    with pytest.raises(SystemExit, match="not exhaustive"):
        mod.gold_signal(str(label_split(store, tmp_path / "lex", LabelSpec(kind="lex", span=None, chunk_size=M,
                                                                            segment_len=S, k=2), progress=False)))


def test_the_progress_bar_counts_exhaustive_golds_pairs_not_chunks(store, tmp_path, monkeypatch):
    """Under exhaustive gold a query chunk costs its whole pool, so the bar counts pairs: its total is the sum of the
    pools, and every chunk advances it by its own pool (a chunk count would run fast early, slow late)."""
    import tqdm.auto

    from rpt.labels.scorer import InductionScorer

    bars = []

    class Recorder:
        def __init__(self, total=None, initial=0, unit="it", **kwargs):
            self.total, self.n, self.unit, self.steps = total, initial, unit, []
            bars.append(self)

        def update(self, n):
            self.n += n
            self.steps.append(n)

        def set_postfix(self, *args, **kwargs):
            pass

        def close(self):
            pass

    monkeypatch.setattr(tqdm.auto, "tqdm", Recorder)
    chunks = store.doc_lengths() // M
    sem = LabelSpec(kind="sem", span=None, chunk_size=M, segment_len=S, candidates="all")
    label_split(store, tmp_path / "sem", sem, InductionScorer(int(store.tokenizer_id["vocab_size"])), progress=False)
    (bar,) = bars
    pools = sum(int(pool_sizes(int(c), sem).sum()) for c in chunks)
    assert (bar.unit, bar.total, bar.n) == ("pair", pools, pools) and pools > 2 * int(chunks.sum())
    lex = LabelSpec(kind="lex", span=None, chunk_size=M, segment_len=S, k=4)
    label_split(store, tmp_path / "lex", lex, progress=False)
    assert (bars[1].unit, bars[1].total, bars[1].n) == ("chunk", int(chunks.sum()), int(chunks.sum()))
