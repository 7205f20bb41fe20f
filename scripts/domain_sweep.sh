#!/usr/bin/env bash
# The paper's comparison on one corpus, from nothing to the table (docs/results.md §1j):
#   prepare the corpus, BM25 (lex) labels, an xl scorer (the seed-0 xl run), sem labels of train and test from it,
#   then `rpt sweep` over the variants and paired seeds; its table, with the paper's figures for the domain, is
#   $OUT/sweep/compare.md (.json).
# Usage: bash scripts/domain_sweep.sh CORPUS [PAPER]     e.g.  bash scripts/domain_sweep.sh kjv pg19
#   CORPUS: a `rpt prepare --corpus` name (stdlib, kjv, austen, pari, coq, metamath, ...)
#   PAPER:  the paper's dataset whose figures go beside the rows: code | pg19 | books3 | arxiv (default: none)
# Settings by environment (defaults: the CPU setting of docs/results.md §1j):
#   STEPS=400 SEEDS=0,1,2 VARIANTS=xl,retro,rpt-sem OUT=runs/<corpus> RPT=rpt (default: on PATH, else .venv/bin/rpt)
#   SEQ_LEN=2048 (training span = the train labels' span) SEGMENT=128 (the tiny preset's)
# Every step is skipped when its output exists, and `rpt sweep` resumes, so a killed run is continued by running the
# same command again.
set -euo pipefail
corpus=${1:?usage: bash scripts/domain_sweep.sh CORPUS [code|pg19|books3|arxiv]}
paper=${2:-}
STEPS=${STEPS:-400}
SEEDS=${SEEDS:-0,1,2}
VARIANTS=${VARIANTS:-xl,retro,rpt-sem}
OUT=${OUT:-runs/${corpus%%@*}}
if [ -z "${RPT:-}" ]; then  # the rpt on PATH, else the one scripts/setup.sh installed
  RPT=rpt; command -v rpt >/dev/null || RPT="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/rpt"
fi
SEQ_LEN=${SEQ_LEN:-2048}
SEGMENT=${SEGMENT:-128}
store=$OUT/store
train=(--preset tiny --store "$store" --seq-len "$SEQ_LEN" --lr 0.01 --steps "$STEPS" --batch-size 2
       --set model.segment_len="$SEGMENT" --set train.checkpoint_every=100 --set train.keep_last=0
       --set train.warmup_steps=50)
label=(--store "$store" --segment-len "$SEGMENT" --k 4)
paper_flag=()
[ -n "$paper" ] && paper_flag=(--paper "$paper")

[ -f "$store/tokenizer.json" ] || $RPT prepare --corpus "$corpus" --tokenizer bpe:2048 --out "$store"
[ -d "$store/labels/train-lex-$SEQ_LEN" ] || $RPT label "${label[@]}" --split train --kind lex --span "$SEQ_LEN"
# The scorer of the sem labels is the seed-0 xl of the sweep itself (trained here first, then reused by the sweep).
$RPT sweep --out "$OUT/sweep" --variants xl --seeds 0 "${paper_flag[@]}" -- "${train[@]}"
scorer=$OUT/sweep/xl-seed0
[ -d "$store/labels/train-sem-$SEQ_LEN" ] || $RPT label "${label[@]}" --split train --kind sem --span "$SEQ_LEN" --scorer "$scorer"
[ -d "$store/labels/test-sem-doc" ] || $RPT label "${label[@]}" --split test --kind sem --span doc --scorer "$scorer"
$RPT sweep --out "$OUT/sweep" --variants "$VARIANTS" --seeds "$SEEDS" "${paper_flag[@]}" -- "${train[@]}"
