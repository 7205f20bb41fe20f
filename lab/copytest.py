"""`python -m lab copytest`: the project's proof that retrieval is used, on the synthetic copy corpus (rpt.data.synthetic).

    near control   xl on synthetic:copy-near: repeats one passage back, inside one layer's attention window (its
                   segment is at least a passage long). xl's loss on repeated chunks must fall far below its loss on
                   fresh ones: the setting can teach copying at all.
    far            xl, retro (BM25 neighbours), rpt-lex and rpt-sem (their own retriever) on synthetic:copy-far:
                   repeats beyond xl's whole receptive field. xl can gain nothing; a retrieving variant gains only
                   through CCA.

The far repeat distance follows from the model: a repeat lies at least (n_layers + 1) * segment_len + 1 tokens back
(xl's reach with sliding windows), in whole passages (128 words by default, on the chunk grid; `passage_max` varies
their length so that repeats fall at any offset to it, counted in the shortest), and at most twice that, inside the
training span.

Every variant of a seed starts from the same weights (paired initialisation) and sees fresh documents only (each
training document is used once). rpt-sem's scoring LM is the near control of the first seed: an xl that has learned
to copy inside its window, exactly what scoring a candidate placed before the query needs (§3.2; any LM with in-context
copying would do). It also labels the test documents, so every retrieving checkpoint is evaluated over whole test
documents with its own neighbours, with none, with K random retrievable chunks of the same document (the control),
with the oracle's (the scorer's best candidates) and, for rpt-lex and rpt-sem, with BM25's. Reported per chunk class
(fresh, repeat-head, repeat-tail): mean NLL, and for the repeat-tail chunks how often the first neighbour's
continuation is exactly the chunk to predict (hit@1).

The copy advantage is loss(fresh) - loss(repeat-tail), nats. The test passes when xl's near advantage is large
(>= `min_near` nats), xl's far advantage is small (< `max_xl_far`), and each retrieving variant's far advantage with
its own neighbours reaches at least half of xl's near advantage (or of `min_near`, whichever is larger: a near control
that learned nothing does not lower the bar), with a retrieval gain (loss without neighbours minus
loss with them, on repeat-tail chunks) of the same size, a gain over random chunks of the document of the same size
(reading the source, not any chunk of the document), and each trained retriever (rpt-lex, rpt-sem) ranks the true
source chunk first for most repeat-tail chunks (hit@1 > 50%).

With `words` = "text" the corpus writes pseudo-words and a BPE trained on it (`tokenizer`, default bpe:2048) splits
them into about two tokens each: passages of varying token length, repeats at any offset to the chunk grid and
chunk boundaries inside words, as in real text. Passage lengths and distances stay in words; the tokens per word
measured on the corpus size the documents and the far distance.

The far corpus repeats every passage from the first far-enough one on by default (`far_p` = 1; the corpus default is
0.5): at 0.5 only 15% of the tokens can be copied through retrieval and CCA stays on the ln(V) plateau for 200 updates
even when handed the true source wherever c_q retrieval can find it; at 1.0 (31%) it leaves it after ~90 updates.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rpt.utils import write_json_atomic

# a retrieving variant's own neighbours at evaluation: retro has no retriever and reads BM25's (c_q only)
OWN_SOURCE = {"retro": "bm25", "rpt-lex": "model", "rpt-sem": "model"}
PASSAGE = 128  # words (= tokens) per passage: two chunks
TEXT_TOKENIZER = "bpe:2048"  # words=text: about two tokens per pseudo-word of the default 1,024
TEXT_VOCAB = 1024  # words=text: enough words that an 8-token run (about 4 words) recurs by chance ~never


@dataclass
class CopyTestSettings:
    out: Path = Path("runs/copytest")
    preset: str = "tiny"
    steps: int = 600  # updates per run (x batch_size fresh documents each)
    lr: float = 1e-2
    warmup: int = 30
    min_lr_ratio: float = 0.1  # cosine decay to this fraction of lr (1: constant after warmup, for short runs)
    near_steps: int = 0  # updates of the near control, which is also rpt-sem's scoring LM (0: steps)
    near_lr: float = 0.0  # peak learning rate of the near control (0: lr)
    near_every_seed: bool = True  # False: the near control (and scorer) runs for the first seed only
    batch_size: int = 4
    seq_len: int = 2048
    segment_len: int = 128
    docs: int = 0  # training documents per store (0: steps * batch_size, so no document is seen twice)
    eval_docs: int = 32
    far_p: float = 1.0  # repeat probability of the far corpus
    near_p: float = 0.5  # repeat probability of the near corpus (the corpus default)
    # rpt-sem's scoring LM (its training labels and the test oracle): "near", the first seed's near control, or any
    # scorer `rpt label --scorer` takes ("induction": a copying LM with no parameters; smollm2; a model folder)
    scorer: str = "near"
    variants: tuple[str, ...] = ("retro", "rpt-lex")  # retrieving variants trained on far (xl always runs)
    scorer_k: int = 4  # BM25 candidates scored per query chunk for rpt-sem's labels and the oracle
    seeds: tuple[int, ...] = (0,)
    threads: int = 0
    progress: bool = True
    model_overrides: dict[str, Any] = field(default_factory=dict)  # e.g. {"cca.positions": False} for ablations
    label_query: str = "pair"  # BM25 query of the training labels: pair (c_q, c_t), as the paper | chunk (c_q alone)
    min_near: float = 2.0
    max_xl_far: float = 0.2
    passage: int = PASSAGE  # words per passage (the shortest, with passage_max)
    passage_max: int = 0  # > passage: lengths vary in passage..passage_max, repeats at any offset to the chunk grid
    words: str = "ids"  # ids: one token per word (w<id>) | text: pseudo-words split by a BPE trained on the corpus
    vocab: int = 0  # words of the corpus (0: the corpus default, 256, or 1,024 with words=text)
    tokenizer: str = ""  # words=text: the tokenizer trained on the corpus (default bpe:2048)
    tokens_per_word: float = 1.0  # words=text: measured on the corpus by `text_tokenizer` (ids: exactly 1)
    # checks not expected at this size, each with the reason (`python -m lab demo`): the table marks them when they are not met
    not_expected: dict[str, str] = field(default_factory=dict)
    chance_only: bool = False  # build the corpora, print source@1's chance levels, train nothing

    @property
    def longest(self) -> int:
        """The longest passage, which sets the passages per document (every document fits one training span)."""
        return max(self.passage, self.passage_max)


def far_distance(s: CopyTestSettings) -> tuple[int, int]:
    """Far repeat distance in passages: the nearest beyond xl's reach, (n_layers + 1) * segment_len tokens (a token
    copies the one d * 128 - 1 back), up to twice that and inside the span. A ValueError when the span is too short."""
    from rpt.config import RPTConfig

    cfg = RPTConfig.from_preset(s.preset, variant="xl", segment_len=s.segment_len,
                                **{k: v for k, v in s.model_overrides.items() if k == "n_layers"})
    reach = (cfg.model.n_layers + 1) * s.segment_len
    M = cfg.model.chunk_size
    typical = s.passage * s.tokens_per_word
    if typical < M + M // 2:  # a repeat-tail chunk needs a copied run of its own tokens and half the chunk before
        raise ValueError(f"--passage {s.passage}: passages of about {typical:.0f} tokens are shorter than a chunk and a "
                         f"half ({M + M // 2} tokens), so no chunk could be a repeat-tail chunk: use longer passages")
    shortest, longest = passage_tokens(s)
    lo = (reach + 1) // shortest + 1  # in passages of the shortest length: every repeat lies beyond the reach
    passages = s.seq_len // longest
    if lo >= passages:
        raise ValueError(f"a {s.seq_len}-token span holds {passages} passages, but far repeats must lie at least {lo} "
                         f"passages back (xl's reach is (n_layers + 1) x segment_len = {reach} tokens): use a longer "
                         f"--seq-len or a shorter --segment-len")
    return lo, min(passages - 1, 2 * lo)


def passage_tokens(s: CopyTestSettings) -> tuple[int, int]:
    """The shortest and the longest passage in tokens: words with words=ids; with words=text the measured tokens per
    word, less 20% for the shortest (a far repeat stays beyond xl's reach) and plus 10% for the longest (a document
    stays inside one training span)."""
    if s.words == "ids":
        return s.passage, s.longest
    return max(1, int(s.passage * s.tokens_per_word * 0.8)), math.ceil(s.longest * s.tokens_per_word * 1.1)


def text_tokenizer(s: CopyTestSettings) -> tuple[Path, float]:
    """words=text: the tokenizer both stores share, trained on 200 documents of the corpus's words (saved under
    OUT/stores, cached by its training text), and the tokens per word it gives them."""
    from rpt.data.synthetic import CopyCorpus, parse_spec
    from rpt.data.tokenizer import load_tokenizer

    spec = f"synthetic:copy-far?docs=200&eval_docs=1&passages=16&words=text&vocab={s.vocab or TEXT_VOCAB}"
    spec += f"&passage={s.passage}" + (f"-{s.passage_max}" if s.passage_max > s.passage else "")
    texts = [d.text for d in CopyCorpus(parse_spec(spec)).documents("train")]
    tok = load_tokenizer(s.tokenizer or TEXT_TOKENIZER, texts)
    per_word = sum(len(tok.encode(t)) for t in texts) / sum(len(t.split()) for t in texts)
    path = s.out / "stores" / f"tokenizer-{_slug(tok.name)}.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tok.save(path)
    return path, per_word


def _slug(spec: str) -> str:
    """A tokenizer spec or name as part of a file name: bpe:2048 -> bpe2048, a path's folders joined by '-'."""
    return re.sub(r"[^\w.=-]+", "-", spec.replace(":", "")).strip("-")


def _steps(setting: str, s: CopyTestSettings) -> int:
    """Updates of a run in `setting` (near | far): the near control may train longer (it is also rpt-sem's scorer)."""
    return (s.near_steps or s.steps) if setting == "near" else s.steps


def _docs(setting: str, s: CopyTestSettings) -> int:
    """Training documents of a corpus (copy-near | copy-far): enough that no run sees one twice."""
    return s.docs or _steps(setting.removeprefix("copy-"), s) * s.batch_size


def _spec(setting: str, s: CopyTestSettings) -> str:
    extra = ""
    if setting == "copy-far":
        lo, hi = far_distance(s)
        extra = f"&p={s.far_p:g}" + (f"&distance={lo}-{hi}" if (lo, hi) != (6, 12) else "")
    elif s.near_p != CopyTestSettings.near_p:
        extra = f"&p={s.near_p:g}"
    if s.passage_max > s.passage:
        extra += f"&passage={s.passage}-{s.passage_max}"
    elif s.passage != PASSAGE:
        extra += f"&passage={s.passage}"
    if s.words == "text":
        extra += f"&words=text&vocab={s.vocab or TEXT_VOCAB}"
    elif s.vocab:
        extra += f"&vocab={s.vocab}"
    passages = s.seq_len // passage_tokens(s)[1]
    return f"synthetic:{setting}?docs={_docs(setting, s)}&eval_docs={s.eval_docs}&passages={passages}{extra}"


def _prepare(setting: str, s: CopyTestSettings, log: list[str], tokenizer: str = "corpus") -> Path:
    from rpt.data.prepare import prepare

    spec = _spec(setting, s)
    tags = _size_tag(s) + (_far_tag(s) if setting == "copy-far" else _near_tag(s)) + f"-{_docs(setting, s)}docs"
    root = s.out / "stores" / (setting + tags)  # one store per corpus: its size, tags and document count
    log.append(f"rpt prepare --corpus '{spec}'" + ("" if tokenizer == "corpus" else f" --tokenizer {tokenizer}")
               + f" --out {root}")
    prepare(spec, tokenizer, root, splits=["train", "test"], progress=s.progress)
    return root


def _label(root: Path, s: CopyTestSettings, log: list[str]) -> Path:
    from rpt.labels.pipeline import LabelSpec, label_split
    from rpt.training.data import open_store

    out = root / "labels" / (f"train-lex-{s.seq_len}-{s.segment_len}" + ("" if s.label_query == "pair" else f"-{s.label_query}"))
    if not (out / "manifest.json").exists():
        log.append(f"rpt label --store {root} --split train --kind lex --span {s.seq_len} --segment-len {s.segment_len} "
                   f"--query {s.label_query} --out {out}")
        label_split(open_store(root, "train"), out, LabelSpec(kind="lex", span=s.seq_len, segment_len=s.segment_len,
                                                              query=s.label_query), progress=s.progress)
    return out


def _label_sem(root: Path, scorer_run: Path | str, s: CopyTestSettings, log: list[str]) -> tuple[Path | None, Path]:
    """rpt-sem's training labels (if it runs) and the test documents' labels for the oracle, scored by `scorer_run`
    (a near control's run folder, or a name `rpt label --scorer` takes)."""
    from rpt.labels.pipeline import LabelSpec, label_split
    from rpt.labels.scorer import load_scorer, rpt_checkpoint_scorer
    from rpt.training.data import open_store

    if isinstance(scorer_run, Path):
        scorer, scorer_name = rpt_checkpoint_scorer(scorer_run), scorer_run.name
    else:
        scorer = load_scorer(scorer_run, store_tokenizer=open_store(root, "train").tokenizer_id)
        scorer_name = _scorer_name(scorer_run)
    outs = []
    for split, span, n_docs in (("train", s.seq_len, None), ("test", None, s.eval_docs)):
        if split == "train" and "rpt-sem" not in s.variants:
            outs.append(None)
            continue
        name = f"{split}-sem-{span or 'doc'}-{s.segment_len}-k{s.scorer_k}-by-{scorer_name}"  # one folder per scorer
        out = root / "labels" / name
        if not (out / "manifest.json").exists():
            log.append(f"rpt label --store {root} --split {split} --kind sem --span {span or 'doc'} --segment-len "
                       f"{s.segment_len} --k {s.scorer_k} --scorer {scorer_run}" +
                       (f" --max-documents {n_docs}" if n_docs else "") + f" --out {out}")
            label_split(open_store(root, split), out, LabelSpec(kind="sem", span=span, segment_len=s.segment_len,
                                                                k=s.scorer_k), scorer=scorer, max_documents=n_docs,
                        progress=s.progress)
        outs.append(out)
    return outs[0], outs[1]


def near_segment(s: CopyTestSettings) -> int:
    """The near control's segment: at least a passage, so a repeat one passage back lies inside one layer's window
    (with shorter segments the token at a segment's start sees fewer than 128 tokens back)."""
    need = max(s.segment_len, passage_tokens(s)[1])
    return next(n for n in range(64, s.seq_len + 1, 64) if n >= need and s.seq_len % n == 0)  # whole chunks, dividing the span


def _train(setting: str, variant: str, root: Path, labels: Path | None, seed: int, s: CopyTestSettings,
           run: Path) -> Path:
    from rpt.config import RPTConfig
    from rpt.training.data import open_store
    from rpt.training.loop import train

    vocab = int(open_store(root, "train").tokenizer_id["vocab_size"])
    overrides = s.model_overrides if variant != "xl" else {}  # ablations concern CCA; xl runs are shared
    segment_len = near_segment(s) if setting == "near" else s.segment_len
    cfg = RPTConfig.from_preset(s.preset, variant=variant, vocab_size=vocab, segment_len=segment_len, **overrides)
    cfg.data.seq_len, cfg.data.store = s.seq_len, str(root)
    t = cfg.train
    t.steps, t.lr, t.warmup_steps, t.batch_size, t.seed, t.out_dir = (_steps(setting, s), _lr(setting, s), s.warmup, s.batch_size,
                                                                      seed, str(run))
    t.min_lr_ratio = s.min_lr_ratio
    t.checkpoint_every, t.log_every = t.steps, 25
    t.alpha_ramp_steps = max(1, t.steps // 5)
    train(cfg, root, labels, resume=True, progress=s.progress)
    return run


def evaluate_copy(run: Path, root: Path, sources: list[str], n_docs: int,
                  oracle_labels: Path | None = None) -> dict[str, dict[str, float]]:
    """Per source: mean NLL per chunk class and over all tokens ("all") of the first `n_docs` test documents, and hit@1
    on repeat-tail chunks. Source "oracle" reads the scorer's best candidates from `oracle_labels` (sem, span doc);
    "random" reads K random retrievable chunks of the same document (the control: a gain that random chunks give too
    is not reading the source)."""
    from rpt.checkpoint import load_model
    from rpt.data.synthetic import CLASSES, CopySpec, copy_classes, run_classes
    from rpt.eval.perplexity import bm25_neighbors, evaluate_document, oracle_neighbors, random_neighbors
    from rpt.labels.store import LabelStore
    from rpt.training.data import open_store

    model, cfg = load_model(run)
    M, S, K = cfg.model.chunk_size, cfg.model.segment_len, cfg.model.n_neighbors
    store = open_store(root, "test")
    spec = CopySpec(**store.manifest["corpus"]["synthetic"]) if "corpus" in store.manifest else CopySpec()
    aligned = spec.aligned(M)  # aligned: passage classes, and a hit is the source's next chunk itself
    out: dict[str, dict[str, float]] = {}
    for src in sources:
        nll, cnt, hits, tails = np.zeros(len(CLASSES)), np.zeros(len(CLASSES)), 0, 0
        total = np.zeros(2)  # NLL and tokens over every predicted token
        labels = LabelStore.open(oracle_labels) if src == "oracle" else None
        for d in range(min(n_docs, len(store))):
            toks = np.asarray(store.document(d), dtype=np.int64)
            C = len(toks) // M
            nb = None
            if src == "bm25":
                nb = bm25_neighbors(toks, M, S, K)
            elif src == "random":
                nb = random_neighbors(C, M, S, K, doc=d)
            elif labels is not None:
                rows = labels.rows(d)
                nb = oracle_neighbors(rows.candidates, rows.target, K)
            elif src == "none" and cfg.model.uses_retrieval:
                nb = np.full((C, K), -1, np.int64)
            ev = evaluate_document(model, toks, neighbor_ids=nb, n_neighbors=K)
            cls = copy_classes(toks, spec.passage, M) if aligned else run_classes(toks, M)
            total += (ev.nll_sum, ev.n_targets)
            for c in range(len(CLASSES)):
                m = cls == c
                nll[c] += ev.chunk_nll[:C][m].sum()
                cnt[c] += ev.chunk_tokens[:C][m].sum()
            if ev.neighbors is not None and src != "none":
                for t in np.nonzero(cls == 2)[0]:
                    tails += 1
                    hits += int(_is_source(toks, M, int(ev.neighbors[t - 1, 0]), int(t), aligned))
        row = {name: float(nll[c] / cnt[c]) if cnt[c] else float("nan") for c, name in enumerate(CLASSES)}
        row["all"] = float(total[0] / total[1])
        row["advantage"] = row["fresh"] - row["repeat-tail"]
        if tails:
            row["hit@1"] = hits / tails
        out[src] = row
    return out


def source_chance(root: Path, s: CopyTestSettings) -> dict[str, float]:
    """What a retriever that knows nothing scores on source@1 over the repeat-tail chunks of the test documents
    evaluated (the same chunks and hit rule as `evaluate_copy`): "random", the exact expected share for one chunk
    drawn uniformly from the query's retrievable chunks; "recency", the share where the most recent retrievable chunk
    holds the chunk to predict."""
    from rpt.chunks import pool_size
    from rpt.config import RPTConfig
    from rpt.data.synthetic import CopySpec, copy_classes, run_classes
    from rpt.training.data import open_store

    M, S = RPTConfig.from_preset(s.preset).model.chunk_size, s.segment_len
    store = open_store(root, "test")
    spec = CopySpec(**store.manifest["corpus"]["synthetic"]) if "corpus" in store.manifest else CopySpec()
    aligned = spec.aligned(M)
    random, recency, tails = 0.0, 0, 0
    for d in range(min(s.eval_docs, len(store))):
        toks = np.asarray(store.document(d), dtype=np.int64)
        cls = copy_classes(toks, spec.passage, M) if aligned else run_classes(toks, M)
        for t in np.nonzero(cls == 2)[0]:
            n = int(pool_size(int(t) - 1, M, S))  # the query is chunk t - 1; its pool: chunks 0 .. n - 1
            if n == 0:
                continue
            hit = [_is_source(toks, M, j, int(t), aligned) for j in range(n)]
            tails += 1
            random += sum(hit) / n
            recency += int(hit[-1])
    return {"random": random / tails, "recency": recency / tails, "repeat_tail_chunks": tails} if tails else {}


def _is_source(toks: np.ndarray, M: int, j: int, t: int, aligned: bool) -> bool:
    """Whether neighbour j (chunk j with its continuation j + 1) gives chunk t to copy: on an aligned corpus its
    continuation is chunk t itself, off the grid it holds chunk t at whatever offset."""
    C = len(toks) // M
    if not 0 <= j < C - 1:
        return False
    chunk = toks[t * M : (t + 1) * M]
    if aligned:
        return bool(np.array_equal(toks[(j + 1) * M : (j + 2) * M], chunk))
    return _holds(toks[j * M : (j + 2) * M], chunk)


def _holds(window: np.ndarray, chunk: np.ndarray) -> bool:
    """True when `chunk` occurs contiguously in `window`."""
    n = len(chunk)
    return any(np.array_equal(window[o : o + n], chunk) for o in range(len(window) - n + 1))


def run_copytest(s: CopyTestSettings) -> dict[str, Any]:
    import torch

    if s.threads:
        torch.set_num_threads(s.threads)
    t0 = time.perf_counter()
    log: list[str] = []
    tokenizer = "corpus"
    if s.words == "text":  # one tokenizer for both corpora (rpt-sem's scorer is trained on the near one)
        path, s.tokens_per_word = text_tokenizer(s)
        tokenizer = str(path)
        far_distance(s)  # the span must still hold the far distance in tokens
    near, far = _prepare("copy-near", s, log, tokenizer), _prepare("copy-far", s, log, tokenizer)
    chance = source_chance(far, s)
    if chance:
        print(chance_line(chance), flush=True)
    if s.chance_only:
        return {"source_chance": chance, "commands": log}
    labels = {v: _label(far, s, log) for v in s.variants if v in ("retro", "rpt-lex")}
    oracle: Path | None = None
    if s.scorer != "near" and s.variants:  # a named scorer labels before any training
        labels["rpt-sem"], oracle = _label_sem(far, s.scorer, s, log)
    runs: list[dict[str, Any]] = []
    for seed in s.seeds:
        plan = [("near", "xl", near)] if s.near_every_seed or seed == s.seeds[0] else []
        plan += [("far", "xl", far)] + [("far", v, far) for v in s.variants]
        for setting, variant, root in plan:
            tag = (_far_tag(s) if setting == "far" else _near_tag(s)) + (_tag(s) if variant != "xl" else "")
            steps = _steps(setting, s)
            tag += ("" if steps == CopyTestSettings.steps else f"-{steps}steps") + _lr_tag(s, setting)  # resumes its own
            if variant == "rpt-sem":  # its labels come from its scorer: another scorer, another run
                tag += _scorer_tag(s)
            run = s.out / "runs" / f"{setting}-{variant}-seed{seed}{_size_tag(s)}{tag}"
            t = time.perf_counter()
            _train(setting, variant, root, labels.get(variant), seed, s, run)
            seconds = time.perf_counter() - t
            if setting == "near" and seed == s.seeds[0] and s.variants and s.scorer == "near":
                # the first near control is the scoring LM: rpt-sem's training labels and the test oracle
                labels["rpt-sem"], oracle = _label_sem(far, run, s, log)
            sources = ["none"]
            if variant != "xl":
                sources = [OWN_SOURCE[variant], "none", "random", "oracle"] + (["bm25"] if variant != "retro" else [])
            res = evaluate_copy(run, root, sources, s.eval_docs, oracle)
            runs.append({"setting": setting, "variant": variant, "seed": seed, "train_seconds": seconds, "eval": res,
                         "run": str(run), "store": str(root)})
            print(format_row(runs[-1]), flush=True)
    summary = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(s).items()}, "runs": runs,
               "commands": log, "seconds": time.perf_counter() - t0, "far_distance": list(far_distance(s)),
               "source_chance": chance}
    summary["verdict"] = verdict(runs, s)
    summary["path"] = str(summary_path(s))
    write_json_atomic(Path(summary["path"]), summary)
    print("\n" + format_table(summary))
    return summary


def summary_path(s: CopyTestSettings) -> Path:
    """Where a copy test with these settings writes its summary (one file per size, corpus and ablation)."""
    named = "" if s.scorer == "near" else f"-scorer={_scorer_name(s.scorer)}"
    near = "" if s.near_p == CopyTestSettings.near_p else f"-nearp{s.near_p:g}"
    steps = ("" if s.steps == CopyTestSettings.steps else f"-{s.steps}steps") + (
        "" if _steps("near", s) == s.steps else f"-near{_steps('near', s)}steps")
    return s.out / f"copytest{_size_tag(s)}{_far_tag(s)}{near}{_tag(s)}{steps}{_lr_tag(s)}{named}.json"


def _scorer_tag(s: CopyTestSettings) -> str:
    """Run suffix of rpt-sem: its scorer when named, else how the near control (the scorer) trains, if not by default
    (updates, rate, corpus)."""
    if s.scorer != "near":
        return f"-scorer={_scorer_name(s.scorer)}"
    steps, lr = _steps("near", s), _lr("near", s)
    return (("" if steps == s.steps else f"-scorer{steps}steps") + ("" if lr == s.lr else f"-scorerlr{lr:g}") +
            ("" if s.near_p == CopyTestSettings.near_p else f"-scorerp{s.near_p:g}"))


def _scorer_name(scorer: str) -> str:
    """A named scorer in file names: the last part of a path, else the name."""
    return Path(scorer).name or scorer


def _lr(setting: str, s: CopyTestSettings) -> float:
    """The peak learning rate of a run in `setting` (near | far): the near control's may differ."""
    return s.near_lr if setting == "near" and s.near_lr else s.lr


def _lr_tag(s: CopyTestSettings, setting: str | None = None) -> str:
    """Run suffix of a learning rate and decay other than the defaults (a run's own, given its setting; for the summary
    both the far and the near control's): runs that differ in them never resume each other."""
    default = CopyTestSettings.lr
    if setting is not None:
        tag = "" if _lr(setting, s) == default else f"-lr{_lr(setting, s):g}"
    else:
        tag = ("" if s.lr == default else f"-lr{s.lr:g}") + (f"-nearlr{s.near_lr:g}" if _lr("near", s) != s.lr else "")
    return tag + ("" if s.min_lr_ratio == CopyTestSettings.min_lr_ratio else f"-minlr{s.min_lr_ratio:g}")


def _size_tag(s: CopyTestSettings) -> str:
    """Run suffix of a span / segment other than the default (one --out can hold several sizes, never mixed)."""
    d = CopyTestSettings()
    size = "" if (s.seq_len, s.segment_len) == (d.seq_len, d.segment_len) else f"-{s.seq_len}x{s.segment_len}"
    if (s.passage, s.passage_max) != (d.passage, d.passage_max):
        size += f"-passage{s.passage}" + (f"-{s.passage_max}" if s.passage_max > s.passage else "")
    if s.words == "text":
        size += f"-text-{_slug(s.tokenizer or TEXT_TOKENIZER)}"
    if s.vocab:
        size += f"-vocab{s.vocab}"
    return size


def _far_tag(s: CopyTestSettings) -> str:
    """Store and run suffix of a far corpus other than the default (one --out can hold both, never mixed)."""
    return "" if s.far_p == CopyTestSettings.far_p else f"-p{s.far_p:g}"


def _near_tag(s: CopyTestSettings) -> str:
    """Store and run suffix of a near corpus other than the default."""
    return "" if s.near_p == CopyTestSettings.near_p else f"-p{s.near_p:g}"


def _tag(s: CopyTestSettings) -> str:
    """Run-name suffix for model overrides and label query (ablations share the xl runs of the same --out)."""
    q = "" if s.label_query == "pair" else f"-query={s.label_query}"
    return "".join(f"-{k}={v}" for k, v in sorted(s.model_overrides.items())) + q


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    return (statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0)


def verdict(runs: list[dict[str, Any]], s: CopyTestSettings) -> dict[str, Any]:
    """Means over seeds and the pass/fail of each requirement (module docstring)."""
    own = OWN_SOURCE

    def adv(setting: str, variant: str, src: str) -> list[float]:
        return [r["eval"][src]["advantage"] for r in runs if r["setting"] == setting and r["variant"] == variant]

    near = _mean_sd(adv("near", "xl", "none"))
    # the far checks' yardstick: xl's near advantage, never below the near check's own floor, so that a near control
    # that learned nothing cannot make them pass by asking for half of nothing
    scale = max(near[0], s.min_near)
    out: dict[str, Any] = {"xl near advantage": near, "xl far advantage": _mean_sd(adv("far", "xl", "none"))}
    checks = {"xl copies near repeats": near[0] >= s.min_near,
              "xl gains nothing on far repeats": out["xl far advantage"][0] < s.max_xl_far}
    for v in s.variants:
        a = _mean_sd(adv("far", v, own[v]))
        gain = _mean_sd([r["eval"]["none"]["repeat-tail"] - r["eval"][own[v]]["repeat-tail"]
                         for r in runs if r["setting"] == "far" and r["variant"] == v])
        out[f"{v} far advantage"], out[f"{v} far retrieval gain"] = a, gain
        far_runs = [r["eval"] for r in runs if r["setting"] == "far" and r["variant"] == v]
        # whole-document perplexity ratios, as the demo reports them: ppl(none) / ppl(own), ppl(none) / ppl(oracle)
        out[f"{v} far ppl gain"] = _mean_sd([float(np.exp(e["none"]["all"] - e[own[v]]["all"])) for e in far_runs])
        if all("oracle" in e for e in far_runs):
            out[f"{v} far ppl gain, oracle"] = _mean_sd([float(np.exp(e["none"]["all"] - e["oracle"]["all"]))
                                                         for e in far_runs])
        checks[f"{v} reaches half of xl's near advantage on far repeats"] = a[0] >= 0.5 * scale
        checks[f"{v} far gain comes from its neighbours"] = gain[0] >= 0.5 * scale
        if all("random" in e for e in far_runs):  # the control: K random retrievable chunks of the same document
            out[f"{v} far ppl gain, random chunks"] = _mean_sd([float(np.exp(e["none"]["all"] - e["random"]["all"]))
                                                                for e in far_runs])
            over = _mean_sd([e["random"]["repeat-tail"] - e[own[v]]["repeat-tail"] for e in far_runs])
            out[f"{v} far gain over random chunks"] = over
            checks[f"{v}'s own neighbours beat random chunks of the document"] = over[0] >= 0.5 * scale
        if own[v] == "model":  # a trained retriever must find the source itself, not only read what it is handed
            hit = _mean_sd([e["model"].get("hit@1", 0.0) for e in far_runs])
            out[f"{v} source@1 (repeat-tail)"] = hit
            checks[f"{v}'s retriever ranks the source first for most far repeats"] = hit[0] > 0.5
    out["checks"] = checks
    out["passed"] = all(checks.values())
    out["not_expected"] = {k: why for k, why in s.not_expected.items() if k in checks and not checks[k]}
    out["passed_at_this_size"] = all(ok for k, ok in checks.items() if k not in out["not_expected"])
    return out


def format_row(r: dict[str, Any]) -> str:
    parts = []
    for src, e in r["eval"].items():
        hit = f" hit@1 {100 * e['hit@1']:.0f}%" if "hit@1" in e else ""
        parts.append(f"{src}: fresh {e['fresh']:.3f} head {e['repeat-head']:.3f} tail {e['repeat-tail']:.3f} "
                     f"adv {e['advantage']:+.3f}{hit}")
    return f"{r['setting']:<5} {r['variant']:<8} seed {r['seed']}  " + " | ".join(parts) + f"  ({r['train_seconds']:.0f} s)"


def format_table(summary: dict[str, Any]) -> str:
    v = summary["verdict"]
    n = len({r["seed"] for r in summary["runs"]})
    lines = [f"copy advantage = loss(fresh) - loss(repeat-tail), nats; mean ± sd over {n} seed(s)"]
    for k, val in v.items():
        if isinstance(val, (list, tuple)) and "ppl gain" in k:
            lines.append(f"  {k:<36} {val[0]:6.2f}x ± {val[1]:.2f}")
        elif isinstance(val, (list, tuple)):
            lines.append(f"  {k:<36} {val[0]:+.3f} ± {val[1]:.3f}")
    if any("source@1" in k for k in v) and summary.get("source_chance"):
        lines.append("  " + chance_line(summary["source_chance"]))
    lines.append("checks:")
    lines += check_lines(v)
    lines.append(verdict_line(v))
    return "\n".join(lines)


def chance_line(chance: dict[str, float]) -> str:
    return (f"source@1 of a retriever that knows nothing (repeat-tail chunks of the far test documents): random "
            f"{100 * chance['random']:.1f}%, recency {100 * chance['recency']:.1f}%")


def check_lines(v: dict[str, Any]) -> list[str]:
    """One line per check of a verdict: [x] met, [ ] not met, [-] not met and not expected at this size (why)."""
    skipped = v.get("not_expected", {})
    return [f"  [-] {name} ({skipped[name]})" if name in skipped else f"  [{'x' if ok else ' '}] {name}"
            for name, ok in v["checks"].items()]


def verdict_line(v: dict[str, Any]) -> str:
    skipped = v.get("not_expected", {})
    if v["passed"] or not skipped:
        return "PASSED" if v["passed"] else "FAILED"
    expected = [ok for name, ok in v["checks"].items() if name not in skipped]
    if v["passed_at_this_size"]:
        return f"every check expected at this size is met ({len(expected)} of {len(v['checks'])})"
    return f"FAILED: {expected.count(False)} of the {len(expected)} checks expected at this size are not met"
