"""The label benchmark runs (a smoke test on small inputs; the timed run is `python benchmarks/bench_labels.py`)."""

import pytest

pytest.importorskip("bm25s")
pytest.importorskip("rank_bm25")


def test_the_command_script_wraps_the_package_benchmark(benchmark_script):
    mod = benchmark_script("bench_labels")
    from lab import bench_labels as bench

    assert mod.run_benchmark is bench.run_benchmark and mod.main is bench.main


def test_benchmark_runs_and_reports_ratios():
    from lab import bench_labels as bench

    tokens, tok = bench.stdlib_tokens(20_000, vocab_size=1024)
    assert len(tokens) == 20_000
    res = {"machine": bench.machine_info("cpu"), "bm25": [bench.bench_bm25(tokens, rank_bm25_queries=3, bm25s_queries=20)]}
    r = res["bm25"][0]
    assert r["bm25s_agreement"] == 1.0 and r["rank_bm25_agreement"] == 1.0
    assert r["ratio_ours_over_bm25s"] > 0 and r["rank_bm25_queries_timed"] == 3
    res["scorer"] = bench.bench_scorer(bench.tiny_scorer(tok, "cpu", width=32, layers=1), tokens, tok, n_queries=1)
    assert res["scorer"]["tokens"] > 0 and res["scorer"]["ratio_ours_over_plain"] > 0
    report = bench.format_report(res)
    assert "ours/bm25s" in report and "ours/rank_bm25" in report and "ours/plain" in report and "CPUs" in report
    s = res["scorer"]
    assert s["hours_per_billion_tokens"] * 3600 * s["chunks_per_s"] == pytest.approx(1e9 / 64)
    assert "device-hours to label a billion training tokens" in report


@pytest.mark.slow  # 4 s: builds SmolLM2-135M's architecture
def test_smollm2_shape_scorer_has_smollm2s_architecture_and_covers_the_bpe():
    """`--scorer smollm2-shape`: SmolLM2-135M's shape (its cost) with random weights; the vocabulary pads past the BPE's."""
    from lab import bench_labels as bench

    _, tok = bench.stdlib_tokens(5_000, vocab_size=512)
    sc = bench.tiny_scorer(tok, "cpu", shape=bench.SMOLLM2_SHAPE)
    cfg = sc.model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (576, 30, 9, 3)
    assert cfg.vocab_size == 49152 and sc.name == "random-llama-576x30"
    assert 134e6 < sum(p.numel() for p in sc.model.parameters()) < 136e6  # SmolLM2-135M's 134.5M, embeddings tied
