"""Correctness of the RPT model (docs/design.md#what-the-tests-prove): no leakage through any path, CCA alignment, the retrievable
rule, cached == full forward, gating, gradients, learning, presets."""

import pytest
import torch

from rpt import RPT, RPTConfig
from rpt.chunks import last_retrievable, retrievable_mask
from rpt.config import PRESETS
from rpt.config import RPT_VARIANTS as VARIANTS

V, M, S = 101, 64, 128  # tiny preset: chunk 64, segment 128 -> chunks 4.. retrieve
T = 1024  # 16 chunks, 8 segments
# rpt-lex and rpt-sem are one model (the same class, parameters and forward: test_rpt_lex_and_rpt_sem_are_one_model);
# they differ only in the labels they train on (tests/train, tests/test_learning.py), so the model's cases run rpt-sem
MODELS = tuple(v for v in VARIANTS if v != "rpt-lex")


def make(variant: str, gate: str = "paper", **kw) -> RPT:
    torch.manual_seed(0)
    model = RPT(RPTConfig.from_preset("tiny", variant=variant, vocab_size=V, **{"gate.kind": gate}, **kw)).eval()
    with torch.no_grad():  # make every path non-trivial: gates away from 0.5, null key/values, biases random
        for name, p in model.named_parameters():
            if p.dim() < 2:
                p.add_(torch.randn_like(p) * (2.0 if name.endswith("gate.w") else 0.1))
            elif name.endswith("rel_bias"):  # CCA's relative-offset bias starts at 0: give it a shape to test
                p.normal_()
    return model


def supplied_ids(B: int, C: int, K: int = 2, seed: int = 1) -> torch.Tensor:
    """Random retrievable neighbour ids [B, C, K] (-1 where nothing is retrievable)."""
    g = torch.Generator().manual_seed(seed)
    lim = last_retrievable(torch.arange(C), M, S)  # [C]
    r = torch.rand(B, C, K, generator=g)
    ids = (r * (lim.clamp(min=0) + 1)[None, :, None]).long()
    return ids.masked_fill(lim[None, :, None] < 0, -1)


def run(model, x, variant, use_supplied=None):
    C = x.shape[1] // M
    nb = supplied_ids(x.shape[0], C) if variant == "retro" or use_supplied is not None else None
    return model(x, neighbor_ids=nb, use_supplied=use_supplied)


def test_public_api_shape():
    model = RPT(RPTConfig.from_preset("tiny", variant="rpt-sem", vocab_size=V))
    x = torch.randint(0, V, (2, 300))
    out = model(x)
    assert out.logits.shape == (2, 300, V)
    assert out.neighbor_ids.shape == (2, 4, 2) and out.retrieval_scores.shape == (2, 4, 4)


def test_the_registry_names_each_variant_s_class_and_module():
    from rpt.config import VARIANTS
    from rpt.model.registry import model_class, spec

    for variant in VARIANTS:
        cls = model_class(variant)
        assert (cls.__module__, cls.__name__) == (spec(variant).module, spec(variant).cls), variant


@pytest.mark.parametrize("variant", MODELS)
@pytest.mark.parametrize("t", [1, 63, 64, 257, 64 * 9 + 63, 64 * 9 + 64, 1000])
def test_no_leakage(variant, t):
    """Perturbing tokens at or after t changes no logit before t — through retrieval, query augmentation, gating
    attention and CCA (16 chunks: chunks 4.. retrieve, so every path is live)."""
    model = make(variant)
    x = torch.randint(0, V, (2, T))
    y = x.clone()
    y[:, t:] = torch.randint(0, V, (2, T - t))
    a, b = run(model, x, variant), run(model, y, variant)
    torch.testing.assert_close(a.logits[:, :t], b.logits[:, :t], atol=1e-5, rtol=0)
    assert not torch.allclose(a.logits[:, t:], b.logits[:, t:])


def test_no_leakage_with_scheduled_sampling():
    variant = "rpt-sem"
    model = make(variant)
    x = torch.randint(0, V, (1, T))
    use = torch.rand(1, T // M) < 0.5
    t = 64 * 10 + 5
    y = x.clone()
    y[:, t:] = (y[:, t:] + 1) % V
    a, b = run(model, x, variant, use), run(model, y, variant, use)
    torch.testing.assert_close(a.logits[:, :t], b.logits[:, :t], atol=1e-5, rtol=0)


def test_supplied_future_ids_are_dropped():
    """A caller that supplies a non-retrievable (future) neighbour cannot leak it into CCA."""
    model = make("retro")
    x = torch.randint(0, V, (1, T))
    nb = supplied_ids(1, T // M)
    bad = nb.clone()
    bad[0, 8, 0] = 12  # chunk 12 is in the future of query chunk 8
    assert (model(x, neighbor_ids=bad).neighbor_ids[0, 8, 0] == -1).item()


@pytest.mark.parametrize("variant", ["retro", "rpt-sem"])
def test_cca_alignment(variant):
    """Token 64g+63 is the first whose logits depend on chunk g's neighbours."""
    model = make(variant)
    x = torch.randint(0, V, (1, T))
    C = T // M
    g = 9
    nb = supplied_ids(1, C)
    use = torch.ones(1, C, dtype=torch.bool)
    other = nb.clone()
    other[0, g] = torch.tensor([0, 1]) if not torch.equal(nb[0, g], torch.tensor([0, 1])) else torch.tensor([2, 3])
    a = model(x, neighbor_ids=nb, use_supplied=use).logits
    b = model(x, neighbor_ids=other, use_supplied=use).logits
    first = M * g + M - 1
    torch.testing.assert_close(a[:, :first], b[:, :first], atol=1e-6, rtol=0)
    assert (a[0, first] - b[0, first]).abs().max() > 1e-4
    # chunk g's neighbours reach the 63 tokens after it; chunk g+1's own neighbours are the same in both runs, but the
    # gating attention lets later chunks see earlier neighbours, so only check where the first effect starts.


def test_retrieval_respects_the_retrievable_set():
    model = make("rpt-sem")
    x = torch.randint(0, V, (2, T))
    out = model(x, retrieve_k=6)
    C = T // M
    mask = retrievable_mask(C, M, S)
    assert torch.equal(torch.isfinite(out.retrieval_scores), mask.expand(2, C, C))
    lim = last_retrievable(torch.arange(C), M, S)
    ids = out.top_ids
    n_allowed = (lim + 1).clamp(min=0)
    for i in range(C):
        got = ids[:, i]
        assert ((got <= lim[i]) | (got == -1)).all()
        assert ((got >= 0).sum(-1) == n_allowed[i].clamp(max=6)).all()  # -1 only when fewer are retrievable
    # own top-K equals the top of the scores
    best = out.retrieval_scores[:, 10].topk(2).indices
    assert torch.equal(out.neighbor_ids[:, 10], best)


CCA_OPTIONS = [{}, {"cca.rel_bias": False, "cca.shift_values": False, "cca.query": "lower"},
               {"cca.positions": False, "gate.on": "states", "cca.context_norm": False}]


GATES = ["paper", "clamp", "official", "bias"]
# every (gate, CCA option) pair once, retro and rpt-sem alternating so that each meets every gate and every option
# (a pairwise cover of variant x gate x option: 12 cases instead of 24); xl has no gate and no CCA
CACHED_CASES = [("xl", "paper", 0)] + [("retro" if (g + o) % 2 == 0 else "rpt-sem", gate, o)
                                       for g, gate in enumerate(GATES) for o in range(len(CCA_OPTIONS))]


@pytest.mark.parametrize("variant, gate, opts", CACHED_CASES)
def test_cached_step_equals_full_forward(variant, gate, opts):
    """Segment-by-segment (and token-by-token) inference with the cache computes the full forward's function, for
    every gate and CCA option (positions, relative bias, shifted values, what the gate scales, context norm)."""
    model = make(variant, gate, **CCA_OPTIONS[opts])
    Tn = T + 37  # a ragged end
    x = torch.randint(0, V, (2, Tn))
    C = -(-Tn // M)
    nb = supplied_ids(2, C) if variant == "retro" else None
    full = model(x, neighbor_ids=nb)
    cache = model.new_cache()
    parts, i = [], 0
    for n in [1, 62, 1, 64, 128, 3, 200, 5, 500]:
        parts.append(model.step(x[:, i : i + n], cache, neighbor_ids=nb))
        i += n
    parts.append(model.step(x[:, i:], cache, neighbor_ids=nb))
    torch.testing.assert_close(torch.cat([p.logits for p in parts], 1), full.logits, atol=2e-5, rtol=1e-4)
    if variant != "xl":
        step_ids = torch.cat([p.neighbor_ids for p in parts if p.neighbor_ids is not None], 1)
        assert torch.equal(step_ids, full.neighbor_ids[:, : step_ids.shape[1]])


@pytest.mark.parametrize("variant", ["retro", "rpt-sem"])
def test_cca_query_from_lower_states(variant):
    """model.cca.query=lower: every CCA layer's queries are made from the reading tokens' lower-decoder states (the
    input of its cca_norm is the last lower layer's output), in the full forward and in cached steps; upper: from
    the layer's own residual, which differs."""
    x = torch.randint(0, V, (1, T))
    nb = supplied_ids(1, T // M)
    outs = {}
    for query in ("upper", "lower"):
        model = make(variant, **{"cca.query": query})
        events: list[tuple[str, torch.Tensor]] = []  # in call order: each CCA input follows its lower output
        model.lower[-1].register_forward_hook(lambda m, a, out, events=events: events.append(("lower", out)))
        for layer in model.upper:
            if layer.cca is not None:
                layer.cca_norm.register_forward_hook(lambda m, a, out, events=events: events.append(("cca", a[0])))
        outs[query] = model(x, neighbor_ids=nb).logits
        cache = model.new_cache()
        for i in range(0, T, 96):
            model.step(x[:, i : i + 96], cache, neighbor_ids=nb)
        assert sum(kind == "cca" for kind, _ in events) > 2
        for n, (kind, h) in enumerate(events):
            if kind == "cca":
                lower = next(t for k, t in reversed(events[:n]) if k == "lower")
                assert (h.shape == lower.shape and torch.equal(h, lower)) == (query == "lower")
    assert not torch.allclose(outs["upper"], outs["lower"])


def test_cached_step_equals_full_with_scheduled_sampling():
    model = make("rpt-sem")
    x = torch.randint(0, V, (1, T))
    C = T // M
    nb, use = supplied_ids(1, C), torch.rand(1, C) < 0.5
    full = model(x, neighbor_ids=nb, use_supplied=use)
    cache = model.new_cache()
    parts = [model.step(x[:, i : i + 100], cache, neighbor_ids=nb, use_supplied=use) for i in range(0, T, 100)]
    step = torch.cat([p.logits for p in parts], 1)
    torch.testing.assert_close(step, full.logits, atol=2e-5, rtol=1e-4)


def test_gate_lower_bound():
    """g = max(eta, sigmoid(w.c/D)): with a huge |w| the logits saturate; negative ones sit exactly at eta = 0.1,
    positive ones near 1, and flipping the sign of w swaps the two ends."""
    model = make("rpt-sem")
    x = torch.randint(0, V, (1, T))
    with torch.no_grad():
        model.gate.w.mul_(1e9)
    out = model(x)
    valid = out.neighbor_ids >= 0
    g = out.gates[valid]
    low = (g - 0.1).abs() < 1e-7
    assert (g >= 0.1).all() and (low | (g > 0.99)).all()
    with torch.no_grad():
        model.gate.w.neg_()
    flipped = model(x).gates[valid]
    assert torch.equal((flipped - 0.1).abs() < 1e-7, ~low) and (flipped[low] > 0.99).all()
    model.gate.kind = "official"  # the authors' 0.1 + 0.9 sigmoid variant never goes below its bound
    assert (model(x).gates[valid] >= 0.1).all()


def test_paper_gate_passes_gradient_below_eta():
    """The default gate is max(eta, sigmoid) forward with the sigmoid's gradient: a gate pushed under eta still
    learns (it can come back); the 'clamp' gate, as printed, gets exactly zero gradient there (a dead zone)."""
    from rpt.model.neighbors import gate_value

    for kind, alive in (("paper", True), ("clamp", False)):
        logit = torch.tensor([-6.0, 0.0, 6.0], requires_grad=True)
        g = gate_value(logit, kind, 0.1)
        torch.testing.assert_close(g.detach(), torch.stack([torch.tensor(0.1), torch.sigmoid(logit[1:]).detach()[0],
                                                            torch.sigmoid(logit[2]).detach()]))
        g.sum().backward()
        assert (logit.grad[0] > 0) == alive and (logit.grad[1:] > 0).all()


@pytest.mark.parametrize("opts", [{}, {"cca.rel_bias": False, "cca.shift_values": False}])
def test_gate_scales_values_not_logits(opts):
    """gate_on=values: a neighbour's gate multiplies its values only, so CCA's attention weights do not depend on it
    (the paper's C^g = g * C would flatten them); checked by the output being linear in a shared gate."""
    from rpt.model.cca import NeighborKV

    cca = make("retro", **opts).layers[2].cca
    h = torch.randn(1, 256, 64)
    states = torch.randn(1, 5, 2 * 2 * M, 64)
    mask = torch.ones(1, 5, 2 * 2 * M, dtype=torch.bool)
    ys = [cca(h, NeighborKV(states, mask, scale=torch.full((1, 5, 2 * 2 * M), g)), 0) for g in (0.0, 0.5, 1.0)]
    torch.testing.assert_close(ys[1] - ys[0], 0.5 * (ys[2] - ys[0]), atol=1e-5, rtol=1e-4)


def test_paired_initialisation():
    """One seed, every variant: identical values in every parameter two variants share (the whole trunk), whatever
    modules one has and the other lacks; another seed gives other values."""
    cfgs = {v: RPTConfig.from_preset("tiny", variant=v, vocab_size=V) for v in VARIANTS}
    models = {v: RPT(c, seed=7) for v, c in cfgs.items()}
    xl = dict(models["xl"].named_parameters())
    for v in ("retro", "rpt-lex", "rpt-sem"):
        other = dict(models[v].named_parameters())
        assert set(xl) < set(other)
        for name, p in xl.items():
            assert torch.equal(p, other[name]), (v, name)
    lex, sem = dict(models["rpt-lex"].named_parameters()), dict(models["rpt-sem"].named_parameters())
    assert all(torch.equal(lex[n], sem[n]) for n in lex)  # the same architecture: all of it
    assert not torch.equal(RPT(cfgs["xl"], seed=8).embed.weight, models["xl"].embed.weight)
    torch.manual_seed(3)  # seed=None draws the seed from the global generator: the training loop's manual_seed pairs too
    a = RPT(cfgs["xl"])
    torch.manual_seed(3)
    b = RPT(cfgs["rpt-sem"])
    assert torch.equal(a.layers[0].attn.qkv.weight, b.layers[0].attn.qkv.weight)


def test_rpt_lex_and_rpt_sem_are_one_model():
    """Built from one seed, rpt-lex and rpt-sem compute the same thing: logits, retrieval scores, neighbours and gates
    (full forward and cached steps), and the same gradients. The model's cases above run rpt-sem for both."""
    x = torch.randint(0, V, (2, T))
    out, grads, steps = {}, {}, {}
    for v in ("rpt-lex", "rpt-sem"):
        model = make(v)
        out[v] = model(x, retrieve_k=6)
        s = out[v].retrieval_scores
        (out[v].logits.square().mean() + s[torch.isfinite(s)].square().mean()).backward()  # every parameter's gradient
        grads[v] = {n: p.grad for n, p in model.named_parameters()}
        with torch.no_grad():
            cache = model.new_cache()
            steps[v] = torch.cat([model.step(x[:, i : i + 300], cache).logits for i in range(0, T, 300)], 1)
    lex, sem = out["rpt-lex"], out["rpt-sem"]
    assert torch.equal(lex.logits, sem.logits) and torch.equal(lex.retrieval_scores, sem.retrieval_scores)
    assert torch.equal(lex.neighbor_ids, sem.neighbor_ids) and torch.equal(lex.top_ids, sem.top_ids)
    assert torch.equal(lex.gates, sem.gates) and torch.equal(steps["rpt-lex"], steps["rpt-sem"])
    assert grads["rpt-lex"].keys() == grads["rpt-sem"].keys()
    for n, g in grads["rpt-sem"].items():
        assert torch.equal(grads["rpt-lex"][n], g), n


def test_every_parameter_gets_a_gradient():
    model = make("rpt-sem").train()
    model.cfg.dropout = 0.0
    x = torch.randint(0, V, (2, T))
    out = model(x)
    lm = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1))
    s = out.retrieval_scores
    ret = s[torch.isfinite(s)].square().mean()  # stands in for LambdaRank: the q/k projections learn only from it
    (lm + ret).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not missing, missing


@pytest.mark.slow
@pytest.mark.parametrize("variant", MODELS)
def test_tiny_model_overfits_a_batch(variant):
    """80 updates on one batch take the loss from ln(101) to under 0.5 (20 s on 2 cores). By default every variant's
    learning is checked by tests/test_learning.py: its loss after 30 updates through the training loop, to 0.005 nats."""
    torch.manual_seed(0)
    model = RPT(RPTConfig.from_preset("tiny", variant=variant, vocab_size=V))
    x = torch.randint(0, V, (1, 384))  # 6 chunks: chunks 4 and 5 retrieve
    nb = supplied_ids(1, 6) if variant == "retro" else None
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(80):
        out = model(x, neighbor_ids=nb)
        loss = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5, loss.item()  # from ln(101) = 4.6


def test_bf16_autocast_is_close_to_fp32():
    """CPU bf16 autocast against fp32, with every path made non-trivial (`make`): the model's own retrieval, gates,
    query augmentation and CCA. bf16 rounds each matmul input to 8 significant bits (0.2%); over the layers that is a
    relative logit error of a few tenths of a percent (measured: under 1%). 3% still fails for anything but rounding
    (a lost term, a mask or gate dropped under a dtype change moves the logits by tens of percent)."""
    model = make("rpt-sem")
    x = torch.randint(0, V, (1, 512))
    with torch.no_grad():
        want = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
    assert torch.isfinite(out.logits.float()).all()
    err = (out.logits.float() - want.logits).norm() / want.logits.norm()
    assert err < 3e-2, float(err)
    ok = torch.isfinite(want.retrieval_scores)
    assert torch.equal(ok, torch.isfinite(out.retrieval_scores))
    torch.testing.assert_close(out.retrieval_scores[ok], want.retrieval_scores[ok], rtol=3e-2, atol=3e-2)


PAPER_PARAMS = {"xl": 202e6, "retro": 236e6, "rpt-sem": 242e6}  # Table 2


@pytest.mark.parametrize("preset", list(PRESETS))
def test_every_preset_builds(preset, capsys):
    """Every variant of the registry, the baselines included, builds at every preset (parameter counts printed)."""
    from rpt.config import VARIANTS as ALL_VARIANTS
    from rpt.model.registry import build_model

    for variant in ALL_VARIANTS:
        with torch.device("meta"):
            kw = {} if preset in ("tiny", "small") else {"vocab_size": 50277}
            model = build_model(RPTConfig.from_preset(preset, variant=variant, **kw).model)
        n = model.num_parameters()
        with capsys.disabled():
            print(f"\n{preset:>5} {variant:>15}: {n / 1e6:8.1f}M parameters", end="")
        if preset == "250m" and variant in PAPER_PARAMS:
            assert abs(n - PAPER_PARAMS[variant]) / PAPER_PARAMS[variant] < 0.01


def test_cca_relative_bias_starts_from_an_alibi_prior_around_the_aligned_key():
    """cca_rel_bias_init=alibi: every head's bias peaks at offset 0 (index 2M - 2: the neighbour token at the query's
    own position, whose shifted value is the token to predict) and falls linearly with |offset|, steepest in head 0;
    init_weights keeps it (paired initialisation redraws matrices, not this prior); zero gives a flat start."""
    from rpt.model.cca import rel_bias_prior

    prior = rel_bias_prior(4, M, "alibi", scale=16.0)
    assert prior.shape == (4, 3 * M - 1)
    assert (prior.argmax(1) == 2 * M - 2).all() and (prior[:, 2 * M - 2] == 0).all()
    slopes = -(prior[:, 2 * M - 1])  # offset +1
    assert (slopes[:-1] > slopes[1:]).all() and torch.allclose(prior[:, 2 * M - 3], prior[:, 2 * M - 1])
    for init, want in (("alibi", prior), ("zero", torch.zeros(4, 3 * M - 1))):
        model = RPT(RPTConfig.from_preset("tiny", variant="retro", vocab_size=V, **{"cca.rel_bias_init": init}), seed=3)
        for layer in (2, 3):
            torch.testing.assert_close(model.layers[layer].cca.rel_bias.detach(), want)
    with pytest.raises(ValueError, match="rel_bias_init"):
        rel_bias_prior(4, M, "gaussian")
    # cca_rel_bias_scale (default 16) multiplies every slope: ALiBi's own slopes with scale 1
    flat = RPT(RPTConfig.from_preset("tiny", variant="retro", vocab_size=V, **{"cca.rel_bias_scale": 1.0}), seed=3)
    torch.testing.assert_close(flat.layers[2].cca.rel_bias.detach() * 16, prior)
    assert prior[0, 2 * M - 1] == -4.0  # head 0: slope 16 * 2^-2, so the aligned key outweighs its neighbours e^4-fold


@pytest.mark.parametrize("variant", MODELS)
def test_forward_with_the_chunked_loss_equals_the_loss_on_full_logits(variant):
    """forward(loss_chunk=n) returns the LM loss without logits; loss and every parameter's gradient are those of the
    plain cross-entropy over the full logits (training's default path is the chunked one)."""
    from rpt.training.losses import lm_loss

    model = make(variant)
    x = torch.randint(0, V, (2, T))
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[1, T - 70 :] = False  # a padded row
    ids = supplied_ids(2, T // 64) if variant != "xl" else None
    full = model(x, neighbor_ids=ids)
    ref = lm_loss(full.logits, x, mask)
    ref.total.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    out = model(x, neighbor_ids=ids, loss_chunk=100, loss_mask=mask)
    assert out.logits is None and out.lm.count == ref.count
    torch.testing.assert_close(out.lm.total, ref.total, rtol=1e-5, atol=1e-4)
    out.lm.total.backward()
    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert got.keys() == want.keys()
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-4, atol=1e-5, msg=n)


def test_cca_match_init_shares_the_query_and_key_draw_and_nothing_else():
    base = RPT(RPTConfig.from_preset("tiny", variant="retro", vocab_size=V,
                                     **{"cca.qk_init": "random", "cca.ov_init": "random"}), seed=3)
    match = RPT(RPTConfig.from_preset("tiny", variant="retro", vocab_size=V,
                                      **{"cca.qk_init": "match", "cca.ov_init": "random"}), seed=3)
    D = base.cfg.d_model
    for i in base.cfg.cca_layers:
        a = match.layers[i].cca.attn
        assert torch.equal(a.q.weight, a.kv.weight[:D])
        assert abs(a.q.weight.std().item() - 0.1) < 0.01  # the automatic std at the tiny preset
        assert torch.equal(a.kv.weight[D:], base.layers[i].cca.attn.kv.weight[D:])  # values as before
    changed = {n for (n, p), (_, q) in zip(base.named_parameters(), match.named_parameters(), strict=True)
               if not torch.equal(p, q)}
    assert changed == {f"layers.{i}.cca.attn.{w}.weight" for i in base.cfg.cca_layers for w in ("q", "kv")}
    # a query whose state equals a neighbour token's attends to it most: logits ~ <x, y>
    x = torch.randn(8, D)
    x = x / x.norm(dim=-1, keepdim=True) * D**0.5
    a = match.layers[base.cfg.cca_layers[0]].cca.attn
    logits = a.q(x) @ a.kv(x)[:, :D].t()
    assert (logits.argmax(1) == torch.arange(8)).all()


def test_the_copy_prior_is_the_default_and_its_match_gap_does_not_grow_with_width():
    for preset in ("tiny", "small", "250m"):
        cfg = RPTConfig.from_preset(preset, variant="rpt-sem", vocab_size=V).model
        assert (cfg.cca.qk_init, cfg.cca.ov_init) == ("match", "identity")
        gap = cfg.head_dim**0.5 * cfg.qk_match_std**2 * cfg.d_model  # identical vs orthogonal normalised states
        assert abs(gap - 2.56) < 1e-6, preset
    assert abs(RPTConfig.from_preset("tiny", variant="retro", vocab_size=V).model.qk_match_std - 0.1) < 1e-9
    assert RPTConfig.from_preset("small", variant="retro", vocab_size=V, **{"cca.qk_match_std": 0.3}).model.qk_match_std == 0.3


def test_cca_identity_ov_init_passes_a_read_state_through():
    base = RPT(RPTConfig.from_preset("tiny", variant="retro", vocab_size=V,
                                     **{"cca.qk_init": "random", "cca.ov_init": "random"}), seed=3)
    ov = RPT(RPTConfig.from_preset("tiny", variant="retro", vocab_size=V,
                                   **{"cca.qk_init": "random", "cca.ov_init": "identity"}), seed=3)
    D, s = base.cfg.d_model, base.cfg.cca.ov_scale
    for i in base.cfg.cca_layers:
        a = ov.layers[i].cca.attn
        torch.testing.assert_close(a.out.weight @ a.kv.weight[D:], s * torch.eye(D), atol=1e-5, rtol=0)
    changed = {n for (n, p), (_, q) in zip(base.named_parameters(), ov.named_parameters(), strict=True)
               if not torch.equal(p, q)}
    assert changed == {f"layers.{i}.cca.attn.{w}.weight" for i in base.cfg.cca_layers for w in ("out", "kv")}


def test_initial_weights_do_not_depend_on_the_thread_count():
    """The copy prior's orthogonal draw (a QR) is computed on one thread: LAPACK's QR rounds differently at 1 and 2
    threads, which started the retrieving variants from different weights for the same seed."""
    cfg = RPTConfig.from_preset("tiny", variant="rpt-sem", vocab_size=V).model
    assert cfg.cca.ov_init == "identity"
    threads = torch.get_num_threads()
    try:
        built = []
        for n in (1, 2):
            torch.set_num_threads(n)
            built.append(RPT(cfg, seed=5).state_dict())
            assert torch.get_num_threads() == n  # the draw leaves the caller's thread count as it was
    finally:
        torch.set_num_threads(threads)
    assert built[0].keys() == built[1].keys()
    for name in built[0]:
        assert torch.equal(built[0][name], built[1][name]), name


@pytest.mark.parametrize("variant", ["retro", "rpt-sem"])
@pytest.mark.parametrize("gate", ["paper", "bias"])
def test_cca_direct_attention_is_sdpa_s_function_with_the_same_gradients(variant, gate, monkeypatch):
    """CCA's direct attention in CPU training (biases added in place into one score tensor) computes what SDPA with
    the full additive mask computes: the same logits and the same gradient in every parameter, the learned relative
    bias and the bias gate included."""
    from rpt.model.cca import ChunkedCrossAttention

    model = make(variant, gate)
    x = torch.randint(0, V, (2, T))
    got = {}
    for direct in (False, True):
        monkeypatch.setattr(ChunkedCrossAttention, "direct_attention", direct)
        model.zero_grad(set_to_none=True)
        out = run(model, x, variant)
        out.logits.square().mean().backward()
        got[direct] = out.logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    torch.testing.assert_close(got[True][0], got[False][0], atol=2e-5, rtol=1e-4)
    assert got[True][1].keys() == got[False][1].keys() and any("rel_bias" in n for n in got[True][1])
    for name, g in got[False][1].items():
        torch.testing.assert_close(got[True][1][name], g, atol=1e-6, rtol=1e-3, msg=name)
