"""scripts/dequantise_gguf.py refuses what it cannot use in one line and writes over nothing (its run on the real
SmolLM2 GGUF: tests/retrofit/test_retrofit_smollm2.py, -m slow)."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "dequantise_gguf.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_refusals(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"x")
    r = run(str(tmp_path / "model.bin"), str(tmp_path / "out"))
    assert r.returncode == 2 and "not a .gguf file" in r.stderr
    (tmp_path / "m.gguf").write_bytes(b"x")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("keep")
    r = run(str(tmp_path / "m.gguf"), str(tmp_path / "taken"))
    assert r.returncode == 2 and "exists" in r.stderr and (tmp_path / "taken" / "mine.txt").read_text() == "keep"
