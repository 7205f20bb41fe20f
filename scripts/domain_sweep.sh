#!/usr/bin/env bash
# The paper's comparison on one corpus, from nothing to the table (docs/results/retrieval.md, docs/results/domains.md):
#   prepare the corpus, BM25 (lex) labels of k = 20 candidates, sem labels of train from a scorer, an exhaustive test
#   gold (every retrievable chunk scored, for a share of the test query chunks), then `python -m lab sweep` over the variants
#   and paired seeds; its table, with the paper's figures for the domain, is $OUT/sweep/compare.md (.json).
# Usage: bash scripts/domain_sweep.sh CORPUS [PAPER]     e.g.  bash scripts/domain_sweep.sh metamath arxiv
#   CORPUS: a `rpt prepare --corpus` name (stdlib, kjv, austen, pari, coq, metamath, ...)
#   PAPER:  the paper's dataset whose figures go beside the rows: code | pg19 | books3 | arxiv (default: none)
# The defaults are the CPU setting of docs/results/retrieval.md#the-papers-comparison-with-these-metrics; no variable
# is needed for it. Settings by environment:
#   STEPS=400 SEEDS=0,1,2 VARIANTS=xl,retro,rpt-lex,rpt-sem OUT=runs/<corpus> RPT=rpt (default: on PATH, else .venv/bin/rpt)
#   PRESET=tiny LR=0.01 BATCH=2 SEQ_LEN=2048 (training span = the train labels' span) SEGMENT=128 (the tiny preset's)
#   TOKENIZER=bpe:2048 MAX_DOCUMENTS= (prepare only the first N documents of each split; default all)
#   K=20 (BM25 candidates of the training labels, the paper's)
#   SCORER=induction (a copying LM with no parameters: it copies by content, which the tiny student does not learn in
#   400 updates; a CPU labels with it in minutes, but its gold is lexical, so BM25 is close to ideal for it)
#   | smollm2 (SmolLM2-135M, an LM scorer; hours on a CPU: scripts/gpu_retrieval.sh runs it on a GPU)
#   | own (the sweep's seed-0 xl: a scorer the size of the student, whose labels add nothing BM25 lacks)
#   | any `rpt label --scorer` value
#   GOLD=all (exhaustive test gold, the paper's metrics) | bm25 (BM25's top K only: BM25 then scores at the labels'
#   positive share by construction) QUERY_FRACTION=0.25 (the share of test query chunks the exhaustive gold scores:
#   the oracle is then reported over their tokens only)
#   ALPHA_RAMP= (updates over which the retrieval loss weight ramps to train.alpha_ret; default the preset's)
#   CHECKPOINT_EVERY=100 (updates between kept checkpoints)
#   JOBS=1 (runs trained at once: `python -m lab sweep --jobs`; e.g. JOBS=3 for three seeds side by side on a GPU)
#   CURVE= (steps, e.g. 100,200,300: each rpt-* run's checkpoints there are also evaluated with its own retriever
#   and --metrics against the test labels; with the final results they make OUT/sweep/curve.md (.json), one row per step)
# The train split's sem labels are made only when VARIANTS holds rpt-sem; the test split's always (the oracle).
# Every step is skipped when its output exists, and `python -m lab sweep` resumes, so a killed run is continued by running the
# same command again.
set -euo pipefail
corpus=${1:?usage: bash scripts/domain_sweep.sh CORPUS [code|pg19|books3|arxiv]}
paper=${2:-}
STEPS=${STEPS:-400}
SEEDS=${SEEDS:-0,1,2}
VARIANTS=${VARIANTS:-xl,retro,rpt-lex,rpt-sem}
OUT=${OUT:-runs/${corpus%%@*}}
if [ -z "${RPT:-}" ]; then  # the rpt on PATH, else the one scripts/setup.sh installed
  RPT=rpt; command -v rpt >/dev/null || RPT="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/rpt"
fi
if [ -z "${LAB:-}" ]; then  # the experiments (lab/, beside the library), with the python of that rpt
  case $RPT in */*) LAB="$(dirname "$RPT")/python -m lab" ;; *) LAB="python -m lab" ;; esac
fi
export PYTHONPATH="$(cd "$(dirname "$0")/.." && pwd)${PYTHONPATH:+:$PYTHONPATH}"
PRESET=${PRESET:-tiny}
LR=${LR:-0.01}
BATCH=${BATCH:-2}
SEQ_LEN=${SEQ_LEN:-2048}
SEGMENT=${SEGMENT:-128}
TOKENIZER=${TOKENIZER:-bpe:2048}
MAX_DOCUMENTS=${MAX_DOCUMENTS:-}
K=${K:-20}
SCORER=${SCORER:-induction}
GOLD=${GOLD:-all}
QUERY_FRACTION=${QUERY_FRACTION:-0.25}
ALPHA_RAMP=${ALPHA_RAMP:-}
CHECKPOINT_EVERY=${CHECKPOINT_EVERY:-100}
CURVE=${CURVE:-}
JOBS=${JOBS:-1}
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
# label folders name their settings, so a changed K, scorer or gold is labelled anew, never read from an older folder
slug=$(basename "$SCORER"); slug=${slug%.gguf}; slug=${slug//[^A-Za-z0-9._-]/_}
lex=$store/labels/train-lex-$SEQ_LEN-k$K
[ -d "$lex" ] || $RPT label "${label[@]}" --k "$K" --split train --kind lex --span "$SEQ_LEN" --out "$lex"
scorer=$SCORER
if [ "$SCORER" = own ]; then  # the scorer of the sem labels is the seed-0 xl of the sweep itself (trained here first)
  $LAB sweep --out "$OUT/sweep" --variants xl --seeds 0 "${paper_flag[@]}" -- "${train[@]}"
  scorer=$OUT/sweep/xl-seed0
fi
sem_flags=()
case ",$VARIANTS," in  # the train split's sem labels only for a variant that trains on them
  *,rpt-sem,*) sem=$store/labels/train-sem-$SEQ_LEN-k$K-$slug
               sem_flags=(--labels-sem "$sem")
               [ -d "$sem" ] || $RPT label "${label[@]}" --k "$K" --split train --kind sem --span "$SEQ_LEN" \
                 --scorer "$scorer" --out "$sem" ;;
esac
if [ "$GOLD" = all ]; then
  test_labels=$store/labels/test-sem-doc-all-q$QUERY_FRACTION-$slug
  [ -d "$test_labels" ] || $RPT label "${label[@]}" --split test --kind sem --span doc --candidates all \
    --query-fraction "$QUERY_FRACTION" --scorer "$scorer" --out "$test_labels"
else
  test_labels=$store/labels/test-sem-doc-k$K-$slug
  [ -d "$test_labels" ] || $RPT label "${label[@]}" --k "$K" --split test --kind sem --span doc --scorer "$scorer" \
    --out "$test_labels"
fi
$LAB sweep --out "$OUT/sweep" --variants "$VARIANTS" --seeds "$SEEDS" --labels-lex "$lex" "${sem_flags[@]}" \
  --test-labels "$test_labels" --jobs "$JOBS" "${paper_flag[@]}" -- "${train[@]}"
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
  $LAB compare "$OUT/sweep/curve" "$OUT/sweep/eval" "${paper_flag[@]}" --out "$OUT/sweep/curve.json" \
    --markdown "$OUT/sweep/curve.md"
fi
