#!/usr/bin/env bash
# The chance rows (BM25, recency, random, oracle) of the BM25-top-k test golds that docs/results/code.md and
# docs/results/baselines.md print P@2 / R@10 / nDCG@20 against. Each setting rebuilds its gold with the commands of its
# page (prepare, the scorer, the test split's sem labels of BM25's top k), then evaluates the scorer with --metrics:
# the chance rows do not depend on the model evaluated, only on the gold and the pools.
# Usage: bash scripts/topk_gold_chance.sh SETTING [SETTING ...]
#   demo   code.md "The demo": 12 packages, the xl scorer after 200 updates at 1,024 tokens, k = 6, 2 test packages
#   real   code.md "A larger setting": 60 packages, the xl scorer after 300 updates at 2,048 tokens, k = 4, 3 test packages
#   long   baselines.md and code.md at 1,200 updates: the whole library, the seed-0 xl after 1,200 updates, k = 4, all
#          13 test packages
# Settings by environment: OUT=runs/topk-gold (one folder per setting) RPT=rpt (default: on PATH, else .venv/bin/rpt)
# THREADS= (torch threads of every step; default torch's)
# Each result is OUT/SETTING/eval.json; a step whose output exists is skipped and training resumes, so a killed run
# continues when run again. A rebuilt gold need not be the page's to the last label (its scorer is trained again): compare BM25's row
# with the page's to see how close it is.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: bash scripts/topk_gold_chance.sh demo|real|long ..." >&2; exit 2; }
OUT=${OUT:-runs/topk-gold}
if [ -z "${RPT:-}" ]; then  # the rpt on PATH, else the one scripts/setup.sh installed
  RPT=rpt; command -v rpt >/dev/null || RPT="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/rpt"
fi
threads=()
[ -n "${THREADS:-}" ] && threads=(--threads "$THREADS")

gold() {  # name, prepare flags, train flags, scorer folder name, label flags, eval flags
  local dir=$OUT/$1 store=$OUT/$1/store scorer=$OUT/$1/$4
  local labels=$store/labels/test-sem-doc
  [ -e "$store/prepare.json" ] || "$RPT" prepare --corpus stdlib --tokenizer bpe:2048 --out "$store" $2
  "$RPT" train --preset tiny --store "$store" --variant xl --out "$scorer" \
    --no-progress "${threads[@]}" $3
  [ -e "$labels/manifest.json" ] || "$RPT" label --store "$store" --split test --kind sem --span doc \
    --segment-len 128 --scorer "$scorer" --out "$labels" $5
  [ -e "$dir/eval.json" ] || "$RPT" eval --checkpoint "$scorer" --store "$store" --labels "$labels" --metrics \
    --out "$dir/eval.json" --no-progress "${threads[@]}" $6
}

for setting in "$@"; do
  case $setting in
    demo) gold demo "--max-documents 12" "--seq-len 1024 --batch-size 2 --set model.segment_len=128 --steps 200 \
            --seed 1" scorer "--k 6 --batch-size 64 --max-documents 2" "--max-documents 2" ;;
    real) gold real "--max-documents 60" "--seq-len 2048 --batch-size 2 --set model.segment_len=128 \
            --set train.lr=0.01 --steps 300 --seed 1" scorer "--k 4 --batch-size 64 --max-documents 3" "--max-documents 3" ;;
    long) gold long "" "--seq-len 2048 --lr 0.01 --steps 1200 --batch-size 2 --set train.checkpoint_every=200 \
            --set train.keep_last=0 --set train.warmup_steps=50 --seed 0" xl-seed0 "--k 4" "" ;;
    *) echo "unknown setting $setting: demo, real or long" >&2; exit 2 ;;
  esac
  echo "$setting: $OUT/$setting/eval.json"
done
