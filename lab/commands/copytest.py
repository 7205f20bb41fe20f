"""`python -m lab copytest`: does retrieval work? xl copies near repeats; retro, rpt-lex and rpt-sem must copy far ones
(lab/copytest.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "the copy test: xl on near repeats (control); xl and retrieving variants on repeats beyond xl's reach, per seed"
ORDER = 85


def add_arguments(p: argparse.ArgumentParser) -> None:
    from lab.copytest import CopyTestSettings
    from rpt.commands.options import add_set

    d = CopyTestSettings()
    p.add_argument("--out", type=Path, default=d.out, help=f"folder for stores, runs and copytest.json (default {d.out})")
    p.add_argument("--steps", type=int, default=d.steps, help=f"updates per run (default {d.steps})")
    p.add_argument("--lr", type=float, default=d.lr, help=f"peak learning rate (default {d.lr})")
    p.add_argument("--min-lr-ratio", type=float, default=d.min_lr_ratio,
                   help=f"cosine decay to this fraction of --lr; 1 keeps it constant after warm-up (default {d.min_lr_ratio})")
    p.add_argument("--near-steps", type=int, default=d.near_steps,
                   help="updates of the near control, which is also rpt-sem's scoring LM (default: --steps)")
    p.add_argument("--near-lr", type=float, default=d.near_lr,
                   help="peak learning rate of the near control, which is also rpt-sem's scoring LM (default: --lr)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help=f"sequences per update (default {d.batch_size})")
    p.add_argument("--seq-len", type=int, default=d.seq_len,
                   help=f"tokens per document and training span, a multiple of 128 (default {d.seq_len})")
    p.add_argument("--segment-len", type=int, default=d.segment_len,
                   help=f"model.segment_len; far repeats lie beyond (n_layers + 1) x segment_len tokens (default "
                   f"{d.segment_len})")
    p.add_argument("--scorer-k", type=int, default=d.scorer_k,
                   help=f"BM25 candidates scored per query chunk for rpt-sem's labels and the oracle (default {d.scorer_k})")
    p.add_argument("--seeds", default=",".join(map(str, d.seeds)), help="comma-separated seeds, e.g. 0,1,2 (default 0)")
    p.add_argument("--variants", default=",".join(d.variants),
                   help="retrieving variants trained on the far corpus, comma-separated, from retro, rpt-lex, rpt-sem "
                   "(default retro,rpt-lex; xl always runs)")
    p.add_argument("--far-p", type=float, default=d.far_p,
                   help=f"probability that a far passage (one far enough from the start) repeats an earlier one "
                   f"(default {d.far_p:g})")
    p.add_argument("--near-p", type=float, default=d.near_p,
                   help=f"repeat probability of the near control's corpus (default {d.near_p:g})")
    p.add_argument("--scorer", default=d.scorer,
                   help="rpt-sem's scoring LM (its labels and the oracle): near (the first seed's near control, default), "
                   "induction (a copying LM with no parameters), or any scorer `rpt label --scorer` takes")
    p.add_argument("--passage", default=str(d.passage),
                   help=f"words per passage, N or LO-HI: lengths that vary put repeats at every offset to the 64-token "
                   f"chunk grid (the unaligned copy test, e.g. 150-250; default {d.passage}: two chunks, on the grid)")
    p.add_argument("--words", choices=("ids", "text"), default=d.words,
                   help="ids: one token per word (default) | text: pseudo-words split by a BPE trained on the corpus "
                   "(--tokenizer), so passages have varying token lengths and chunk boundaries fall inside words")
    p.add_argument("--vocab", type=int, default=d.vocab,
                   help="words of the corpus (default: 256, or 1024 with --words text)")
    p.add_argument("--tokenizer", default=d.tokenizer,
                   help="--words text: the tokenizer trained on the corpus (default bpe:2048, about two tokens a word)")
    p.add_argument("--near-first-seed-only", action="store_true",
                   help="run the near control (and rpt-sem's scorer) for the first seed only")
    p.add_argument("--eval-docs", type=int, default=d.eval_docs, help=f"test documents evaluated (default {d.eval_docs})")
    add_set(p, ("model",), "model.cca.positions=false")
    p.add_argument("--label-query", choices=("pair", "chunk"), default=d.label_query,
                   help="BM25 query of the training labels of retro / rpt-lex: pair (c_q, c_t), the paper's (default) | "
                   "chunk (c_q alone, as at inference)")
    p.add_argument("--threads", type=int, default=d.threads, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--chance-only", action="store_true",
                   help="build the corpora, print what a retriever that knows nothing scores on source@1 (random and "
                        "recency), and train nothing")


def run(args: argparse.Namespace) -> int:

    from lab.copytest import CopyTestSettings, far_distance, run_copytest
    from rpt.commands.options import parse_sets
    from rpt.config import RETRIEVING, RPTConfig
    from rpt.utils import UserError, parse_seeds

    seeds = parse_seeds(args.seeds)
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    bad = [v for v in variants if v not in RETRIEVING]
    if bad:
        raise UserError(f"--variants {args.variants!r}: choose from retro, rpt-lex, rpt-sem (xl always runs)")
    for flag, p in (("--far-p", args.far_p), ("--near-p", args.near_p)):
        if not 0.0 <= p <= 1.0:
            raise UserError(f"{flag} {p:g}: a probability in [0, 1]")
    if args.seq_len <= 0 or args.seq_len % 128:
        raise UserError(f"--seq-len {args.seq_len}: a positive multiple of 128 (the passage length)")
    if args.segment_len <= 0 or args.segment_len % 64 or args.seq_len % args.segment_len:
        raise UserError(f"--segment-len {args.segment_len}: a positive multiple of 64 (the chunk size) that divides "
                        f"--seq-len {args.seq_len}")
    if not 0.0 < args.min_lr_ratio <= 1.0:
        raise UserError(f"--min-lr-ratio {args.min_lr_ratio:g}: a fraction in (0, 1]")
    if args.near_lr < 0 or not args.lr > 0:
        raise UserError(f"--lr {args.lr:g} / --near-lr {args.near_lr:g}: a learning rate above 0 (--near-lr 0: --lr)")
    if args.near_steps < 0:
        raise UserError(f"--near-steps {args.near_steps}: 0 (same as --steps) or more")
    if args.scorer_k < 1:
        raise UserError(f"--scorer-k {args.scorer_k}: at least 1")
    if args.scorer not in ("near", "induction", "smollm2"):
        from rpt.labels.scorer import check_scorer_name, is_rpt_checkpoint

        if not is_rpt_checkpoint(args.scorer):
            check_scorer_name(args.scorer)  # a missing path or an uncached hub name: one line, before any training
    lo, _, hi = args.passage.partition("-")
    try:
        passage, passage_max = int(lo), int(hi) if hi else 0
    except ValueError:
        raise UserError(f"--passage {args.passage!r}: a number of words, or LO-HI (e.g. 150-250)") from None
    if passage < 1 or (passage_max and passage_max < passage):
        raise UserError(f"--passage {args.passage!r}: at least 1 word, and LO <= HI")
    if args.vocab < 0 or args.vocab == 1:
        raise UserError(f"--vocab {args.vocab}: at least 2 words (0: the default)")
    if args.tokenizer and args.words != "text":
        raise UserError(f"--tokenizer {args.tokenizer}: only with --words text (the ids corpus has its own)")
    overrides = {key.removeprefix("model."): value for key, value in parse_sets(args.set, ("model",)).items()}
    s = CopyTestSettings(out=args.out, steps=args.steps, lr=args.lr, batch_size=args.batch_size, seeds=seeds,
                         seq_len=args.seq_len, segment_len=args.segment_len, scorer_k=args.scorer_k,
                         min_lr_ratio=args.min_lr_ratio, near_steps=args.near_steps, near_lr=args.near_lr,
                         near_every_seed=not args.near_first_seed_only,
                         variants=variants, eval_docs=args.eval_docs, far_p=args.far_p, near_p=args.near_p, threads=args.threads,
                         scorer=args.scorer,
                         progress=not args.no_progress,
                         model_overrides=overrides, label_query=args.label_query, passage=passage,
                         passage_max=passage_max, words=args.words, vocab=args.vocab, tokenizer=args.tokenizer,
                         chance_only=args.chance_only)
    try:
        if s.words == "text":
            from lab.copytest import text_tokenizer

            s.tokens_per_word = text_tokenizer(s)[1]
        far_distance(s)
        # a misspelt or mistyped --set field fails now, not when the first retrieving variant starts training
        RPTConfig.from_preset(s.preset, variant=variants[0] if variants else "rpt-sem", segment_len=s.segment_len,
                              **overrides)
    except ValueError as e:
        raise UserError(str(e)) from None
    from lab.folders import COPYTEST
    from rpt.outputs import claim_folder

    claim_folder(args.out, COPYTEST)  # before any work: never into a folder of the user's
    summary = run_copytest(s)
    from rpt.outputs import mark_folder

    mark_folder(args.out, COPYTEST)
    if s.chance_only:
        return 0
    print(f"wrote {summary['path']}")
    return 0 if summary["verdict"]["passed"] else 1
