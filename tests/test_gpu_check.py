"""scripts/gpu_check.sh (the GPU checks): its stages run, dry, on a CPU at a tiny size, so the commands it
holds are real; without a GPU it refuses in one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def run(out: Path, *stages: str, **env: str) -> subprocess.CompletedProcess:
    bindir = Path(sys.executable).parent
    rpt = bindir / "rpt"
    full = {**os.environ, "PYTHON": sys.executable, "RPT": str(rpt) if rpt.exists() else f"{sys.executable} -m rpt.cli",
            **env}
    return subprocess.run(["bash", str(SCRIPT), str(out), *stages], capture_output=True, text=True, cwd=ROOT, env=full)


def test_dry_run_on_cpu_writes_each_stage(tmp_path):
    out = tmp_path / "gc"
    r = run(out, "env", "kernels", "scale", DEVICE="cpu", PRESET="tiny", SEQ="512", PRECISION="fp32", STEPS="2",
            VARIANTS="xl,rpt-sem", KERNEL_VARIANTS="xl,rpt-sem")
    assert r.returncode == 0, r.stderr + r.stdout[-2000:]
    assert {"env.txt", "kernels.txt", "kernels.json", "scale.txt", "scale.json"} <= {p.name for p in out.iterdir()}
    kernels = json.loads((out / "kernels.json").read_text())["kernels"]
    assert [k["variant"] for k in kernels] == ["xl", "rpt-sem"]
    rows = json.loads((out / "scale.json").read_text())["scale"]["rows"]
    assert [x["variant"] for x in rows] == ["xl", "rpt-sem", "xl"] and all(x["seconds_per_update"] > 0 for x in rows)
    assert "exit 0 after" in (out / "scale.txt").read_text()


def test_refusals_are_one_line(tmp_path):
    r = run(tmp_path / "gc", "kernels", "bogus", DEVICE="cpu")
    assert r.returncode == 2 and "unknown stage 'bogus'" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    if not torch.cuda.is_available():
        r = run(tmp_path / "gc", "kernels")
        assert r.returncode == 2 and "no CUDA device" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "gc").exists()
