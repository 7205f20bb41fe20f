import math

import pytest
import torch
import torch.nn.functional as F

from rpt.training.losses import (
    count_pairs,
    delta_ndcg,
    lambdarank_loss,
    lm_loss,
    lm_loss_chunked,
    normalise,
    recall_at_k,
    relevance_from_candidates,
)

INF = float("inf")


def test_lm_loss_shifts_and_masks():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)  # row 1: 3 real tokens, 2 pads
    s = lm_loss(logits, ids, mask)
    # by hand: position t predicts token t+1; row 0 has 4 targets, row 1 has targets at tokens 1, 2 (token 3, 4 pads)
    terms = [F.cross_entropy(logits[0, t], ids[0, t + 1]) for t in range(4)]
    terms += [F.cross_entropy(logits[1, t], ids[1, t + 1]) for t in range(2)]
    assert s.count.item() == 6
    assert torch.allclose(s.total, torch.stack(terms).sum())
    assert torch.allclose(s.mean(), torch.stack(terms).mean())


@pytest.mark.parametrize("chunk", [1, 5, 7, 1000])
def test_chunked_lm_loss_equals_the_plain_one_in_value_and_gradients(chunk):
    torch.manual_seed(0)
    B, T, D, V = 2, 6, 8, 11
    h = torch.randn(B, T, D, dtype=torch.float64, requires_grad=True)
    w = torch.randn(V, D, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, V, (B, T))
    mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]], dtype=torch.bool)  # 5 + 3 targets; chunks straddle rows and pads
    plain = lm_loss(h @ w.t(), ids, mask)
    gh, gw = torch.autograd.grad(3.0 * plain.total, (h, w))
    chunked = lm_loss_chunked(h, w, ids, mask, chunk=chunk)
    ch, cw = torch.autograd.grad(3.0 * chunked.total, (h, w))  # the incoming gradient (3) is applied
    assert chunked.count.item() == plain.count.item() == 8
    assert torch.allclose(chunked.total.double(), plain.total.double(), atol=1e-5)  # both sum in fp32
    assert torch.allclose(ch, gh, atol=1e-5) and torch.allclose(cw, gw, atol=1e-5)
    assert ch[1, 3:].abs().max() == 0  # a position whose target is padding gets no gradient
    with torch.no_grad():  # evaluation: no gradient buffers are built, same value
        assert torch.allclose(lm_loss_chunked(h, w, ids, None, chunk).total.double(), lm_loss(h @ w.t(), ids).total.double(),
                              atol=1e-5)


def test_chunked_lm_loss_holds_no_full_logits():
    # the largest tensor autograd keeps is the size of the inputs, never [N, V]: 1024 targets x V = 50K would be
    # 200 MB of logits, 64 times the largest input; here the saved tensors are grad_h [N, D] and grad_w [V, D]
    h = torch.randn(1, 1025, 16, requires_grad=True)
    w = torch.randn(50_000, 16, requires_grad=True)
    ids = torch.randint(0, 50_000, (1, 1025))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        loss = lm_loss_chunked(h, w, ids, chunk=256)
    loss.total.backward()
    assert saved and max(saved) <= max(h.numel(), w.numel())
    assert w.grad.shape == w.shape and torch.isfinite(w.grad).all()


def test_normalise_splits_a_global_mean_across_micro_batches_and_ranks():
    totals, counts = torch.tensor([3.0, 5.0, 1.0, 7.0]), torch.tensor([2.0, 4.0, 1.0, 3.0])
    full = totals.sum() / counts.sum()
    # 2 ranks x 2 micro-batches: DDP averages over ranks, hence the world_size factor
    per_rank = [sum(normalise(totals[i], counts.sum(), world_size=2) for i in r) for r in ([0, 1], [2, 3])]
    assert torch.allclose(sum(per_rank) / 2, full)
    assert normalise(torch.tensor(0.0), torch.tensor(0.0)).item() == 0.0  # nothing to count: 0, not nan


# The hand-computed case. One query chunk, five chunks:
#   chunk        0      1      2          3                4
#   s_q          2.0    1.0    3.0        -inf (not retr.) 0.5
#   label        s_t=1  s_t=-.5  none     (s_t=5, ignored) s_t=2
#   positive     yes    no     no         no (not retr.)   yes
# Ranking by s_q among retrievable chunks: 2 (rank 1), 0 (rank 2), 1 (rank 3), 4 (rank 4).
# Discounts 1/log2(1+rank): d2 = 1, d0 = 1/log2(3), d1 = 1/log2(4) = 0.5, d4 = 1/log2(5).
# Gains: g0 = 1, g4 = 2, others 0.  Ideal DCG = 2 * 1 + 1 * 1/log2(3).
# Valid pairs (l positive, j retrievable with lower target): (0,1), (0,2), (4,0), (4,1), (4,2)  -> 5 pairs.
# lambda_lj = |g_l - g_j| * |d_l - d_j| / IDCG ;  hinge = max(0, tau - (s_l - s_j)) with tau = 1:
#   (0,1): 1 * (d0 - 0.5) / IDCG,  hinge 1 - (2 - 1)   = 0
#   (0,2): 1 * (1 - d0)   / IDCG,  hinge 1 - (2 - 3)   = 2
#   (4,0): 1 * (d0 - d4)  / IDCG,  hinge 1 - (0.5 - 2) = 2.5
#   (4,1): 2 * (0.5 - d4) / IDCG,  hinge 1 - (0.5 - 1) = 1.5
#   (4,2): 2 * (1 - d4)   / IDCG,  hinge 1 - (0.5 - 3) = 3.5
D0, D4 = 1 / math.log2(3), 1 / math.log2(5)
IDCG = 2 + D0
LAM = {(0, 1): (D0 - 0.5) / IDCG, (0, 2): (1 - D0) / IDCG, (4, 0): (D0 - D4) / IDCG, (4, 1): 2 * (0.5 - D4) / IDCG,
       (4, 2): 2 * (1 - D4) / IDCG}
HINGE = {(0, 1): 0.0, (0, 2): 2.0, (4, 0): 2.5, (4, 1): 1.5, (4, 2): 3.5}


def hand_case():
    scores = torch.tensor([[2.0, 1.0, 3.0, -INF, 0.5]], requires_grad=True)
    relevance = torch.tensor([[1.0, -0.5, -INF, 5.0, 2.0]])
    positive = torch.tensor([[True, False, False, True, True]])  # chunk 3 is a positive but not retrievable
    return scores, relevance, positive


def test_lambdarank_hand_computed():
    scores, relevance, positive = hand_case()
    # the numbers, written out: IDCG = 2.6309298
    assert [round(LAM[p], 7) for p in HINGE] == [0.0497656, 0.1402813, 0.0761150, 0.0526988, 0.4327926]
    s = lambdarank_loss(scores, relevance, positive, tau=1.0)
    expected = sum(LAM[p] * HINGE[p] for p in LAM)
    assert s.count.item() == 5
    assert s.total.item() == pytest.approx(expected, rel=1e-6)
    assert s.total.item() == pytest.approx(2.0646723, abs=1e-6)  # 0.14028*2 + 0.07612*2.5 + 0.05270*1.5 + 0.43279*3.5
    assert s.mean().item() == pytest.approx(expected / 5, rel=1e-6)
    # gradient: each active pair pushes s_l up and s_j down by lambda
    s.total.backward()
    g = scores.grad[0]
    assert g[0].item() == pytest.approx(-LAM[(0, 2)] + LAM[(4, 0)], rel=1e-5)  # (0,1) has a zero hinge
    assert g[1].item() == pytest.approx(LAM[(4, 1)], rel=1e-5)
    assert g[2].item() == pytest.approx(LAM[(0, 2)] + LAM[(4, 2)], rel=1e-5)
    assert g[3].item() == 0.0
    assert g[4].item() == pytest.approx(-(LAM[(4, 0)] + LAM[(4, 1)] + LAM[(4, 2)]), rel=1e-5)


def test_exponential_gains_are_two_to_the_relevance_minus_one():
    """The authors' gains 2^g - 1: the same pairs and hinges, lambdas from gains 1 and 3 (for relevances 1 and 2)."""
    scores, relevance, positive = hand_case()
    exp = lambdarank_loss(scores, relevance, positive, tau=1.0, gain="exponential")
    gains = torch.tensor([[1.0, 0.0, 0.0, 0.0, 3.0]])
    lam = delta_ndcg(scores.detach(), gains, torch.tensor([[0, 4]]))
    expected = sum(lam[0, [0, 4].index(l), j].item() * h for (l, j), h in HINGE.items())
    assert exp.count.item() == 5 and exp.total.item() == pytest.approx(expected, rel=1e-6)
    assert exp.total.item() != pytest.approx(lambdarank_loss(scores, relevance, positive, tau=1.0).total.item(), rel=1e-3)
    with pytest.raises(ValueError, match="gain"):
        lambdarank_loss(scores, relevance, positive, tau=1.0, gain="square")


def test_delta_ndcg_matrix_hand_computed():
    scores, relevance, positive = hand_case()
    gains = torch.tensor([[1.0, 0.0, 0.0, 0.0, 2.0]])
    lam = delta_ndcg(scores.detach(), gains, torch.tensor([[0, 4]]))  # [1, 2, 5]
    for (l, j), v in LAM.items():
        assert lam[0, [0, 4].index(l), j].item() == pytest.approx(v, rel=1e-6)
    # swapping a chunk with itself changes nothing
    assert lam[0, 0, 0].item() == 0.0 and lam[0, 1, 4].item() == 0.0


def test_margin_is_respected():
    scores = torch.tensor([[5.0, 1.0]])
    rel, pos = torch.tensor([[1.0, -INF]]), torch.tensor([[True, False]])
    assert lambdarank_loss(scores, rel, pos, tau=3.9).total.item() == 0.0  # s_l - s_j = 4 > tau
    assert lambdarank_loss(scores, rel, pos, tau=4.5).total.item() > 0.0


def reference_lambdarank(scores, relevance, positive, tau):
    """Loops over queries and pairs, straight from the formula (for the vectorised version's equivalence test)."""
    total, count = 0.0, 0
    for n in range(scores.shape[0]):
        s, r = scores[n].tolist(), relevance[n].tolist()
        retr = [math.isfinite(x) for x in s]
        pos = [bool(positive[n, c]) and retr[c] for c in range(len(s))]
        gains = [r[c] if pos[c] else 0.0 for c in range(len(s))]
        order = sorted((c for c in range(len(s)) if retr[c]), key=lambda c: (-s[c], c))
        order += [c for c in range(len(s)) if not retr[c]]
        disc = {c: 1 / math.log2(i + 2) for i, c in enumerate(order)}
        ideal = sum(g / math.log2(i + 2) for i, g in enumerate(sorted(gains, reverse=True)))
        for lc in range(len(s)):
            for j in range(len(s)):
                if pos[lc] and retr[j] and r[j] < r[lc]:
                    lam = abs(gains[lc] - gains[j]) * abs(disc[lc] - disc[j]) / ideal
                    total += lam * max(0.0, tau - (s[lc] - s[j]))
                    count += 1
    return total, count


def test_vectorised_matches_loops_on_random_queries():
    g = torch.Generator().manual_seed(1)
    C, N = 12, 30
    scores = torch.randn(N, C, generator=g) * 2
    retr = torch.rand(N, C, generator=g) < 0.7
    scores = scores.masked_fill(~retr, -INF)
    cand = torch.rand(N, C, generator=g) < 0.5
    relevance = torch.where(cand, torch.randn(N, C, generator=g), torch.full((N, C), -INF))
    positive = cand & (relevance > 0)
    s = lambdarank_loss(scores, relevance, positive, tau=1.5)
    total, count = reference_lambdarank(scores, relevance, positive, 1.5)
    assert s.count.item() == count > 0
    assert s.total.item() == pytest.approx(total, rel=1e-5)
    assert count_pairs(relevance, positive, retr).item() == count


def test_batched_shapes_and_no_nan_gradients():
    B, C = 2, 8
    scores = torch.randn(B, C, C).masked_fill(torch.ones(C, C, dtype=torch.bool).triu(), -INF).requires_grad_()
    cands = torch.tensor([[[-1, -1]] * C] * B)
    cands[:, 5] = torch.tensor([0, 3])
    cands[:, 7] = torch.tensor([2, -1])
    rel, pos = relevance_from_candidates(cands, torch.tensor([[[2.0, 1.0]] * C] * B), C)
    assert rel[0, 5, 0] == 2.0 and rel[0, 5, 3] == 1.0 and rel[0, 5, 1] == -INF and not pos[0, 5, 1]
    assert pos[0, 7].tolist() == [False, False, True] + [False] * 5  # the -1 slot scattered nothing
    s = lambdarank_loss(scores, rel, pos, tau=2.0)
    s.total.backward()
    assert torch.isfinite(scores.grad).all()
    # per query: (5: l=0 over 4 lower chunks, l=3 over 3) + (7: l=2 over 6 lower chunks)
    assert s.count.item() == B * (4 + 3 + 6)


def test_recall_at_k():
    scores = torch.tensor([[0.9, 0.8, 0.1, 0.5], [1.0, 2.0, 3.0, -INF], [1.0, 2.0, 3.0, 4.0]])
    positive = torch.tensor([[True, False, True, False], [False, False, False, True], [False] * 4])
    r = recall_at_k(scores, positive, k=2)
    # query 0: top-2 = {0, 1}, positives {0, 2} -> 1/2. query 1: the only positive is not retrievable -> not counted.
    # query 2: no positives -> not counted.
    assert r.count.item() == 1 and r.total.item() == pytest.approx(0.5)


def test_chunked_lm_loss_under_bf16_autocast_is_close_to_the_plain_one():
    # what a GPU run does (bf16 matmuls, fp32 softmax); checked here with CPU autocast
    torch.manual_seed(0)
    h = torch.randn(1, 40, 16, requires_grad=True)
    w = torch.randn(30, 16, requires_grad=True)
    ids = torch.randint(0, 30, (1, 40))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = lm_loss(h @ w.t(), ids)
        chunked = lm_loss_chunked(h, w, ids, chunk=16)
    gp = torch.autograd.grad(plain.total, (h, w))
    gc = torch.autograd.grad(chunked.total, (h, w))
    assert chunked.total.dtype == torch.float32
    assert torch.allclose(chunked.total, plain.total, rtol=2e-2)
    assert gc[0].dtype == h.dtype and gc[1].dtype == w.dtype
    for a, b in zip(gc, gp, strict=True):
        assert torch.allclose(a, b, rtol=5e-2, atol=5e-2)
