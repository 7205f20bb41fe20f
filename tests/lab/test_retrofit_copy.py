"""benchmarks/retrofit_copy.py: the far-copy documents' layout, and the perplexity per region and control ratios."""

import json
import math
import random
from pathlib import Path

import pytest


def test_a_document_repeats_its_fresh_passages_after_a_spacer(benchmark_script):
    mod = benchmark_script("retrofit_copy")
    ids = list(range(5000))
    passages = mod.document(ids, random.Random(3))
    assert len(passages) == 2 * mod.FRESH + mod.SPACER and all(len(p) == mod.PASSAGE for p in passages)
    fresh, repeats = passages[: mod.FRESH], passages[mod.FRESH + mod.SPACER :]
    assert sorted(repeats) == sorted(fresh) and repeats != fresh  # the same passages, shuffled
    gap = mod.SPACER * mod.PASSAGE  # tokens between the last fresh passage and the first repeat
    assert gap >= 256  # beyond a window of segments of 128
    assert mod.document(ids, random.Random(3)) == passages


def write_result(path: Path, per_doc: list[list[float]]) -> None:
    """An `rpt eval --per-chunk` result: one document per list of per-chunk NLL per token, 64 tokens a chunk."""
    docs = [{"chunks": {"nll": [x * 64 for x in nll], "tokens": [64] * len(nll)}} for nll in per_doc]
    path.write_text(json.dumps({"documents": docs}))


def test_summary_regions_and_control_ratios(tmp_path, capsys, benchmark_script):
    mod = benchmark_script("retrofit_copy")
    base = [1.0] * 16
    reads = [1.0] * 11 + [0.5] * 4 + [1.0]  # lower NLL on the repeats (chunks 11-14) with BM25's neighbours
    write_result(tmp_path / "a-bm25.json", [reads, reads])
    write_result(tmp_path / "a-random.json", [base, base])
    write_result(tmp_path / "b-bm25.json", [base, base])
    write_result(tmp_path / "b-random.json", [base, base])
    out = tmp_path / "s.json"
    mod.main(["summary", *map(str, sorted(tmp_path.glob("*-*.json"))), "--against", "b", "--out", str(out)])
    got = json.loads(out.read_text())
    assert got["results"]["a-bm25"]["repeat"]["perplexity"] == pytest.approx(math.exp(0.5))
    assert got["results"]["a-bm25"]["fresh"]["perplexity"] == pytest.approx(math.e)
    ratio = got["repeat_ratios"]["a: random / bm25"]
    assert ratio["ratio"] == pytest.approx(math.exp(0.5)) and ratio["low"] == pytest.approx(math.exp(0.5))
    assert got["repeat_ratios"]["b: random / bm25"]["ratio"] == pytest.approx(1.0)
    paired = got["repeat_ratios"]["a against b: (random / bm25) over (random / bm25)"]
    assert paired["ratio"] == pytest.approx(math.exp(0.5))
    assert "a against b" in capsys.readouterr().out
    short = {"chunks": {"nll": [64.0] * 16, "tokens": [64] * 14 + [32, 64]}}  # a repeat chunk of another length
    (tmp_path / "d-bm25.json").write_text(json.dumps({"documents": [short, short]}))
    write_result(tmp_path / "d-random.json", [base, base])
    with pytest.raises(SystemExit, match="the same tokens"):
        mod.main(["summary", str(tmp_path / "d-bm25.json"), str(tmp_path / "d-random.json")])
    (tmp_path / "c-bm25.json").write_text(json.dumps({"documents": [{}]}))
    with pytest.raises(SystemExit, match="no per-chunk data"):
        mod.main(["summary", str(tmp_path / "c-bm25.json")])
