"""Faults met while running, each refused or reported in one line naming the file or key, never as a traceback:
a second writer of a run, label or store folder (an OS lock names the holder, and a killed holder leaves no stale
lock); a full disk while writing a checkpoint, token store or labels (saying what is intact); a config file with a
Python tag or broken YAML; a token store whose files disagree with its manifest; config numbers out of range."""

import errno
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from train_helpers import make_store  # noqa: E402

from rpt import checkpoint as ck  # noqa: E402
from rpt.cli import main  # noqa: E402
from rpt.config import ConfigError, RPTConfig  # noqa: E402
from rpt.data.store import StoreError, StoreWriter, TokenStore  # noqa: E402
from rpt.labels.store import LabelWriter  # noqa: E402
from rpt.locks import FolderBusy, folder_lock, lock_path  # noqa: E402
from rpt.utils import WriteFailed  # noqa: E402

RPT = str(Path(sys.executable).with_name("rpt"))
SMALL = ["--set", "model.chunk_size=8", "--set", "model.segment_len=16", "--seq-len", "64",
         "--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.mlp_hidden=64", "--set", "train.log_every=1",
         "--set", "train.checkpoint_every=2", "--set", "train.keep_last=0", "--no-progress"]


@pytest.fixture
def store(tmp_path) -> Path:
    root = tmp_path / "store"
    make_store(root / "train", [160, 192, 112, 64])
    return root


def train_args(store: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--preset", "tiny", "--variant", "xl", "--store", str(store), "--out", str(out), *SMALL, *extra]


def one_line(err: str, verb: str, *fragments: str) -> str:
    assert err.startswith(f"rpt {verb}: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for f in fragments:
        assert f in err, err
    return err


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`rpt args` in a fresh process (the installed console script), as a user runs it."""
    return subprocess.run([RPT, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})


# ------------------------------------------------------------------------------------------------------------------
# 1. one writer per folder


def test_a_second_train_into_a_run_folder_is_refused_naming_the_holder(store, tmp_path):
    out = tmp_path / "run"
    with folder_lock(out):  # this process holds the run folder, as a first `rpt train --out` would
        r = cli(*train_args(store, out, "--steps", "2"))
    assert r.returncode == 2, r.stderr
    one_line(r.stderr, "train", f"{out} is being written by process {os.getpid()} on host {socket.gethostname()}",
             "wait for it or stop it")
    assert not (out / "checkpoints").exists()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    folder = tmp_path / "run"
    code = ("import sys, time; from rpt.locks import folder_lock\n"
            "with folder_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderBusy, match=rf"is being written by process {holder.pid} on host .*-c"):
            with folder_lock(folder):
                pass
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert lock_path(folder).exists()  # the killed holder's file stays, but no one holds it
    with folder_lock(folder):  # free at once
        assert json.loads(lock_path(folder).read_text())["pid"] == os.getpid()
    assert not lock_path(folder).exists()  # a holder that lets go removes its file


def test_train_releases_its_lock_and_a_second_run_resumes(store, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(train_args(store, out, "--steps", "4", "--stop-after", "2")) == 0
    assert main(train_args(store, out, "--steps", "4")) == 0  # the first run's lock is gone
    assert [p.name for p in ck.list_checkpoints(out)] == ["step_00000002", "step_00000004"]


def test_a_label_folder_being_written_is_refused(tmp_path, capsys):
    from rpt.labels.pipeline import LabelSpec, label_split

    root = tmp_path / "store"
    make_store(root / "train", [160, 192])
    labels = tmp_path / "labels"
    spec = LabelSpec(kind="lex", span=None, k=2, chunk_size=8, segment_len=16)
    with folder_lock(labels, "labelled"):
        with pytest.raises(FolderBusy, match=rf"{labels} is being labelled by process {os.getpid()}"):
            label_split(TokenStore.open(root / "train"), labels, spec, progress=False)
    assert not labels.exists() and not (tmp_path / ".labels.partial").exists()
    label_split(TokenStore.open(root / "train"), labels, spec, progress=False)  # free again
    assert (labels / "manifest.json").exists()


def test_a_store_being_built_is_refused(tmp_path, capsys):
    (tmp_path / "docs" / "train").mkdir(parents=True)
    (tmp_path / "docs" / "train" / "a.txt").write_text("alpha beta gamma " * 40)
    out = tmp_path / "data"
    with folder_lock(out, "built"):
        assert main(["prepare", "--corpus", str(tmp_path / "docs"), "--tokenizer", "bpe:300", "--out", str(out),
                     "--chunk-size", "8"]) == 2
    one_line(capsys.readouterr().err, "prepare", f"{out} is being built by process {os.getpid()}")
    assert not out.exists()


# ------------------------------------------------------------------------------------------------------------------
# 2. a full disk


def enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("writer", ["safetensors", "safetensors-wrapped", "torch", "eio"])
def test_a_full_disk_while_checkpointing_names_the_file_and_the_last_complete_checkpoint(store, tmp_path, capsys,
                                                                                          monkeypatch, writer):
    out = tmp_path / "run"
    assert main(train_args(store, out, "--steps", "2")) == 0
    capsys.readouterr()
    if writer == "safetensors":
        monkeypatch.setattr(ck, "save_file", enospc)
    elif writer == "safetensors-wrapped":  # what safetensors itself raises on a full disk
        from safetensors import SafetensorError

        def wrapped(*args, **kwargs):
            raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                                  '"No space left on device" })')
        monkeypatch.setattr(ck, "save_file", wrapped)
    elif writer == "torch":  # the optimizer state, after the weights went through
        def torch_save(obj, path, *a, **k):
            raise RuntimeError(f"[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0: {path}: "
                               "No space left on device")
        monkeypatch.setattr(ck.torch, "save", torch_save)
    else:
        def eio(*args, **kwargs):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        monkeypatch.setattr(ck, "save_file", eio)
    assert main(train_args(store, out, "--steps", "4")) == 2
    err = capsys.readouterr().err
    file = "optimizer.pt" if writer == "torch" else "model.safetensors"
    cause = "OSError: [Errno 5] Input/output error" if writer == "eio" else "no space left on device"
    one_line(err, "train", f"{cause} writing {out / 'checkpoints' / '.step_00000004.tmp' / file}",
             f"the last complete checkpoint is step 2 ({out / 'checkpoints' / 'step_00000002'})")
    monkeypatch.undo()
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_00000002"]  # no half-written folder left
    ck.verify(out / "checkpoints" / "step_00000002")  # intact
    assert main(train_args(store, out, "--steps", "4")) == 0  # space freed: resumes from step 2


def test_a_full_disk_before_any_checkpoint_says_none_is_complete(store, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(ck, "save_file", enospc)
    assert main(train_args(store, tmp_path / "run", "--steps", "2")) == 2
    one_line(capsys.readouterr().err, "train", "no space left on device writing", "no checkpoint of this run was complete yet")


def test_a_full_disk_while_writing_a_token_store_leaves_no_store(tmp_path, monkeypatch):
    path = tmp_path / "train"
    w = StoreWriter(path, {"name": "t", "hash": "h", "vocab_size": 64}, 8)
    w.add("d0", np.arange(16))
    monkeypatch.setattr("rpt.data.store.np.save", enospc)
    with pytest.raises(WriteFailed, match=r"^no space left on device writing .*\.train\.partial/offsets\.npy; "
                                          rf"{path} is unchanged"):
        w.close()
    assert not path.exists()

    class FullFile:
        name = str(tmp_path / ".other.partial" / "tokens.bin")

        def write(self, data):
            enospc()

        def close(self):
            pass

    w = StoreWriter(tmp_path / "other", {"name": "t", "hash": "h", "vocab_size": 64}, 8)
    w._bin = FullFile()
    with pytest.raises(WriteFailed, match=r"no space left on device writing .*\.other\.partial/tokens\.bin"):
        w.add("d0", np.arange(16))


def test_a_full_disk_while_labelling_keeps_the_documents_done(tmp_path, monkeypatch):
    import rpt.labels.store as ls

    path = tmp_path / "labels"
    chunks = np.array([2, 3])
    config = {"kind": "lex", "k": 2}
    rows = [np.full((n, 2), -1, np.int32) for n in chunks]
    w = LabelWriter(path, config, (0, 2), chunks, 2)
    w.write(0, rows[0], np.full((2, 2), np.nan, np.float32), np.full((2, 2), np.nan, np.float32), {})
    monkeypatch.setattr(ls, "_fsync_json", enospc)
    with pytest.raises(WriteFailed, match=r"^no space left on device writing .*progress\.json; the documents that .* "
                                          r"records as done are kept: free space and run `rpt label` again to resume"):
        w.write(1, rows[1], np.full((3, 2), np.nan, np.float32), np.full((3, 2), np.nan, np.float32), {})
    monkeypatch.undo()
    assert LabelWriter(path, config, (0, 2), chunks, 2).next_doc == 1  # resumes after the durable document

    # the arrays are allocated up front: a disk too small for them fails at once, not with a SIGBUS later
    monkeypatch.setattr(ls.os, "posix_fallocate", enospc)
    with pytest.raises(WriteFailed, match=r"no space left on device writing .*\.fresh\.partial/candidates\.npy; "
                                          "no labels were written yet"):
        LabelWriter(tmp_path / "fresh", config, (0, 2), chunks, 2)


# ------------------------------------------------------------------------------------------------------------------
# 3. config files


def test_a_config_with_a_python_tag_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran"
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"preset: tiny\ntrain: !!python/object/apply:os.system ['touch {marker}']\n")
    r = cli("train", "--config", str(bad), "--store", str(tmp_path), "--out", str(tmp_path / "run"))
    assert r.returncode == 2, r.stderr
    one_line(r.stderr, "train", f"--config {bad}: the tag !!python/object/apply:os.system at line 2", "not allowed")
    assert not marker.exists()
    with pytest.raises(ConfigError, match=rf"^config {bad}: the tag !!python/object/apply:os.system at line 2"):
        RPTConfig.from_yaml(bad)


@pytest.mark.parametrize("text", ["train: {lr: 1\n", "train:\n  lr: 1\n lr: 2\n", "a: b: c\n"])
def test_a_config_that_is_not_yaml_names_the_file_and_line(tmp_path, capsys, text):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    assert main(["train", "--config", str(bad), "--out", str(tmp_path / "run")]) == 2
    one_line(capsys.readouterr().err, "train", f"--config {bad} is not valid YAML", "at line")
    with pytest.raises(ConfigError, match=rf"^config {bad} is not valid YAML: .* at line \d+, column \d+$"):
        RPTConfig.from_yaml(bad)


def test_a_set_value_that_is_not_yaml_names_the_flag(store, tmp_path, capsys):
    assert main(train_args(store, tmp_path / "run", "--set", "model.cca_layers=[2,3")) == 2
    one_line(capsys.readouterr().err, "train", "--set model.cca_layers=[2,3 is not valid YAML")


# ------------------------------------------------------------------------------------------------------------------
# 4. a token store that disagrees with its manifest


def damage(split: Path, how: str) -> str:
    """Damage a store split; returns the file the refusal must name."""
    if how == "truncated":
        data = (split / "tokens.bin").read_bytes()
        (split / "tokens.bin").write_bytes(data[: len(data) // 2])
        return "tokens.bin is damaged"
    if how == "longer":
        with open(split / "tokens.bin", "ab") as f:
            f.write(b"\0" * 10)
        return "tokens.bin is damaged"
    if how == "offsets":
        offsets = np.load(split / "offsets.npy")
        offsets[-1] += 8
        np.save(split / "offsets.npy", offsets)
        return "offsets.npy is damaged"
    if how == "decreasing":
        offsets = np.load(split / "offsets.npy")
        offsets[1], offsets[2] = offsets[2], offsets[1]
        np.save(split / "offsets.npy", offsets)
        return "offsets.npy is damaged"
    if how == "offsets-torn":
        (split / "offsets.npy").write_bytes((split / "offsets.npy").read_bytes()[:20])
        return "offsets.npy is damaged"
    if how == "documents":
        lines = (split / "documents.jsonl").read_text().splitlines()
        (split / "documents.jsonl").write_text("\n".join(lines[:-1]) + "\n")
        return "documents.jsonl is damaged"
    (split / "manifest.json").write_text('{"format_version": 1, "dtype"')
    return "manifest.json is damaged"


@pytest.mark.parametrize("how", ["truncated", "longer", "offsets", "decreasing", "offsets-torn", "documents", "manifest"])
def test_a_damaged_token_store_is_refused_naming_the_file_and_the_cure(store, tmp_path, capsys, how):
    says = damage(store / "train", how)
    with pytest.raises(StoreError, match=rf"{store / 'train'}/{says}.*rpt prepare"):
        TokenStore.open(store / "train")
    assert main(train_args(store, tmp_path / "run", "--vocab-size", "64", "--steps", "2")) == 2
    one_line(capsys.readouterr().err, "train", f"{store / 'train'}/{says}", "rebuild it with `rpt prepare --force`")


def test_a_truncated_store_says_how_many_bytes_are_missing(store, tmp_path, capsys):
    """Without --vocab-size (the store's is read first); the installed console script's own one-line errors are those
    of the python-tag and second-writer tests above."""
    damage(store / "train", "truncated")
    assert main(train_args(store, tmp_path / "run", "--steps", "2")) == 2
    err = capsys.readouterr().err
    one_line(err, "train", f"{store / 'train' / 'tokens.bin'} is damaged", "bytes where", "rpt prepare")
    assert "mmap length" not in err


# ------------------------------------------------------------------------------------------------------------------
# 5. config numbers out of range


@pytest.mark.parametrize("setting, key", [
    ("train.lr=-1", "train.lr must be > 0"), ("train.lr=0", "train.lr must be > 0"), ("train.lr=.nan", "train.lr"),
    ("train.steps=0", "train.steps must be >= 1"), ("train.batch_size=0", "train.batch_size must be >= 1"),
    ("train.grad_accum=-2", "train.grad_accum"), ("train.warmup_steps=-1", "train.warmup_steps must be >= 0"),
    ("train.min_lr_ratio=2", "train.min_lr_ratio must be in [0, 1]"), ("train.betas=[0.9]", "train.betas"),
    ("train.betas=[0.9, 1.5]", "train.betas"), ("train.weight_decay=-1", "train.weight_decay"),
    ("train.ss_fraction=1.5", "train.ss_fraction"), ("train.checkpoint_every=0", "train.checkpoint_every"),
    ("train.keep_last=-1", "train.keep_last"), ("model.dropout=1", "model.dropout=1"),
    ("model.n_heads=0", "model.n_heads must be >= 1"), ("model.n_heads=3", "not divisible by model.n_heads=3"),
    ("model.segment_len=12", "model.segment_len=12 is not a multiple of model.chunk_size=8"),
    ("model.init_std=0", "model.init_std must be > 0"), ("model.gate.eta=1", "model.gate.eta"),
    ("eval.n_neighbors=0", "eval.n_neighbors must be in [1, 16]"), ("data.seq_len=0", "data.seq_len"),
])
def test_config_values_out_of_range_are_refused_with_their_key(store, tmp_path, capsys, setting, key):
    out = tmp_path / "run"
    assert main(train_args(store, out, "--set", setting)) == 2
    one_line(capsys.readouterr().err, "train", key)
    assert not out.exists()


def test_a_negative_learning_rate_flag_is_refused_before_the_optimiser(store, tmp_path, capsys):
    assert main(train_args(store, tmp_path / "run", "--lr", "-1")) == 2
    err = capsys.readouterr().err
    one_line(err, "train", "train.lr must be > 0, not -1.0")
    assert "Invalid learning rate" not in err and not (tmp_path / "run").exists()


def test_every_preset_is_in_range():
    from rpt.config import PRESETS

    for name in PRESETS:
        RPTConfig.from_preset(name)
