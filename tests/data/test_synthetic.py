"""The synthetic copy corpus: deterministic, the structure it promises, its tokenizer, its chunk classes."""

import numpy as np
import pytest

from rpt.cli import main
from rpt.data.corpora import load_corpus
from rpt.data.synthetic import CopySpec, copy_classes, copy_document, copy_runs, parse_spec, run_classes
from rpt.training.data import open_store


def test_spec_parsing_and_round_trip():
    s = parse_spec("synthetic:copy-far?docs=10&vocab=64&distance=3-5&p=0.25")
    assert (s.docs, s.vocab, s.min_distance, s.max_distance, s.p_repeat) == (10, 64, 3, 5, 0.25)
    assert parse_spec(s.spec) == s
    assert parse_spec("synthetic:copy-near").spec == "synthetic:copy-near"
    for bad in ("synthetic:copy-mid", "synthetic:copy-far?size=3", "synthetic:copy-far?docs=x",
                "synthetic:copy-far?distance=20-30"):
        with pytest.raises(ValueError, match="synthetic|corpus"):
            parse_spec(bad)


@pytest.mark.parametrize("setting,lo,hi", [("copy-near", 1, 1), ("copy-far", 6, 12)])
def test_repeats_lie_at_the_promised_distance(setting, lo, hi):
    spec = parse_spec(f"synthetic:{setting}?vocab=256")
    rng = np.random.default_rng(0)
    distances = []
    for _ in range(50):
        p = copy_document(rng, spec).reshape(spec.passages, spec.passage)
        for i in range(spec.passages):
            src = [d for d in range(1, i + 1) if np.array_equal(p[i], p[i - d])]  # nearest earlier copy first
            if src:
                distances.append(src[0])
    assert distances and min(distances) >= lo and max(distances) <= hi
    frac = len(distances) / (50 * (spec.passages - lo))
    assert 0.35 < frac < 0.65  # p_repeat = 0.5 of the passages that may repeat


def test_copy_classes():
    s = CopySpec(vocab=50, passage=128, passages=4, min_distance=1, max_distance=1, p_repeat=1.0)
    toks = copy_document(np.random.default_rng(1), s)  # passages 1..3 all repeat passage 0
    assert copy_classes(toks, 128, 64).tolist() == [0, 0, 1, 2, 1, 2, 1, 2]
    with pytest.raises(ValueError, match="multiple"):
        copy_classes(toks, 100, 64)


def test_prepare_synthetic_is_deterministic_with_one_token_per_word(tmp_path):
    spec = "synthetic:copy-far?docs=6&eval_docs=2"
    for out in ("a", "b"):
        assert main(["prepare", "--corpus", spec, "--out", str(tmp_path / out), "--no-progress"]) == 0
    a, b = open_store(tmp_path / "a", "train"), open_store(tmp_path / "b", "train")
    assert len(a) == 6 and a.doc_lengths().tolist() == [2048] * 6
    assert all(np.array_equal(a.document(i), b.document(i)) for i in range(6))
    corpus = load_corpus(spec)
    words = next(corpus.documents("train")).text.split()
    assert np.array_equal(a.document(0), [int(w[1:]) for w in words])  # word w17 is token 17
    assert a.manifest["corpus"]["synthetic"]["min_distance"] == 6
    test = open_store(tmp_path / "a", "test")
    train_docs = {a.document(i).tobytes() for i in range(6)}
    assert not any(test.document(i).tobytes() in train_docs for i in range(len(test)))


def test_text_words_are_pseudo_words_that_a_bpe_splits_and_never_on_the_grid(tmp_path, capsys):
    s = parse_spec("synthetic:copy-far?docs=4&eval_docs=2&vocab=1024&words=text&passage=20-30&passages=12&distance=4-8")
    assert s.words == "text" and parse_spec(s.spec) == s and "words=text" in s.spec
    assert not s.aligned(64) and not parse_spec("synthetic:copy-far?words=text").aligned(64)  # BPE: any length
    corpus = load_corpus(s.spec)
    ids = next(corpus.word_ids("train"))
    words = next(corpus.documents("train")).text.split()
    assert len(words) == len(ids) and all(w.isalpha() and 3 <= len(w) <= 8 for w in words)
    assert len({(w, int(i)) for w, i in zip(words, ids, strict=True)}) == len(set(ids.tolist()))  # one word per id
    with pytest.raises(ValueError, match="bpe"):
        corpus.tokenizer()  # none of its own: prepare says so in one line, and a BPE prepares it
    assert main(["prepare", "--corpus", s.spec, "--out", str(tmp_path / "x"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "tokenizer" in err and "bpe:512" in err and len(err.strip().splitlines()) == 1
    assert main(["prepare", "--corpus", s.spec, "--tokenizer", "bpe:600", "--out", str(tmp_path / "y"),
                 "--no-progress"]) == 0
    store = open_store(tmp_path / "y", "train")
    assert store.doc_lengths().min() > len(words)  # several tokens per pseudo-word
    with pytest.raises(ValueError, match="words"):
        parse_spec("synthetic:copy-far?words=bpe")


def test_unknown_synthetic_corpus_is_one_clear_line(tmp_path, capsys):
    assert main(["prepare", "--corpus", "synthetic:copy-mid", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "synthetic:copy-near" in err and "Traceback" not in err


def test_variable_passages_put_repeats_at_every_offset_to_the_chunk_grid():
    s = parse_spec("synthetic:copy-far?passage=96-160&passages=12&distance=4-8&p=1")
    assert (s.passage, s.passage_max, s.variable, s.aligned(64)) == (96, 160, True, False)
    assert parse_spec(s.spec) == s and "passage=96-160" in s.spec
    assert parse_spec("synthetic:copy-far?passage=128").aligned(64)
    assert not parse_spec("synthetic:copy-far?passage=100").aligned(64)
    with pytest.raises(ValueError, match="LO <= HI"):
        parse_spec("synthetic:copy-far?passage=160-96")
    rng = np.random.default_rng(0)
    offsets, lengths = set(), set()
    for _ in range(40):
        doc = copy_document(rng, s)
        src = copy_runs(doc)
        copied = np.nonzero(src >= 0)[0]
        assert len(copied) and (doc[copied] == doc[src[copied]]).all()  # every copied token equals its source
        starts = copied[np.r_[True, np.diff(src[copied]) != 1]]  # where each copied run begins
        offsets |= set((starts % 64).tolist())
        lengths.add(len(doc))
    assert len(offsets) > 40 and len(lengths) > 20  # repeats start almost anywhere on the grid; documents vary


def test_run_classes_on_a_hand_built_unaligned_document():
    """A 64-token chunk is repeat-tail when it and the half chunk before it are one copied run."""
    rng = np.random.default_rng(3)
    fresh = rng.permutation(1000)[:400]  # distinct words: nothing repeats by chance
    doc = np.concatenate([fresh[:300], fresh[10:150], fresh[300:400]])  # tokens 300..439 copy 10..149
    src = copy_runs(doc)
    assert (src[300:440] == np.arange(10, 150)).all() and (src[:300] < 0).all() and (src[440:] < 0).all()
    # chunks: 4 = 256..319 (20 copied tokens), 5 = 320..383 (copied; half chunk before, 288..319, is not all copied),
    # 6 = 384..447 (tokens 440..447 fresh) -> head; 7 = 448..511 fresh
    assert run_classes(doc, 64).tolist() == [0, 0, 0, 0, 1, 1, 1, 0]
    doc2 = np.concatenate([fresh[:300], fresh[10:200], fresh[300:400]])  # 300..489 copy 10..199
    assert run_classes(doc2, 64).tolist()[4:8] == [1, 1, 2, 1]  # 384..447 and 352..383 one run; 448..511 partly fresh


def test_run_classes_agree_with_passage_classes_on_an_aligned_document():
    s = CopySpec(vocab=50, passage=128, passages=4, min_distance=1, max_distance=1, p_repeat=1.0)
    toks = copy_document(np.random.default_rng(1), s)
    assert run_classes(toks, 64).tolist() == copy_classes(toks, 128, 64).tolist()
