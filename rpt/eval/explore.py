"""The retrieval explorer: the paper's qualitative analysis (§5.4, the figure with the top-1 neighbours of RPT-Sem and
BM25 for one query chunk) as a tool over a whole document.

For every query chunk c_q = c_i of a document the page shows its target chunk c_t = c_{i+1} and, side by side:

    model   the retriever's top-R over the document memory (rpt-lex / rpt-sem) with its scores s_q, marking the K that
            CCA used and their gate values; for retro the BM25 neighbours CCA used; nothing for xl
    BM25    BM25's top-R among the retrievable chunks with the query chunk alone as the query and causal statistics
            (RETRO at inference; the same neighbours as `rpt eval --source bm25`)
    gold    the label store's candidates (BM25 with query (c_q, c_t), §3.2) ordered by the scoring LM's target score
            s_t, positives (s_t > 0) marked; with "lex" labels the BM25 top-k are the positives

Every neighbour is shown as chunk c_j followed by its continuation c_{j+1} (what CCA reads). Tokens that also occur in
the target chunk are highlighted (in the query chunk: no highlight; in neighbours, a dotted underline marks tokens
shared only with the query), which is usually enough to see why a chunk was retrieved and whether it could help. With
`compare`, the target chunk's loss is also computed with no neighbours, BM25's or the gold ones fed to CCA.

The model runs over the document with `model.step` one segment at a time (K/V cache + document memory, linear in the
document's length), exactly as long-document evaluation does. The page is one self-contained HTML file: inline CSS,
a few lines of optional JavaScript (expand all, filters), no network.

Dimension letters: L tokens, C chunks, M chunk length, K neighbours fed to CCA, R neighbours shown per column.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from rpt.chunks import last_retrievable
from rpt.config import check_neighbors

if TYPE_CHECKING:
    from rpt.data.tokenizer import Tokenizer
    from rpt.labels.store import LabelRows
    from rpt.model.memory import ChunkMemory
    from rpt.model.rpt import RPT

COMPARE = ("none", "bm25", "gold")  # extra passes: the target loss with these neighbours fed to CCA instead


@dataclass
class Neighbor:
    """One retrieved (or candidate) chunk j for a query chunk; shown as c_j + c_{j+1}."""

    chunk: int
    rank: int  # 0 = best in its column
    score: float | None = None  # s_q (model), BM25 score (bm25 and gold columns)
    used: bool = False  # fed to CCA
    gate: float | None = None  # its gate value when used
    s_t: float | None = None  # the scorer's target score, when j is one of the label candidates
    positive: bool = False  # a gold positive (s_t > 0, or a BM25 candidate for lex labels)


@dataclass
class QueryView:
    """Query chunk `chunk` (target chunk + 1) with its three neighbour columns."""

    chunk: int
    n_retrievable: int  # chunks 0 .. n_retrievable - 1 may be retrieved (rpt.chunks)
    model: list[Neighbor] = field(default_factory=list)
    bm25: list[Neighbor] = field(default_factory=list)
    gold: list[Neighbor] = field(default_factory=list)
    target_loss: dict[str, float] = field(default_factory=dict)  # mean NLL of the target's tokens per pass

    @property
    def n_positive(self) -> int:
        return sum(n.positive for n in self.gold)

    def hit(self, column: str, k: int) -> bool:
        """True when one of the column's first k neighbours is a gold positive."""
        return any(n.positive for n in getattr(self, column)[:k])


@dataclass
class Exploration:
    tokens: np.ndarray  # [L] the document
    chunk_size: int
    segment_len: int
    variant: str
    n_neighbors: int  # K
    top: int  # R
    queries: list[QueryView]
    label_kind: str | None = None  # "sem" | "lex" | None (no labels)
    passes: list[str] = field(default_factory=list)  # "model" plus the compared sources

    @property
    def n_chunks(self) -> int:
        return len(self.tokens) // self.chunk_size


# ------------------------------------------------------------------------------------------------------------------
# computing


@dataclass
class DocumentPass:
    """One pass of the model over a document (`run_document`)."""

    nll: np.ndarray  # [L - 1] nll[p] = -log P(token p+1 | tokens <= p)
    neighbor_ids: np.ndarray | None = None  # [C, K]
    gates: np.ndarray | None = None  # [C, K]
    top_ids: np.ndarray | None = None  # [C, R]
    top_scores: np.ndarray | None = None  # [C, R]


@torch.no_grad()
def run_document(model: RPT, tokens: np.ndarray, n_neighbors: int, retrieve_k: int | None = None,
                 neighbor_ids: np.ndarray | None = None,
                 memory: ChunkMemory | Callable[[], ChunkMemory] | None = None) -> DocumentPass:
    """One pass of `model.step` over a document, a segment at a time: per-token NLL and, per finished chunk, the
    neighbours CCA used, their gates and the retriever's top-R. neighbor_ids [C, K'] document-absolute ids to feed
    instead of the model's own (retro: required; -1 everywhere: no retrieval)."""
    cfg = model.cfg
    M, S = cfg.chunk_size, cfg.segment_len
    device = next(model.parameters()).device
    L, C = len(tokens), len(tokens) // M
    x = torch.as_tensor(np.asarray(tokens, dtype=np.int64), device=device)[None]  # [1, L]
    nb = torch.as_tensor(neighbor_ids, dtype=torch.long, device=device)[None] if neighbor_ids is not None else None
    R = retrieve_k if cfg.has_retriever else None
    cache = model.new_cache(memory)
    nll = np.zeros(max(L - 1, 0), np.float32)
    res = DocumentPass(nll)
    if cfg.uses_retrieval:
        res.neighbor_ids, res.gates = np.full((C, n_neighbors), -1, np.int64), np.full((C, n_neighbors), np.nan, np.float32)
    if R:
        res.top_ids, res.top_scores = np.full((C, R), -1, np.int64), np.full((C, R), -np.inf, np.float32)
    for a in range(0, L, S):
        b = min(a + S, L)
        out = model.step(x[:, a:b], cache, neighbor_ids=nb, n_neighbors=n_neighbors, retrieve_k=R)
        n_pred = min(b, L - 1) - a  # positions a .. a+n_pred-1 have a next token
        if n_pred > 0:
            logp = F.log_softmax(out.logits[0, :n_pred].float(), -1)  # [n, V]
            nll[a : a + n_pred] = (-logp.gather(-1, x[0, a + 1 : a + 1 + n_pred, None])[:, 0]).cpu().numpy()
        if out.neighbor_ids is not None:
            c0, nc = out.chunk_start, out.neighbor_ids.shape[1]
            res.neighbor_ids[c0 : c0 + nc] = out.neighbor_ids[0].cpu().numpy()
            if out.gates is not None:
                res.gates[c0 : c0 + nc] = out.gates[0].float().cpu().numpy()
            if out.top_ids is not None and R:
                res.top_ids[c0 : c0 + nc] = out.top_ids[0, :, :R].cpu().numpy()
                res.top_scores[c0 : c0 + nc] = out.top_scores[0, :, :R].float().cpu().numpy()
    return res


def _target_loss(nll: np.ndarray, i: int, M: int) -> float:
    """Mean NLL of target chunk c_{i+1}'s tokens (predicted from positions (i+1)M - 1 .. (i+2)M - 2)."""
    seg = nll[(i + 1) * M - 1 : (i + 2) * M - 1]
    return float(seg.mean()) if len(seg) else math.nan


def _finite(x: float) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def gold_ids(labels: LabelRows, kind: str, k: int) -> np.ndarray:
    """The gold's neighbours [C, k]: the best positives by s_t (sem, `rpt.eval.perplexity.oracle_neighbors` with
    oracle "positives") or the BM25 (c_q, c_t) order (lex: its top-k are the positives), -1 where fewer."""
    from rpt.eval.perplexity import oracle_neighbors

    cand = np.asarray(labels.candidates, dtype=np.int64)
    if kind == "lex":
        return np.pad(cand[:, :k], ((0, 0), (0, max(0, k - cand.shape[1]))), constant_values=-1)
    return oracle_neighbors(cand, np.asarray(labels.target), k, "positives")


def bm25_causal(tokens: np.ndarray, chunk_size: int, segment_len: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """BM25 with the query chunk c_q alone among its retrievable chunks, causal statistics (idf and average length of
    the retrievable chunks only): the ids of `rpt.labels.bm25.bm25_neighbors` (what `rpt eval --source bm25` and
    retro generation use), with their scores. Returns ids int64 [C, k] (-1 none) and scores float32 [C, k] (-inf)."""
    from rpt.labels.bm25 import bm25_weights, chunk_term_matrix, topk_rows

    cps = segment_len // chunk_size
    counts = chunk_term_matrix(np.asarray(tokens), chunk_size)  # [C, V']
    C = counts.shape[0]
    ids, scores = np.full((C, k), -1, np.int64), np.full((C, k), -np.inf, np.float32)
    for s0 in range(2 * cps, C, cps):  # the chunks of one segment share one retrievable set 0..limit
        limit = int(last_retrievable(s0, chunk_size, segment_len))
        block = (counts[s0 : s0 + cps] @ bm25_weights(counts[: limit + 1]).T).toarray()  # [<=cps, limit+1]
        block[block <= 0] = -np.inf  # shares no token with the query: not a candidate
        i, v = topk_rows(block, k)
        ids[s0 : s0 + cps], scores[s0 : s0 + cps] = i, np.where(i >= 0, v, -np.inf)
    return ids, scores


def explore_document(model: RPT, tokens: np.ndarray | Sequence[int], *, labels: LabelRows | None = None,
                     label_kind: str = "sem", top: int = 4, n_neighbors: int | None = None,
                     chunks: range | None = None, compare: Sequence[str] = (),
                     memory: ChunkMemory | Callable[[], ChunkMemory] | None = None) -> Exploration:
    """Retrieval of every query chunk of one document by the model, by BM25 (query c_q) and by the labels.

    tokens [L]; labels: the document's rows of a label store (document-absolute ids, whole-document span);
    top: R neighbours per column; chunks: query chunk indices to keep (default: every chunk that can retrieve and has
    a target); compare: extra passes among "none", "bm25", "gold" whose target loss is reported beside the model's."""
    cfg = model.cfg
    M, S = cfg.chunk_size, cfg.segment_len
    check_neighbors(n_neighbors, "n_neighbors")
    K = n_neighbors or cfg.n_neighbors
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.ndim != 1 or len(tokens) == 0:
        raise ValueError("tokens must be a non-empty 1-D array of token ids")
    if tokens.min() < 0 or tokens.max() >= cfg.vocab_size:
        raise ValueError(f"token ids must lie in [0, {cfg.vocab_size}) (the model's vocabulary)")
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top}")
    bad = [c for c in compare if c not in COMPARE]
    if bad:
        raise ValueError(f"compare: unknown source(s) {bad}; choose from {list(COMPARE)}")
    C = len(tokens) // M
    if labels is not None:
        if len(labels.candidates) != C:
            raise ValueError(f"labels have {len(labels.candidates)} chunks, the document has {C}")
        if "gold" in compare and label_kind == "sem" and not np.isfinite(np.asarray(labels.target)).any():
            raise ValueError("compare 'gold' needs target scores (sem labels)")
    elif "gold" in compare:
        raise ValueError("compare 'gold' needs labels")

    bm25_ids, bm25_scores = bm25_causal(tokens[: C * M], M, S, k=max(top, K))  # [C, k]
    bm25_feed = np.where(bm25_ids[:, :K] >= 0, bm25_ids[:, :K], -1).astype(np.int64)
    main = run_document(model, tokens, K, max(top, K), bm25_feed if cfg.variant == "retro" else None, memory)
    passes = {"model": main}
    feeds = {"none": np.full((C, K), -1, np.int64), "bm25": bm25_feed}
    if labels is not None:
        feeds["gold"] = gold_ids(labels, label_kind, K)
    for src in compare:
        if cfg.uses_retrieval and not (src == "bm25" and cfg.variant == "retro"):
            passes[src] = run_document(model, tokens, K, None, feeds[src], memory)

    can = np.nonzero(last_retrievable(np.arange(C), M, S) >= 0)[0]  # query chunks that can retrieve anything
    first = int(can[0]) if len(can) else C
    keep = [i for i in (chunks if chunks is not None else range(first, C - 1)) if 0 <= i < C - 1]
    views = []
    for i in keep:
        gold_st: dict[int, float | None] = {}
        q = QueryView(chunk=i, n_retrievable=max(0, int(last_retrievable(i, M, S)) + 1))
        if labels is not None:
            cand, bm, tgt = (np.asarray(a[i]) for a in (labels.candidates, labels.bm25, labels.target))
            rows = [(int(j), _finite(b), _finite(t)) for j, b, t in zip(cand, bm, tgt, strict=True) if j >= 0]
            if label_kind != "lex":
                rows.sort(key=lambda r: -r[2] if r[2] is not None else math.inf)
            for r, (j, b, t) in enumerate(rows):
                pos = (t is not None and t > 0) if label_kind != "lex" else True
                q.gold.append(Neighbor(j, r, score=b, s_t=t, positive=pos))
                gold_st[j] = t
        positives = {n.chunk for n in q.gold if n.positive}

        def make(j: int, r: int, score: float | None, **kw: Any) -> Neighbor:
            return Neighbor(j, r, score=score, s_t=gold_st.get(j), positive=j in positives, **kw)  # noqa: B023

        used = {}
        if main.neighbor_ids is not None:
            used = {int(j): (_finite(g) if main.gates is not None else None)
                    for j, g in zip(main.neighbor_ids[i], main.gates[i], strict=True) if j >= 0}
        if main.top_ids is not None:  # rpt-*: the retriever's own ranking
            for r, (j, s) in enumerate(zip(main.top_ids[i], main.top_scores[i], strict=True)):
                if j >= 0:
                    q.model.append(make(int(j), r, _finite(s), used=int(j) in used, gate=used.get(int(j))))
        elif used:  # retro: the BM25 neighbours CCA used, with their gates
            for r, (j, g) in enumerate(used.items()):
                q.model.append(make(j, r, _finite(bm25_scores[i][r]), used=True, gate=g))
        for r, (j, s) in enumerate(zip(bm25_ids[i][:top], bm25_scores[i][:top], strict=True)):
            if j >= 0:
                q.bm25.append(make(int(j), r, _finite(s), used=cfg.variant == "retro" and r < K))
        q.target_loss = {name: _target_loss(p.nll, i, M) for name, p in passes.items()}
        views.append(q)
    return Exploration(tokens=tokens, chunk_size=M, segment_len=S, variant=cfg.variant, n_neighbors=K, top=top,
                       queries=views, label_kind=label_kind if labels is not None else None, passes=list(passes))


# ------------------------------------------------------------------------------------------------------------------
# text


def token_pieces(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
    """The text of each token in context: "".join(pieces) == tokenizer.decode(ids) for byte-level BPEs.

    A multi-byte character split over several tokens is given to the token that completes it. Uses the tokenizers
    library's DecodeStream (tokenizers >= 0.21) when available, else decodes a short window around each token."""
    ids = [int(t) for t in ids]
    try:
        from tokenizers.decoders import DecodeStream
    except ImportError:
        DecodeStream = None  # noqa: N806
    pieces: list[str] = []
    if DecodeStream is not None:
        ds = DecodeStream(skip_special_tokens=False)
        for t in ids:
            pieces.append(ds.step(tokenizer.tok, t) or "")
        return pieces
    prev = ""
    for p in range(len(ids)):  # fallback: the text a window of earlier tokens gains by adding token p
        lo = max(0, p - 8)
        prev = tokenizer.decode(ids[lo:p])
        cur = tokenizer.decode(ids[lo : p + 1])
        pieces.append(cur[len(prev):] if cur.startswith(prev) else tokenizer.decode([ids[p]]))
    return pieces


# ------------------------------------------------------------------------------------------------------------------
# HTML

_CSS = """
:root { --bg:#fff; --fg:#1d1f23; --mut:#6a7079; --line:#dde1e6; --q:#e8f0fe; --t:#e6f4ea; --m:#fff3c4;
        --model:#3367d6; --bm25:#b3261e; --gold:#137333; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg);
       margin: 0 auto; max-width: 1500px; padding: 12px 18px 60px; }
h1 { font-size: 20px; margin: 4px 0 8px; }
h3 { font-size: 13px; margin: 0 0 4px; color: var(--mut); }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 0 0 8px; font-size: 13px; }
dl.meta dt { color: var(--mut); } dl.meta dd { margin: 0; }
.legend, .stats { font-size: 13px; color: var(--mut); margin: 4px 0; }
.controls { position: sticky; top: 0; background: var(--bg); padding: 6px 0; border-bottom: 1px solid var(--line);
            z-index: 2; display: flex; gap: 12px; align-items: center; flex-wrap: wrap; }
nav.map { display: flex; flex-wrap: wrap; gap: 2px; margin: 8px 0; }
nav.map a { font-size: 10px; min-width: 22px; text-align: center; padding: 1px 2px; border-radius: 3px;
            background: #eef0f3; color: var(--fg); text-decoration: none; }
nav.map a.hit { background: #cdeccf; } nav.map a.miss { background: #f6d6d3; }
details.query { border: 1px solid var(--line); border-radius: 6px; margin: 6px 0; scroll-margin-top: 52px; }
details.query > summary { cursor: pointer; padding: 6px 10px; display: flex; gap: 10px; align-items: baseline; }
details.query[open] > summary { border-bottom: 1px solid var(--line); background: #fafbfc; }
.cid { font-weight: 600; min-width: 4.5em; } .snippet { color: var(--mut); white-space: nowrap; overflow: hidden;
       text-overflow: ellipsis; flex: 1; font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; }
.badge { font-size: 11px; padding: 0 6px; border-radius: 9px; background: #eef0f3; white-space: nowrap; }
.badge.good { background: #cdeccf; } .badge.bad { background: #f6d6d3; }
.body { padding: 8px 10px; }
.qt { display: grid; grid-template-columns: 1fr 1fr; gap: 10px; margin-bottom: 10px; }
.qt section { border-radius: 6px; padding: 6px 8px; }
.query-chunk { background: var(--q); } .target-chunk { background: var(--t); }
.cols { display: grid; grid-template-columns: repeat(3, minmax(0, 1fr)); gap: 10px; }
.col > h3 { border-bottom: 2px solid var(--line); padding-bottom: 2px; }
.col.model > h3 { border-color: var(--model); } .col.bm25 > h3 { border-color: var(--bm25); }
.col.gold > h3 { border-color: var(--gold); }
article.nb { border: 1px solid var(--line); border-radius: 6px; margin: 0 0 8px; padding: 4px 6px; }
article.nb.used { border-left: 4px solid var(--model); } article.nb.positive { background: #f3fbf4; }
article.nb > header { font-size: 12px; display: flex; gap: 8px; flex-wrap: wrap; color: var(--mut); }
article.nb > header .j { font-weight: 600; color: var(--fg); }
pre { white-space: pre-wrap; word-break: break-word; margin: 2px 0 0; font: 12px/1.4 ui-monospace, Menlo, Consolas,
      monospace; max-height: 22em; overflow: auto; }
.cont { color: var(--mut); } .cont::before { content: "⏎ continuation ⏎"; display: block; font-size: 10px;
        color: var(--mut); border-top: 1px dashed var(--line); margin-top: 2px; }
mark.ot { background: var(--m); padding: 0; } span.oq { text-decoration: underline dotted #3367d6; }
.empty { color: var(--mut); font-style: italic; font-size: 12px; }
table.cands { font-size: 12px; border-collapse: collapse; } table.cands td, table.cands th { padding: 1px 6px;
              text-align: right; border-bottom: 1px solid var(--line); }
.hidden { display: none; }
"""

_JS = """
(function () {
  var all = function () { return document.querySelectorAll('details.query'); };
  document.getElementById('expand-all').onclick = function () { all().forEach(function (d) { d.open = true; }); };
  document.getElementById('collapse-all').onclick = function () { all().forEach(function (d) { d.open = false; }); };
  document.getElementById('filter').onchange = function (e) {
    var v = e.target.value;
    all().forEach(function (d) {
      var pos = d.dataset.positives !== '0', mh = d.dataset.modelHit === '1', bh = d.dataset.bm25Hit === '1';
      var show = v === 'all' || (v === 'positives' && pos) || (v === 'model-hit' && mh) ||
                 (v === 'model-miss' && pos && !mh) || (v === 'bm25-better' && bh && !mh);
      d.classList.toggle('hidden', !show);
    });
  };
  function openHash() {
    var el = location.hash && document.getElementById(location.hash.slice(1));
    if (el && el.tagName === 'DETAILS') { el.open = true; el.scrollIntoView(); }
  }
  window.addEventListener('hashchange', openHash); openHash();
})();
"""


def _fmt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


class _Renderer:
    def __init__(self, exp: Exploration, tokenizer: Tokenizer) -> None:
        self.exp = exp
        self.M = exp.chunk_size
        self.pieces = token_pieces(tokenizer, exp.tokens.tolist())
        self.listed = {q.chunk for q in exp.queries}

    def ids(self, j: int) -> list[int]:
        return self.exp.tokens[j * self.M : (j + 1) * self.M].tolist()

    def text(self, j: int) -> str:
        return "".join(self.pieces[j * self.M : (j + 1) * self.M])

    def chunk(self, j: int, target: set[int] = frozenset(), query: set[int] = frozenset()) -> str:  # type: ignore[assignment]
        """Escaped text of chunk j; tokens shared with the target (mark.ot) or only with the query (span.oq)."""
        if not 0 <= j < self.exp.n_chunks:
            return ""
        out = []
        for t, piece in zip(self.ids(j), self.pieces[j * self.M : (j + 1) * self.M], strict=True):
            esc = html.escape(piece)
            wordy = any(ch.isalnum() for ch in piece)
            if wordy and t in target:
                out.append(f'<mark class="ot">{esc}</mark>')
            elif wordy and t in query:
                out.append(f'<span class="oq">{esc}</span>')
            else:
                out.append(esc)
        return "".join(out)

    def neighbour(self, n: Neighbor, column: str, target: set[int], query: set[int]) -> str:
        cls = ["nb"] + (["used"] if n.used else []) + (["positive"] if n.positive else [])
        link = f'<a href="#q{n.chunk}">#{n.chunk}</a>' if n.chunk in self.listed else f"#{n.chunk}"
        score_name = {"model": "s_q", "bm25": "BM25", "gold": "BM25(q,t)"}[column]
        bits = [f'<span class="j">{link}</span>', f"rank {n.rank + 1}", f"{score_name} {_fmt(n.score)}"]
        if n.used:
            bits.append(f"CCA gate {_fmt(n.gate, 2)}" if n.gate is not None else "fed to CCA")
        if n.s_t is not None:
            bits.append(f"s_t {n.s_t:+.3f}")
        if n.positive:
            bits.append('<span class="badge good">gold</span>')
        head = "".join(f"<span>{b}</span>" for b in bits)
        body = (f'<span class="nb-c">{self.chunk(n.chunk, target, query)}</span>'
                f'<span class="cont">{self.chunk(n.chunk + 1, target, query)}</span>')
        return (f'<article class="{" ".join(cls)}" data-chunk="{n.chunk}"><header>{head}</header>'
                f"<pre>{body}</pre></article>")

    def column(self, q: QueryView, name: str, title: str, target: set[int], query: set[int], note: str) -> str:
        items = [n for n in getattr(q, name) if n.rank < self.exp.top or n.used]  # top-R, plus what CCA used
        inner = "".join(self.neighbour(n, name, target, query) for n in items) or f'<p class="empty">{note}</p>'
        extra = ""
        if name == "gold" and len(q.gold) > self.exp.top:
            rows = "".join(f"<tr><td>#{n.chunk}</td><td>{_fmt(n.score)}</td><td>{_fmt(n.s_t)}</td>"
                           f"<td>{'✓' if n.positive else ''}</td></tr>" for n in q.gold)
            extra = (f"<details><summary>all {len(q.gold)} candidates</summary><table class=\"cands\"><tr><th>chunk</th>"
                     f"<th>BM25</th><th>s_t</th><th>gold</th></tr>{rows}</table></details>")
        return f'<section class="col {name}"><h3>{html.escape(title)}</h3>{inner}{extra}</section>'

    def query(self, q: QueryView) -> str:
        exp, M, i = self.exp, self.M, q.chunk
        target, query = set(self.ids(i + 1)), set(self.ids(i))
        k = exp.n_neighbors
        model_hit, bm25_hit = q.hit("model", k), q.hit("bm25", k)
        badges = []
        for name, loss in q.target_loss.items():
            badges.append(f'<span class="badge">{"loss" if name == "model" else "loss/" + name} {_fmt(loss, 2)}</span>')
        if exp.label_kind is not None:
            badges.append(f'<span class="badge">{q.n_positive} gold</span>')
            if q.n_positive and exp.variant != "xl":
                badges.append(f'<span class="badge {"good" if model_hit else "bad"}">model {"hit" if model_hit else "miss"}'
                              "</span>")
        snippet = html.escape(" ".join(self.text(i).split())[:160])
        summary = (f'<summary><span class="cid">#{i}</span><span class="snippet">{snippet}</span>{"".join(badges)}'
                   "</summary>")
        qt = (f'<div class="qt"><section class="query-chunk"><h3>query chunk c<sub>{i}</sub> · tokens {i * M}–'
              f"{(i + 1) * M - 1}</h3><pre>{self.chunk(i)}</pre></section>"
              f'<section class="target-chunk"><h3>target chunk c<sub>{i + 1}</sub> · tokens {(i + 1) * M}–{(i + 2) * M - 1}'
              f"</h3><pre>{self.chunk(i + 1)}</pre></section></div>")
        model_title = {"xl": "model (xl: no retrieval)", "retro": "model (retro: BM25 fed to CCA)"}.get(
            exp.variant, f"model retriever ({exp.variant}) top-{exp.top}")
        model_note = ("xl retrieves nothing" if exp.variant == "xl" else
                      f"nothing retrievable yet ({q.n_retrievable} earlier chunks)")
        gold_note = "no labels given" if exp.label_kind is None else "no candidates"
        cols = (self.column(q, "model", model_title, target, query, model_note)
                + self.column(q, "bm25", f"BM25 (query c_q) top-{exp.top}", target, query, "no lexical match")
                + self.column(q, "gold", "gold: BM25 (c_q, c_t) candidates (lex labels)" if exp.label_kind == "lex" else
                              f"gold: scorer s_t ({exp.label_kind or '–'} labels)", target, query, gold_note))
        attrs = (f'id="q{i}" data-chunk="{i}" data-positives="{q.n_positive}" data-model-hit="{int(model_hit)}" '
                 f'data-bm25-hit="{int(bm25_hit)}"')
        return f'<details class="query" {attrs}>{summary}<div class="body">{qt}<div class="cols">{cols}</div></div></details>'

    def page(self, title: str, meta: dict[str, Any]) -> str:
        exp, k = self.exp, self.exp.n_neighbors
        qs = exp.queries
        info = {"variant": exp.variant, "tokens": len(exp.tokens), "chunks": f"{exp.n_chunks} of {self.M} tokens",
                "segment": f"{exp.segment_len} tokens", "K (fed to CCA)": k, "R (shown)": exp.top,
                "labels": exp.label_kind or "none", **meta}
        dl = "".join(f"<dt>{html.escape(str(a))}</dt><dd>{html.escape(str(b))}</dd>" for a, b in info.items())
        stats = [f"{len(qs)} query chunks shown"]
        for name in exp.passes:
            vals = [q.target_loss[name] for q in qs if np.isfinite(q.target_loss.get(name, math.nan))]
            if vals:
                what = {"model": "the model's own retrieval", "none": "no neighbours", "bm25": "BM25's neighbours",
                        "gold": "the gold neighbours"}[name]
                stats.append(f"mean target loss with {what}: {np.mean(vals):.3f}")
        with_pos = [q for q in qs if q.n_positive]
        if exp.label_kind is not None:
            stats.append(f"{len(with_pos)} have gold positives")
            if with_pos:
                if exp.variant != "xl":
                    stats.append(f"model top-{k} holds a positive for {sum(q.hit('model', k) for q in with_pos)}")
                stats.append(f"BM25 top-{k} for {sum(q.hit('bm25', k) for q in with_pos)}")
        links = []
        for q in qs:
            cls = "" if not q.n_positive or exp.variant == "xl" else (' class="hit"' if q.hit("model", k) else ' class="miss"')
            links.append(f'<a href="#q{q.chunk}"{cls} title="query chunk {q.chunk}">{q.chunk}</a>')
        body = "".join(self.query(q) for q in qs) or (
            '<p class="empty">No query chunk to show: a chunk retrieves only once an earlier segment lies behind the '
            "one it can attend to (rpt.chunks), so the document is too short, or --chunks selected none.</p>")
        legend = ("Each query chunk c<sub>q</sub> retrieves earlier chunks to help predict its target c<sub>t</sub>. "
                  "Neighbours are shown as chunk + continuation (what CCA reads). "
                  '<mark class="ot">highlighted</mark> tokens also occur in the target; '
                  '<span class="oq">underlined</span> ones only in the query. A blue left bar marks the neighbours fed '
                  "to CCA; green cards are gold positives (s<sub>t</sub> &gt; 0).")
        controls = ('<div class="controls"><button type="button" id="expand-all">expand all</button>'
                    '<button type="button" id="collapse-all">collapse all</button><label>show <select id="filter">'
                    '<option value="all">all query chunks</option><option value="positives">with gold positives</option>'
                    '<option value="model-hit">model retrieved a positive</option>'
                    '<option value="model-miss">model missed the positives</option>'
                    '<option value="bm25-better">BM25 hit, model missed</option></select></label></div>')
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                "<meta name=\"generator\" content=\"rpt explore\">"
                f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{html.escape(title)}</title>"
                f"<style>{_CSS}</style></head><body><header><h1>{html.escape(title)}</h1><dl class=\"meta\">{dl}</dl>"
                f"<p class=\"legend\">{legend}</p><p class=\"stats\">{html.escape(' · '.join(stats))}</p></header>"
                f"{controls}<nav class=\"map\" aria-label=\"query chunks\">{''.join(links)}</nav>"
                f"<main id=\"chunks\">{body}</main><script>{_JS}</script></body></html>\n")


def render_html(exp: Exploration, tokenizer: Tokenizer, title: str = "RPT retrieval explorer",
                meta: dict[str, Any] | None = None) -> str:
    """The explorer page for `exp` (one self-contained HTML document). meta: extra rows for the header (source, ...)."""
    return _Renderer(exp, tokenizer).page(title, meta or {})
