"""Damaged checkpoints and logs: a truncated, emptied or altered file in the newest checkpoint is reported
and skipped, never loaded; one named explicitly is refused in one line; a torn last line of log.jsonl does not block
resume. Every case goes through the CLI, as a user meets it."""

import json
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from train_helpers import make_store  # noqa: E402

from rpt import checkpoint as ck  # noqa: E402
from rpt.cli import _one_line_warnings, main  # noqa: E402
from rpt.utils import RPTWarning  # noqa: E402

SMALL = ["--set", "model.chunk_size=8", "--set", "model.segment_len=16", "--seq-len", "64",
         "--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.mlp_hidden=64", "--set", "train.log_every=1",
         "--set", "train.checkpoint_every=2", "--set", "train.keep_last=0", "--no-progress"]


@pytest.fixture
def run(tmp_path):
    """An xl run of 4 updates with checkpoints at steps 2 and 4, on a store whose train split is also evaluated."""
    root = tmp_path / "store"
    make_store(root / "train", [160, 192, 112, 64])
    out = tmp_path / "run"
    args = ["train", "--preset", "tiny", "--variant", "xl", "--store", str(root), "--out", str(out), *SMALL]
    assert main([*args, "--steps", "4"]) == 0
    assert [p.name for p in ck.list_checkpoints(out)] == ["step_00000002", "step_00000004"]
    return {"root": root, "out": out, "args": args, "newest": out / "checkpoints" / "step_00000004"}


def evaluate(run, checkpoint, tmp_path):
    return main(["eval", "--checkpoint", str(checkpoint), "--store", str(run["root"]), "--split", "train", "--out",
                 str(tmp_path / "r.json"), "--no-progress"])


def truncate(path: Path, fraction: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])


def one_error_line(capsys, verb: str, *fragments: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith(f"rpt {verb}: error:") and "Traceback" not in err and err.count("\n") == 1, err
    for f in fragments:
        assert f in err, err
    return err


def test_checkpoints_record_sizes_and_sha256(run):
    files = json.loads((run["newest"] / "state.json").read_text())["files"]
    assert set(files) == set(ck.CHECKED_FILES)
    weights = run["newest"] / "model.safetensors"
    assert files["model.safetensors"] == {"bytes": weights.stat().st_size, "sha256": ck.sha256_file(weights)}


def test_eval_of_a_run_skips_a_truncated_newest_checkpoint(run, tmp_path, capsys):
    truncate(run["newest"] / "model.safetensors", 0.5)
    with pytest.warns(RPTWarning, match="damaged checkpoint skipped: .*step_00000004/model.safetensors.*cut short"):
        assert evaluate(run, run["out"], tmp_path) == 0
    assert json.loads((tmp_path / "r.json").read_text())["checkpoint"].endswith("step_00000002")


def test_eval_of_a_damaged_checkpoint_named_explicitly_is_one_line(run, tmp_path, capsys):
    truncate(run["newest"] / "model.safetensors", 0.5)
    assert evaluate(run, run["newest"], tmp_path) == 2
    one_error_line(capsys, "eval", "step_00000004/model.safetensors", "cut short")
    assert evaluate(run, run["newest"] / "model.safetensors", tmp_path) == 2
    one_error_line(capsys, "eval", "cut short")
    assert not (tmp_path / "r.json").exists()


def test_an_altered_file_of_the_same_size_is_caught_by_its_sha256(run, tmp_path, capsys):
    weights = run["newest"] / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF  # a flipped byte inside the last tensor: safetensors itself would load it without complaint
    weights.write_bytes(bytes(data))
    assert evaluate(run, run["newest"], tmp_path) == 2
    one_error_line(capsys, "eval", "sha256", "altered")


def test_the_shared_model_loader_skips_a_damaged_newest_checkpoint(run):
    """generate, explore and the checkpoint scorer load through ck.load_model: the same fallback and refusal."""
    (run["newest"] / "model.safetensors").write_bytes(b"")
    with pytest.warns(RPTWarning, match="step_00000004"):
        model, cfg = ck.load_model(run["out"])
        assert cfg.model.variant == "xl" and ck.resolve_checkpoint(run["out"]).name == "step_00000002"
    with pytest.raises(ck.DamagedCheckpoint, match="step_00000004/model.safetensors has 0 bytes"):
        ck.load_model(run["newest"])


def test_resume_skips_a_damaged_newest_checkpoint_and_redoes_its_steps(run, capsys):
    (run["newest"] / "optimizer.pt").write_bytes(b"")  # emptied: a disk that filled up while saving
    with pytest.warns(RPTWarning, match="step_00000004.*optimizer.pt"):
        assert main([*run["args"], "--steps", "6"]) == 0
    assert "trained xl to step 6" in capsys.readouterr().out
    assert [p.name for p in ck.list_checkpoints(run["out"])] == ["step_00000002", "step_00000004", "step_00000006"]
    ck.verify(run["newest"])  # step 4 was redone and saved afresh
    steps = [json.loads(x)["step"] for x in (run["out"] / "log.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_resume_with_every_checkpoint_damaged_is_refused(run, capsys):
    for p in ck.list_checkpoints(run["out"]):
        truncate(p / "rng.pt", 0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RPTWarning)
        assert main([*run["args"], "--steps", "6"]) == 2
    one_error_line(capsys, "train", "every checkpoint of", "is damaged", "rng.pt")


def test_a_checkpoint_without_checksums_that_fails_to_parse_is_one_line(run, tmp_path, capsys):
    """Checkpoints written before checksums were recorded: the parse error itself is reported, naming the file."""
    state = json.loads((run["newest"] / "state.json").read_text())
    del state["files"]
    (run["newest"] / "state.json").write_text(json.dumps(state))
    truncate(run["newest"] / "model.safetensors", 0.5)
    assert evaluate(run, run["newest"], tmp_path) == 2
    one_error_line(capsys, "eval", "step_00000004/model.safetensors cannot be read as safetensors")


def test_resume_skips_a_torn_last_log_line(run, capsys):
    log = run["out"] / "log.jsonl"
    with open(log, "a") as f:
        f.write('{"step": 5, "lm_lo')  # killed while writing the line of step 5
    with pytest.warns(RPTWarning, match="log.jsonl: skipping its torn last line 5"):
        assert main([*run["args"], "--steps", "6"]) == 0
    steps = [json.loads(x)["step"] for x in log.read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_a_bad_line_inside_the_log_names_the_file_and_line(run, capsys):
    log = run["out"] / "log.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join([lines[0], "garbage", *lines[1:]]) + "\n")
    assert main([*run["args"], "--steps", "6"]) == 2
    one_error_line(capsys, "train", "log.jsonl: line 2 is not a JSON object")


def test_our_warnings_print_as_one_line():
    _one_line_warnings()
    text = warnings.formatwarning("skipping x", RPTWarning, "f.py", 3)
    assert text == "rpt: warning: skipping x\n"
    assert "f.py" in warnings.formatwarning("other", UserWarning, "f.py", 3)


# --------------------------------------------------------------------------------------------------------------
# a step that cannot fit in memory is refused before anything is built


def test_a_sequence_too_long_for_memory_is_refused_with_the_estimate(tmp_path, capsys):
    root = tmp_path / "store"
    make_store(root / "train", [160, 192])
    out = tmp_path / "huge"
    small = [a for a in SMALL if a not in ("--seq-len", "64")]
    args = ["train", "--preset", "tiny", "--variant", "xl", "--store", str(root), "--out", str(out), "--steps", "2",
            *small, "--set", "data.seq_len=100000000"]
    assert main(args) == 2
    one_error_line(capsys, "train", "data.seq_len=100,000,000", "GiB", "logits", "is available", "--no-memory-check")
    assert not (out / "checkpoints").exists()


def test_the_estimate_counts_the_model_and_grows_with_the_step():
    from rpt.config import RPTConfig
    from rpt.model.rpt import RPT
    from rpt.training.footprint import check_fits, estimate_step_memory
    from rpt.utils import UserError

    cfg = RPTConfig.from_preset("tiny", variant="rpt-sem", vocab_size=512)
    cfg.data.seq_len, cfg.train.loss_chunk = 1024, 1024  # the chunked loss (tiny's own default is the full logits)
    est = estimate_step_memory(cfg)
    assert est.parameters == RPT(cfg.model).num_parameters() and est.states == 16 * est.parameters
    assert est.retrieval > 0 and estimate_step_memory(RPTConfig.from_preset("tiny", variant="xl")).retrieval == 0
    cfg.data.seq_len *= 2
    doubled = estimate_step_memory(cfg)
    assert doubled.layers == 2 * est.layers and doubled.total > est.total
    # the chunked loss (default) holds [chunk, V] logits, not [B, T, V]: capped at train.loss_chunk tokens
    chunk_part = 4 * cfg.train.loss_chunk * 512
    assert doubled.logits == chunk_part + 4 * 512 * cfg.model.d_model
    cfg.train.loss_chunk = 0  # full logits: three fp32 [B, T, V] tensors, linear in batch and length
    full = estimate_step_memory(cfg)
    assert full.logits == 3 * 4 * cfg.train.batch_size * 2048 * 512
    cfg.train.batch_size *= 2
    assert estimate_step_memory(cfg).logits == 2 * full.logits
    doubled = estimate_step_memory(cfg)
    assert check_fits(cfg, "cpu", available=10 * doubled.total).total == estimate_step_memory(cfg).total
    with pytest.raises(UserError, match=r"train.batch_size=\d+.*is available"):
        check_fits(cfg, "cpu", available=doubled.total // 4)


def test_each_baseline_counts_its_own_layers_in_the_estimate():
    from rpt.config import RPTConfig
    from rpt.training.footprint import estimate_step_memory

    def layers(variant, **model):
        cfg = RPTConfig.from_preset("tiny", variant=variant, vocab_size=512, **model)
        cfg.data.seq_len = 2048
        return estimate_step_memory(cfg).layers

    xl = layers("xl")
    # the kNN layer keeps k retrieved values per query token: more k, more memory; the first two segments read none
    assert (xl < layers("memorizing", **{"memorizing.topk": 8}) < layers("memorizing")
            < layers("memorizing", **{"memorizing.topk": 64}))
    # the state cell grows with the number of state vectors
    assert (xl < layers("block-recurrent", **{"block_recurrent.state": 32})
            < layers("block-recurrent", **{"block_recurrent.state": 128}))
    # an all-attention Griffin is xl's layer count; recurrent blocks keep no [H, 2S] scores but 18 R elements a token
    assert layers("griffin", **{"griffin.pattern": "A"}) == xl
    assert layers("griffin", **{"griffin.pattern": "R"}) != xl and layers("griffin") != xl
    assert estimate_step_memory(RPTConfig.from_preset("tiny", variant="griffin")).retrieval == 0
