"""benchmarks/paired_loss_gap.py: the per-block gap of two settings' training losses, paired by seed."""

import json
from pathlib import Path

import pytest


def write_run(folder: Path, losses: list[float]) -> None:
    folder.mkdir(parents=True)
    rows = [{"step": 10 * (i + 1), "lm_loss": x} for i, x in enumerate(losses)]
    (folder / "log.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_gap_per_block_and_seed(tmp_path, capsys, benchmark_script):
    for s in range(2):
        write_run(tmp_path / "a" / f"rpt-sem-seed{s}", [5.0] * 4)
        write_run(tmp_path / "b" / f"x-seed{s}", [5.0 + s, 5.0 + s, 5.5, 5.5])  # seed 1 worse early; both later
    write_run(tmp_path / "b" / "x-seed7", [9.0] * 4)  # no partner in the reference: ignored
    gap = benchmark_script("paired_loss_gap")
    r = gap.main([str(tmp_path / "a"), str(tmp_path / "b" / "x"), "block=20", f"out={tmp_path / 'g.json'}"])
    got = r["others"][str(tmp_path / "b" / "x")]
    assert got["seeds"] == [0, 1]
    assert got["gap"]["0"] == {20: 0.0, 40: 0.5} and got["gap"]["1"] == {20: 1.0, 40: 0.5}
    assert got["mean"] == {20: 0.5, 40: 0.5} and got["sd"][40] == 0.0
    assert "+0.500" in capsys.readouterr().out and (tmp_path / "g.json").exists()
    with pytest.raises(SystemExit, match="no <name>-seed<N>"):
        benchmark_script("paired_loss_gap").main([str(tmp_path / "a"), str(tmp_path / "nothing")])
