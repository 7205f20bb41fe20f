"""`python -m lab bench --scale`: each variant's step measured in its own process, beside the memory estimate."""

import json
import mmap

import pytest

from lab.bench import format_training, largest_batch, peak_rss_mb, reset_peak_rss
from lab.cli import main
from rpt.config import RPTConfig
from rpt.training.footprint import estimate_step_memory


@pytest.mark.slow
def test_bench_scale_measures_each_variant_in_its_own_process(tmp_path, capsys):
    """Two probes: rpt-sem with tiny's full-logit loss (its retrieval loss too) and the extra xl row with the chunked
    loss, each in a process of its own (a probe is a fresh process: 5 s on 2 cores; 11 s here). By default a probe runs
    for real, its peak against the estimate, in tests/lab/test_memory_benchmarks.py; the rows and ratios built from the
    probes' figures in test_bench_scale_compile_both_compares_within_each_mode below; the command's rows with
    --estimate-only in tests/lab/test_gpu_check.py."""
    out = tmp_path / "scale.json"
    code = main(["bench", "--scale", "--preset", "tiny", "--seq-len", "512", "--batch-size", "1", "--vocab-size", "256",
                 "--variants", "rpt-sem", "--steps", "2", "--loss-chunks", "128", "--memory-budget", "2",
                 "--out", str(out)])
    assert code == 0
    r = json.loads(out.read_text())["scale"]
    rows = {(x["variant"], x["loss_chunk"]): x for x in r["rows"]}
    assert set(rows) == {("rpt-sem", 0), ("xl", 128)}  # tiny's full-logit loss, and a chunked row
    for x in rows.values():
        assert x["peak_bytes"] > 0 and x["seconds_per_update"] > 0 and x["updates_timed"] == 1
        assert 0.3 < x["estimate_vs_peak"] < 3  # the estimate is in the measured peak's range, even at this size
        assert x["largest_batch"] >= 1
    xl = next(x for x in r["rows"] if x["variant"] == "xl")["seconds_per_update"]  # the first xl row is the reference
    for x in rows.values():  # each row's ratio is its own time over that row's, as recorded
        assert x["time_vs_xl"] == pytest.approx(x["seconds_per_update"] / xl)
    assert "largest batch in budget" in capsys.readouterr().out


def test_largest_batch_is_the_last_that_fits():
    cfg = RPTConfig.from_preset("250m", variant="rpt-sem")
    cfg.data.seq_len = 16384
    budget = 80 * 2**30
    b = largest_batch(cfg, budget, "cuda")
    assert b >= 1
    cfg.train.batch_size = b
    assert estimate_step_memory(cfg, "cuda").total <= budget
    cfg.train.batch_size = b + 1
    assert estimate_step_memory(cfg, "cuda").total > budget
    assert largest_batch(cfg, 1.0, "cuda") == 0


@pytest.mark.parametrize("flags, needle", [(["--variants", "xl,gpt"], "--variants"),
                                           (["--loss-chunks", "-3"], "--loss-chunks"),
                                           (["--memory-budget", "0"], "--memory-budget"),
                                           (["--preset", "huge"], "--preset")])
def test_bench_scale_bad_flags_are_one_line(flags, needle, capsys):
    assert main(["bench", "--scale", "--estimate-only", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_peak_rss_is_reset_between_variants():
    """`python -m lab bench` resets the peak resident set before each variant, so a variant's peak RSS is its own, not the
    running maximum of the ones before it; where no reset exists the table marks the figure as the process's."""
    if not reset_peak_rss():
        pytest.skip("no /proc/self/clear_refs: the peak cannot be reset here")
    # 96 MiB mapped and touched, then unmapped: an anonymous mmap, because a malloc'd block in a long-lived process
    # may come from (and go back to) the heap's free space instead of the kernel, and then RSS does not fall
    block = mmap.mmap(-1, 96 * 2**20)
    block.write(b"\1" * len(block))
    high = peak_rss_mb()
    block.close()
    assert reset_peak_rss()
    assert peak_rss_mb() < high - 64  # the freed block is no longer in the peak
    row = {"parameters": 1e6, "seconds_per_update": 0.1, "time_vs_xl": 1.0, "tokens_per_s": 10.0, "peak_rss_mb": 100.0}
    table = {"preset": "tiny", "batch_size": 1, "seq_len": 8, "steps_timed": 1}
    assert "running maximum" not in format_training({**table, "variants": {"xl": {**row, "peak_rss_scope": "variant"}}})
    assert "running maximum" in format_training({**table, "variants": {"xl": {**row, "peak_rss_scope": "process"}}})


def test_bench_scale_compile_both_compares_within_each_mode(monkeypatch):
    """--compile both: every variant eager and compiled; time_vs_xl within a mode, compile_speedup per variant
    (measure_step scripted here; tests/train/test_train_loop.py compiles for real)."""
    import lab.bench as B

    secs = {("xl", False): 1.0, ("rpt-sem", False): 2.0, ("xl", True): 0.5, ("rpt-sem", True): 2.5}

    def fake(**spec):
        s = secs[(spec["variant"], spec["compile"])]
        return {"seconds_per_update": s, "tokens_per_s": 512 / s, "peak_bytes": 2**20, "updates_timed": 1,
                "first_update_s": 9.0, "compile": spec["compile"]}

    monkeypatch.setattr(B, "measure_step", fake)
    r = B.bench_scale("tiny", 512, ("xl", "rpt-sem"), device="cpu", loss_chunks=(), compile_modes=(False, True),
                      budget_gib=1)
    rows = {(x["variant"], x["compile"]): x for x in r["rows"]}
    assert rows[("rpt-sem", False)]["time_vs_xl"] == 2.0 and rows[("rpt-sem", True)]["time_vs_xl"] == 5.0
    assert rows[("xl", True)]["compile_speedup"] == 2.0 and rows[("rpt-sem", True)]["compile_speedup"] == 0.8
    assert "compile_speedup" not in rows[("xl", False)]
    assert "rpt-sem compiled" in B.format_scale(r) and "0.80x faster than eager" in B.format_scale(r)


def test_largest_batch_measured_scales_the_estimate_to_the_peak(monkeypatch):
    """The estimate omits the allocator's slack: a measured row also reports the largest batch whose estimate, scaled
    by that row's peak / estimate, fits the budget (on an H200 the estimate's 8 for rpt-sem at 250m / 16K was 6)."""
    import lab.bench as B

    cfg = B.scale_config("rpt-sem", "250m", 16384, 1, None, "bf16", None)
    est = estimate_step_memory(cfg, "cuda").total
    monkeypatch.setattr(B, "measure_step", lambda **spec: {"seconds_per_update": 1.0, "tokens_per_s": 1.0,
                                                           "peak_bytes": 1.25 * est, "updates_timed": 1})
    monkeypatch.setattr(B.torch.cuda, "is_available", lambda: True)
    r = B.bench_scale("250m", 16384, ("rpt-sem",), device="cuda", loss_chunks=(), precision="bf16", budget_gib=139)
    row = r["rows"][0]
    assert row["largest_batch"] == largest_batch(cfg, 139 * 2**30, "cuda")
    assert row["largest_batch_measured"] == largest_batch(cfg, 139 * 2**30 / 1.25, "cuda") < row["largest_batch"]
    assert f"{row['largest_batch_measured']} by the estimate scaled to the measured peak" in B.format_scale(r)
