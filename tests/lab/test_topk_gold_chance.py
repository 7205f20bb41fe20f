"""scripts/topk_gold_chance.sh, the chance rows beside the BM25-top-k golds of docs/results/code.md and baselines.md:
run dry with a stand-in `rpt`, each setting rebuilds its gold with its page's settings and evaluates the scorer with
--metrics; an unknown setting is refused before anything runs."""

import os
import subprocess
from pathlib import Path

from cli_parsers import build_parser

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "topk_gold_chance.sh"


def run(out: Path, rpt: Path, *settings: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *settings], env=dict(os.environ, OUT=str(out), RPT=str(rpt), **env),
                          capture_output=True, text=True, timeout=60)


def test_each_setting_rebuilds_its_pages_gold_and_evaluates_the_chance_rows(tmp_path, recording_command):
    rpt = recording_command("rpt")
    done = run(tmp_path / "g", rpt, "demo", "real", "long", THREADS="1")
    assert done.returncode == 0, done.stderr
    calls = recording_command.calls("rpt")
    assert [c[0] for c in calls] == ["prepare", "train", "label", "eval"] * 3
    parser = build_parser()
    args = [parser.parse_args(argv) for argv in calls]  # every command names only flags its verb has
    expected = {  # setting: (prepared documents, span, updates, seed, k, test documents): the pages' commands
        "demo": (12, 1024, 200, 1, 6, 2), "real": (60, 2048, 300, 1, 4, 3), "long": (None, 2048, 1200, 0, 4, None)}
    for i, (name, (docs, span, steps, seed, k, test_docs)) in enumerate(expected.items()):
        prepare, train, label, ev = args[4 * i : 4 * i + 4]
        folder = tmp_path / "g" / name
        assert (prepare.corpus, prepare.tokenizer, prepare.max_documents) == ("stdlib", "bpe:2048", docs)
        assert Path(prepare.out) == Path(train.store) == Path(label.store) == Path(ev.store) == folder / "store"
        assert (train.variant, train.preset, train.seq_len, train.steps, train.seed, train.threads) == (
            "xl", "tiny", span, steps, seed, 1)
        assert (label.kind, label.split, label.span, label.k, label.segment_len, label.candidates) == (
            "sem", "test", "doc", k, 128, "bm25")
        assert Path(label.scorer) == Path(train.out) == Path(ev.checkpoint)
        assert Path(ev.labels) == Path(label.out) and ev.metrics and Path(ev.out) == folder / "eval.json"
        assert ev.max_documents == test_docs and label.max_documents == test_docs


def test_an_unknown_setting_or_none_is_refused(tmp_path, recording_command):
    rpt = recording_command("rpt")
    assert run(tmp_path / "g", rpt).returncode == 2
    bad = run(tmp_path / "g", rpt, "books")
    assert bad.returncode == 2 and "unknown setting books" in bad.stderr
    assert recording_command.calls("rpt") == []
