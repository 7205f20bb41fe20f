"""scripts/gpu_retrieval.sh, the retrieval comparison for a lent GPU: exhaustive test gold, the sweep evaluated with
it, chance levels and the random-neighbour control in its table.

In the default suite it runs dry with a stand-in `rpt` that records its commands: with no setting given they are the
measured setting of docs/results/retrieval.md (SmolLM2 labels at k = 20, exhaustive gold on a quarter of the test
chunks, xl and rpt-sem at the small preset, 3 seeds) and each parses. The same commands run for real on a CPU at a
tiny size under -m slow here; the sweep with exhaustive gold, chance levels and the random control runs by default
in tests/lab/test_sweep.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli_parsers import build_parser

ROOT = Path(__file__).resolve().parents[2]
RPT = Path(sys.executable).parent / "rpt"


def test_default_settings_are_the_measured_ones_and_every_command_parses(tmp_path, recording_command):
    rpt = recording_command("rpt")
    out = tmp_path / "gr"
    env = dict(os.environ, REQUIRE_GPU="0", RPT=str(rpt), LAB=str(rpt), PYTHON=sys.executable, ALPHA_RAMP="80")
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_retrieval.sh"), str(out)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    calls = recording_command.calls("rpt")
    assert [c[0] for c in calls] == ["prepare", "label", "label", "label", "sweep"]  # a named scorer: no own xl first
    parser = build_parser()
    prepare, lex, sem, gold, sweep = (parser.parse_args(c) for c in calls)
    store = out / "store"
    assert (prepare.corpus, prepare.tokenizer, prepare.max_documents, Path(prepare.out)) == ("stdlib", "bpe:16384", 40,
                                                                                            store)
    assert (lex.kind, lex.split, lex.span, lex.k, lex.segment_len) == ("lex", "train", "4096", 20, 512)
    assert (sem.kind, sem.split, sem.span, sem.k, sem.scorer) == ("sem", "train", "4096", 20, "smollm2")
    assert (gold.kind, gold.split, gold.span, gold.candidates, gold.query_fraction, gold.scorer) == (
        "sem", "test", "doc", "all", 0.25, "smollm2")
    assert (sweep.variants, sweep.seeds, sweep.paper, sweep.test_labels) == ("xl,rpt-sem", "0,1,2", "code",
                                                                             Path(gold.out))
    train = parser.parse_args(["train", *sweep.train_args])
    assert (train.preset, train.seq_len, train.steps, train.batch_size, train.lr) == ("small", 4096, 400, 4, 1e-3)
    assert {"model.segment_len=512", "train.alpha_ramp_steps=80"} <= set(train.set)
    assert "the table: " + str(out / "sweep" / "compare.md") in done.stdout


@pytest.mark.slow
@pytest.mark.skipif(not RPT.exists(), reason="the rpt console script is not installed beside this python")
def test_dry_run_on_cpu_writes_the_table_with_exhaustive_gold(tmp_path):
    out = tmp_path / "gr"
    env = dict(os.environ, REQUIRE_GPU="0", PRESET="tiny", SCORER="own", SEQ_LEN="512", SEGMENT="64", STEPS="2",
               LR="0.01", BATCH="2", SEEDS="0", ALPHA_RAMP="1", TOKENIZER="corpus", QUERY_FRACTION="1", RPT=str(RPT),
               LAB=f"{sys.executable} -m lab",
               PYTHON=sys.executable, CURVE="1", CHECKPOINT_EVERY="1",
               CORPUS="synthetic:copy-far?docs=6&eval_docs=2&passages=8&passage=64&distance=2-4")
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_retrieval.sh"), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    gold = json.loads((out / "store" / "labels" / "test-sem-doc-all-q1-own" / "manifest.json").read_text())
    assert gold["candidates"] == "all" and gold["kind"] == "sem"
    lex = json.loads((out / "store" / "labels" / "train-lex-512-k20" / "manifest.json").read_text())
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
    curve = json.loads((out / "sweep" / "curve.json").read_text())  # the retriever at update 1, then at the end
    assert [(r["variant"], r["step"]) for r in curve["rows"] if "metrics_model" in r] == [("rpt-sem", 1), ("rpt-sem", 2)]


@pytest.mark.slow  # 3 s: a fresh interpreter imports torch to look for CUDA
def test_refuses_without_a_gpu_in_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_retrieval.sh"), str(tmp_path / "x")],
                       env=dict(os.environ, PYTHON=sys.executable), capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "no CUDA device" in r.stderr
