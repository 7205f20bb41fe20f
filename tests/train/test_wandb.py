"""W&B logging beside log.jsonl (train.wandb, rpt.training.tracking): offline without a login or with WANDB_MODE=offline,
online falling back to offline when W&B cannot be reached, a missing package refused before training starts."""

import json
import sys
import time
import types
import warnings

import pytest
from train_helpers import tiny_config

from rpt.cli import main
from rpt.training import tracking
from rpt.training.loop import train
from rpt.utils import RPTWarning, UserError


@pytest.fixture
def no_login(monkeypatch, tmp_path):
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))


def test_the_mode(no_login, monkeypatch, tmp_path):
    assert tracking.wandb_mode() == "offline"  # no login: offline, never a prompt
    monkeypatch.setenv("WANDB_MODE", "online")
    with pytest.warns(RPTWarning, match="no W&B login"):
        assert tracking.wandb_mode() == "offline"
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password k\n")
    monkeypatch.setenv("NETRC", str(netrc))
    assert tracking.wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert tracking.wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert tracking.wandb_mode() == "disabled"
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_API_KEY", "k")
    assert tracking.wandb_mode() == "online"


class FakeRun:
    def __init__(self, mode):
        self.mode, self.rows, self.finished = mode, [], False

    def define_metric(self, *args, **kwargs):
        pass

    def log(self, row):
        self.rows.append(row)

    def finish(self):
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch):
    """A stand-in wandb module whose online start fails, as when W&B cannot be reached."""
    calls = []

    def init(mode, settings, **kwargs):
        calls.append({"mode": mode, **kwargs})
        if mode == "online":
            raise TimeoutError("connection to api.wandb.ai timed out")
        calls[-1]["run"] = FakeRun(mode)
        return calls[-1]["run"]

    module = types.SimpleNamespace(init=init, Settings=lambda **kw: kw)
    monkeypatch.setitem(sys.modules, "wandb", module)
    return calls


def test_unreachable_wandb_falls_back_to_offline_and_a_resumed_run_keeps_its_id(corpus, fake_wandb, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "k")  # "logged in": online is tried first
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = tiny_config(corpus["tmp"], "xl", steps=3, wandb=True, wandb_project="proj")
    with pytest.warns(RPTWarning, match="W&B could not be reached .*timed out.*logging offline"):
        train(cfg, corpus["root"], None, progress=False, memory_check=False, stop_after=2)
    assert [c["mode"] for c in fake_wandb] == ["online", "offline"] and fake_wandb[1]["project"] == "proj"
    run = fake_wandb[1]["run"]
    log = [json.loads(x) for x in (corpus["tmp"] / "run" / "log.jsonl").read_text().splitlines()]
    assert run.rows == log and run.finished  # the scalars of log.jsonl, row by row
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RPTWarning)
        train(cfg, corpus["root"], None, progress=False, memory_check=False)
    assert fake_wandb[3]["id"] == fake_wandb[1]["id"] and fake_wandb[3]["resume"] == "allow"
    assert [r["step"] for r in fake_wandb[3]["run"].rows] == [3]


def test_a_missing_package_is_one_line_before_training(corpus, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    cfg = tiny_config(corpus["tmp"], "xl", steps=2, wandb=True)
    with pytest.raises(UserError, match=r"train.wandb needs the wandb package.*pip install 'rpt\[wandb\]'"):
        train(cfg, corpus["root"], None, progress=False, memory_check=False)
    assert not (corpus["tmp"] / "run" / "log.jsonl").exists()
    argv = ["train", "--preset", "tiny", "--variant", "xl", "--store", str(corpus["root"]), "--steps", "1", "--wandb",
            "--out", str(corpus["tmp"] / "cli"), "--no-progress", "--seq-len", "64", "--set", "model.chunk_size=8",
            "--set", "model.segment_len=16"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("rpt train: error: train.wandb needs") and err.count("\n") == 1


@pytest.mark.slow  # 3 s: a run logged through the real wandb package offline
def test_an_offline_run_holds_the_scalars(corpus, no_login, monkeypatch, tmp_path):
    """A real wandb, offline: a two-step run writes an offline W&B run holding each row's scalars."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    (tmp_path / "wb").mkdir()
    cfg = tiny_config(corpus["tmp"], "xl", steps=2, wandb=True)
    train(cfg, corpus["root"], None, progress=False, memory_check=False)
    run_id = json.loads((corpus["tmp"] / "run" / "wandb.json").read_text())["id"]
    files = list((tmp_path / "wb" / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(files) == 1
    rows = [json.loads(x) for x in (corpus["tmp"] / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    wanted = [(key, json.dumps(row[key])) for row in rows for key in ("lm_loss", "grad_norm", "tokens_per_s", "lr")]
    # wandb's service process may still be writing the file when finish() has returned: wait for it, briefly
    deadline = time.monotonic() + 30
    while True:
        data = files[0].read_bytes()  # the run's records; each scalar is stored as its JSON text
        if all(k.encode() in data and v.encode() in data for k, v in wanted) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for key, value in wanted:
        assert key.encode() in data and value.encode() in data, key
