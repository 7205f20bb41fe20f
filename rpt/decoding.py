"""Generation with retrieval at every chunk boundary (§3.4 "Retrieval at inference time", docs/design.md#inference).

Decoding lives here, outside the model: the model only computes. One loop serves every variant:

    prefill   one `model.step` over the whole prompt (a long prompt: one call per `prefill_tokens`, whole segments):
              the K/V cache of the sliding window fills, every finished prompt chunk enters the document memory and
              retrieves from the chunks before it
    decode    one token per `model.step`; when a generated token completes a chunk, that chunk enters the memory too
              and retrieves (its neighbours condition the next chunk from its last token on, as in training), so later
              chunks can retrieve text the model wrote itself

Neighbour sources by variant: rpt-lex / rpt-sem use their own retriever over the memory; xl retrieves nothing; retro
gets BM25 neighbours (query = the finished chunk c_q alone, as RETRO at inference) computed on the fly with
`rpt.labels.bm25.bm25_candidates` over the text up to the end of that chunk (see `Bm25Neighbours`).

Batches. The model advances all rows of a batch in lockstep (one shared position; there is no padding mask, and a pad
token would enter the document and its memory). Prompts of different lengths are therefore handled in one of two
honest ways (`GenerateConfig.ragged`):
    "separate" (default)  prompts are grouped by length; each group is one batch; groups run one after another
    "truncate"            every prompt is cut on the left to the shortest prompt's length (a warning says so)
Sampling draws from one generator per prompt seeded with ``seed + prompt index``, so a prompt's continuation does not
depend on which other prompts share its batch.

Dimension letters: B batch (prompts of one group), T prompt tokens, V vocabulary, C chunks, K neighbours, R top-R.

Called as a function, ``rpt.generate(model_or_path, "text", max_new_tokens=...)``, this module runs
`rpt.api.generate` (text in, text out).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from rpt.config import check_neighbors
from rpt.utils import UserError, argument_error

if TYPE_CHECKING:
    from rpt.config import RPTConfig
    from rpt.data.tokenizer import Tokenizer
    from rpt.model.memory import ChunkMemory
    from rpt.model.rpt import RPT, RPTOutput


@dataclass
class GenerateConfig:
    """How to decode. `greedy` (or temperature 0) takes the argmax; otherwise temperature, then top-k, then top-p."""

    max_new_tokens: int = 200  # tokens to generate per prompt (fewer when stopping at EOS)
    greedy: bool = False  # argmax decoding (ignores temperature / top-k / top-p)
    temperature: float = 1.0  # logits / temperature before sampling; 0 means greedy
    top_p: float = 1.0  # nucleus: sample from the smallest set of tokens whose probability mass reaches top_p
    top_k: int = 0  # keep only the k most likely tokens (0 = all)
    seed: int = 0  # prompt i samples from a generator seeded with seed + i
    stop_at_eos: bool = False  # stop a prompt's continuation at the end-of-text token (it is included)
    eos_id: int | None = None  # the end-of-text id (CLI: the tokenizer's)
    n_neighbors: int | None = None  # K fed to CCA (None: the model's n_neighbors)
    retrieve_k: int | None = None  # also report the retriever's top-R ids and scores per chunk (rpt-* only)
    ragged: Literal["separate", "truncate"] = "separate"  # prompts of different lengths: see the module docstring
    vocab_size: int | None = None  # sample only ids < vocab_size (the tokenizer's; the embedding may have spare rows)
    prefill_tokens: int = 8192  # prompt tokens per prefill step() call (bounds its [B, n, V] logits); whole segments

    def validate(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):  # NaN fails every comparison
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        check_neighbors(self.n_neighbors, "n_neighbors")
        if self.retrieve_k is not None and self.retrieve_k < 1:
            raise ValueError(f"retrieve_k must be >= 1, got {self.retrieve_k}")
        if self.ragged not in ("separate", "truncate"):
            raise ValueError(f"ragged must be 'separate' or 'truncate', got {self.ragged!r}")
        if self.prefill_tokens < 1:
            raise ValueError(f"prefill_tokens must be >= 1, got {self.prefill_tokens}")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {self.vocab_size}")
        if self.stop_at_eos and self.eos_id is None:
            raise ValueError("stop_at_eos needs eos_id (the tokenizer has no end-of-text token?)")

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0


@dataclass
class ChunkRetrieval:
    """What happened when document chunk `chunk` finished: its neighbours (which condition chunk + 1's tokens, from
    the last token of `chunk` on). Ids are document-absolute chunk indices, -1 = empty slot."""

    chunk: int
    generated: bool  # the chunk holds at least one generated token
    neighbor_ids: list[int] = field(default_factory=list)  # the K ids CCA used (empty for xl)
    gates: list[float] | None = None  # their gate values
    top_ids: list[int] | None = None  # the retriever's top-R (rpt-*, with retrieve_k)
    top_scores: list[float] | None = None


@dataclass
class TokenEvent:
    """One generated token of prompt `row`; `text` is the newly decodable text (may be "" mid-character)."""

    row: int
    index: int  # 0 = first generated token
    token: int
    text: str = ""


@dataclass
class ChunkEvent:
    """Retrieval at a chunk boundary of prompt `row` (prefill reports every finished prompt chunk)."""

    row: int
    retrieval: ChunkRetrieval


Event = TokenEvent | ChunkEvent


@dataclass
class Generation:
    """The result for one prompt."""

    prompt: list[int]  # the prompt as the model saw it (left-truncated with ragged="truncate")
    tokens: list[int]  # generated ids
    retrievals: list[ChunkRetrieval]  # one per finished chunk, prompt chunks first, in chunk order
    stop_reason: Literal["length", "eos"] = "length"
    text: str | None = None  # decoded generated text (with a tokenizer)
    truncated: int = 0  # prompt tokens dropped on the left

    @property
    def generated_retrievals(self) -> list[ChunkRetrieval]:
        return [r for r in self.retrievals if r.generated]


# ------------------------------------------------------------------------------------------------------------------
# sampling


def filter_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """logits [B, V] -> temperature-scaled logits with -inf outside the top-k and outside the top-p nucleus.

    The nucleus keeps the smallest prefix of tokens (most likely first) whose probability reaches top_p; the most likely
    token is always kept, so top_p -> 0 leaves only the argmax."""
    logits = logits.float() / max(temperature, 1e-8)
    V = logits.shape[-1]
    if 0 < top_k < V:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)  # [B, V]
        probs = sorted_logits.softmax(-1)
        before = probs.cumsum(-1) - probs  # mass of the more likely tokens
        drop_sorted = before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(logits: torch.Tensor, cfg: GenerateConfig, generators: Sequence[torch.Generator] | None = None) -> torch.Tensor:
    """logits [B, V] -> next token ids [B] (long). One generator per row keeps rows independent of each other."""
    if cfg.vocab_size is not None and cfg.vocab_size < logits.shape[-1]:
        logits = logits.clone()
        logits[:, cfg.vocab_size :] = float("-inf")  # ids the tokenizer cannot decode
    if cfg.is_greedy:
        return logits.argmax(-1)
    probs = filter_logits(logits, cfg.temperature, cfg.top_k, cfg.top_p).softmax(-1)  # [B, V]
    if generators is None:
        return torch.multinomial(probs, 1).squeeze(-1)
    return torch.cat([torch.multinomial(p[None], 1, generator=g)[0] for p, g in zip(probs, generators, strict=True)])


# ------------------------------------------------------------------------------------------------------------------
# neighbour sources that live outside the model


class Bm25Neighbours:
    """RETRO's neighbours at generation: BM25 with the finished chunk c_q alone as the query, among the chunks
    retrievable for it, with causal statistics (idf and average length from those retrievable chunks only): exactly
    `rpt eval --source bm25` (`rpt.labels.bm25.bm25_neighbors`), so generation sees what evaluation measured.

    A chunk's ids depend only on text up to its own end, so they never change as text is added, and do not depend on
    where the prompt ended. `ids()` is the `neighbor_ids` argument of `model.step` ([B, C, K], document-absolute,
    covering every finished chunk)."""

    def __init__(self, n_rows: int, chunk_size: int, segment_len: int, k: int) -> None:
        try:
            from rpt.labels.bm25 import bm25_neighbors
        except ImportError as e:  # someone else's module: fail with what is missing
            raise UserError("retro generation needs BM25 neighbours at every chunk (rpt.labels.bm25.bm25_neighbors), "
                            f"which cannot be imported: {e}") from e
        self._bm25 = bm25_neighbors
        self.M, self.S, self.k = chunk_size, segment_len, k
        self.rows = [np.full((0, k), -1, np.int64) for _ in range(n_rows)]  # per row: [finished chunks, K]

    def update(self, history: Sequence[Sequence[int]], n_tokens: int) -> None:
        """Cover every chunk finished within the first n_tokens of each row's history."""
        n_chunks = n_tokens // self.M
        for b, toks in enumerate(history):
            have = len(self.rows[b])
            if have < n_chunks:
                ids = self._bm25(np.asarray(toks[: n_chunks * self.M], dtype=np.int64), self.M, self.S, self.k)  # [C, K]
                self.rows[b] = np.concatenate([self.rows[b], ids[have:n_chunks]])

    def ids(self, device: torch.device) -> torch.Tensor:
        return torch.from_numpy(np.stack(self.rows)).to(device)  # [B, C, K]


def memory_factory(kind: str = "auto", device: torch.device | str = "cpu") -> Callable[[], ChunkMemory]:
    """The document memory to generate with (`rpt.model.memory.make_memory`): "torch" (exact matmul), "faiss" (an
    inner-product index on the CPU, as in the paper) or "auto" (torch on a GPU, Faiss on CPU when installed)."""
    from rpt.model.memory import make_memory

    try:
        return make_memory(kind, device)  # type: ignore[arg-type]
    except ValueError as e:
        raise UserError(str(e)) from None


# ------------------------------------------------------------------------------------------------------------------
# text


class IncrementalDecoder:
    """Turns a growing list of generated ids into text increments (for streaming).

    Decodes the generated ids after a few prompt tokens of context (so tokenizers that drop a leading space on the
    first token decode as they would mid-text) and holds back a trailing U+FFFD: a multi-byte character that is still
    incomplete."""

    def __init__(self, tokenizer: Tokenizer, context: Sequence[int] = ()) -> None:
        self.tok = tokenizer
        self.context = [int(t) for t in context[-4:]]
        self.prefix = tokenizer.decode(self.context)
        self.ids: list[int] = []
        self.emitted = 0

    def text(self) -> str:
        full = self.tok.decode(self.context + self.ids)
        return full[len(self.prefix):] if full.startswith(self.prefix) else self.tok.decode(self.ids)

    def push(self, token: int) -> str:
        self.ids.append(int(token))
        text = self.text()
        end = len(text)
        while end > self.emitted and text[end - 1] == "\ufffd":
            end -= 1
        new = text[self.emitted : end]
        self.emitted = max(self.emitted, end)
        return new

    def flush(self) -> str:
        """Whatever is held back (at the end of generation an incomplete character stays U+FFFD)."""
        text = self.text()
        new = text[self.emitted :]
        self.emitted = len(text)
        return new


# ------------------------------------------------------------------------------------------------------------------
# decoding


def _as_prompts(prompts: Sequence[Sequence[int]] | torch.Tensor) -> list[list[int]]:
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() == 1:
            prompts = prompts[None]
        return [[int(t) for t in row] for row in prompts.tolist()]
    if len(prompts) and isinstance(prompts[0], (int, np.integer)):
        raise ValueError("prompts must be a list of token-id lists (one per prompt), not one flat list")
    out = [[int(t) for t in p] for p in prompts]
    return out


def _cuts(prompts: list[list[int]], ragged: str) -> list[int]:
    """Tokens cut from each prompt's left: none with ragged="separate", down to the shortest with "truncate"."""
    if ragged != "truncate":
        return [0] * len(prompts)
    shortest = min(len(p) for p in prompts)
    return [len(p) - shortest for p in prompts]


def _groups(prompts: list[list[int]], ragged: str) -> list[list[int]]:
    """Rows grouped into lockstep batches (prompts of one length; all of them after truncation)."""
    lengths = [len(p) for p in prompts]
    if ragged == "truncate":
        if len(set(lengths)) > 1:
            warnings.warn(f"prompts have different lengths {sorted(set(lengths))}: each is cut on the left to the "
                          f"shortest ({min(lengths)} tokens) so the batch runs in lockstep (ragged='separate' keeps them "
                          "whole)", stacklevel=4)
        return [list(range(len(prompts)))]
    by_len: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        by_len.setdefault(n, []).append(i)
    return list(by_len.values())


def _chunk_events(out: RPTOutput, rows: list[int], live: list[bool], prompt_len: int, M: int) -> Iterator[ChunkEvent]:
    """ChunkEvents for the chunks that finished during one step call (none for xl: it retrieves nothing)."""
    if out.neighbor_ids is None:
        return
    nb = out.neighbor_ids.tolist()  # [B, nc, K]
    gates = out.gates.tolist() if out.gates is not None else None
    top_ids = out.top_ids.tolist() if out.top_ids is not None else None
    top_scores = out.top_scores.float().tolist() if out.top_scores is not None else None
    for b, row in enumerate(rows):
        if not live[b]:
            continue
        for j in range(len(nb[b])):
            c = out.chunk_start + j
            yield ChunkEvent(row, ChunkRetrieval(
                chunk=c, generated=(c + 1) * M > prompt_len, neighbor_ids=nb[b][j],
                gates=gates[b][j] if gates is not None else None,
                top_ids=top_ids[b][j] if top_ids is not None else None,
                top_scores=top_scores[b][j] if top_scores is not None else None))


def _run_group(model: RPT, prompts: list[list[int]], rows: list[int], cfg: GenerateConfig,
               memory: ChunkMemory | Callable[[], ChunkMemory] | None, tokenizer: Tokenizer | None) -> Iterator[Event]:
    mcfg = model.cfg
    M, S = mcfg.chunk_size, mcfg.segment_len
    K = cfg.n_neighbors or mcfg.n_neighbors
    device = next(model.parameters()).device
    B, T = len(rows), len(prompts[0])
    history = [list(p) for p in prompts]
    gens = [torch.Generator(device=device).manual_seed(cfg.seed + r) for r in rows]
    decoders = [IncrementalDecoder(tokenizer, p) for p in prompts] if tokenizer is not None else None
    bm25 = Bm25Neighbours(B, M, S, K) if mcfg.variant == "retro" else None
    retrieve_k = cfg.retrieve_k if mcfg.has_retriever else None

    def step(ids: torch.Tensor) -> RPTOutput:
        nb = None
        if bm25 is not None:
            bm25.update(history, cache.pos + ids.shape[1])
            nb = bm25.ids(device)
        return model.step(ids, cache, neighbor_ids=nb, n_neighbors=K, retrieve_k=retrieve_k)

    cache = model.new_cache(memory)
    live = [True] * B
    # prefill: one step() over the prompt [B, T], in pieces of whole segments when it is long (step() splits at
    # segment boundaries anyway, so this computes the same thing; only the last position's logits are kept)
    ids = torch.tensor(prompts, dtype=torch.long, device=device)
    piece = max(S, cfg.prefill_tokens // S * S)
    for a in range(0, T, piece):
        out = step(ids[:, a : a + piece])
        yield from _chunk_events(out, rows, live, T, M)
    for n in range(cfg.max_new_tokens):
        tok = sample_next(out.logits[:, -1], cfg, gens)  # [B]
        toks = tok.tolist()
        for b, row in enumerate(rows):
            history[b].append(toks[b])
            if not live[b]:
                continue
            last = n == cfg.max_new_tokens - 1 or (cfg.stop_at_eos and toks[b] == cfg.eos_id)
            text = ""
            if decoders is not None:
                text = decoders[b].push(toks[b]) + (decoders[b].flush() if last else "")
            yield TokenEvent(row, n, toks[b], text)
            if cfg.stop_at_eos and toks[b] == cfg.eos_id:
                live[b] = False
        if n == cfg.max_new_tokens - 1 or not any(live):
            break
        # rows that stopped keep stepping (lockstep) but report nothing more
        out = step(tok[:, None])  # [B, 1]: the new token enters the cache; a finished chunk enters the memory
        yield from _chunk_events(out, rows, live, T, M)


def stream(model: RPT, prompts: Sequence[Sequence[int]] | torch.Tensor, cfg: GenerateConfig | None = None, *,
           tokenizer: Tokenizer | None = None,
           memory: ChunkMemory | Callable[[], ChunkMemory] | None = None) -> Iterator[Event]:
    """Generate continuations of `prompts` (lists of token ids, or a LongTensor [B, T]), yielding events as they happen:
    a `TokenEvent` per generated token (with its text increment when `tokenizer` is given) and a `ChunkEvent` per
    finished chunk (prompt chunks at prefill, then each generated chunk). `memory`: a ChunkMemory factory (one memory
    per batch of prompts; default TorchMemory). Prompts of different lengths: see `GenerateConfig.ragged`."""
    cfg = cfg or GenerateConfig()
    cfg.validate()
    all_prompts = _as_prompts(prompts)
    if not all_prompts:
        raise ValueError("no prompts")
    if any(len(p) == 0 for p in all_prompts):
        raise ValueError("empty prompt: generation needs at least one prompt token")
    V = model.cfg.vocab_size
    bad = [t for p in all_prompts for t in p if not 0 <= t < V]
    if bad:
        raise ValueError(f"prompt token id {bad[0]} is outside the model's vocabulary [0, {V})")
    if memory is not None and not callable(memory) and len(set(len(p) for p in all_prompts)) > 1 and cfg.ragged == "separate":
        raise ValueError("one memory instance cannot serve several prompt groups: pass a factory (e.g. the class)")
    groups, cut = _groups(all_prompts, cfg.ragged), _cuts(all_prompts, cfg.ragged)
    was_training = model.training
    model.eval()
    try:
        for rows in groups:
            group = [all_prompts[r][cut[r]:] for r in rows]
            yield from _run_group(model, group, rows, cfg, memory, tokenizer)
    finally:
        model.train(was_training)


def generate(model: RPT, prompts: Sequence[Sequence[int]] | torch.Tensor, cfg: GenerateConfig | None = None, *,
             tokenizer: Tokenizer | None = None, memory: ChunkMemory | Callable[[], ChunkMemory] | None = None,
             on_event: Callable[[Event], None] | None = None) -> list[Generation]:
    """`stream` collected into one `Generation` per prompt (in prompt order). `on_event` sees every event as it comes."""
    cfg = cfg or GenerateConfig()
    all_prompts = _as_prompts(prompts)
    cut = _cuts(all_prompts, cfg.ragged) if all_prompts else []
    results = [Generation(prompt=p[c:], tokens=[], retrievals=[], truncated=c) for p, c in zip(all_prompts, cut, strict=True)]
    for ev in stream(model, all_prompts, cfg, tokenizer=tokenizer, memory=memory):
        if on_event is not None:
            on_event(ev)
        g = results[ev.row]
        if isinstance(ev, TokenEvent):
            g.tokens.append(ev.token)
            if cfg.stop_at_eos and ev.token == cfg.eos_id:
                g.stop_reason = "eos"
        else:
            g.retrievals.append(ev.retrieval)
    if tokenizer is not None:
        for g in results:
            g.text = tokenizer.decode(g.tokens)
    return results


# ------------------------------------------------------------------------------------------------------------------
# checkpoints


def find_tokenizer(folder: Path, cfg: RPTConfig) -> Path | None:
    """The tokenizer file a checkpoint was trained with: tokenizer.json in the checkpoint or run folder, else the one
    beside the token store its config names (data.store); None when there is none."""
    for cand in (folder / "tokenizer.json", folder.parent.parent / "tokenizer.json", Path(cfg.data.store) / "tokenizer.json"):
        if cand.is_file():
            return cand
    return None


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu", tokenizer: str | Path | None = None,
                    allow_other_tokenizer: bool = False) -> tuple[RPT, RPTConfig, Tokenizer | None, Path]:
    """Load a checkpoint for inference (eval mode, on `device`): its folder, its model.safetensors, or a run folder
    (the newest checkpoint), through the shared `load_model` of rpt.checkpoint. The tokenizer is `tokenizer` if given, else
    found by `find_tokenizer` (None when nowhere to be found); it must be the one the run recorded (see
    `check_tokenizer`). Returns (model, its run config, the tokenizer or None, the checkpoint folder): what
    `rpt.api.load_model` wraps in a LoadedModel and `rpt.export` writes."""
    from rpt.checkpoint import load_model as load_checkpoint
    from rpt.checkpoint import resolve_checkpoint
    from rpt.data.tokenizer import Tokenizer

    if not Path(path).exists():
        raise argument_error("checkpoint", path, "no such file or folder")
    folder = resolve_checkpoint(path)
    model, cfg = load_checkpoint(folder, device)
    tok_path = Path(tokenizer) if tokenizer is not None else find_tokenizer(folder, cfg)
    tok = Tokenizer.from_file(tok_path) if tok_path is not None else None
    if tok is not None:
        check_tokenizer(tok, folder, cfg, allow_other_tokenizer)
    return model, cfg, tok, folder


def check_tokenizer(tok: Tokenizer, folder: Path, cfg: RPTConfig, allow_other: bool = False) -> None:
    """Refuse a tokenizer other than the one the run recorded (`rpt.checkpoint.checkpoint_tokenizer`): its ids name
    other strings, and the model would continue the prompt with fluent-looking garbage and exit 0. `allow_other` lets
    through a tokenizer the user knows to be compatible (e.g. re-saved); ids past the model's embedding never pass."""
    from rpt.checkpoint import checkpoint_tokenizer

    if tok.vocab_size > cfg.model.vocab_size:
        raise UserError(f"tokenizer {tok.name} has {tok.vocab_size} ids but the model's vocabulary is "
                        f"{cfg.model.vocab_size}: it is not the tokenizer this checkpoint was trained with")
    recorded = checkpoint_tokenizer(folder, cfg)
    if allow_other or recorded is None or recorded.get("hash") == tok.hash:
        return
    raise argument_error("tokenizer", tok.name, f"hash {tok.hash[:12]} is not the tokenizer checkpoint {folder} was "
                         f"trained with, {recorded.get('name')} (hash {str(recorded.get('hash'))[:12]}): pass that one "
                         "as {tokenizer}, or {allow_other_tokenizer=True} if its ids mean the same tokens")


def read_text_file(path: str | Path, flag: str) -> str:
    """The UTF-8 text of a file the user named with `flag`, or a UserError naming both (missing, unreadable, or not
    UTF-8: a bare UnicodeDecodeError says neither which file nor which option)."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{flag} {p}: no such file")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{flag} {p}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); convert it "
                        "first, e.g. iconv -f latin1 -t utf-8") from None
    except OSError as e:
        raise UserError(f"{flag} {p}: cannot read it ({e.strerror})") from None
