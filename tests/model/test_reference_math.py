"""RPT's own math (§3.1) against plain loop-by-loop transcriptions of its equations on hand-sized cases.

Each reference below reads the module's weights and computes its output one chunk, head, token and key at a time,
with nothing shared with the implementation but the weights (no reshapes, no masks, no batched matmuls):

- the retriever: s(i, j) = <W_Q rms(c_i) + b_Q, W_K rms(c_j)> / sqrt(D) over mean-pooled chunk encodings, -inf unless
  chunk j and its continuation j + 1 end before the segment preceding chunk i's segment; top-K best first, -1 padding;
- query augmentation: each neighbour's 2M tokens attend bidirectionally to each other (rotary positions 0..2M-1), then
  cross-attend to the query chunk's lower-decoder states;
- the neighbour gate: mean-pool each neighbour, causal attention over neighbours ordered by (chunk, rank) inside the
  two-segment window, logit w.x / D, and the gate of each option (paper max(eta, sigmoid), clamp, official
  0.1 + 0.9 sigmoid, bias, none);
- chunked cross-attention: token p attends to the neighbours of chunk (p + 1) // M - 1 (none before token M - 1) plus
  a learned null key/value, with the options rotary positions (neighbour token l at l mod 2M, query offset u at
  M - 1 + u), relative-offset bias, shifted values, context norm, and the gate as a value scale, a logit bias or a
  state scale;
- the whole model's wiring: the CCA of an upper layer, fed from the lower decoder through encoder, retriever, top-K,
  supplied / scheduled-sampling choice, query augmentation and gate, equals the references composed by hand.

Computed in float64 (the implementation rounds norms and rotary angles through float32, hence atol 1e-5).
"""

import dataclasses
import math

import pytest
import torch

from rpt import RPT, RPTConfig
from rpt.model.cca import ChunkedCrossAttention, NeighborKV
from rpt.model.neighbors import GateCache, NeighborGate, QueryAugmentation
from rpt.model.retriever import ChunkEncoder, Retriever, top_k

DT = torch.float64
TOL = {"atol": 1e-5, "rtol": 1e-5}


# --- plain transcriptions of the building blocks ------------------------------------------------------------------
def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of one vector: x / sqrt(mean(x^2) + eps) * w."""
    return x / math.sqrt(sum(float(v) ** 2 for v in x) / len(x) + eps) * w


def rope(x: torch.Tensor, pos: int, base: float) -> torch.Tensor:
    """Rotary position of one head vector: pair (i, i + E/2) rotated by pos * base^(-2i/E)."""
    E = len(x)
    out = x.clone()
    for i in range(E // 2):
        theta = pos * base ** (-2.0 * i / E)
        c, s = math.cos(theta), math.sin(theta)
        out[i] = x[i] * c - x[i + E // 2] * s
        out[i + E // 2] = x[i + E // 2] * c + x[i] * s
    return out


def softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    e = [math.exp(v - top) for v in logits]
    return [v / sum(e) for v in e]


def heads(v: torch.Tensor, H: int) -> list[torch.Tensor]:
    E = len(v) // H
    return [v[h * E : (h + 1) * E] for h in range(H)]


@torch.no_grad()
def attention(attn, queries: list[torch.Tensor], keys: list[torch.Tensor], visible=None, q_pos=None, k_pos=None,
              base: float = 10000.0) -> list[torch.Tensor]:
    """Multi-head attention of `attn` (an rpt Attention: q, kv, out projections) from each query vector to the key
    vectors it may see (visible(t, s)), one head, query and key at a time; optional rotary positions."""
    H, D = attn.n_heads, attn.q.weight.shape[0]
    E = D // H
    Wq, Wk, Wv, Wo = attn.q.weight, attn.kv.weight[:D], attn.kv.weight[D:], attn.out.weight
    key_value: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (key, head): each computed once

    def kv(s: int, h: int) -> tuple[torch.Tensor, torch.Tensor]:
        if (s, h) not in key_value:
            k = heads(Wk @ keys[s], H)[h]
            key_value[s, h] = (rope(k, k_pos[s], base) if k_pos is not None else k), heads(Wv @ keys[s], H)[h]
        return key_value[s, h]

    outs = []
    for t, xq in enumerate(queries):
        concat = []
        for h in range(H):
            q = heads(Wq @ xq, H)[h]
            if q_pos is not None:
                q = rope(q, q_pos[t], base)
            logits, values = [], []
            for s in range(len(keys)):
                if visible is not None and not visible(t, s):
                    continue
                k, v = kv(s, h)
                logits.append(float(q @ k) / math.sqrt(E))
                values.append(v)
            p = softmax(logits)
            concat.append(sum(pi * v for pi, v in zip(p, values, strict=True)))
        outs.append(Wo @ torch.cat(concat))
    return outs


def randomise(module: torch.nn.Module, seed: int, gate_w_std: float = 20.0) -> None:
    """Non-trivial values everywhere: matrices ~ 1/sqrt(fan_in), norm weights around 1, null key/values, the gate's w
    wide enough that gates fall on both sides of eta, CCA's relative bias random."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=p.dtype)
            if name.endswith("gate.w") or name == "w":
                p.copy_(r * gate_w_std)
            elif name.endswith("rel_bias"):
                p.copy_(r)
            elif p.dim() == 2 and not name.endswith("embed.weight"):
                p.copy_(r / math.sqrt(p.shape[1]))
            elif name.endswith(".bias"):
                p.copy_(r * 0.3)
            elif name.endswith(("null_k", "null_v")) or name.endswith("embed.weight"):
                p.copy_(r)
            else:  # norm weights
                p.copy_(1.0 + 0.3 * r)


# --- the retriever and top-K --------------------------------------------------------------------------------------
def retrievable(i: int, j: int, M: int, S: int) -> bool:
    """Chunk j (with continuation j + 1) is retrievable for query chunk i iff j + 1 lies before the segment preceding
    chunk i's segment (everything chunk i's tokens can see through the sliding window is after it)."""
    cps = S // M
    first_visible = (i // cps - 1) * cps  # first chunk of the previous segment
    return j + 1 < first_visible


@torch.no_grad()
def reference_scores(ret: Retriever, pooled: torch.Tensor, M: int, S: int) -> torch.Tensor:
    """pooled [C, D] -> [C, C]."""
    C, D = pooled.shape
    out = torch.full((C, C), float("-inf"), dtype=DT)
    for i in range(C):
        q = (ret.q_proj.weight @ rms(pooled[i], ret.q_norm.weight, ret.q_norm.eps) + ret.q_proj.bias) / math.sqrt(D)
        for j in range(C):
            if retrievable(i, j, M, S):
                k = ret.k_proj.weight @ rms(pooled[j], ret.k_norm.weight, ret.k_norm.eps)
                out[i, j] = float(q @ k)
    return out


def reference_top_k(row: list[float], k: int) -> list[int]:
    """Ids of the k best finite scores, best first; -1 where fewer exist."""
    allowed = sorted((j for j, v in enumerate(row) if v != float("-inf")), key=lambda j: -row[j])
    return (allowed + [-1] * k)[:k]


def test_retrieval_scores_and_top_k():
    D, M, S, C = 12, 4, 8, 9
    ret = Retriever(D, 1e-6).to(DT)
    randomise(ret, 0)
    pooled = torch.randn(2, C, D, dtype=DT, generator=torch.Generator().manual_seed(1))
    got = ret.scores(pooled, M, S).detach().to(DT)
    for b in range(2):
        want = reference_scores(ret, pooled[b], M, S)
        assert torch.equal(torch.isinf(got[b]), torch.isinf(want))  # chunks 4..: 0 (4, 5), 0..2 (6, 7), 0..4 (8)
        torch.testing.assert_close(got[b][torch.isfinite(want)], want[torch.isfinite(want)], **TOL)
        ids, vals = top_k(got[b], 3)
        for i in range(C):
            assert ids[i].tolist() == reference_top_k(got[b][i].tolist(), 3), i
            for r, j in enumerate(ids[i].tolist()):
                assert (j < 0 and vals[i, r] == float("-inf")) or vals[i, r] == got[b][i, j]
    assert torch.isinf(got[0, 3]).all() and torch.isfinite(got[0, 8, :5]).all() and torch.isinf(got[0, 8, 5:]).all()


def test_top_k_pads_past_the_number_of_candidates():
    ids, vals = top_k(torch.tensor([[0.5, float("-inf"), 2.0]]), 5)
    assert ids.tolist() == [[2, 0, -1, -1, -1]]
    assert vals[0, :2].tolist() == [2.0, 0.5] and torch.isinf(vals[0, 2:]).all()


# --- the chunk encoder and query augmentation ---------------------------------------------------------------------
@torch.no_grad()
def reference_encoder(enc: ChunkEncoder, chunk: torch.Tensor) -> torch.Tensor:
    """chunk [M, D] lower-decoder states -> the bidirectional encoding [M, D] (pre-norm residual, rotary 0..M-1)."""
    M = chunk.shape[0]
    normed = [rms(x, enc.norm.weight, enc.norm.eps) for x in chunk]
    att = attention(enc.attn, normed, normed, q_pos=list(range(M)), k_pos=list(range(M)), base=enc.rope_base)
    return torch.stack([chunk[t] + att[t] for t in range(M)])


@torch.no_grad()
def reference_query_augmentation(qa: QueryAugmentation, nb: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """One neighbour nb [2M, D] and its query chunk's lower states query [M, D] -> [2M, D]."""
    L = nb.shape[0]
    normed = [rms(x, qa.self_norm.weight, qa.self_norm.eps) for x in nb]
    att = attention(qa.self_attn, normed, normed, q_pos=list(range(L)), k_pos=list(range(L)), base=qa.rope_base)
    x = [nb[t] + att[t] for t in range(L)]
    ctx = [rms(y, qa.ctx_norm.weight, qa.ctx_norm.eps) for y in query]
    cross = attention(qa.cross_attn, [rms(v, qa.cross_norm.weight, qa.cross_norm.eps) for v in x], ctx)
    return torch.stack([x[t] + cross[t] for t in range(L)])


def test_chunk_encoder():
    enc = ChunkEncoder(8, 2, 4, 10000.0, 1e-6, 0.0).to(DT).eval()
    randomise(enc, 2)
    h = torch.randn(2, 3, 4, 8, dtype=DT, generator=torch.Generator().manual_seed(3))
    got = enc(h)
    for b in range(2):
        for c in range(3):
            torch.testing.assert_close(got[b, c], reference_encoder(enc, h[b, c]), **TOL)


def test_query_augmentation():
    D, M, Q, K = 8, 4, 2, 2
    qa = QueryAugmentation(D, 2, 10000.0, 1e-6, 0.0).to(DT).eval()
    randomise(qa, 4)
    g = torch.Generator().manual_seed(5)
    nb, query = torch.randn(1, Q, K, 2 * M, D, dtype=DT, generator=g), torch.randn(1, Q, M, D, dtype=DT, generator=g)
    got = qa(nb, query)
    for q in range(Q):
        for k in range(K):
            torch.testing.assert_close(got[0, q, k], reference_query_augmentation(qa, nb[0, q, k], query[0, q]), **TOL)


# --- the neighbour gate -------------------------------------------------------------------------------------------
GATE_KINDS = ["paper", "clamp", "official", "bias", "none"]


def reference_gate_value(logit: float, kind: str, eta: float) -> float:
    sig = 1.0 / (1.0 + math.exp(-logit))
    return {"paper": max(eta, sig), "clamp": max(eta, sig), "official": 0.1 + 0.9 * sig}.get(kind, 1.0)


@torch.no_grad()
def reference_gate(gate: NeighborGate, nb: torch.Tensor, valid: torch.Tensor, chunks: list[int]):
    """nb [Q, K, 2M, D] of query chunks `chunks`, valid [Q, K] -> logits {(chunk, rank): logit}.

    Item (c, r) attends to the items (c', r') ordered before or at it, (c' < c, or c' = c and r' <= r), whose chunk
    lies in the same segment or the one before (c' // cps >= c // cps - 1), that are real neighbours (or itself)."""
    Q, K = valid.shape
    items = [(chunks[q], r, nb[q, r].mean(0), bool(valid[q, r])) for q in range(Q) for r in range(K)]
    normed = [rms(p, gate.norm.weight, gate.norm.eps) for _, _, p, _ in items]

    def visible(t, s):
        (c, r), (c2, r2) = items[t][:2], items[s][:2]
        before = c2 < c or (c2 == c and r2 <= r)
        return before and c2 // gate.cps >= c // gate.cps - 1 and (items[s][3] or s == t)

    att = attention(gate.attn, normed, normed, visible)
    return {(c, r): float((p + att[t]) @ gate.w) / gate.dim for t, (c, r, p, _) in enumerate(items)}


@pytest.mark.parametrize("kind", GATE_KINDS)
def test_neighbour_gate(kind):
    D, M, K, cps, eta = 8, 4, 2, 2, 0.1
    gate = NeighborGate(D, 2, kind, eta, cps, 1e-6, 0.0).to(DT).eval()
    randomise(gate, 6, gate_w_std=30.0)
    g = torch.Generator().manual_seed(7)
    chunks = list(range(2, 9))  # 7 query chunks over segments 1..4: the window drops segment-old neighbours
    nb = torch.randn(1, len(chunks), K, 2 * M, D, dtype=DT, generator=g)
    valid = torch.rand(1, len(chunks), K, generator=g) < 0.7
    gates, logits = gate(nb, valid, torch.tensor(chunks))
    want = reference_gate(gate, nb[0], valid[0], chunks)
    for q, c in enumerate(chunks):
        for r in range(K):
            assert logits[0, q, r].item() == pytest.approx(want[c, r], abs=1e-5)
            assert gates[0, q, r].item() == pytest.approx(reference_gate_value(want[c, r], kind, eta), abs=1e-6)
    sig = torch.sigmoid(logits)
    assert (sig < eta).any() and (sig > eta).any()  # the case has gates on both sides of the lower bound
    # the same items in two calls through the cache (as model.step): the window's cut keeps what the second call needs
    cache = GateCache()
    gate(nb[:, :3], valid[:, :3], torch.tensor(chunks[:3]), cache)
    _, late = gate(nb[:, 3:], valid[:, 3:], torch.tensor(chunks[3:]), cache)
    torch.testing.assert_close(late, logits[:, 3:], **TOL)


def test_gate_gradients_below_eta():
    """paper: the gradient of the sigmoid passes below eta; clamp: the clamp's own gradient (zero below eta)."""
    from rpt.model.neighbors import gate_value

    logit = torch.tensor([-4.0, 0.5], dtype=DT, requires_grad=True)
    for kind, below in (("paper", True), ("clamp", False)):
        (grad,) = torch.autograd.grad(gate_value(logit, kind, 0.1).sum(), logit)
        s = torch.sigmoid(logit.detach())
        torch.testing.assert_close(grad[1], s[1] * (1 - s[1]))
        assert (grad[0] == s[0] * (1 - s[0])) if below else (grad[0] == 0)


# --- chunked cross-attention --------------------------------------------------------------------------------------
@torch.no_grad()
def reference_cca(cca: ChunkedCrossAttention, x: torch.Tensor, start: int, block_row) -> torch.Tensor:
    """x [n, D] holds tokens start .. start + n - 1. block_row(r) -> None (no neighbours: only the null key) or
    (states [L, D], mask [L], bias [L] | None, scale [L] | None) of the neighbours block r reads, block r being tokens
    r*M - 1 .. r*M + M - 2 (the last token of chunk r - 1 and the first M - 1 of chunk r)."""
    M, H = cca.M, cca.H
    D = x.shape[1]
    E = D // H
    a = cca.attn
    Wq, Wk, Wv, Wo = a.q.weight, a.kv.weight[:D], a.kv.weight[D:], a.out.weight
    out = []
    for t in range(x.shape[0]):
        p = start + t
        r, u = (p + 1) // M, (p + 1) % M  # block, offset inside it
        row = block_row(r)
        concat = []
        for h in range(H):
            q = heads(Wq @ x[t], H)[h]
            if cca.positions:
                q = rope(q, M - 1 + u, cca.rope_base)
            logits = [float(q @ heads(cca.null_k, H)[h]) / math.sqrt(E)]  # the null: no position, bias or gate
            values = [heads(cca.null_v, H)[h]]
            if row is not None:
                states, mask, bias, scale = row
                ctx = [rms(s, cca.ctx_norm.weight, cca.ctx_norm.eps) if cca.ctx_norm is not None else s for s in states]
                for ll in range(len(states)):
                    pos = ll % (2 * M)  # token index inside its neighbour (c_j, c_j+1)
                    if not mask[ll] or (cca.shift_values and pos == 2 * M - 1):
                        continue  # a missing neighbour; with shifted values the last token has no successor
                    k = heads(Wk @ ctx[ll], H)[h]
                    if cca.positions:
                        k = rope(k, pos, cca.rope_base)
                    logit = float(q @ k) / math.sqrt(E)
                    if cca.rel_bias is not None:
                        logit += float(cca.rel_bias[h, pos - u + M - 1])
                    if bias is not None:
                        logit += float(bias[ll])
                    v = heads(Wv @ ctx[ll + 1 if cca.shift_values else ll], H)[h]
                    logits.append(logit)
                    values.append(v * (float(scale[ll]) if scale is not None else 1.0))
            pr = softmax(logits)
            concat.append(sum(pi * v for pi, v in zip(pr, values, strict=True)))
        out.append(Wo @ torch.cat(concat))
    return torch.stack(out)


CCA_OPTIONS = [  # a covering set of (positions, ctx_norm, rel_bias, shift_values) with bias / scale rows
    dict(positions=True, ctx_norm=True, rel_bias=True, shift_values=True, bias=False, scale=True),
    dict(positions=True, ctx_norm=False, rel_bias=False, shift_values=False, bias=True, scale=False),
    dict(positions=False, ctx_norm=True, rel_bias=True, shift_values=False, bias=False, scale=False),
    dict(positions=False, ctx_norm=False, rel_bias=False, shift_values=True, bias=True, scale=True),
    dict(positions=True, ctx_norm=True, rel_bias=False, shift_values=True, bias=True, scale=False),
]


@pytest.mark.parametrize("opts", CCA_OPTIONS, ids=lambda o: "-".join(k for k, v in o.items() if v) or "plain")
@pytest.mark.parametrize("start,n,grad", [(0, 12, True), (0, 12, False), (5, 6, False), (2, 1, True), (7, 5, True),
                                          (3, 1, False)])
def test_chunked_cross_attention(opts, start, n, grad):
    """Every token against the loop reference: blocks with and without neighbours, missing neighbours, a gate's bias
    or value scale; from the start of a sequence and from inside a block (as in step); the CPU training path
    (direct attention, grad on, relative bias) and scaled_dot_product_attention (grad off)."""
    D, H, M, K = 8, 2, 4, 2
    o = dict(opts)
    cca = ChunkedCrossAttention(D, H, M, 0.0, positions=o["positions"], ctx_norm=o["ctx_norm"], rel_bias=o["rel_bias"],
                                shift_values=o["shift_values"]).to(DT).eval()
    randomise(cca, 8)
    g = torch.Generator().manual_seed(9)
    B, L = 2, K * 2 * M
    first = (start + 1) // M  # rows start at the first block the tokens touch (as step's first_block)
    R = (start + n) // M + 1 - first
    states = torch.randn(B, R, L, D, dtype=DT, generator=g)
    keep = torch.rand(B, R, K, generator=g) < 0.7
    keep[0, 0] = False  # a block with no neighbour at all: only the null key
    mask = keep[..., None].expand(B, R, K, 2 * M).reshape(B, R, L)
    bias = torch.randn(B, R, K, generator=g, dtype=DT)[..., None].expand(B, R, K, 2 * M).reshape(B, R, L) if o["bias"] else None
    scale = torch.rand(B, R, K, generator=g, dtype=DT)[..., None].expand(B, R, K, 2 * M).reshape(B, R, L) if o["scale"] else None
    nkv = NeighborKV(states, mask, bias, scale, first_block=first)
    x = torch.randn(B, n, D, dtype=DT, generator=g)
    with torch.set_grad_enabled(grad):
        got = cca(x, nkv, start)
    for b in range(B):
        def row(r, b=b):
            i = r - first
            return (states[b, i], mask[b, i], None if bias is None else bias[b, i], None if scale is None else scale[b, i])

        torch.testing.assert_close(got[b].detach(), reference_cca(cca, x[b], start, row), **TOL)


# --- the whole model's wiring -------------------------------------------------------------------------------------
M_, S_, K_ = 4, 8, 2
MODEL_CASES = [  # a covering set of the options that change the math (variant, gate, gate_on and CCA's switches)
    dict(variant="rpt-sem", **{"gate.kind": "paper"}, **{"gate.on": "values"}),
    dict(variant="rpt-sem", **{"gate.kind": "clamp"}, **{"gate.on": "states"}, **{"cca.rel_bias": False}),
    dict(variant="rpt-lex", **{"gate.kind": "official", "gate.on": "values", "cca.shift_values": False,
                               "cca.positions": False}),
    dict(variant="rpt-sem", **{"gate.kind": "bias"}, **{"cca.context_norm": False}, query_augmentation=False),
    dict(variant="rpt-lex", **{"gate.kind": "none"}, **{"cca.rel_bias": False}, **{"cca.shift_values": False}),
    dict(variant="retro", **{"gate.kind": "paper"}, **{"gate.on": "states"}, **{"cca.context_norm": False}),
    dict(variant="retro", **{"gate.kind": "official", "gate.on": "values", "cca.positions": False},
         query_augmentation=False),
    dict(variant="rpt-sem", **{"gate.kind": "official"}, **{"gate.on": "states"}, **{"cca.positions": False}, supplied=True),
]


def small_model(case: dict) -> RPT:
    kw = {k: v for k, v in case.items() if k != "supplied"}
    base = RPTConfig.from_preset("tiny", variant=kw.pop("variant"), vocab_size=23, **kw).model
    cfg = dataclasses.replace(base, d_model=8, n_heads=2, n_layers=2, cca_layers=[1], mlp_hidden=12, chunk_size=M_,
                              segment_len=S_, n_neighbors=K_, dropout=0.0, attn_dropout=0.0)
    cfg.validate()
    model = RPT(cfg, seed=0).to(DT).eval()
    randomise(model, 10)
    return model


@pytest.mark.parametrize("case", MODEL_CASES, ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_model_wiring(case):
    """The upper layer's CCA output for every token equals the references composed by hand from the lower-decoder
    states: chunk encodings, scores and top-K (or the supplied ids, checked against the retrievable rule, and the
    scheduled-sampling choice), neighbours c_j ++ c_j+1, query augmentation with the query chunk, gate (logit
    bias / value scale / state scale), and token p reading chunk (p + 1) // M - 1's neighbours."""
    model = small_model(case)
    cfg = model.cfg
    B, T = 2, 40  # 10 chunks, 5 segments: chunks 4.. retrieve
    C = T // M_
    g = torch.Generator().manual_seed(11)
    x = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    kwargs, supplied, use = {}, None, None
    if cfg.variant == "retro" or case.get("supplied"):
        supplied = torch.randint(-1, C, (B, C, K_), generator=g)  # some not retrievable: the model must drop them
        kwargs["neighbor_ids"] = supplied
        if cfg.has_retriever:
            use = torch.rand(B, C, generator=g) < 0.5
            kwargs["use_supplied"] = use
    seen = {}
    model.layers[0].register_forward_hook(lambda m, a, out: seen.__setitem__("lower", out))
    model.layers[1].cca.register_forward_hook(lambda m, a, out: seen.__setitem__("cca", (a[0], out)))
    out = model(x, **kwargs)
    lower, (cca_in, cca_out) = seen["lower"].detach(), (t.detach() for t in seen["cca"])
    ok_ids = []
    for b in range(B):
        chunk = [lower[b, c * M_ : (c + 1) * M_] for c in range(C)]
        enc = [reference_encoder(model.encoder, ch) for ch in chunk] if model.encoder is not None else chunk
        ids = [[-1] * K_ for _ in range(C)]
        if model.retriever is not None:
            pooled = torch.stack([e.mean(0) for e in enc])
            scores = reference_scores(model.retriever, pooled, M_, S_)
            got = out.retrieval_scores[b].detach().to(DT)
            fin = torch.isfinite(scores)
            assert torch.equal(torch.isfinite(got), fin)
            torch.testing.assert_close(got[fin], scores[fin], **TOL)
            ids = [reference_top_k(got[i].tolist(), K_) for i in range(C)]  # order from the (equal) model scores
        if supplied is not None:
            for i in range(C):
                if use is None or use[b, i]:
                    ids[i] = [j if j >= 0 and retrievable(i, j, M_, S_) else -1 for j in supplied[b, i].tolist()]
        assert out.neighbor_ids[b].tolist() == ids
        ok_ids.append(ids)
        # neighbours of each query chunk, augmented, pooled and gated
        nbs, valid = [], []
        for i in range(C):
            row = []
            for j in ids[i]:
                n = torch.cat([enc[max(j, 0)], enc[max(j, 0) + 1]])  # c_j ++ c_j+1 (an empty slot is masked below)
                if model.query_aug is not None:
                    n = reference_query_augmentation(model.query_aug, n, chunk[i])
                row.append(n)
            nbs.append(torch.stack(row))
            valid.append([j >= 0 for j in ids[i]])
        nbs_t, valid_t = torch.stack(nbs), torch.tensor(valid)
        bias = scale = None
        if model.gate is not None:
            logit = reference_gate(model.gate, nbs_t, valid_t, list(range(C)))
            gate = torch.tensor([[reference_gate_value(logit[i, r], cfg.gate.kind, cfg.gate.eta) for r in range(K_)]
                                 for i in range(C)], dtype=DT)
            torch.testing.assert_close(out.gates[b].detach().to(DT), gate, **TOL)
            if cfg.gate.kind == "bias":
                bias = torch.tensor([[logit[i, r] for r in range(K_) for _ in range(2 * M_)] for i in range(C)], dtype=DT)
            elif cfg.gate.on == "states":
                nbs_t = nbs_t * gate[..., None, None]
            else:
                scale = gate[..., None].expand(C, K_, 2 * M_).reshape(C, -1)

        def block_row(r, nbs_t=nbs_t, valid_t=valid_t, bias=bias, scale=scale):
            g_ = r - 1  # block r reads the neighbours of chunk r - 1
            if g_ < 0:
                return None
            mask = valid_t[g_][:, None].expand(K_, 2 * M_).reshape(-1)
            return (nbs_t[g_].reshape(-1, cfg.d_model), mask, None if bias is None else bias[g_],
                    None if scale is None else scale[g_])

        want = reference_cca(model.layers[1].cca, cca_in[b], 0, block_row)
        torch.testing.assert_close(cca_out[b], want, **TOL)
    assert any(j >= 0 for ids in ok_ids for row in ids for j in row)  # the case reads real neighbours
