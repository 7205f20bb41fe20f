"""`rpt label --kind sem --scorer FOLDER` with a Llama-family scorer scores with shared prefixes, and its labels are
those of the unshared scorer."""

from __future__ import annotations

import numpy as np
from retrofit_helpers import TEXT, byte_bpe, tiny_llama


def test_label_with_a_llama_scorer_shares_prefixes_and_gives_the_same_labels(tmp_path, monkeypatch):
    from rpt.cli import main
    from rpt.labels import scorer as scorers
    from rpt.labels.scorer import SharedPrefixScorer
    from rpt.labels.store import LabelStore

    tok = byte_bpe()
    folder = tmp_path / "llama"
    tiny_llama(vocab=len(tok)).save_pretrained(folder)
    tok.save_pretrained(folder)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for n in range(2):
        (corpus / f"m{n}.py").write_text(f"# {n}\n" + TEXT[: 700 + 300 * n])
    store = tmp_path / "store"
    assert main(["prepare", "--corpus", str(corpus), "--tokenizer", str(folder), "--out", str(store), "--chunk-size",
                 "8", "--splits", "train", "--no-progress"]) == 0

    used = []
    load = scorers.load_scorer

    def spy(*args, **kwargs):
        used.append(load(*args, **kwargs))
        return used[-1]

    labels = {}
    for name, shared in (("shared", True), ("plain", False)):
        monkeypatch.setattr(scorers, "load_scorer", lambda *a, _s=shared, **k: spy(*a, **{**k, "shared_prefix": _s}))
        out = tmp_path / name
        assert main(["label", "--store", str(store), "--split", "train", "--kind", "sem", "--span", "96",
                     "--segment-len", "16", "--k", "4", "--scorer", str(folder), "--device", "cpu", "--out", str(out),
                     "--no-progress"]) == 0
        labels[name] = LabelStore.open(out)
    assert isinstance(used[0], SharedPrefixScorer) and type(used[1]) is scorers.HFScorer
    a, b = labels["plain"], labels["shared"]
    np.testing.assert_array_equal(np.asarray(b.candidates), np.asarray(a.candidates))
    np.testing.assert_allclose(np.asarray(b.target), np.asarray(a.target), atol=1e-4, rtol=1e-4)
    assert np.isfinite(np.asarray(a.target)[np.asarray(a.candidates) >= 0]).any()


def test_load_scorer_shares_prefixes_of_llama_folders_only(tmp_path):
    from rpt.labels.scorer import HFScorer, SharedPrefixScorer, load_scorer

    tok = byte_bpe()
    folder = tmp_path / "llama"
    tiny_llama(vocab=len(tok)).save_pretrained(folder)
    tok.save_pretrained(folder)
    assert isinstance(load_scorer(str(folder), device="cpu"), SharedPrefixScorer)
    assert type(load_scorer(str(folder), device="cpu", shared_prefix=False)) is HFScorer
