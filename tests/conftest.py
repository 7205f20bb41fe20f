import os

import pytest
import torch

# Two cores here: one thread per test process keeps timings stable and avoids oversubscription.
# tests/durations.txt lists the slowest tests of a measured run of the default suite (command and machine at its top):
# start there when the suite needs to be faster.
torch.set_num_threads(int(os.environ.get("RPT_TEST_THREADS", "1")))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def recording_command(tmp_path):
    """make(name) -> an executable stand-in for a command (rpt, python) that records each call's arguments and exits 0;
    calls(name) -> those calls, in order. For dry runs of the shell scripts: what they would run, without running it."""
    import json
    import sys

    folder = tmp_path / "stand-ins"

    def make(name: str):
        folder.mkdir(exist_ok=True)
        path, log = folder / name, folder / f"{name}.calls"
        path.write_text(f"#!{sys.executable}\nimport json, sys\nwith open({str(log)!r}, 'a') as f:\n"
                        "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n")
        path.chmod(0o755)
        return path

    def calls(name: str) -> list[list[str]]:
        log = folder / f"{name}.calls"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    make.calls = calls
    return make


@pytest.fixture
def benchmark_script():
    """load(name) -> the module of benchmarks/<name>.py, imported from its file (benchmarks/ is not a package)."""
    import importlib.util
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "benchmarks"

    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"benchmark_{name}", folder / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load
