import json

import numpy as np
import pytest

from rpt.data import prepare as prepmod
from rpt.data.corpora import SPLITS, load_corpus
from rpt.data.prepare import format_summary, prepare
from rpt.data.store import StoreError, TokenStore
from rpt.data.tokenizer import Tokenizer

SUBSET = "stdlib:json,colorsys,keyword,fnmatch,_weakrefset"  # train: json, colorsys, keyword; validation; test


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "tok-cache"


@pytest.fixture
def stdlib_out(tmp_path, cache):
    out = tmp_path / "stdlib"
    summary = prepare(SUBSET, "bpe:400", out, tokenizer_cache=cache, progress=False)
    return out, summary


def test_stdlib_subset_memmap_equals_direct_tokenization(stdlib_out):
    out, summary = stdlib_out
    tok = Tokenizer.from_file(out / "tokenizer.json")
    assert summary.tokenizer["hash"] == tok.hash and summary.tokenizer_cache_hit is False
    corpus = load_corpus(SUBSET)
    expected_ids = {"train": ["colorsys", "json", "keyword"], "validation": ["_weakrefset"], "test": ["fnmatch"]}
    for split in SPLITS:
        store = TokenStore.open(out / split)
        store.check_compatible(tokenizer_id=tok.identity, chunk_size=64, vocab_size=400)
        assert store.tokens.dtype == np.uint16 and store.doc_ids == expected_ids[split]
        docs = list(corpus.documents(split))
        assert [d.id for d in docs] == store.doc_ids
        for d, doc in enumerate(docs):
            direct = tok.encode(doc.text)
            assert np.array_equal(store.document(d), np.asarray(direct)), doc.id
            assert tok.decode(store.document(d)) == doc.text
        lengths = store.doc_lengths()
        m = store.manifest
        assert m["n_documents"] == len(docs) and m["n_tokens"] == int(lengths.sum())
        assert m["median_doc_tokens"] == float(np.median(lengths)) and m["mean_doc_tokens"] == pytest.approx(lengths.mean())
        assert m["skipped"] == {} and m["corpus"]["spec"] == SUBSET and m["min_tokens"] == 128 and m["split"] == split
    report = json.loads((out / "prepare.json").read_text())
    assert [s["split"] for s in report["splits"]] == list(SPLITS)
    assert report["tokenizer"]["hash"] == tok.hash and report["tokenizer"]["name"].startswith("bpe:400/")
    text = format_summary(summary)
    assert "total" in text and f"{summary.tokens:,}" in text and "skipped in" not in text


def test_rerun_reuses_up_to_date_stores(stdlib_out, cache):
    out, first = stdlib_out
    before = (out / "train" / "tokens.bin").stat().st_mtime_ns
    again = prepare(SUBSET, "bpe:400", out, tokenizer_cache=cache, progress=False)
    assert again.tokenizer_cache_hit is True and all(s.reused for s in again.splits)
    assert [(s.documents, s.tokens) for s in again.splits] == [(s.documents, s.tokens) for s in first.splits]
    assert (out / "train" / "tokens.bin").stat().st_mtime_ns == before
    assert "reused" in format_summary(again)


def test_mismatched_store_is_an_error_unless_forced(stdlib_out, cache):
    out, _ = stdlib_out
    with pytest.raises(StoreError, match="chunk_size 64, config asks for 32.*--force"):
        prepare(SUBSET, "bpe:400", out, chunk_size=32, tokenizer_cache=cache, progress=False)
    with pytest.raises(StoreError, match="tokenized with.*--force"):
        prepare(SUBSET, "bpe:420", out, tokenizer_cache=cache, progress=False)
    same_tok = Tokenizer.from_file(out / "tokenizer.json")
    with pytest.raises(StoreError, match="max_documents=None, this run asks for 1"):
        prepare(SUBSET, same_tok, out, max_documents=1, progress=False)
    with pytest.raises(StoreError, match="'spec': 'stdlib:json'"):
        prepare("stdlib:json", same_tok, out, splits=["train"], progress=False)
    assert TokenStore.open(out / "train").chunk_size == 64  # the failed runs changed nothing
    forced = prepare(SUBSET, "bpe:400", out, chunk_size=32, force=True, tokenizer_cache=cache, progress=False)
    assert not any(s.reused for s in forced.splits)
    assert TokenStore.open(out / "train").chunk_size == 32


def test_bad_documents_are_counted_skips(bad_folder, tmp_path, cache, texts):
    tok = Tokenizer.train_bpe(texts, 300, cache_dir=cache)
    summary = prepare(str(bad_folder), tok, tmp_path / "out", progress=False)
    (st,) = summary.splits
    assert st.documents == 1 and st.documents_read == 3
    assert {r: v["count"] for r, v in st.skipped.items()} == {"binary": 1, "undecodable": 1, "empty": 1, "too_short": 1}
    assert st.skipped["too_short"]["examples"][0].startswith("short.txt (")
    store = TokenStore.open(tmp_path / "out" / "train")
    assert store.doc_ids == ["good.txt"] and store.manifest["skipped"] == st.skipped
    report = format_summary(summary)
    for reason in ("binary", "undecodable", "empty", "too_short"):
        assert f"skipped in train: 1 {reason}" in report


def test_min_chunks_max_documents_and_split_selection(split_folder, tmp_path, cache, texts):
    tok = Tokenizer.train_bpe(texts, 300, cache_dir=cache)
    n_tokens = [len(tok.encode(p.read_text())) for p in sorted((split_folder / "train").iterdir())]
    limit = sorted(n_tokens)[1] + 1  # two of the four train documents are shorter than this
    s = prepare(str(split_folder), tok, tmp_path / "a", chunk_size=limit, min_chunks=1, progress=False)
    assert s.splits[0].documents == 2 and s.splits[0].skipped["too_short"]["count"] == 2
    s = prepare(str(split_folder), tok, tmp_path / "b", splits=["train", "dev"], max_documents=3, progress=False)
    assert [x.split for x in s.splits] == ["train", "validation"]
    assert [x.documents for x in s.splits] == [3, 2] and not (tmp_path / "b" / "test").exists()
    with pytest.raises(ValueError, match="unknown split 'holdout'"):
        prepare(str(split_folder), tok, tmp_path / "c", splits=["holdout"], progress=False)
    (tmp_path / "only" / "train").mkdir(parents=True)
    with pytest.raises(ValueError, match="has no split.*test"):
        prepare(str(tmp_path / "only"), tok, tmp_path / "c", splits=["test"], progress=False)
    with pytest.raises(ValueError, match="max_documents"):
        prepare(str(split_folder), tok, tmp_path / "c", max_documents=0, progress=False)


def test_empty_split_gives_an_empty_store_and_a_warning(tmp_path, cache):
    s = prepare("stdlib:colorsys", "bpe:300", tmp_path / "one", tokenizer_cache=cache, progress=False)
    assert [x.documents for x in s.splits] == [1, 0, 0]
    assert len(TokenStore.open(tmp_path / "one" / "test")) == 0
    assert "warning: split test has no documents" in format_summary(s)


def test_killed_run_never_leaves_a_loadable_store(split_folder, tmp_path, cache, texts, monkeypatch):
    tok = Tokenizer.train_bpe(texts, 300, cache_dir=cache)
    monkeypatch.setattr(prepmod, "BATCH_DOCS", 1)  # one document per batch: fail after the first one is written
    calls = {"n": 0}
    real = Tokenizer.encode_batch

    def dying(self, batch):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("killed")
        return real(self, batch)

    monkeypatch.setattr(Tokenizer, "encode_batch", dying)
    with pytest.raises(KeyboardInterrupt):
        prepare(str(split_folder), tok, tmp_path / "out", progress=False)
    assert (tmp_path / "out" / ".train.partial" / "tokens.bin").stat().st_size > 0  # half-written, kept for inspection
    with pytest.raises(StoreError, match="interrupted run"):
        TokenStore.open(tmp_path / "out" / "train")
    monkeypatch.setattr(Tokenizer, "encode_batch", real)
    done = prepare(str(split_folder), tok, tmp_path / "out", progress=False)  # a rerun cleans up and completes
    assert done.splits[0].documents == 4 and not (tmp_path / "out" / ".train.partial").exists()
    assert len(TokenStore.open(tmp_path / "out" / "train")) == 4


def test_a_folder_that_is_not_a_store_is_not_overwritten(split_folder, tmp_path, cache, texts):
    tok = Tokenizer.train_bpe(texts, 300, cache_dir=cache)
    (tmp_path / "out" / "train").mkdir(parents=True)
    (tmp_path / "out" / "train" / "precious.txt").write_text("mine")
    for force in (False, True):  # --force replaces only a store, never a folder of the user's
        with pytest.raises(ValueError, match="out=.*did not write"):
            prepare(str(split_folder), tok, tmp_path / "out", progress=False, force=force)
    assert (tmp_path / "out" / "train" / "precious.txt").read_text() == "mine"
