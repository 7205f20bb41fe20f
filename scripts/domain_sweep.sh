#!/usr/bin/env bash
# The paper's comparison on one corpus, from nothing to the table (docs/results/domains.md):
#   prepare the corpus, BM25 (lex) labels, a scorer (by default the seed-0 xl run of the sweep itself), sem labels of
#   train and test from it, then `rpt sweep` over the variants and paired seeds; its table, with the paper's figures
#   for the domain, is $OUT/sweep/compare.md (.json).
# Usage: bash scripts/domain_sweep.sh CORPUS [PAPER]     e.g.  bash scripts/domain_sweep.sh kjv pg19
#   CORPUS: a `rpt prepare --corpus` name (stdlib, kjv, austen, pari, coq, metamath, ...)
#   PAPER:  the paper's dataset whose figures go beside the rows: code | pg19 | books3 | arxiv (default: none)
# Settings by environment (defaults: the CPU setting of docs/results/domains.md):
#   STEPS=400 SEEDS=0,1,2 VARIANTS=xl,retro,rpt-sem OUT=runs/<corpus> RPT=rpt (default: on PATH, else .venv/bin/rpt)
#   PRESET=tiny LR=0.01 BATCH=2 SEQ_LEN=2048 (training span = the train labels' span) SEGMENT=128 (the tiny preset's)
#   TOKENIZER=bpe:2048 MAX_DOCUMENTS= (prepare only the first N documents of each split; default all)
#   K=4 (BM25 candidates of the training labels; the paper's is 20)
#   ALPHA_RAMP= (updates over which the retrieval loss weight ramps to train.alpha_ret; default the preset's)
#   CHECKPOINT_EVERY=100 (updates between kept checkpoints)
#   CURVE= (steps, e.g. 100,200,300: each rpt-* run's checkpoints there are also evaluated with its own retriever
#   and --metrics against the test labels; with the final results they make OUT/sweep/curve.md (.json), one row per step)
#   SCORER=own (the sweep's seed-0 xl) | smollm2 | induction (a copying LM, cheap on a CPU) | any `rpt label --scorer` value
#   GOLD=bm25 (test labels: BM25's top K) | all (exhaustive gold: every retrievable chunk, the paper's metrics; the
#   sweep then evaluates with it) QUERY_FRACTION=1 (the share of test query chunks scored for exhaustive gold)
# The train split's sem labels are made only when VARIANTS holds rpt-sem; the test split's always (the oracle).
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
PRESET=${PRESET:-tiny}
LR=${LR:-0.01}
BATCH=${BATCH:-2}
SEQ_LEN=${SEQ_LEN:-2048}
SEGMENT=${SEGMENT:-128}
TOKENIZER=${TOKENIZER:-bpe:2048}
MAX_DOCUMENTS=${MAX_DOCUMENTS:-}
K=${K:-4}
SCORER=${SCORER:-own}
GOLD=${GOLD:-bm25}
QUERY_FRACTION=${QUERY_FRACTION:-1}
ALPHA_RAMP=${ALPHA_RAMP:-}
CHECKPOINT_EVERY=${CHECKPOINT_EVERY:-100}
CURVE=${CURVE:-}
case $GOLD in bm25|all) ;; *) echo "domain_sweep: GOLD must be bm25 or all, not '$GOLD'" >&2; exit 2 ;; esac
store=$OUT/store
train=(--preset "$PRESET" --store "$store" --seq-len "$SEQ_LEN" --lr "$LR" --steps "$STEPS" --batch-size "$BATCH"
       --set model.segment_len="$SEGMENT" --set train.checkpoint_every="$CHECKPOINT_EVERY" --set train.keep_last=0
       --set train.warmup_steps=50)
[ -n "$ALPHA_RAMP" ] && train+=(--set train.alpha_ramp_steps="$ALPHA_RAMP")
label=(--store "$store" --segment-len "$SEGMENT")
paper_flag=()
[ -n "$paper" ] && paper_flag=(--paper "$paper")
prepare_flags=()
[ -n "$MAX_DOCUMENTS" ] && prepare_flags=(--max-documents "$MAX_DOCUMENTS")

[ -f "$store/tokenizer.json" ] || $RPT prepare --corpus "$corpus" --tokenizer "$TOKENIZER" --out "$store" "${prepare_flags[@]}"
[ -d "$store/labels/train-lex-$SEQ_LEN" ] || $RPT label "${label[@]}" --k "$K" --split train --kind lex --span "$SEQ_LEN"
scorer=$SCORER
if [ "$SCORER" = own ]; then  # the scorer of the sem labels is the seed-0 xl of the sweep itself (trained here first)
  $RPT sweep --out "$OUT/sweep" --variants xl --seeds 0 "${paper_flag[@]}" -- "${train[@]}"
  scorer=$OUT/sweep/xl-seed0
fi
case ",$VARIANTS," in  # the train split's sem labels only for a variant that trains on them
  *,rpt-sem,*) [ -d "$store/labels/train-sem-$SEQ_LEN" ] ||
                 $RPT label "${label[@]}" --k "$K" --split train --kind sem --span "$SEQ_LEN" --scorer "$scorer" ;;
esac
if [ "$GOLD" = all ]; then
  test_labels=$store/labels/test-sem-doc-all
  [ -d "$test_labels" ] || $RPT label "${label[@]}" --split test --kind sem --span doc --candidates all \
    --query-fraction "$QUERY_FRACTION" --scorer "$scorer" --out "$test_labels"
else
  test_labels=$store/labels/test-sem-doc
  [ -d "$test_labels" ] || $RPT label "${label[@]}" --k "$K" --split test --kind sem --span doc --scorer "$scorer"
fi
$RPT sweep --out "$OUT/sweep" --variants "$VARIANTS" --seeds "$SEEDS" --test-labels "$test_labels" "${paper_flag[@]}" \
  -- "${train[@]}"
if [ -n "$CURVE" ]; then  # the retrievers at earlier checkpoints of the same runs: one more table, a row per step
  for v in ${VARIANTS//,/ }; do
    case $v in rpt-*) ;; *) continue ;; esac
    for seed in ${SEEDS//,/ }; do
      for step in ${CURVE//,/ }; do
        result=$OUT/sweep/curve/$v-seed$seed-$step-model.json
        [ -f "$result" ] || $RPT eval --checkpoint "$OUT/sweep/$v-seed$seed/checkpoints/$(printf 'step_%08d' "$step")" \
          --store "$store" --split test --source model --metrics --labels "$test_labels" --out "$result" --no-progress
      done
    done
  done
  $RPT compare "$OUT/sweep/curve" "$OUT/sweep/eval" "${paper_flag[@]}" --out "$OUT/sweep/curve.json" \
    --markdown "$OUT/sweep/curve.md"
fi
