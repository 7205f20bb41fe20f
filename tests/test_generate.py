"""Generation (rpt/decoding.py, docs/design.md#generation, docs/design.md#what-the-tests-prove): cached decoding ==
recomputing the full forward, generated chunks enter the memory and are retrieved later, batches == single prompts,
sampling filters, streaming, EOS, the CLI."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from rpt import RPT, RPTConfig
from rpt.decoding import (
    ChunkEvent,
    GenerateConfig,
    IncrementalDecoder,
    TokenEvent,
    filter_logits,
    generate,
    sample_next,
    stream,
)
from rpt.eval.perplexity import bm25_neighbors
from rpt.model.memory import TorchMemory

V, M, S = 101, 64, 128  # tiny preset: chunk 64, segment 128 -> chunks 4.. retrieve


def make(variant: str, vocab: int = V) -> RPT:
    """A tiny random model whose greedy continuations vary (init_std 0.3) and whose gates, null key/values and biases
    are away from their initial values, so every retrieval path changes the logits."""
    torch.manual_seed(0)
    model = RPT(RPTConfig.from_preset("tiny", variant=variant, vocab_size=vocab, init_std=0.3)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() < 2:
                p.add_(torch.randn_like(p) * (2.0 if name.endswith("gate.w") else 0.1))
    return model


def prompt(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def causal_bm25(seq: list[int], n_chunks: int, k: int, cache: dict[int, np.ndarray]) -> torch.Tensor:
    """Reference RETRO neighbours [1, C, k]: chunk i's BM25 neighbours (rpt eval's, query c_i, causal statistics)
    computed from the text up to the end of chunk i alone."""
    rows = []
    for i in range(n_chunks):
        if i not in cache:
            cache[i] = bm25_neighbors(np.asarray(seq[: (i + 1) * M]), M, S, k)[i]
        rows.append(cache[i])
    return torch.from_numpy(np.stack(rows)).long()[None]


@pytest.mark.parametrize("variant, n_new", [("rpt-sem", 150), ("xl", 90), ("retro", 100)])
def test_greedy_cached_equals_recomputed_forward(variant, n_new):
    """KV-cached decoding with retrieval at every chunk boundary gives the tokens of re-running the full forward over
    prompt + generated at every step (300-token prompt: chunk 4 retrieves at prefill; new tokens cross the chunk
    boundaries at 320 and 384 (a segment boundary too) and, for rpt-sem, 448). The full forward is causal
    (tests/model/test_model.py::test_no_leakage): one pass over prompt + generated gives, at each position, the logits
    of re-running it on the tokens up to there, so its argmax there is the token each step must have chosen."""
    model = make(variant)
    p = prompt(300)
    got = generate(model, [p], GenerateConfig(max_new_tokens=n_new, greedy=True))[0]
    seq = p + got.tokens
    nb = causal_bm25(seq, len(seq) // M, 2, {}) if variant == "retro" else None  # chunk i's from the text up to it
    with torch.no_grad():
        logits = model(torch.tensor([seq]), neighbor_ids=nb).logits[0]
    assert got.tokens == logits[len(p) - 1 : -1].argmax(-1).tolist()
    assert len(set(got.tokens)) > 10  # the model does not just repeat one token
    if variant == "xl":
        assert got.retrievals == []
    else:
        assert [r.chunk for r in got.retrievals] == list(range((300 + n_new - 1) // M))
        assert any(nid >= 0 for r in got.retrievals for nid in r.neighbor_ids)  # retrieval really happened


def test_generated_chunks_enter_memory_and_are_retrieved():
    """Each chunk finished by generation is added to the memory when it finishes, and later chunks retrieve it."""
    model = make("rpt-sem")
    mems: list[TorchMemory] = []

    def factory() -> TorchMemory:
        mems.append(TorchMemory())
        return mems[-1]

    p = prompt(320)  # exactly 5 chunks; generated chunks are 5, 6, ...
    seen = []
    for ev in stream(model, [p], GenerateConfig(max_new_tokens=400, greedy=True, n_neighbors=8, retrieve_k=8),
                     memory=factory):
        if isinstance(ev, ChunkEvent):
            seen.append(ev.retrieval)
            if ev.retrieval.generated:
                assert mems[0].n_chunks == ev.retrieval.chunk + 1  # the memory grows as generation crosses boundaries
    assert len(mems) == 1 and mems[0].n_chunks == (320 + 400 - 1) // M == 11  # the last sampled token is never fed
    by_chunk = {r.chunk: r for r in seen}
    assert [r.chunk for r in seen if r.generated] == list(range(5, 11))
    # chunk 10 may retrieve chunks 0..6 (rpt.chunks): generated chunks 5 and 6 are among its neighbours and top-R
    assert {5, 6} <= set(by_chunk[10].neighbor_ids) and {5, 6} <= set(by_chunk[10].top_ids)
    assert all(np.isfinite(by_chunk[10].top_scores[:7])) and by_chunk[10].gates is not None
    assert all(i < 0 or i <= 6 for i in by_chunk[10].top_ids)  # never anything not yet retrievable


@pytest.mark.parametrize("variant", ["rpt-sem", "retro"])
def test_batch_equals_each_prompt_alone(variant):
    model = make(variant)
    cfg = GenerateConfig(max_new_tokens=40, greedy=True)
    a, b = prompt(300, 1), prompt(300, 2)
    batch = generate(model, [a, b], cfg)
    alone = [generate(model, [x], cfg)[0] for x in (a, b)]
    assert [g.tokens for g in batch] == [g.tokens for g in alone]
    assert [[r.neighbor_ids for r in g.retrievals] for g in batch] == [[r.neighbor_ids for r in g.retrievals] for g in alone]


def test_prefill_in_pieces_is_the_same():
    model = make("rpt-sem")
    p = prompt(300)
    one = generate(model, [p], GenerateConfig(max_new_tokens=30, greedy=True, retrieve_k=3))[0]
    pieces = generate(model, [p], GenerateConfig(max_new_tokens=30, greedy=True, retrieve_k=3, prefill_tokens=100))[0]
    assert one.tokens == pieces.tokens
    assert [(r.chunk, r.neighbor_ids, r.top_ids) for r in one.retrievals] == [
        (r.chunk, r.neighbor_ids, r.top_ids) for r in pieces.retrievals]


def test_ragged_prompts_separate_or_truncate():
    model = make("rpt-sem")
    cfg = GenerateConfig(max_new_tokens=20, greedy=True)
    a, b, c = prompt(300, 1), prompt(280, 2), prompt(300, 3)
    sep = generate(model, [a, b, c], cfg)  # groups {a, c} and {b}, each whole
    assert [g.tokens for g in sep] == [generate(model, [x], cfg)[0].tokens for x in (a, b, c)]
    assert [g.truncated for g in sep] == [0, 0, 0]
    with pytest.warns(UserWarning, match="cut on the left"):
        tr = generate(model, [a, b], GenerateConfig(max_new_tokens=20, greedy=True, ragged="truncate"))
    assert tr[0].prompt == a[20:] and tr[0].truncated == 20 and tr[1].prompt == b
    assert tr[0].tokens == generate(model, [a[20:]], cfg)[0].tokens


def test_sampling_is_seeded_per_prompt():
    """Prompt i samples with seed + i, whatever else is in its batch; the same seed repeats."""
    model = make("rpt-sem")
    a, b = prompt(200, 1), prompt(200, 2)
    cfg = GenerateConfig(max_new_tokens=30, temperature=0.9, top_p=0.95, top_k=50, seed=7)
    batch = generate(model, [a, b], cfg)
    again = generate(model, [a, b], cfg)
    alone = generate(model, [b], GenerateConfig(max_new_tokens=30, temperature=0.9, top_p=0.95, top_k=50, seed=8))
    assert [g.tokens for g in batch] == [g.tokens for g in again]
    assert batch[1].tokens == alone[0].tokens
    greedy = generate(model, [a], GenerateConfig(max_new_tokens=30, greedy=True))[0]
    assert batch[0].tokens != greedy.tokens


def test_top_p_to_zero_is_greedy():
    model = make("rpt-sem")
    p = prompt(300)
    greedy = generate(model, [p], GenerateConfig(max_new_tokens=60, greedy=True))[0].tokens
    nucleus = generate(model, [p], GenerateConfig(max_new_tokens=60, temperature=1.0, top_p=1e-6, seed=3))[0].tokens
    top1 = generate(model, [p], GenerateConfig(max_new_tokens=60, temperature=1.5, top_k=1, seed=4))[0].tokens
    assert nucleus == greedy == top1


def test_filter_logits_hand_case():
    probs = torch.tensor([[0.1, 0.5, 0.2, 0.2 - 1e-3, 1e-3]])
    logits = probs.log()
    keep = lambda out: torch.isfinite(out[0]).nonzero().flatten().tolist()  # noqa: E731
    assert keep(filter_logits(logits, top_p=0.55)) == [1, 2]  # 0.5 < 0.55: the next most likely joins
    assert keep(filter_logits(logits, top_p=0.5)) == [1]  # 0.5 already reaches 0.5
    assert keep(filter_logits(logits, top_p=0.75)) == [1, 2, 3]
    assert keep(filter_logits(logits, top_k=2)) == [1, 2]
    assert keep(filter_logits(logits, top_k=2, top_p=0.99)) == [1, 2]
    torch.testing.assert_close(filter_logits(logits, temperature=2.0), logits / 2)
    g = [torch.Generator().manual_seed(0)]
    assert sample_next(logits, GenerateConfig(top_p=1e-9), g).tolist() == [1]
    assert sample_next(logits, GenerateConfig(greedy=True, vocab_size=1)).tolist() == [0]


def test_stop_at_eos():
    model = make("xl")
    p = prompt(100)
    free = generate(model, [p], GenerateConfig(max_new_tokens=40, greedy=True))[0].tokens
    eos = free[5]
    first = free.index(eos)
    got = generate(model, [p, prompt(100, 9)], GenerateConfig(max_new_tokens=40, greedy=True, stop_at_eos=True, eos_id=eos))
    assert got[0].tokens == free[: first + 1] and got[0].stop_reason == "eos"
    # the other row of the batch runs to its own end: its free continuation up to its first EOS, or all 40 tokens
    other = generate(model, [prompt(100, 9)], GenerateConfig(max_new_tokens=40, greedy=True))[0].tokens
    assert len(other) == 40
    if eos in other:
        assert got[1].tokens == other[: other.index(eos) + 1] and got[1].stop_reason == "eos"
    else:
        assert got[1].tokens == other and got[1].stop_reason == "length"


def test_stream_yields_tokens_as_produced_and_text_increments(tmp_path: Path):
    from rpt.data.tokenizer import Tokenizer

    text = ("the retriever scores chunks of earlier text — naïve café déjà vu — and the decoder attends to the best "
            "neighbours while the language model predicts the next chunk. ") * 30
    tok = Tokenizer.train_bpe([text], 300, cache_dir=tmp_path)
    model = make("rpt-sem", vocab=512)
    ids = tok.encode(text)[:300]
    events = list(stream(model, [ids], GenerateConfig(max_new_tokens=150, greedy=True), tokenizer=tok))
    toks = [e for e in events if isinstance(e, TokenEvent)]
    assert [e.index for e in toks] == list(range(150))
    kinds = [type(e).__name__ for e in events]
    assert kinds.index("TokenEvent") < len(kinds) - 1 - kinds[::-1].index("ChunkEvent")  # interleaved, not batched
    streamed = "".join(e.text for e in toks)
    full = generate(model, [ids], GenerateConfig(max_new_tokens=150, greedy=True), tokenizer=tok)[0].text
    assert streamed == full  # the increments add up to the text, the held-back tail flushed at the end
    # a character split across tokens is held back until complete
    dec = IncrementalDecoder(tok, ids)
    e_acute = tok.encode("é")
    pieces = [dec.push(t) for t in tok.encode("déjà vu")]
    assert "".join(pieces) == "déjà vu" and (len(e_acute) == 1 or "" in pieces)


def test_bad_input():
    model = make("xl")
    with pytest.raises(ValueError, match="empty prompt"):
        generate(model, [[]])
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        generate(model, [[1, 2, V]])
    with pytest.raises(ValueError, match="top_p"):
        generate(model, [[1, 2]], GenerateConfig(top_p=0))
    with pytest.raises(ValueError, match="eos_id"):
        generate(model, [[1, 2]], GenerateConfig(stop_at_eos=True))
    with pytest.raises(ValueError, match="list of token-id lists"):
        generate(model, [1, 2, 3])


# ----------------------------------------------------------------------------------------------------------------
# CLI


@pytest.fixture
def checkpoint(tmp_path: Path) -> dict:
    """A tokenizer + token store (as `rpt prepare` writes them) and a checkpoint of a tiny model that names the store."""
    from rpt import checkpoint as ckpt
    from rpt.data.store import StoreWriter
    from rpt.data.tokenizer import Tokenizer

    text = "\n".join(f"def f{i}(x):\n    return x * {i} + value_{i % 7}" for i in range(200))
    store = tmp_path / "store"
    tok = Tokenizer.train_bpe([text], 400, cache_dir=tmp_path / "tok")
    tok.save(store / "tokenizer.json")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = StoreWriter(store / "test", tok.identity, M)
        w.add("doc0", tok.encode(text)[:900])
        w.close()
    cfg = RPTConfig.from_preset("tiny", variant="rpt-sem", vocab_size=512, init_std=0.3)
    cfg.data.store = str(store)
    model = RPT(cfg.model)
    path = ckpt.save(tmp_path / "run", 5, model.state_dict(), {}, cfg, [ckpt.rng_state()], {})
    return {"path": path, "run": tmp_path / "run", "store": store, "tokenizer": tok, "text": text, "model": model}


def test_cli_generate_streams_and_matches_library(checkpoint, capsys):
    from rpt.api import load_model
    from rpt.cli import main

    text = checkpoint["text"][:1200]
    rc = main(["generate", "--checkpoint", str(checkpoint["run"]), "--prompt", text, "--max-new-tokens", "70", "--greedy",
               "--neighbors", "2", "--show-retrieval"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    loaded = load_model(checkpoint["path"])
    ids = loaded.tokenizer.encode(text)
    cfg = GenerateConfig(max_new_tokens=70, greedy=True, vocab_size=loaded.tokenizer.vocab_size)
    ref = generate(loaded.model, [ids], cfg, tokenizer=loaded.tokenizer)[0]
    assert max(ref.tokens) < loaded.tokenizer.vocab_size < 512  # ids past the tokenizer's are never sampled
    assert ref.text in out.out
    assert "chunk" in out.err  # --show-retrieval reports the chunks each generated chunk retrieved (on stderr)


def test_cli_generate_prompt_file_batch(checkpoint, tmp_path, capsys):
    from rpt.cli import main

    f = tmp_path / "prompts.txt"
    f.write_text("def f1(x):\n    return\n\ndef f2(y):\n    return y\n")
    rc = main(["generate", "--checkpoint", str(checkpoint["path"]), "--prompt-file", str(f), "--prompt-sep", "blank",
               "--max-new-tokens", "8", "--temperature", "0.8", "--top-p", "0.95", "--seed", "0"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert out.out.count("=== prompt") == 2


@pytest.mark.parametrize("args, message", [
    (["--checkpoint", "{tmp}/nope", "--prompt", "x"], "no such file"),
    (["--checkpoint", "{ckpt}", "--prompt", ""], "empty prompt"),
    (["--checkpoint", "{ckpt}", "--prompt", "x", "--top-p", "0"], "top_p"),
    (["--checkpoint", "{ckpt}", "--prompt-file", "{tmp}/none.txt"], "no such file"),
])
def test_cli_generate_bad_input(checkpoint, tmp_path, capsys, args, message):
    from rpt.cli import main

    args = [a.format(tmp=tmp_path, ckpt=checkpoint["path"]) for a in args]
    assert main(["generate", *args]) == 2
    assert message in capsys.readouterr().err
