"""GPU readiness checked on the CPU: every variant runs its training step, its cached evaluation and its generation
steps with the model and its inputs on the `meta` device while torch's default device stays the CPU.

A meta tensor has a shape and a dtype but no values, and torch refuses to mix it with a CPU tensor: any tensor the
model creates without `device=` (a mask, a position range, a padding row) lands on the CPU and fails loudly here,
exactly where it would cost a host-device copy, or fail, on a GPU. Shapes and dtypes are checked as on a real device.
What needs values (reading a sampled token back with `.tolist()`, a loss as a Python float) cannot run on meta and is
left to the tests on real tensors; each place is named below."""

import dataclasses

import pytest
import torch

from rpt import RPTConfig
from rpt.chunks import retrievable_mask
from rpt.config import VARIANTS
from rpt.decoding import filter_logits
from rpt.model.memory import make_memory
from rpt.model.registry import build_model, spec
from rpt.training.losses import lm_loss, relevance_from_candidates
from rpt.training.schedules import gold_neighbors, sample_gold_mask

V = 101
META = torch.device("meta")
M, S = 8, 16  # short chunks and segments: on meta every op runs through Python shape functions, so few steps
# rpt-lex's model is rpt-sem's (tests/model/test_model.py::test_rpt_lex_and_rpt_sem_are_one_model): one case for both
MODELS = tuple(v for v in VARIANTS if v != "rpt-lex")


def tiny(variant: str):
    cfg = dataclasses.replace(RPTConfig.from_preset("tiny", variant=variant, vocab_size=V, **{"memorizing.tokens": 4 * S}).model,
                              chunk_size=M, segment_len=S)
    cfg.validate()
    return build_model(cfg, seed=0)


def on_meta(variant: str):
    model = tiny(variant).to(META)
    assert all(p.device == META for p in model.parameters())
    assert all(b.device == META for b in model.buffers())
    return model


def tokens(B: int, T: int) -> torch.Tensor:
    return torch.randint(0, V, (B, T)).to(META)


def neighbour_kwargs(model, B: int, T: int) -> dict:
    """What the training loop feeds each variant (rpt.training.loop.prepare): BM25 ids for retro, gold ids and a
    scheduled-sampling draw for rpt-*, nothing for the rest. Built on meta from label-shaped tensors."""
    cfg = model.cfg
    C = T // cfg.chunk_size
    if not cfg.uses_retrieval:
        return {}
    cands = torch.randint(-1, C, (B, C, 20)).to(META)
    rel, pos = relevance_from_candidates(cands, torch.rand(B, C, 20).to(META), C)
    kwargs = {"neighbor_ids": gold_neighbors(rel, pos, cfg.n_neighbors)}
    if cfg.has_retriever:
        kwargs["use_supplied"] = sample_gold_mask(list(range(B)), C, 0.5, META)
    return kwargs


@pytest.mark.parametrize("variant", MODELS)
def test_training_forward_and_backward_on_meta(variant):
    model = on_meta(variant).train()
    cfg = model.cfg
    B, T = 2, 4 * cfg.segment_len
    x = tokens(B, T)
    kwargs = neighbour_kwargs(model, B, T)
    # the LM loss on the full logits (train.loss_chunk = 0). The chunked loss (loss_chunk > 0) asks torch whether
    # autocast is on for the device type, a question torch refuses for meta: it is checked on real tensors only.
    mask = torch.ones(B, T, dtype=torch.bool).to(META)
    out = model(x, **kwargs)
    assert out.logits.shape == (B, T, V) and out.logits.device == META
    loss = lm_loss(out.logits, x, mask).total
    if out.retrieval_scores is not None:
        # rpt-*: a gradient through the retrieval scores. The LambdaRank loss itself (rpt.training.losses) sizes its pairs
        # by the largest number of positives of a query, a value: it runs on real tensors only.
        C = T // cfg.chunk_size
        allowed = retrievable_mask(C, cfg.chunk_size, cfg.segment_len, device=META)
        loss = loss + torch.where(allowed, out.retrieval_scores, 0.0).sum()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and g.device == META for g in grads)


@pytest.mark.parametrize("variant", MODELS)
def test_cached_evaluation_on_meta(variant):
    """model.new_cache / model.step segment by segment with the torch document memory, as
    rpt.eval.perplexity.evaluate_document does it (that function itself sums the NLL into Python floats, which meta
    tensors cannot give, so its loop is driven here)."""
    model = on_meta(variant).eval()
    cfg = model.cfg
    T = 4 * S - 2  # three whole segments and most of a fourth
    x = tokens(1, T + 3)
    kwargs = {}
    if spec(variant).neighbours == "bm25":  # retro reads BM25 ids from outside, document-absolute
        kwargs["neighbor_ids"] = torch.randint(-1, 2, (1, (T + 3) // M, cfg.n_neighbors)).to(META)
    cache = model.new_cache(memory=make_memory("torch", META))
    for p in range(0, T, S):
        n = min(S, T - p)
        out = model.step(x[:, p : p + n], cache, **kwargs)
        assert out.logits.shape == (1, n, V) and out.logits.device == META
        if out.neighbor_ids is not None:
            assert out.neighbor_ids.device == META
    # token by token across a chunk and segment boundary (position 4S), as generation steps
    for p in range(T, T + 3):
        out = model.step(x[:, p : p + 1], cache, **kwargs)
        assert out.logits.shape == (1, 1, V)


@pytest.mark.parametrize("variant", MODELS)
def test_generation_steps_on_meta(variant):
    """What rpt.generate drives: one prefill step over a batch of prompts, then one token per step, with the
    sampling filters (temperature, top-k, top-p) on the last logits. rpt.generate itself reads each sampled token back
    with `.tolist()` (to stop at EOS and to decode), which needs values: here the next token is a meta tensor of the
    right shape and dtype, and the sampler's filters run on meta."""
    model = on_meta(variant).eval()
    cfg = model.cfg
    B, T = 2, 2 * M - 2
    cache = model.new_cache(memory=make_memory("torch", META))
    retro = spec(variant).neighbours == "bm25"

    def nb(n_tokens: int) -> dict:
        return {"neighbor_ids": torch.zeros(B, n_tokens // M, cfg.n_neighbors, dtype=torch.long).to(META)} if retro else {}

    out = model.step(tokens(B, T), cache, **nb(T))
    for n in range(3):  # the third new token starts chunk 2: chunk 1 (generated text) enters the memory
        logits = filter_logits(out.logits[:, -1], temperature=0.8, top_k=10, top_p=0.9)
        assert logits.shape == (B, V) and logits.device == META
        nxt = logits.softmax(-1).argmax(-1)  # greedy; multinomial sampling needs values
        assert nxt.dtype == torch.long
        out = model.step(nxt[:, None], cache, **nb(T + n + 1))
        assert out.logits.shape == (B, 1, V)


# --- bf16 autocast against fp32 (CPU) -----------------------------------------------------------------------------
# bf16 keeps 8 significant bits: every matmul input under autocast is rounded by up to 2^-9 (0.2%) of its size, and
# these independent roundings add up over the layers to a relative logit error of a few tenths of a percent (0.3% for
# every variant at the tiny preset). BF16_REL = 2% leaves a margin of ~7x over that, and still fails for any error
# beyond rounding: a term lost or doubled, a state or recurrence kept in bf16 over many steps, a mask dropped under a
# dtype change all move the logits by tens of percent.
BF16_REL = 2e-2


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


@pytest.mark.parametrize("variant", MODELS)
def test_bf16_autocast_forward_is_close_to_fp32(variant):
    cfg = RPTConfig.from_preset("tiny", variant=variant, vocab_size=V).model
    model = build_model(cfg, seed=0).eval()
    T = 3 * cfg.segment_len
    x = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(0))
    kwargs = {}
    if cfg.uses_retrieval:  # fixed supplied neighbours: a near tie in the retriever must not swap a neighbour
        C = T // cfg.chunk_size
        kwargs = {"neighbor_ids": torch.randint(0, 3, (2, C, cfg.n_neighbors), generator=torch.Generator().manual_seed(1))}
    with torch.no_grad():
        want = model(x, **kwargs)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = model(x, **kwargs)
    assert got.logits.dtype == torch.bfloat16  # autocast really ran the output projection in bf16
    assert relative_error(got.logits, want.logits) < BF16_REL
    # log-probabilities within 0.05 nats (at most ~5% relative on any one probability)
    assert (got.logits.float().log_softmax(-1) - want.logits.log_softmax(-1)).abs().max() < 0.05
    if want.retrieval_scores is not None:  # the retriever's scores (computed in fp32 from bf16 projections)
        ok = torch.isfinite(want.retrieval_scores)
        assert got.retrieval_scores.dtype == torch.float32  # scores stay fp32 under autocast (ranking, LambdaRank)
        assert torch.equal(ok, torch.isfinite(got.retrieval_scores))
        assert relative_error(got.retrieval_scores[ok], want.retrieval_scores[ok]) < BF16_REL
