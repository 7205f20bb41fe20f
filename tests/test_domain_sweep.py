"""scripts/domain_sweep.sh, the per-domain comparison of docs/results/domains.md, runs as written: lex labels, the
seed-0 xl as the sem scorer, sem labels, the sweep and the table; run again, it redoes nothing."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rpt.cli import main

ROOT = Path(__file__).resolve().parents[1]
RPT = Path(sys.executable).parent / "rpt"


@pytest.mark.skipif(not RPT.exists(), reason="the rpt console script is not installed beside this python")
def test_domain_sweep_script_runs_end_to_end_and_resumes(tmp_path):
    out = tmp_path / "dom"
    spec = "synthetic:copy-far?docs=6&eval_docs=2&passages=8&passage=64&distance=2-4"
    assert main(["prepare", "--corpus", spec, "--out", str(out / "store"), "--no-progress"]) == 0  # skips `prepare`
    env = dict(os.environ, STEPS="2", SEEDS="0", VARIANTS="xl,retro,rpt-sem", SEQ_LEN="512", SEGMENT="64",
               OUT=str(out), RPT=str(RPT))

    def run():
        return subprocess.run(["bash", str(ROOT / "scripts" / "domain_sweep.sh"), spec, "pg19"], env=env,
                              capture_output=True, text=True, timeout=600)

    done = run()
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(re.findall(r"^labels: ", done.stdout, re.M)) == 3  # lex, sem train, sem test
    labels = sorted(p.name for p in (out / "store" / "labels").iterdir())
    assert labels == ["test-sem-doc", "train-lex-512", "train-sem-512"]
    table = json.loads((out / "sweep" / "compare.json").read_text())
    rows = {row["variant"]: row for row in table["rows"]}
    assert list(rows) == ["xl", "retro", "rpt-sem"] and all(row["step"] == 2 for row in rows.values())
    assert rows["rpt-sem"]["oracle"][2] == 1 and rows["xl"]["paper"]["ppl"] == 11.48  # PG19's xl figure
    sem = json.loads((out / "store" / "labels" / "train-sem-512" / "manifest.json").read_text())
    assert str(out / "sweep" / "xl-seed0") in json.dumps(sem)  # scored by the sweep's own seed-0 xl

    again = run()
    assert again.returncode == 0, again.stderr[-2000:]
    counts = re.findall(r"(\d+) jobs, (\d+) already done", again.stdout)
    assert len(counts) == 2 and all(total == done_ for total, done_ in counts)  # both sweeps: nothing left to do
    assert not re.findall(r"^labels: ", again.stdout, re.M)  # no label store made again
