"""The retrieval explorer (rpt/eval/explore.py, `rpt explore`): the page shows each query chunk's text, its target and the
neighbours of the model, BM25 and the labels; its numbers agree with the model's full forward; it is well-formed HTML
and renders in a headless browser."""

from __future__ import annotations

import math
import shutil
import subprocess
import warnings
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rpt import RPT, RPTConfig
from rpt.chunks import last_retrievable
from rpt.eval.explore import bm25_causal, explore_document, gold_ids, render_html, token_pieces
from rpt.eval.perplexity import bm25_neighbors
from rpt.labels.bm25 import bm25_candidates
from rpt.labels.store import LabelRows

M, S, VOCAB = 64, 128, 512
CHROMIUM = "/usr/bin/chromium"

# Code-like text with characters HTML must escape; ASCII only, so chunk boundaries never split a character.
TEXT = "\n".join(
    f"def f{i}(x, y):\n    if x < {i} and y > {i % 5} & True:\n        return \"<b>{i}</b>\" + str(value_{i % 7})\n"
    f"    return '</pre><script>alert({i})</script>'"
    for i in range(60)
)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from rpt.data.tokenizer import Tokenizer

    return Tokenizer.train_bpe([TEXT], 400, cache_dir=tmp_path_factory.mktemp("tok"))


def make(variant: str) -> RPT:
    torch.manual_seed(0)
    model = RPT(RPTConfig.from_preset("tiny", variant=variant, vocab_size=VOCAB, init_std=0.3)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() < 2:
                p.add_(torch.randn_like(p) * (2.0 if name.endswith("gate.w") else 0.1))
    return model


def fake_labels(tokens: np.ndarray, k: int = 8) -> LabelRows:
    """BM25 (query c_q, c_t) candidates with made-up target scores, some positive."""
    cand, bm25 = bm25_candidates(tokens, M, S, k=k, query="pair")
    rng = np.random.default_rng(0)
    target = np.where(cand >= 0, rng.normal(0, 0.5, cand.shape), np.nan).astype(np.float32)
    return LabelRows(cand, bm25, target)


class Dom(HTMLParser):
    """A minimal DOM from html.parser that also checks well-formedness: every non-void element is closed, in order."""

    VOID = {"meta", "br", "hr", "img", "input", "link", "wbr"}

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.root = {"tag": "#root", "attrs": {}, "children": []}
        self.stack = [self.root]
        self.errors: list[str] = []
        self.feed(text)
        self.close()
        if len(self.stack) != 1:
            self.errors.append(f"unclosed: {[n['tag'] for n in self.stack[1:]]}")

    def handle_starttag(self, tag, attrs):
        node = {"tag": tag, "attrs": dict(attrs), "children": []}
        self.stack[-1]["children"].append(node)
        if tag not in self.VOID:
            self.stack.append(node)

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if self.stack[-1]["tag"] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1]['tag']}>")
            return
        self.stack.pop()

    def handle_data(self, data):
        self.stack[-1]["children"].append(data)

    def find(self, pred, node=None):
        node = node or self.root
        for c in node["children"]:
            if isinstance(c, dict):
                if pred(c):
                    yield c
                yield from self.find(pred, c)

    @staticmethod
    def text(node) -> str:
        return "".join(c if isinstance(c, str) else Dom.text(c) for c in node["children"])


def has_class(name: str):
    return lambda n: name in n["attrs"].get("class", "").split()


@pytest.fixture(scope="module")
def explored(tok):
    tokens = np.asarray(tok.encode(TEXT)[:900], dtype=np.int64)  # 14 chunks: chunks 4..12 are queries with a target
    labels = fake_labels(tokens)
    model = make("rpt-sem")
    exp = explore_document(model, tokens, labels=labels, top=3, compare=["none", "bm25", "gold"])
    return {"tokens": tokens, "labels": labels, "model": model, "exp": exp, "page": render_html(exp, tok)}


def test_explorer_numbers_match_full_forward(explored):
    """Top ids/scores, the neighbours CCA used, gates and target losses equal the model's full forward; BM25 equals
    rpt eval's (query chunk, causal statistics); gold follows the labels."""
    exp, tokens, model, labels = explored["exp"], explored["tokens"], explored["model"], explored["labels"]
    x = torch.as_tensor(tokens)[None]
    with torch.no_grad():
        full = model(x, retrieve_k=3)
        alone = model(x, neighbor_ids=torch.full((1, 14, 2), -1))
    nll = F.cross_entropy(full.logits[0, :-1], x[0, 1:], reduction="none").numpy()
    nll_none = F.cross_entropy(alone.logits[0, :-1], x[0, 1:], reduction="none").numpy()
    bm_ids = bm25_neighbors(tokens, M, S, 3)  # what `rpt eval --source bm25` feeds retro
    assert [q.chunk for q in exp.queries] == list(range(4, 13))
    for q in exp.queries:
        i = q.chunk
        assert q.n_retrievable == last_retrievable(i, M, S) + 1
        want = [j for j in full.top_ids[0, i].tolist() if j >= 0]
        assert [n.chunk for n in q.model] == want and all(j < q.n_retrievable for j in want)
        np.testing.assert_allclose([n.score for n in q.model], full.top_scores[0, i, : len(want)].numpy(), rtol=1e-4)
        used = [j for j in full.neighbor_ids[0, i].tolist() if j >= 0]
        assert [n.chunk for n in q.model if n.used] == used
        np.testing.assert_allclose([n.gate for n in q.model if n.used], full.gates[0, i, : len(used)].numpy(), rtol=1e-4)
        assert [n.chunk for n in q.bm25] == [j for j in bm_ids[i].tolist() if j >= 0]
        np.testing.assert_allclose(q.target_loss["model"], nll[(i + 1) * M - 1 : (i + 2) * M - 1].mean(), rtol=1e-4)
        np.testing.assert_allclose(q.target_loss["none"], nll_none[(i + 1) * M - 1 : (i + 2) * M - 1].mean(), rtol=1e-4)
        st = [n.s_t for n in q.gold]
        assert st == sorted(st, reverse=True) and {n.chunk for n in q.gold} == {j for j in labels.candidates[i] if j >= 0}
        assert all(n.positive == (n.s_t > 0) for n in q.gold)
        for n in q.model + q.bm25:  # every shown neighbour carries its label score when it is a candidate
            assert n.positive == (n.chunk in {g.chunk for g in q.gold if g.positive})
    assert {"model", "none", "bm25", "gold"} == set(exp.passes)
    gold = gold_ids(labels, "sem", 2)
    assert all(labels.target[i][list(labels.candidates[i]).index(j)] > 0 for i in range(14) for j in gold[i] if j >= 0)


def test_page_shows_query_target_and_neighbours_escaped(explored, tok):
    exp, tokens, page = explored["exp"], explored["tokens"], explored["page"]
    dom = Dom(page)
    assert dom.errors == []
    assert page.startswith("<!DOCTYPE html>") and "<script>alert(" not in page  # document text is escaped
    assert "&lt;/pre&gt;" in page or "&lt;/" in page  # ... as entities, split by highlights at most
    chunk_text = lambda j: tok.decode(tokens[j * M : (j + 1) * M].tolist())  # noqa: E731
    queries = list(dom.find(lambda n: n["tag"] == "details" and has_class("query")(n)))
    assert [int(d["attrs"]["data-chunk"]) for d in queries] == [q.chunk for q in exp.queries]
    for d, q in zip(queries, exp.queries, strict=True):
        (qc,) = dom.find(has_class("query-chunk"), d)
        (tc,) = dom.find(has_class("target-chunk"), d)
        assert Dom.text(next(dom.find(lambda n: n["tag"] == "pre", qc))) == chunk_text(q.chunk)
        assert Dom.text(next(dom.find(lambda n: n["tag"] == "pre", tc))) == chunk_text(q.chunk + 1)
        for col, want in (("model", q.model), ("bm25", q.bm25), ("gold", q.gold)):
            (sec,) = dom.find(lambda n, c=col: n["tag"] == "section" and has_class("col")(n) and has_class(c)(n), d)
            cards = list(dom.find(lambda n: n["tag"] == "article", sec))
            assert [int(a["attrs"]["data-chunk"]) for a in cards] == [n.chunk for n in want[: exp.top]]
            for a, n in zip(cards, want, strict=False):
                (c,) = dom.find(has_class("nb-c"), a)
                (cont,) = dom.find(has_class("cont"), a)
                assert Dom.text(c) == chunk_text(n.chunk) and Dom.text(cont) == chunk_text(n.chunk + 1)
                assert ("used" in a["attrs"]["class"]) == n.used and ("positive" in a["attrs"]["class"]) == n.positive
    # tokens of a neighbour that occur in the target are highlighted
    q = exp.queries[-1]
    target = set(tokens[(q.chunk + 1) * M : (q.chunk + 2) * M].tolist())
    shared = [t for t in tokens[q.model[0].chunk * M : (q.model[0].chunk + 1) * M].tolist() if t in target]
    assert not shared or '<mark class="ot">' in page
    assert "".join(token_pieces(tok, tokens.tolist())) == tok.decode(tokens.tolist())


def test_explore_xl_and_retro(tok):
    tokens = np.asarray(tok.encode(TEXT)[:700], dtype=np.int64)
    xl = explore_document(make("xl"), tokens, top=2, compare=["none"])
    assert xl.queries and all(q.model == [] and q.bm25 for q in xl.queries) and xl.passes == ["model"]
    assert "xl retrieves nothing" in render_html(xl, tok)
    retro = explore_document(make("retro"), tokens, top=2)
    bm_ids = bm25_neighbors(tokens, M, S, 2)
    for q in retro.queries:  # retro feeds BM25 (query c_q) to CCA
        assert [n.chunk for n in q.model] == [j for j in bm_ids[q.chunk] if j >= 0] and all(n.used for n in q.model)
    assert Dom(render_html(retro, tok)).errors == []


def textbook_bm25(query: list[int], docs: list[list[int]], k1: float = 1.5, b: float = 0.75) -> list[float]:
    """BM25 from its definition, Lucene's variant: score(d) = sum over the query's tokens t (repeats counted) of
    idf(t) * f(t, d) / (f(t, d) + k1 * (1 - b + b * |d| / avgdl)), idf(t) = ln(1 + (N - n_t + 0.5) / (n_t + 0.5)),
    with N, n_t and avgdl over `docs` only."""
    N = len(docs)
    avgdl = sum(len(d) for d in docs) / N
    n = {}
    for d in docs:
        for t in set(d):
            n[t] = n.get(t, 0) + 1
    out = []
    for d in docs:
        score = 0.0
        for t in query:
            f = d.count(t)
            if f:
                idf = math.log(1.0 + (N - n[t] + 0.5) / (n[t] + 0.5))
                score += idf * f / (f + k1 * (1.0 - b + b * len(d) / avgdl))
        out.append(score)
    return out


def test_bm25_column_scores(tok):
    """bm25_causal gives rpt eval's ids, best first, with BM25 scores of the query chunk against the retrievable
    chunks under their own statistics: checked against BM25 written out from its definition over exactly the chunks
    retrievable for each query (causal statistics), not against the implementation's own weights."""
    tokens = np.asarray(tok.encode(TEXT)[:1100], dtype=np.int64)
    ids, scores = bm25_causal(tokens, M, S, 5)
    np.testing.assert_array_equal(ids, bm25_neighbors(tokens, M, S, 5))
    chunks = [tokens[c * M : (c + 1) * M].tolist() for c in range(len(tokens) // M)]
    checked = 0
    for i in range(len(chunks)):
        lim = int(last_retrievable(i, M, S))
        if lim < 0:
            assert (ids[i] == -1).all()
            continue
        want = textbook_bm25(chunks[i], chunks[: lim + 1])  # [lim + 1]
        got = [j for j in ids[i] if j >= 0]
        np.testing.assert_allclose(scores[i][: len(got)], [want[j] for j in got], rtol=1e-5)
        assert list(scores[i][: len(got)]) == sorted(scores[i][: len(got)], reverse=True)
        assert np.isneginf(scores[i][len(got):]).all()
        # the top of the textbook ranking: every chunk left out scores no higher than the last one kept (up to
        # float32 rounding), chunks sharing no token are never neighbours, and slots stay empty only when none is left
        left = [want[j] for j in range(lim + 1) if j not in got]
        assert all(want[j] > 0 for j in got)
        if len(got) < 5:
            assert all(v == 0 for v in left)
        elif left:
            assert max(left) <= want[got[-1]] * (1 + 1e-5)
        checked += 1
    assert checked >= 10


def test_explore_short_document_and_bad_input(tok):
    model = make("rpt-sem")
    short = np.asarray(tok.encode(TEXT)[:200], dtype=np.int64)
    exp = explore_document(model, short)
    assert exp.queries == [] and "No query chunk to show" in render_html(exp, tok)
    with pytest.raises(ValueError, match="needs labels"):
        explore_document(model, short, compare=["gold"])
    with pytest.raises(ValueError, match="unknown source"):
        explore_document(model, short, compare=["oracle"])
    with pytest.raises(ValueError, match="vocabulary"):
        explore_document(model, np.array([1, 2, VOCAB]))


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"headless Chromium not installed at {CHROMIUM} "
                    "(apt-get install -y chromium)")
def test_page_renders_in_headless_chromium(explored, tmp_path):
    page = tmp_path / "explore.html"
    page.write_text(explored["page"], encoding="utf-8")
    q = explored["exp"].queries[2].chunk
    profile = tmp_path / "profile"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
           "--dump-dom", f"file://{page}#q{q}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = Dom(done.stdout)
    queries = list(dom.find(lambda n: n["tag"] == "details" and has_class("query")(n)))
    assert len(queries) == len(explored["exp"].queries)
    opened = [d for d in queries if "open" in d["attrs"]]  # the script ran: the #q<i> in the URL opened that chunk
    assert [d["attrs"]["id"] for d in opened] == [f"q{q}"]
    assert len(list(dom.find(lambda n: n["tag"] == "article" and has_class("nb")(n)))) > 0
    assert len(list(dom.find(lambda n: n["tag"] == "select" and n["attrs"].get("id") == "filter"))) == 1


# ----------------------------------------------------------------------------------------------------------------
# CLI


@pytest.fixture
def stored(tmp_path: Path, tok) -> dict:
    """A token store (test split, 2 documents), whole-document sem labels and a checkpoint naming the store."""
    from rpt import checkpoint as ckpt
    from rpt.data.store import StoreWriter, TokenStore
    from rpt.labels.pipeline import LabelSpec
    from rpt.labels.store import LabelWriter

    root = tmp_path / "store"
    tok.save(root / "tokenizer.json")
    ids = tok.encode(TEXT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = StoreWriter(root / "test", tok.identity, M)
        w.add("first", ids[:300])
        w.add("second", ids[100:1000])
        w.close()
    store = TokenStore.open(root / "test")
    spec = LabelSpec(kind="sem", span=None, chunk_size=M, segment_len=S, k=8)
    chunks = store.doc_lengths() // M
    writer = LabelWriter(root / "labels" / "test-sem-doc", {**spec.manifest(), "scorer": "fake",
                                                              "tokenizer": store.tokenizer_id}, (0, 2), chunks, 8)
    for d in range(2):
        rows = fake_labels(np.asarray(store.document(d)))
        writer.write(d, rows.candidates, rows.bm25, rows.target, {})
    writer.publish({})
    cfg = RPTConfig.from_preset("tiny", variant="rpt-sem", vocab_size=VOCAB)
    cfg.data.store = str(root)
    path = ckpt.save(tmp_path / "run", 3, make("rpt-sem").state_dict(), {}, cfg, [ckpt.rng_state()], {})
    return {"root": root, "ckpt": path, "tmp": tmp_path}


def test_cli_explore_store_document(stored, capsys):
    from rpt.cli import main

    out = stored["tmp"] / "page" / "explore.html"
    rc = main(["explore", "--checkpoint", str(stored["ckpt"]), "--store", str(stored["root"]), "--split", "test",
               "--doc", "second", "--out", str(out), "--top", "2", "--compare", "none", "--chunks", "5:9"])
    assert rc == 0, capsys.readouterr().err
    dom = Dom(out.read_text())
    assert dom.errors == []
    queries = list(dom.find(lambda n: n["tag"] == "details" and has_class("query")(n)))
    assert [d["attrs"]["id"] for d in queries] == ["q5", "q6", "q7", "q8"]
    assert any(has_class("positive")(a) for a in dom.find(lambda n: n["tag"] == "article"))  # labels found by default
    assert "test-sem-doc" in out.read_text()


def test_cli_explore_text_file(stored, capsys):
    from rpt.cli import main

    src = stored["tmp"] / "doc.py"
    src.write_text(TEXT[:3000])
    out = stored["tmp"] / "text.html"
    assert main(["explore", "--checkpoint", str(stored["ckpt"]), "--text", str(src), "--out", str(out)]) == 0
    assert Dom(out.read_text()).errors == [] and "details" in out.read_text()


def test_cli_explore_bad_input(stored, tmp_path, capsys):
    from rpt.cli import main
    from rpt.data.store import StoreWriter
    from rpt.data.tokenizer import Tokenizer

    other = Tokenizer.train_bpe(["something else entirely " * 50], 300, cache_dir=tmp_path / "tok2")
    w = StoreWriter(tmp_path / "other" / "test", other.identity, M)
    w.add("x", list(range(300)))
    w.close()
    base = ["explore", "--checkpoint", str(stored["ckpt"]), "--out", str(tmp_path / "x.html")]
    cases = [
        (["--store", str(tmp_path / "other")], "tokenized with"),
        (["--store", str(stored["root"]), "--doc", "7"], "has documents 0..1"),
        (["--store", str(stored["root"]), "--doc", "nope"], "no document with that id"),
        (["--text", str(tmp_path / "missing.txt")], "no such file"),
        ([], "--store ROOT"),
        (["--store", str(stored["root"]), "--compare", "oracle"], "--compare"),
    ]
    for extra, message in cases:
        assert main(base + extra) == 2
        assert message in capsys.readouterr().err
    assert main(["explore", "--checkpoint", str(tmp_path / "nope"), "--text", "x"]) == 2
    assert "no such file" in capsys.readouterr().err
