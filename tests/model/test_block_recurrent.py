"""Correctness of the Block-Recurrent Transformer baseline (rpt.model.block_recurrent): the common model contract
(registry, paired initialisation with xl, forward / step, caches), no leakage, cached == full, the state's reset and
reach, gradients, the chunked loss, the 250m parameter budget, bf16 and dropout."""

import pytest
import torch
import torch.nn.functional as F
from model_contract import assert_chunked_loss_equals_full_logits, step_in_pieces

from rpt import RPT, RPTConfig
from rpt.model.block_recurrent import BlockRecurrentCache, BlockRecurrentTransformer, RecurrentLayer
from rpt.model.registry import build_model, model_class, spec

V, S, L = 101, 128, 4  # tiny preset: segment (= block) 128, 4 layers, the recurrent layer is layer 2
GATES = ["fixed", "learned"]


def config(**kw):
    return RPTConfig.from_preset("tiny", variant="block-recurrent", vocab_size=V, **kw).model


def make(gate: str = "fixed", seed: int = 0, **kw) -> BlockRecurrentTransformer:
    """An eval-mode model with every vector parameter (norms, gate logits, gate biases) moved off its constant start,
    so that every path is non-trivial."""
    model = build_model(config(**{"block_recurrent.gate": gate}, **kw), seed=seed).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() < 2:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model




# --- 1, 2: construction ------------------------------------------------------------------------------------------
def test_built_by_the_registry():
    assert model_class("block-recurrent") is BlockRecurrentTransformer and spec("block-recurrent").state == "recurrent"
    model = build_model(config(), seed=0)
    assert isinstance(model, BlockRecurrentTransformer) and model.cfg.variant == "block-recurrent"
    kinds = [type(layer) is RecurrentLayer for layer in model.layers]
    assert kinds == [False, False, True, False]  # default: max(n_layers // 2, n_layers - 3) = 2 (Hutchins' 10th of 12)
    first = build_model(config(**{"block_recurrent.layer": 0}), seed=0)
    assert [type(layer) is RecurrentLayer for layer in first.layers] == [True, False, False, False]
    x = torch.randint(0, V, (1, 300))
    assert first(x).logits.shape == (1, 300, V)
    with pytest.raises(ValueError, match="block-recurrent"):
        BlockRecurrentTransformer(RPTConfig.from_preset("tiny", variant="xl", vocab_size=V))


def test_paired_initialisation_with_xl():
    """One seed: every parameter xl has exists here under the same name (the whole trunk, the recurrent layer's
    attention and MLP included) and holds the same values; another seed gives other values."""
    xl = dict(RPT(RPTConfig.from_preset("tiny", variant="xl", vocab_size=V), seed=3).named_parameters())
    ours = dict(build_model(config(), seed=3).named_parameters())
    assert set(xl) < set(ours) and "layers.2.attn.qkv.weight" in xl
    for name, p in xl.items():
        assert torch.equal(p, ours[name]), name
    other = dict(build_model(config(), seed=4).named_parameters())
    assert not torch.equal(other["embed.weight"], ours["embed.weight"])
    assert not torch.equal(other["layers.2.cell.state_ids"], ours["layers.2.cell.state_ids"])
    torch.manual_seed(5)  # seed=None draws from the global generator: the training loop's manual_seed pairs too
    a = RPT(RPTConfig.from_preset("tiny", variant="xl", vocab_size=V))
    torch.manual_seed(5)
    b = build_model(config())
    assert torch.equal(a.layers[2].attn.qkv.weight, b.layers[2].attn.qkv.weight)
    ids = ours["layers.2.cell.state_ids"]  # state IDs drawn N(0, 1), comparable to the normed state
    assert ids.shape == (128, 64) and 0.8 < ids.std().item() < 1.2  # the tiny preset: 128 state vectors (its block)


# --- 3: forward --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("T", [1, 100, 128, 300])
def test_forward_any_length_and_no_neighbours(T):
    model = make()
    x = torch.randint(0, V, (2, T))
    out = model(x, n_neighbors=2, retrieve_k=4)  # accepted (the common contract) and ignored
    assert out.logits.shape == (2, T, V) and torch.isfinite(out.logits).all()
    assert out.neighbor_ids is None and out.lm is None
    with pytest.raises(ValueError, match="block-recurrent"):
        model(x, neighbor_ids=torch.zeros(2, 1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="block-recurrent"):
        model.step(x, model.new_cache(), neighbor_ids=torch.zeros(2, 1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="block-recurrent"):
        model(x, use_supplied=torch.ones(2, 1, dtype=torch.bool))


# --- 4: no leakage -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gate", GATES)
def test_no_leakage(gate):
    """Perturbing tokens at or after t changes no logit before t: not through the sliding window, and not through the
    state (block b reads the state of blocks 0..b-1; t = S and 2S test its boundaries)."""
    model = make(gate)
    T = 5 * S + 37
    x = torch.randint(0, V, (2, T))
    a = model(x).logits
    for t in (1, S - 1, S, S + 1, 2 * S, 300, 4 * S + 5, T - 1):
        y = x.clone()
        y[:, t:] = (y[:, t:] + 1 + torch.randint(0, V - 1, y[:, t:].shape)) % V
        b = model(y).logits
        torch.testing.assert_close(a[:, :t], b[:, :t], atol=1e-5, rtol=0, msg=f"t={t}")
        assert not torch.allclose(a[:, t:], b[:, t:]), t


# --- 5: cached == full -------------------------------------------------------------------------------------------
SCHEDULES = {"mixed": [1, 62, 1, 64, 128, 3, 200, 5, 500], "7": [7] * 200, "S": [S] * 10, "ragged": [300, 300, 77]}


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_cached_step_equals_full_forward(gate, schedule):
    """A 5+-segment document with a ragged end through new_cache() + step() in pieces of several sizes gives the
    logits of forward on the whole document."""
    model = make(gate)
    x = torch.randint(0, V, (2, 5 * S + 37))
    full = model(x).logits
    got, cache = step_in_pieces(model, x, SCHEDULES[schedule])
    torch.testing.assert_close(got, full, atol=1e-4, rtol=1e-4)
    assert cache.pos == x.shape[1]


def test_cached_step_token_by_token_equals_full_forward():
    model = make("learned")
    x = torch.randint(0, V, (1, 2 * S + 20))
    got, _ = step_in_pieces(model, x, [1] * x.shape[1])
    torch.testing.assert_close(got, model(x).logits, atol=1e-4, rtol=1e-4)


def test_the_state_changes_only_when_a_block_is_complete():
    """Pieces that end mid-block keep the block's token states (`partial`) and leave the state alone; the block's last
    token updates it."""
    model = make()
    x = torch.randint(0, V, (2, 3 * S))
    _, c0 = step_in_pieces(model, x[:, :1], [])
    start = c0.state.clone()
    _, c1 = step_in_pieces(model, x[:, :S - 1], [50])
    assert torch.equal(c1.state, start) and c1.partial.shape == (2, S - 1, 64)
    model.step(x[:, S - 1 : S], c1)
    assert c1.partial is None and not torch.allclose(c1.state, start)
    after_one = c1.state.clone()
    model.step(x[:, S : 2 * S - 1], c1)
    assert torch.equal(c1.state, after_one)
    model.step(x[:, 2 * S - 1 : 2 * S + 3], c1)  # a piece across the boundary: updated at the boundary, not after
    _, c2 = step_in_pieces(model, x[:, : 2 * S], [S])
    torch.testing.assert_close(c1.state, c2.state, atol=1e-6, rtol=0)
    assert c1.partial.shape == (2, 3, 64)


# --- 6: document boundaries and reach ----------------------------------------------------------------------------
def test_a_new_cache_resets_the_state():
    """Document A then document B with a fresh cache == B alone (nothing of A stays in the model); B continuing A's
    cache differs (the cache, and only the cache, carries a document)."""
    model = make()
    a = torch.randint(0, V, (1, 3 * S + 17))
    b = torch.randint(0, V, (1, 2 * S + 40))
    alone = model(b).logits
    step_in_pieces(model, a, [100])
    fresh, _ = step_in_pieces(model, b, [100])
    torch.testing.assert_close(fresh, alone, atol=1e-4, rtol=1e-4)
    model(a)  # a forward on another document leaves nothing behind either
    torch.testing.assert_close(model(b).logits, alone, atol=0, rtol=0)
    _, cache_a = step_in_pieces(model, a[:, : 3 * S], [S])
    continued = model.step(b, cache_a).logits
    assert not torch.allclose(continued, alone, atol=1e-3)


def test_the_state_carries_information_beyond_the_sliding_window():
    """Changing token 0 changes logits in segment L + 1 and after, which xl's stacked sliding windows (one segment
    per layer: segments 0..L) cannot reach; xl from the same seed stays identical there."""
    x = torch.randint(0, V, (1, 7 * S))
    y = x.clone()
    y[0, 0] = (y[0, 0] + 1) % V
    far = (L + 1) * S
    xl = RPT(RPTConfig.from_preset("tiny", variant="xl", vocab_size=V), seed=0).eval()
    torch.testing.assert_close(xl(x).logits[:, far:], xl(y).logits[:, far:], atol=1e-6, rtol=0)
    model = make()
    a, b = model(x).logits, model(y).logits
    assert (a[0, far] - b[0, far]).abs().max() > 1e-4  # the first token out of xl's reach
    assert (a[0, -S:] - b[0, -S:]).abs().amax(-1).min() > 1e-5  # every token of the last segment
    ca, _ = step_in_pieces(model, x, [S])  # the same through the cache
    cb, _ = step_in_pieces(model, y, [S])
    assert (ca[0, -1] - cb[0, -1]).abs().max() > 1e-4


# --- 7, 8: gradients ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gate", GATES)
def test_every_parameter_gets_a_gradient(gate):
    model = make(gate).train()
    x = torch.randint(0, V, (2, 3 * S + 10))
    out = model(x)
    F.cross_entropy(out.logits[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1)).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not missing, missing


def test_forward_with_the_chunked_loss_equals_the_loss_on_full_logits():
    assert_chunked_loss_equals_full_logits(make(), 3 * S + 20)


# --- 9: parameter budget -----------------------------------------------------------------------------------------
def test_parameter_count_at_the_250m_preset(capsys):
    """xl's trunk plus one recurrent cell: 8 D^2 (token -> state query and projection, the state's queries, K/V and
    2D -> D projection) + one SwiGLU + state IDs and initial state (2 N D) + 2 norms and 2 gate logits (4 D);
    within 10% of the paper's 212M."""
    counts = {}
    for variant, gate in (("xl", "fixed"), ("block-recurrent", "fixed"), ("block-recurrent", "learned")):
        with torch.device("meta"):
            model = build_model(RPTConfig.from_preset("250m", variant=variant, vocab_size=50277,
                                                      **{"block_recurrent.gate": gate}).model)
        counts[variant, gate] = model.num_parameters()
    cfg = model.cfg
    D, Fh, N = cfg.d_model, cfg.mlp_hidden, cfg.block_recurrent.state
    xl, ours, lstm = counts["xl", "fixed"], counts["block-recurrent", "fixed"], counts["block-recurrent", "learned"]
    assert ours == xl + 8 * D * D + 3 * D * Fh + 2 * N * D + 4 * D
    assert lstm == ours - 2 * D + 2 * (4 * D * D + 2 * D)  # two [z, c] -> (input, forget) linears instead
    assert abs(ours - 212e6) / 212e6 < 0.10
    with capsys.disabled():
        print(f"\n250m block-recurrent: {ours / 1e6:.1f}M parameters (xl {xl / 1e6:.1f}M, LSTM gate {lstm / 1e6:.1f}M)")


# --- 10: cache sizes ---------------------------------------------------------------------------------------------
def test_cache_bytes():
    """memory_bytes is the state and its K/V, constant in document length; window_bytes the sliding-window K/V of
    every layer and the unfinished block, bounded."""
    model = make()
    B, D, N = 2, 64, 128  # the tiny preset: 128 state vectors
    x = torch.randint(0, V, (B, 6 * S))
    cache = model.new_cache()
    assert isinstance(cache, BlockRecurrentCache) and cache.memory_bytes() == 0 and cache.window_bytes() == 0
    mem, win = [], []
    for p in range(0, x.shape[1], S // 2):  # two pieces per block: mid-block, then block end
        model.step(x[:, p : p + S // 2], cache)
        mem.append(cache.memory_bytes())
        win.append(cache.window_bytes())
    assert all(isinstance(v, int) for v in mem + win)
    assert set(mem) == {B * 3 * N * D * 4}  # fp32 state + its keys and values, from the first token to the last
    kv = 2 * B * D * 4  # K and V bytes per token and layer
    assert win[:4] == [L * kv * S // 2 + B * D * 4 * S // 2, L * kv * S, L * kv * 3 * S // 2 + B * D * 4 * S // 2,
                       L * kv * S]  # mid-block: the half block's inputs too; block end: one full segment per layer
    assert win[2:] == win[2:4] * 5  # from the second block on: one segment + the current one, constant per phase


# --- 11, 12: precision and training mode -------------------------------------------------------------------------
@pytest.mark.parametrize("gate", GATES)
def test_bf16_autocast_is_finite(gate):
    model = make(gate)
    x = torch.randint(0, V, (1, 2 * S + 30))
    with torch.no_grad():
        want = model(x).logits
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
        got, cache = step_in_pieces(model, x, [S - 10, 40])
    assert torch.isfinite(out.logits.float()).all() and torch.isfinite(got.float()).all()
    assert cache.state.dtype == torch.float32  # the state is carried in fp32
    # bf16 rounds each matmul input to 8 significant bits (0.2%); over the layers a relative logit error of a few
    # tenths of a percent (measured ~0.3%). 2% fails for anything beyond rounding, e.g. a state kept in bf16
    for logits in (out.logits, got):
        err = (logits.detach().float() - want).norm() / want.norm()
        assert err < 2e-2, float(err)


def test_train_mode_with_dropout():
    model = build_model(config(dropout=0.1), seed=0)
    x = torch.randint(0, V, (2, 2 * S + 30))
    model.train()
    a, b = model(x).logits, model(x).logits
    assert not torch.allclose(a, b)  # dropout is live
    F.cross_entropy(a[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1)).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.eval()
    torch.testing.assert_close(model(x).logits, model(x).logits, atol=0, rtol=0)
    got, _ = step_in_pieces(model, x, [S])
    torch.testing.assert_close(got, model(x).logits, atol=1e-4, rtol=1e-4)


def test_gates_start_mostly_keeping_the_state():
    """The fixed gate starts at g = sigmoid(1) = 0.73 of the old state in every dimension; the LSTM gate (forget
    offset +1, input offset -1) makes the same update when its weights are zero."""
    fixed = build_model(config(), seed=0).layers[2].cell
    lstm = build_model(config(**{"block_recurrent.gate": "learned"}), seed=0).layers[2].cell
    c, z = torch.randn(2, 512, 64), torch.randn(2, 512, 64)
    g = torch.sigmoid(torch.tensor(1.0))
    torch.testing.assert_close(fixed._gate("attn", c, z), c * g + z * (1 - g))
    torch.testing.assert_close(fixed._gate("mlp", c, z), c * g + z * (1 - g))
    with torch.no_grad():
        lstm.attn_gate.weight.zero_()
    assert (lstm.attn_gate.bias == 0).all()
    torch.testing.assert_close(lstm._gate("attn", c, z), c * g + z * (1 - g))
