"""The document memory: Faiss == torch (neighbours, scores, logits), linear growth, bounded K/V cache, the factory."""

import importlib.util

import numpy as np
import pytest
import torch
from eval_helpers import M, S, doc_tokens, make_model

from rpt.chunks import last_retrievable
from rpt.eval.perplexity import evaluate_document
from rpt.model.memory import FaissMemory, TorchMemory, make_memory, memory_name

HAS_FAISS = importlib.util.find_spec("faiss") is not None
needs_faiss = pytest.mark.skipif(not HAS_FAISS, reason="faiss not installed (pip install -e .[faiss])")
MEMORIES = [TorchMemory, pytest.param(FaissMemory, marks=needs_faiss, id="FaissMemory")]


def fill(mem, keys: torch.Tensor) -> None:
    """Feed keys [B, N, D] in uneven pieces, as the model does chunk by chunk (states are not needed for search)."""
    B, N, D = keys.shape
    i = 0
    for n in (1, 3, 2, 7, N):
        n = min(n, N - i)
        if n <= 0:
            break
        mem.add_states(torch.zeros(B, n, M, D))
        mem.add_keys(keys[:, i : i + n])
        i += n


@needs_faiss
def test_faiss_and_torch_search_agree():
    torch.manual_seed(0)
    B, N, D, Q = 2, 13, 16, 5
    keys, queries = torch.randn(B, N, D), torch.randn(B, Q, D)
    mems = [TorchMemory(), FaissMemory()]
    for mem in mems:
        fill(mem, keys)
    for limit in (-1, 0, 4, 9, 12):  # the searchable set only grows
        for k in (1, 3, 20):  # 20 > N: padded with -1 / -inf
            (ti, ts), (fi, fs) = (mem.search(queries, limit, k) for mem in mems)
            assert torch.equal(ti, fi)
            assert fi.dtype == torch.long and fi.shape == (B, Q, k)
            assert ((fi >= 0) == torch.isfinite(fs)).all() and (fi <= limit).all()
            torch.testing.assert_close(fs[fi >= 0], ts[ti >= 0], atol=1e-5, rtol=1e-5)
    # exactness: the best id is the argmax over the allowed keys
    expected = (queries @ keys.transpose(1, 2)).argmax(-1)
    assert torch.equal(mems[1].search(queries, N - 1, 1)[0][..., 0], expected)


@needs_faiss
def test_faiss_and_torch_give_the_same_neighbours_and_logits():
    model = make_model("rpt-sem")
    toks = doc_tokens(30 * M + 5, seed=3)
    a = evaluate_document(model, toks, memory=TorchMemory, retrieve_k=6)
    b = evaluate_document(model, toks, memory=FaissMemory, retrieve_k=6)
    assert (a.neighbors >= 0).any()
    np.testing.assert_array_equal(a.neighbors, b.neighbors)
    np.testing.assert_array_equal(a.top_ids, b.top_ids)
    np.testing.assert_allclose(a.chunk_nll, b.chunk_nll, rtol=1e-5, atol=1e-5)
    assert a.memory_bytes == b.memory_bytes  # same states, same number of float32 keys


@pytest.mark.parametrize("memory", MEMORIES, ids=lambda m: getattr(m, "__name__", m))
def test_memory_grows_linearly_and_the_kv_cache_is_bounded(memory):
    """Sizes, not times: the memory holds each finished chunk's states (M x D floats) plus one key per chunk that has
    become searchable; the sliding-window K/V cache never holds more than two segments per layer."""
    model = make_model("rpt-sem")
    D, cps = model.cfg.d_model, S // M
    sizes, kv = [], []
    lengths = [4 * S, 8 * S, 12 * S, 16 * S]
    for T in lengths:
        ev = evaluate_document(model, doc_tokens(T, seed=1), memory=memory)
        n = T // M
        searchable = int(last_retrievable(n - cps, M, S)) + 1  # the last segment's search made chunks 0..limit searchable
        assert ev.memory_bytes == n * M * D * 4 + searchable * D * 4
        sizes.append(ev.memory_bytes)
        kv.append(ev.kv_cache_bytes)
    steps = np.diff(sizes)
    assert (steps == steps[0]).all() and steps[0] == 4 * S // M * (M + 1) * D * 4  # equal increments: linear
    assert len(set(kv)) == 1 and kv[0] <= len(model.layers) * 2 * 2 * S * D * 4  # K and V of <= 2 segments per layer


def test_make_memory():
    assert make_memory("auto", torch.device("cuda")) is TorchMemory  # a device object; no GPU is touched
    assert make_memory("torch", "cpu") is TorchMemory
    assert memory_name(FaissMemory) == "faiss" and memory_name(TorchMemory) == "torch"
    with pytest.raises(ValueError, match="auto, faiss or torch"):
        make_memory("annoy")


@needs_faiss
def test_make_memory_with_faiss():
    assert make_memory("auto", "cpu") is FaissMemory and make_memory("faiss", "cpu") is FaissMemory
    assert isinstance(make_memory("faiss")(), FaissMemory)


def test_auto_falls_back_to_torch_without_faiss(monkeypatch):
    import rpt.model.memory as mem_mod
    from rpt.utils import MissingDependency

    def missing(module, purpose=""):
        raise MissingDependency(f"{module} is needed")

    monkeypatch.setattr(mem_mod, "require", missing)
    assert mem_mod.make_memory("auto", "cpu") is TorchMemory
    with pytest.raises(MissingDependency):
        mem_mod.make_memory("faiss", "cpu")
