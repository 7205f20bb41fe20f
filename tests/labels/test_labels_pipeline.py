"""The label pipeline: spans, lex/sem label sets, resume after a kill, shards, compatibility checks, the CLI."""

import json
from pathlib import Path

import numpy as np
import pytest
from labels_helpers import doc_texts, make_store, tiny_lm, train_bpe

from rpt.cli import main
from rpt.labels.bm25 import bm25_candidates
from rpt.labels.pipeline import LabelSpec, label_document, label_split, merge_shards, shard_path, shard_range, store_decoder
from rpt.labels.scorer import HFScorer
from rpt.labels.store import LabelError, LabelStore, default_label_path

M, S, SPAN = 8, 16, 128  # 16 chunks per span, 2 chunks per segment
SPEC_LEX = LabelSpec(kind="lex", span=SPAN, chunk_size=M, segment_len=S, k=4)
SPEC_SEM = LabelSpec(kind="sem", span=SPAN, chunk_size=M, segment_len=S, k=4)


@pytest.fixture(scope="module")
def store(tmp_path_factory, bpe):
    """5 documents of ~25-45 chunks (the json package's source), chunk size 8."""
    return make_store(tmp_path_factory.mktemp("tok"), bpe, doc_texts(5, 700), M)


@pytest.fixture(scope="module")
def scorer(scorer_dir):
    return HFScorer.from_pretrained(scorer_dir, device="cpu", batch_size=64)


def arrays(path):
    s = LabelStore.open(path)
    return {name: np.asarray(getattr(s, name)) for name in ("candidates", "bm25", "target", "chunk_offsets")}


def assert_same(a, b):
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)  # NaN == NaN here


def test_spans_cut_documents_and_ids_are_document_absolute(store):
    tokens = np.asarray(store.document(2))
    cand, bm25, target, stats = label_document(tokens, SPEC_LEX)
    n = len(tokens) // M
    assert cand.shape == (n, 4) and n > 2 * SPAN // M  # at least two spans
    assert np.isnan(target).all() and stats == {"n_scored": 0, "n_positive": 0}
    per_span = SPAN // M
    for s0 in range(0, n, per_span):
        s1 = min(s0 + per_span, n)
        ids, scores = bm25_candidates(tokens[s0 * M : s1 * M], M, S, k=4)
        np.testing.assert_array_equal(cand[s0:s1], np.where(ids >= 0, ids + s0, -1))
        np.testing.assert_array_equal(bm25[s0:s1], scores)
        rows = cand[s0:s1]
        assert ((rows == -1) | ((rows >= s0) & (rows + 1 < np.arange(s0, s1)[:, None]))).all()  # inside the span
    doc, _, _, _ = label_document(tokens, LabelSpec(kind="lex", span=None, chunk_size=M, segment_len=S, k=4))
    ids, _ = bm25_candidates(tokens, M, S, k=4)
    np.testing.assert_array_equal(doc, ids)  # span "doc": the whole document is one span


def test_sem_labels_score_every_candidate(store, scorer, bpe, tmp_path, monkeypatch):
    out = label_split(store, tmp_path / "sem", SPEC_SEM, scorer=scorer, decode=store_decoder(store.path.parent /
                      "tokenizer.json"), progress=False)
    labels = LabelStore.open(out)
    m = labels.manifest
    assert m["kind"] == "sem" and m["span"] == SPAN and m["k"] == 4 and m["segment_len"] == S and m["chunk_size"] == M
    assert m["scorer"] == scorer.name and m["tokenizer"] == store.tokenizer_id and m["bm25"] == "lucene"
    assert m["n_rows"] == int((store.doc_lengths() // M).sum()) and m["doc_range"] == [0, len(store)]
    cand = np.asarray(labels.candidates)
    target = np.asarray(labels.target)
    assert ((cand >= 0) == np.isfinite(target)).all()
    assert m["n_scored"] == int(np.isfinite(target).sum()) > 0
    assert m["positive_share"] == pytest.approx((target[np.isfinite(target)] > 0).mean())
    # Scoring in small groups of query chunks (other batches, other padding) gives the same scores up to rounding.
    doc = np.asarray(store.document(1))
    monkeypatch.setattr("rpt.labels.pipeline.SCORE_ROWS", 5)
    seen = []
    small = label_document(doc, SPEC_SEM, scorer, bpe.decode_batch, on_progress=seen.append)[2]
    np.testing.assert_allclose(small, labels.rows(1).target, atol=1e-5)
    assert seen[-1] == len(doc) // M and len(seen) > 2 and seen == sorted(seen)
    rows = labels.rows(3)
    assert rows.candidates.shape == (store.doc_lengths()[3] // M, 4)
    with pytest.raises(LabelError, match="not document 9"):
        labels.rows(9)


def test_killed_run_resumes_to_identical_labels(store, scorer, tmp_path, monkeypatch):
    decode = store_decoder(store.path.parent / "tokenizer.json")
    whole = label_split(store, tmp_path / "whole", SPEC_SEM, scorer=scorer, decode=decode, progress=False)
    assert [e["from_document"] for e in LabelStore.open(whole).manifest["environments"]] == [0]
    assert {"cpu", "threads", "torch", "transformers"} <= set(LabelStore.open(whole).manifest["environments"][0])

    class Killed(Exception):
        pass

    def kill_after_two(d):
        if d == 1:
            raise Killed

    out = tmp_path / "resumed"
    with pytest.raises(Killed):
        label_split(store, out, SPEC_SEM, scorer=scorer, decode=decode, progress=False, on_document=kill_after_two)
    assert not out.exists()  # nothing is published before the end
    progress = json.loads((tmp_path / ".resumed.partial" / "progress.json").read_text())
    assert progress["next_doc"] == 2
    with pytest.raises(LabelError, match="resume"):
        LabelStore.open(out)
    seen = []
    import rpt.utils

    here = rpt.utils.environment()
    monkeypatch.setattr(rpt.utils, "environment", lambda: {**here, "threads": here["threads"] + 1})  # resumed elsewhere
    label_split(store, out, SPEC_SEM, scorer=scorer, decode=decode, progress=False, on_document=seen.append)
    assert seen == [2, 3, 4]  # continued after the last complete document
    assert_same(arrays(out), arrays(whole))
    where = LabelStore.open(out).manifest["environments"]  # where each stretch of documents was labelled
    assert [(e["from_document"], e["threads"]) for e in where] == [(0, here["threads"]), (2, here["threads"] + 1)]
    assert LabelStore.open(out).manifest["n_scored"] == LabelStore.open(whole).manifest["n_scored"]
    assert not (tmp_path / ".resumed.partial").exists()


def test_merged_shards_equal_an_unsharded_run(store, tmp_path, monkeypatch):
    whole = label_split(store, tmp_path / "whole", SPEC_LEX, progress=False)
    out = tmp_path / "sharded"
    chunks = store.doc_lengths() // M
    ranges = [shard_range(chunks, i, 3) for i in range(3)]
    assert ranges[0][0] == 0 and ranges[-1][1] == len(store)
    assert all(ranges[i][1] == ranges[i + 1][0] for i in range(2)) and len({r[0] for r in ranges}) == 3
    assert label_split(store, out, SPEC_LEX, shard=(2, 3), progress=False).name == "sharded.shard-2-of-3"
    monkeypatch.setenv("RANK", "0")  # torchrun's environment picks the shard
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert label_split(store, out, SPEC_LEX, progress=False).name == "sharded.shard-0-of-3"
    assert not out.exists()
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert label_split(store, out, SPEC_LEX, shard=(1, 3), progress=False) == out  # the last shard merges
    assert_same(arrays(out), arrays(whole))
    assert LabelStore.open(out).manifest["doc_range"] == [0, len(store)]
    assert [e["from_document"] for e in LabelStore.open(out).manifest["environments"]] == [r[0] for r in ranges]
    assert not list(tmp_path.glob("sharded.shard-*"))


def test_shards_wait_for_a_running_merge_and_merge_on_request(store, tmp_path, capsys):
    whole = label_split(store, tmp_path / "whole", SPEC_LEX, progress=False)
    out = tmp_path / "sharded"
    lock = tmp_path / ".sharded.merge.lock"
    lock.touch()  # another process is merging: finishing shards leave it alone
    for i in range(2):
        assert label_split(store, out, SPEC_LEX, shard=(i, 2), progress=False) == shard_path(out, i, 2)
    assert not out.exists()
    lock.unlink()
    rc = main(["label", "--store", str(store.path.parent), "--kind", "lex", "--span", str(SPAN), "--segment-len", str(S),
               "--k", "4", "--out", str(out), "--merge", "2"])
    assert rc == 0 and "chunks" in capsys.readouterr().out
    assert_same(arrays(out), arrays(whole))
    with pytest.raises(LabelError, match="shards not finished"):
        merge_shards(tmp_path / "nothing", 2)


def test_labels_for_another_tokenizer_chunk_size_segment_or_span_are_refused(store, bpe, tmp_path):
    out = label_split(store, tmp_path / "lex", SPEC_LEX, progress=False)
    labels = LabelStore.open(out)
    labels.check_compatible(store, segment_len=S, span=SPAN)  # the matching case passes
    with pytest.raises(LabelError, match=r"segment_len 16.*segment_len 32"):
        labels.check_compatible(store, segment_len=32, span=SPAN)
    with pytest.raises(LabelError, match=r"span 128.*span doc"):
        labels.check_compatible(store, segment_len=S, span="doc")
    with pytest.raises(LabelError, match=r"span 128.*span 256"):
        labels.check_compatible(store, segment_len=S, span=256)
    with pytest.raises(LabelError, match="kind lex.*kind sem"):
        labels.check_compatible(store, segment_len=S, span=SPAN, kind="sem")
    texts = doc_texts(5, 700)
    other_tok = make_store(tmp_path / "other_tok", train_bpe(texts[0] * 3, 350), texts, M, name="other")
    with pytest.raises(LabelError, match=r"tokenizer bpe \(hash .*\).*uses other \(hash"):
        labels.check_compatible(other_tok, segment_len=S, span=SPAN)
    other_m = make_store(tmp_path / "other_m", bpe, texts, 16)
    with pytest.raises(LabelError, match="chunk_size 8.*chunk_size 16"):
        labels.check_compatible(other_m, segment_len=S, span=SPAN)
    with pytest.raises(LabelError, match="chunk_size 16, labels asked for 8"):
        label_split(other_m, tmp_path / "x", SPEC_LEX, progress=False)
    # Another span in the same folder is not silently reused.
    with pytest.raises(LabelError, match=r"already holds labels made with other settings \(span: existing 128, asked doc\)"):
        label_split(store, out, LabelSpec(kind="lex", span=None, chunk_size=M, segment_len=S, k=4), progress=False)


def test_cli_end_to_end(store, scorer_dir, tmp_path, capsys):
    root = store.path.parent
    png = tmp_path / "quality.png"
    rc = main(["label", "--store", str(root), "--split", "train", "--kind", "sem", "--span", str(SPAN), "--segment-len",
               str(S), "--k", "4", "--scorer", str(scorer_dir), "--device", "cpu", "--batch-size", "32",
               "--max-documents", "3", "--no-progress", "--quality", str(png)])
    out = capsys.readouterr().out
    assert rc == 0, out
    path = default_label_path(root, "train", "sem", SPAN)
    assert path == root / "labels" / "train-sem-128"
    labels = LabelStore.open(path)
    assert labels.doc_range == (0, 3) and labels.manifest["scorer"] == str(scorer_dir)
    share = labels.manifest["positive_share"]
    assert f"= {share:.4f}" in out and "positives (s_t > 0)" in out
    assert png.exists() and png.stat().st_size > 0
    # lex over whole documents, sharded by hand, then a second run is a no-op.
    for i in range(2):
        assert main(["label", "--store", str(root), "--kind", "lex", "--span", "doc", "--segment-len", str(S), "--k",
                     "4", "--shard", f"{i}/2", "--no-progress"]) == 0
    lex = LabelStore.open(root / "labels" / "train-lex-doc")
    assert lex.span is None and lex.doc_range == (0, len(store)) and np.isnan(np.asarray(lex.target)).all()
    lex.check_compatible(store, S, "doc")

    def snapshot() -> dict:  # every file under labels/: modification time and contents
        return {str(f.relative_to(root)): (f.stat().st_mtime_ns, f.read_bytes())
                for f in sorted((root / "labels").rglob("*")) if f.is_file()}

    before = snapshot()
    assert main(["label", "--store", str(root), "--kind", "lex", "--span", "doc", "--segment-len", str(S), "--k", "4",
                 "--no-progress"]) == 0
    after = snapshot()
    assert after.keys() == before.keys()  # nothing written, nothing removed
    changed = [f for f in before if after[f] != before[f]]
    assert not changed, changed
    capsys.readouterr()
    # Bad input: one clear line, exit 2.
    assert main(["label", "--store", str(root), "--kind", "lex", "--span", "100", "--segment-len", str(S)]) == 2
    assert "multiple of segment_len" in capsys.readouterr().err
    assert main(["label", "--store", str(tmp_path / "nowhere"), "--kind", "lex"]) == 2
    assert main(["label", "--store", str(root), "--kind", "lex", "--shard", "3/2"]) == 2


def test_store_decoder_needs_the_tokenizer_file(tmp_path):
    with pytest.raises(LabelError, match="tokenizer.json not found"):
        store_decoder(Path(tmp_path) / "tokenizer.json")


def test_tiny_lm_is_small():
    assert sum(p.numel() for p in tiny_lm(300).parameters()) < 100_000  # the scorers here stay tiny
