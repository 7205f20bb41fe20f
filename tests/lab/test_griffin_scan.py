import json

import torch


def test_the_three_scans_agree_and_the_report_names_each(benchmark_script, tmp_path, capsys):
    bench = benchmark_script("griffin_scan")
    g = torch.Generator().manual_seed(1)
    log_a, b = -torch.rand(2, 37, 5, generator=g), torch.randn(2, 37, 5, generator=g)
    want = bench.loop(log_a, b)
    for L in (1, 4, 8, 64):  # chunks that divide T, that do not, and one longer than T
        assert torch.allclose(bench.closed(log_a, b, L), want, atol=1e-5), L
    out = tmp_path / "scan.json"
    assert bench.main(["T=40", "rounds=2", f"out={out}"]) == 0
    report = json.loads(out.read_text())
    assert set(report["median_ms"]) == {"scan", "loop", "closed 4", "closed 8", "closed 16", "closed 64"}
    assert report["vs_scan"]["scan"] == 1.0 and report["largest_difference"] < 1e-4 and report["R"] == 84
    assert "x the scan" in capsys.readouterr().out
