"""scripts/gpu_retrieval.sh (the retrieval comparison for a lent GPU) runs, dry, on a CPU at a tiny size: exhaustive
test gold, the sweep evaluated with it, chance levels and the random-neighbour control in its table."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RPT = Path(sys.executable).parent / "rpt"


@pytest.mark.skipif(not RPT.exists(), reason="the rpt console script is not installed beside this python")
def test_dry_run_on_cpu_writes_the_table_with_exhaustive_gold(tmp_path):
    out = tmp_path / "gr"
    env = dict(os.environ, REQUIRE_GPU="0", PRESET="tiny", SCORER="own", SEQ_LEN="512", SEGMENT="64", STEPS="2",
               LR="0.01", BATCH="2", SEEDS="0", ALPHA_RAMP="1", TOKENIZER="corpus", QUERY_FRACTION="1", RPT=str(RPT),
               PYTHON=sys.executable,
               CORPUS="synthetic:copy-far?docs=6&eval_docs=2&passages=8&passage=64&distance=2-4")
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_retrieval.sh"), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    gold = json.loads((out / "store" / "labels" / "test-sem-doc-all" / "manifest.json").read_text())
    assert gold["candidates"] == "all" and gold["kind"] == "sem"
    lex = json.loads((out / "store" / "labels" / "train-lex-512" / "manifest.json").read_text())
    assert lex["k"] == 20  # the paper's k
    table = json.loads((out / "sweep" / "compare.json").read_text())
    rows = {row["variant"]: row for row in table["rows"]}
    assert list(rows) == ["xl", "rpt-sem"]
    run = yaml.safe_load((out / "sweep" / "rpt-sem-seed0" / "config.yaml").read_text())
    assert run["train"]["alpha_ramp_steps"] == 1 and run["data"]["seq_len"] == 512  # ALPHA_RAMP reaches the run
    sem = rows["rpt-sem"]
    assert sem["random_gain"][2] == 1 and sem["oracle_gain"][2] == 1
    assert {"metrics_model", "metrics_bm25", "metrics_recency", "metrics_random", "metrics_oracle"} <= set(sem)
    assert sem["gold"] == ["exhaustive"]
    md = (out / "sweep" / "compare.md").read_text()
    assert "random (chance, expected)" in md and "P@2 by pool size" in md and "ppl, random neighbours" in md


def test_refuses_without_a_gpu_in_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_retrieval.sh"), str(tmp_path / "x")],
                       env=dict(os.environ, PYTHON=sys.executable), capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "no CUDA device" in r.stderr
