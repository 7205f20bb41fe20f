"""Losses of §3.3: the token-level LM loss and the LambdaRank retrieval loss, plus retrieval recall for logging.

Every loss here returns a `Sum` (total, count) rather than a mean. The mean is taken once, by `normalise`, with
the denominator of the *global* batch (all micro-batches of a step on all ranks). That single function is what
makes gradient accumulation and DDP give the same update as one big batch on one device:

    loss_micro = normalise(sum_micro, count_global, world_size)   # world_size undoes DDP's gradient averaging

Dimension letters: B batch, T tokens, C chunks, N query chunks (usually B*C flattened), P positives per query,
K neighbours, V vocabulary.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from rpt.model.loss import Sum, lm_loss, lm_loss_chunked, normalise  # noqa: F401  (the losses training sums)


def forward_lm(model: torch.nn.Module, input_ids: torch.Tensor, model_kwargs: dict, loss_mask: torch.Tensor | None,
               loss_chunk: int) -> tuple[object, Sum]:
    """The model's forward and its LM loss: computed by the model in chunks (loss_chunk > 0: no [B, T, V] logits) or
    from the full logits (loss_chunk = 0). The training loop and `python -m lab bench` take their step through here."""
    if loss_chunk > 0:
        out = model(input_ids, **model_kwargs, loss_chunk=loss_chunk, loss_mask=loss_mask)
        return out, out.lm
    out = model(input_ids, **model_kwargs)
    return out, lm_loss(out.logits, input_ids, loss_mask)


def lm_token_count(loss_mask: torch.Tensor) -> torch.Tensor:
    """Number of LM targets in a micro-batch, known before the forward pass (the global denominator)."""
    return loss_mask[:, 1:].sum().to(torch.float32)


# --------------------------------------------------------------------------------------------------------------
# LambdaRank (§3.3, docs/design.md#supervision-and-training)
#
# For one query chunk, over its retrievable chunks: pairs (l, j) with l a positive and j any retrievable chunk of
# strictly lower target relevance (non-candidates have relevance -inf, i.e. lower than every positive). Each pair
# costs  lambda_jl * max(0, tau - (s_q[l] - s_q[j]))  where lambda_jl = |Delta nDCG| of swapping l and j in the
# current ranking by s_q. Gains (our choice): linear, g = relevance for positives (s_t > 0 for rpt-sem, the BM25
# score for rpt-lex), 0 for everything else; discount 1 / log2(1 + rank); nDCG over the full ranking (no cut-off),
# normalised by the ideal DCG of the query. Linear rather than exponential (2^g - 1) gains by default because BM25 scores
# of 10-30 would make 2^g explode; train.lambdarank_gain=exponential takes the authors' 2^g - 1 (for s_t, rpt-sem).
# The loss is summed over pairs and divided by the number of valid pairs.
#
# Memory: only positives can be the `l` of a pair, so pairs are built as [N, P, C] with P = the largest number of
# positives of any query (<= the label store's k, 20) instead of [N, C, C].


def relevance_from_candidates(candidates: torch.Tensor, values: torch.Tensor, n_chunks: int,
                              positive: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scatter per-candidate labels into dense per-chunk tensors.

    candidates [..., k] long, sequence-relative chunk ids, -1 = no candidate; values [..., k] float (s_t or BM25);
    positive [..., k] bool (default: every present candidate). Returns relevance [..., C] (-inf for non-candidates)
    and positive [..., C] bool.
    """
    present = candidates >= 0
    pos = present if positive is None else positive & present
    idx = candidates.clamp_min(0)
    shape = (*candidates.shape[:-1], n_chunks)
    rel = torch.full(shape, float("-inf"), dtype=torch.float32, device=candidates.device)
    # scatter only present candidates: absent ones write -inf onto chunk 0 otherwise, so route them to a spare column
    spare = torch.where(present, idx, torch.full_like(idx, n_chunks))
    rel_ext = torch.cat([rel, rel[..., :1]], dim=-1).scatter(-1, spare, values.to(torch.float32))
    pos_ext = torch.zeros((*shape[:-1], n_chunks + 1), dtype=torch.bool, device=candidates.device).scatter(-1, spare, pos)
    return rel_ext[..., :n_chunks], pos_ext[..., :n_chunks]


def _ranks(scores: torch.Tensor) -> torch.Tensor:
    """0-based rank of every chunk when sorted by score, descending (ties broken by index). [N, C] -> [N, C] long."""
    order = torch.argsort(scores, dim=-1, descending=True, stable=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, torch.arange(scores.shape[-1], device=scores.device).expand_as(order))
    return ranks


def ideal_dcg(gains: torch.Tensor) -> torch.Tensor:
    """DCG of the best ordering of `gains` [N, C] -> [N]."""
    g = torch.sort(gains, dim=-1, descending=True).values
    disc = 1.0 / torch.log2(torch.arange(gains.shape[-1], device=gains.device, dtype=gains.dtype) + 2.0)
    return (g * disc).sum(-1)


def delta_ndcg(scores: torch.Tensor, gains: torch.Tensor, l_idx: torch.Tensor) -> torch.Tensor:
    """lambda_jl = |Delta nDCG| of swapping chunk l (given by l_idx) and every chunk j in the ranking by `scores`.

    scores [N, C] (ranking only, no gradient); gains [N, C]; l_idx [N, P] long. Returns [N, P, C].
    Swapping l and j changes DCG by (g_l - g_j) * (d_j - d_l) with d = 1 / log2(2 + rank), hence the product of
    absolute differences, divided by the query's ideal DCG.
    """
    disc = 1.0 / torch.log2(_ranks(scores.detach()).to(gains.dtype) + 2.0)  # [N, C]
    g_l = gains.gather(-1, l_idx).unsqueeze(-1)  # [N, P, 1]
    d_l = disc.gather(-1, l_idx).unsqueeze(-1)  # [N, P, 1]
    idcg = ideal_dcg(gains).clamp_min(torch.finfo(gains.dtype).tiny)[:, None, None]  # [N, 1, 1]
    return (g_l - gains[:, None, :]).abs() * (d_l - disc[:, None, :]).abs() / idcg


def _positive_slots(positive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices [N, P] of each query's positives (P = max count) and which slots are real [N, P] bool."""
    P = max(int(positive.sum(-1).max().item()) if positive.numel() else 0, 1)
    # a stable descending sort of the mask puts the positives first, in chunk order
    idx = torch.argsort(positive.to(torch.int8), dim=-1, descending=True, stable=True)[:, :P]
    return idx, positive.gather(-1, idx)


def lambdarank_pairs(relevance: torch.Tensor, positive: torch.Tensor, retrievable: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The valid pairs of the loss: (l_idx [N, P], valid [N, P, C] bool, positive restricted to retrievable [N, C]).

    valid[n, p, j] is True iff l = l_idx[n, p] is a retrievable positive, j is retrievable and
    relevance[n, j] < relevance[n, l]. Depends only on labels and the retrievable rule, not on the model, so the
    pair count of a global batch is known before any forward pass.
    """
    pos = positive & retrievable
    l_idx, l_ok = _positive_slots(pos)
    rel_l = relevance.gather(-1, l_idx).unsqueeze(-1)  # [N, P, 1]
    valid = l_ok.unsqueeze(-1) & retrievable[:, None, :] & (relevance[:, None, :] < rel_l)
    return l_idx, valid, pos


def count_pairs(relevance: torch.Tensor, positive: torch.Tensor, retrievable: torch.Tensor) -> torch.Tensor:
    """Number of valid LambdaRank pairs (the retrieval loss's denominator). Shapes as `lambdarank_loss`."""
    relevance, positive, retrievable = _flat(relevance, positive, retrievable.expand_as(positive))
    return lambdarank_pairs(relevance, positive, retrievable)[1].sum().to(torch.float32)


def _flat(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(x.reshape(-1, x.shape[-1]) for x in xs)  # [..., C] -> [N, C]


def lambdarank_loss(scores: torch.Tensor, relevance: torch.Tensor, positive: torch.Tensor, tau: float,
                    retrievable: torch.Tensor | None = None, gain: str = "linear") -> Sum:
    """LambdaRank with margin tau over query chunks (§3.3), summed over pairs.

    scores [..., C] float: s_q of every chunk for each query chunk, -inf where not retrievable.
    relevance [..., C]: the target relevance (s_t or BM25) of candidates, -inf for non-candidates.
    positive [..., C] bool: the gold set (rpt-sem: candidates with s_t > 0; rpt-lex: all candidates).
    retrievable [..., C] bool (or broadcastable): default isfinite(scores). Leading dims are flattened to N.
    gain: "linear" (g = relevance of a positive) | "exponential" (g = 2^relevance - 1, the authors' code; relevance
    clamped at 100 so that BM25 scores cannot overflow).
    Returns Sum(sum over valid pairs of lambda * hinge, number of valid pairs); divide with `normalise`.
    """
    if retrievable is None:
        retrievable = torch.isfinite(scores)
    scores, relevance, positive, retrievable = _flat(scores, relevance, positive, retrievable.expand_as(positive))
    l_idx, valid, pos = lambdarank_pairs(relevance, positive, retrievable)
    # -inf would give inf - inf = nan in masked-out pairs (and nan gradients); only retrievable scores enter pairs
    s = torch.where(retrievable, scores.float(), torch.zeros((), device=scores.device))
    if gain == "exponential":
        relevance = torch.expm1(relevance.float().clamp(max=100.0) * math.log(2.0))
    elif gain != "linear":
        raise ValueError(f"gain must be linear or exponential, not {gain!r}")
    gains = torch.where(pos, relevance, torch.zeros((), device=relevance.device)).float()
    lam = delta_ndcg(torch.where(retrievable, s, float("-inf")), gains, l_idx)  # [N, P, C], no gradient
    s_l = s.gather(-1, l_idx).unsqueeze(-1)  # [N, P, 1]
    hinge = F.relu(tau - (s_l - s[:, None, :]))  # [N, P, C]
    total = torch.where(valid, lam * hinge, torch.zeros((), device=s.device)).sum()
    return Sum(total, valid.sum().to(torch.float32))


def recall_at_k(scores: torch.Tensor, positive: torch.Tensor, k: int) -> Sum:
    """Recall@k of gold positives under the retriever's ranking, summed over query chunks that have positives.

    scores [..., C] (-inf = not retrievable), positive [..., C] bool. Per query: |top-k ∩ positives| / |positives|.
    Returns Sum(sum of per-query recalls, number of queries with at least one positive).
    """
    scores, positive = _flat(scores, positive)
    positive = positive & torch.isfinite(scores)
    k = min(k, scores.shape[-1])
    top = scores.detach().topk(k, dim=-1).indices  # [N, k]
    hits = positive.gather(-1, top).sum(-1).float()
    n_pos = positive.sum(-1).float()
    has = n_pos > 0
    return Sum((hits / n_pos.clamp_min(1))[has].sum(), has.sum().to(torch.float32))
