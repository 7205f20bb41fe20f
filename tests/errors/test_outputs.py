"""Nothing a user gives is lost: every verb that writes checks its output before any work (rpt/outputs.py).

Each data-loss case asserts that the user's files are byte-identical after the refusal, with and without --force /
--overwrite. Then: a resumed run says what it resumes and refuses changed settings; SIGINT during training writes a
checkpoint; readers that cannot hang or blow up; strict JSON; the public API names a wrongly typed argument."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from train_helpers import make_store  # noqa: E402

from rpt import checkpoint as ck  # noqa: E402
from rpt import outputs  # noqa: E402
from rpt.cli import main  # noqa: E402
from rpt.data.corpora import JsonlCorpus, TextFolderCorpus  # noqa: E402

SMALL = ["--set", "model.chunk_size=8", "--set", "model.segment_len=16", "--seq-len", "64",
         "--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.mlp_hidden=64", "--set", "train.log_every=1",
         "--set", "train.checkpoint_every=2", "--set", "train.keep_last=0", "--no-progress"]
LABEL = ["--split", "train", "--kind", "lex", "--span", "64", "--segment-len", "16", "--k", "2", "--no-progress"]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (its relative path -> bytes): compared before and after a refused command."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(capsys, argv: list, *says: str) -> str:
    """`rpt argv` exits 2 with exactly one line on stderr holding each of `says`."""
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"rpt {argv[0]}: error: "), err
    for s in says:
        assert s in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def store(tmp_path) -> Path:
    root = tmp_path / "store"
    make_store(root / "train", [160, 192, 112, 64])
    return root


@pytest.fixture
def mine(tmp_path) -> Path:
    """A folder of the user's: files, a subfolder, names a verb also writes (train/, manifest.json, config.json)."""
    folder = tmp_path / "mine"
    (folder / "train").mkdir(parents=True)
    (folder / "notes.txt").write_text("my notes")
    (folder / "train" / "a.txt").write_text("my text " * 50)
    (folder / "manifest.json").write_text('{"mine": true}')
    (folder / "config.json").write_text('{"model_type": "llama"}')
    return folder


def train_args(store: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--preset", "tiny", "--variant", "xl", "--store", str(store), "--out", str(out), *SMALL, *extra]


# ------------------------------------------------------------------------------------------------------------------
# 1. a folder of the user's is never written into, --force or not


@pytest.mark.parametrize("extra", [[], ["--overwrite"]])
def test_label_never_replaces_a_folder_of_the_users(store, mine, capsys, extra):
    before = snapshot(mine)
    refused(capsys, ["label", "--store", store, "--out", mine, *LABEL, *extra], "--out", "did not write", "notes.txt")
    assert snapshot(mine) == before


@pytest.mark.parametrize("out", ["store", "parent", "split"])
def test_label_never_writes_over_its_store(store, tmp_path, capsys, out):
    target = {"store": store, "parent": tmp_path, "split": store / "train" / "x"}[out]
    before = snapshot(tmp_path)
    refused(capsys, ["label", "--store", store, "--out", target, *LABEL, "--overwrite"], "--out")
    assert snapshot(tmp_path) == before


def test_label_max_documents_zero_is_refused(store, tmp_path, capsys):
    refused(capsys, ["label", "--store", store, "--out", tmp_path / "l", *LABEL, "--max-documents", "0"],
            "--max-documents 0")
    assert not (tmp_path / "l").exists()


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_prepare_never_writes_over_its_corpus_or_a_folder_of_the_users(mine, tmp_path, capsys, force):
    corpus = tmp_path / "books"
    (corpus / "train").mkdir(parents=True)
    for i in range(3):
        (corpus / "train" / f"b{i}.txt").write_text(f"book {i} " + "words and more words " * 200)
    before, theirs = snapshot(corpus), snapshot(mine)
    base = ["prepare", "--corpus", corpus, "--tokenizer", "bpe:300", "--chunk-size", "8", "--no-progress", *force]
    refused(capsys, [*base, "--out", corpus], "--out", "--corpus", "an input")
    refused(capsys, [*base, "--out", corpus / "store"], "--out", "inside --corpus")
    refused(capsys, [*base, "--out", tmp_path], "--out", "--corpus")
    refused(capsys, [*base, "--out", mine], "--out", "did not write")
    assert snapshot(corpus) == before and snapshot(mine) == theirs


def test_prepare_force_replaces_its_own_store(tmp_path, capsys):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"doc {i} " + "alpha beta gamma " * 80}) + "\n" for i in range(8)))
    base = ["prepare", "--corpus", corpus, "--tokenizer", "bpe:280", "--chunk-size", "8", "--no-progress",
            "--out", tmp_path / "s"]
    assert main([str(a) for a in base]) == 0
    assert outputs.read_mark(tmp_path / "s")["verb"] == "prepare"
    assert main([str(a) for a in base] + ["--force"]) == 0
    (tmp_path / "s" / "mine.txt").write_text("mine")  # a file of the user's inside: now the folder is refused
    refused(capsys, [*base, "--force"], "did not write", "mine.txt")
    assert (tmp_path / "s" / "mine.txt").read_text() == "mine"


def test_train_never_writes_into_a_folder_of_the_users_nor_over_its_store(store, mine, tmp_path, capsys):
    before, theirs = snapshot(store), snapshot(mine)
    refused(capsys, train_args(store, mine, "--steps", "2"), "--out", "did not write")
    refused(capsys, train_args(store, store, "--steps", "2"), "--out", "--store")
    refused(capsys, train_args(store, tmp_path, "--steps", "2"), "--out", "--store")
    assert snapshot(store) == before and snapshot(mine) == theirs


@pytest.fixture
def run(store, tmp_path) -> Path:
    out = tmp_path / "run"
    assert main(train_args(store, out, "--steps", "2")) == 0
    return out


def test_export_never_writes_over_the_run_it_exports_nor_a_folder_of_the_users(run, mine, tmp_path, capsys):
    before, theirs = snapshot(run), snapshot(mine)
    refused(capsys, ["export", run, "--out", run, "--force"], "--out", "an input")
    refused(capsys, ["export", run / "checkpoints" / "step_00000002", "--out", run, "--force"], "--out", "holds")
    refused(capsys, ["export", run, "--out", run / "hf"], "--out", "inside")
    refused(capsys, ["export", run, "--out", mine, "--force"], "--out", "did not write")
    assert snapshot(run) == before and snapshot(mine) == theirs
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    refused(capsys, ["export", run, "--out", tmp_path / "hf"], "--force")  # its own export: replaced when asked
    assert main(["export", str(run), "--out", str(tmp_path / "hf"), "--force"]) == 0


def test_a_missing_checkpoint_lists_those_that_exist(run, tmp_path, capsys):
    refused(capsys, ["export", run / "checkpoints" / "step_50", "--out", tmp_path / "hf"], "step_00000002")


@pytest.mark.parametrize("verb", ["eval", "generate", "train", "label", "prepare", "export"])
def test_an_output_under_a_file_is_refused_before_any_work(run, store, tmp_path, capsys, verb):
    afile = tmp_path / "afile"
    afile.write_text("x")
    argv = {
        "eval": ["eval", "--checkpoint", run, "--store", store, "--split", "train", "--out", afile / "r.json"],
        "generate": ["generate", "--checkpoint", run, "--prompt", "a", "--json", afile / "g.json"],
        "train": train_args(store, afile / "run", "--steps", "2"),
        "label": ["label", "--store", store, "--out", afile / "l", *LABEL],
        "prepare": ["prepare", "--corpus", "stdlib:json", "--out", afile / "s"],
        "export": ["export", run, "--out", afile / "hf"],
    }[verb]
    t0 = time.perf_counter()
    refused(capsys, argv, "afile is a file, not a folder")
    assert afile.read_text() == "x" and time.perf_counter() - t0 < 20


def test_eval_and_generate_replace_only_files_rpt_wrote(run, store, tmp_path, capsys):
    theirs = tmp_path / "r.json"
    theirs.write_text('{"mine": 1}')
    refused(capsys, ["eval", "--checkpoint", run, "--store", store, "--split", "train", "--out", theirs],
            "not written by rpt")
    refused(capsys, ["generate", "--checkpoint", run, "--prompt", "a", "--json", theirs], "not written by rpt")
    assert theirs.read_text() == '{"mine": 1}'


def test_an_unwritable_folder_is_refused_before_any_work(store, tmp_path, capsys, monkeypatch):
    # the tests may run as root, for whom permissions do not hold: the check itself is what is tested
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(outputs.os, "access", lambda p, mode: False if Path(p) == locked else real(p, mode))
    refused(capsys, train_args(store, locked / "run", "--steps", "2"), "is not writable")
    refused(capsys, ["label", "--store", store, "--out", locked, *LABEL], "is not writable")
    assert list(locked.iterdir()) == []


# ------------------------------------------------------------------------------------------------------------------
# 2. resume says what it does


def test_resume_names_its_step_and_refuses_changed_settings(store, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(train_args(store, out, "--steps", "4", "--stop-after", "2")) == 0
    capsys.readouterr()
    config = (out / "config.yaml").read_bytes()
    refused(capsys, train_args(store, out, "--steps", "4", "--lr", "0.5"), "train.lr", "--allow-changes")
    assert (out / "config.yaml").read_bytes() == config and [p.name for p in ck.list_checkpoints(out)] == ["step_00000002"]
    assert main(train_args(store, out, "--steps", "6", "--stop-after", "2")) == 0  # more steps: named, not refused
    said = capsys.readouterr().out
    assert "resuming" in said and "from step 2 of 6" in said and "train.steps 4 -> 6" in said
    assert main(train_args(store, out, "--steps", "6", "--lr", "0.5", "--allow-changes")) == 0
    text = (out / "config.yaml").read_text()
    assert "# from step 4: train.lr" in text and "0.5" in text  # never claims lr 0.5 for the updates before step 4
    history = json.loads((out / "changes.json").read_text())
    assert [h["from_step"] for h in history] == [2, 4]


def test_sigint_during_training_writes_a_checkpoint(store, tmp_path):
    from rpt.api import train_config
    from rpt.training.loop import TrainingInterrupted, train

    cfg = train_config("tiny", store, tmp_path / "run", variant="xl", steps=50, seq_len=64, **{
        "model.chunk_size": 8, "model.segment_len": 16, "model.d_model": 32, "model.n_heads": 2,
        "model.mlp_hidden": 64, "train.checkpoint_every": 100})

    def on_step(step: int, metrics: dict) -> None:
        if step == 3:  # arrives after update 3: training stops after the update it interrupts, the 4th
            os.kill(os.getpid(), signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN in a shell's background job
    with pytest.raises(TrainingInterrupted, match="stopped at step 4 of 50; checkpoint .*step_00000004"):
        train(cfg, progress=False, on_step=on_step)
    assert [p.name for p in ck.list_checkpoints(tmp_path / "run")] == ["step_00000004"]
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back


@pytest.mark.slow  # seconds to tens of seconds: -m slow runs it
def test_sigint_to_rpt_train_exits_130_with_a_checkpoint(store, tmp_path):
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "rpt.cli", *train_args(store, out, "--steps", "100000",
                                                          "--set", "train.checkpoint_every=100000")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    try:
        deadline = time.time() + 90
        while time.time() < deadline and not ((out / "log.jsonl").is_file() and (out / "log.jsonl").read_text()):
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "run the same command to resume" in err
    assert len(ck.list_checkpoints(out)) == 1


# ------------------------------------------------------------------------------------------------------------------
# 3. readers


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path, capsys):
    bomb = tmp_path / "bomb.yaml"
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for name, prev in zip("bcdefgh", "abcdefg", strict=True):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    bomb.write_text("\n".join(lines) + "\n")
    t0 = time.perf_counter()
    refused(capsys, ["train", "--config", bomb, "--print-config"], "alias")
    assert time.perf_counter() - t0 < 5


def test_config_errors_show_values_cut_short(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("preset: tiny\ntrain:\n  lr: " + "x" * 5000 + "\n")
    line = refused(capsys, ["train", "--config", cfg, "--print-config"], "train.lr")
    assert len(line) < 400


def test_jsonl_reader_counts_any_bad_line_and_accepts_a_bom(tmp_path):
    path = tmp_path / "c.jsonl"
    docs = [json.dumps({"text": f"doc {i}", "split": "train"}) for i in range(3)]
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join([docs[0], "[" * 100000, docs[1], "{not json", docs[2]]).encode())
    from rpt.data.documents import Skips

    skips = Skips()
    corpus = JsonlCorpus(path)
    got = [d.text for d in corpus.documents("train", skips)]
    for split in ("validation", "test"):  # a bad line is counted once, in the split its <file>:<line> hashes to
        list(corpus.documents(split, skips))
    assert got == ["doc 0", "doc 1", "doc 2"] and skips.counts["bad_json"] == 2


def test_a_folder_corpus_reads_each_real_folder_once(tmp_path):
    root = tmp_path / "corpus"
    (root / "train" / "sub").mkdir(parents=True)
    for i in range(3):
        (root / "train" / f"{i}.txt").write_text(f"text {i}")
        (root / "train" / "sub" / f"{i}.txt").write_text(f"more {i}")
    (root / "train" / "up").symlink_to("..")  # a loop
    (root / "train" / "again").symlink_to("sub")  # a second name for one folder
    docs = list(TextFolderCorpus(root).documents("train"))
    assert len(docs) == 6


@pytest.mark.slow  # seconds to tens of seconds: -m slow runs it
def test_a_closed_stdout_ends_quietly(tmp_path):
    cmd = f"{sys.executable} -m rpt.cli train --preset tiny --print-config | head -c 10 > /dev/null"
    res = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd}"], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr, res.stderr


# ------------------------------------------------------------------------------------------------------------------
# 4. strict JSON, Python callers


def test_json_is_strict(tmp_path):
    from rpt.utils import write_json_atomic

    write_json_atomic(tmp_path / "r.json", {"a": float("nan"), "b": [float("-inf"), 1.5], "c": np.float32(2.0)})
    obj = json.loads((tmp_path / "r.json").read_text(), parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))
    assert obj == {"a": None, "b": [None, 1.5], "c": 2.0}
    assert not math.isnan(obj["c"])


@pytest.mark.parametrize("kwargs, says", [({"max_new_tokens": "3"}, "max_new_tokens='3': expected int, got str"),
                                          ({"prompt": b"bytes"}, "prompt=b'bytes': expected str"),
                                          ({"greedy": 1}, "greedy=1: expected bool")])
def test_api_arguments_of_the_wrong_type_are_named(run, kwargs, says):
    import rpt

    model = rpt.load(run)
    args = {"prompt": "a b c", **kwargs}
    with pytest.raises(TypeError, match=says.replace("(", r"\(").replace("[", r"\[")):
        model.generate(args.pop("prompt"), **args)


def test_a_checkpoint_rotated_away_while_it_is_read_is_read_again(run, monkeypatch):
    calls = []
    real = ck._load_model

    def vanishing(path, device, memory_tokens):
        calls.append(path)
        if len(calls) == 1:
            raise FileNotFoundError("step_00000002/model.safetensors")  # pruned by the training run meanwhile
        return real(path, device, memory_tokens)

    monkeypatch.setattr(ck, "_load_model", vanishing)
    model, cfg = ck.load_model(run)
    assert len(calls) == 2 and cfg.model.variant == "xl"


def test_a_scorer_folder_with_custom_code_never_asks(tmp_path):
    from rpt.labels.scorer import load_scorer

    folder = tmp_path / "custom"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "mystery", "auto_map": {
        "AutoConfig": "code.MysteryConfig", "AutoModelForCausalLM": "code.MysteryModel"}}))
    (folder / "code.py").write_text("raise SystemExit('custom code ran')\n")
    with pytest.raises(Exception) as e:
        load_scorer(str(folder), device="cpu")
    assert "custom code ran" not in str(e.value)


def test_an_exported_model_scores_as_scorer(run, store, tmp_path, capsys):
    from rpt.labels.scorer import load_scorer

    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    with pytest.raises(ValueError, match="an `rpt export` folder"):
        load_scorer(str(tmp_path / "hf"), device="cpu")  # named, not a padding error deep inside transformers
    out = tmp_path / "labels"
    sem = [a if a != "lex" else "sem" for a in LABEL]
    assert main(["label", "--store", str(store), "--out", str(out), *sem, "--scorer", str(tmp_path / "hf"),
                 "--device", "cpu"]) == 0, capsys.readouterr().err
    assert json.loads((out / "manifest.json").read_text())["n_scored"] > 0


def test_plots_rpt_wrote_are_recognised_and_a_users_png_is_not(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rpt.utils import save_figure

    fig, ax = plt.subplots()
    ax.plot([1, 2])
    ours = save_figure(fig, tmp_path / "ours.png")
    theirs = tmp_path / "theirs.png"
    theirs.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)
    assert outputs.written_by(ours) == "rpt" and outputs.written_by(theirs) is None
    outputs.claim_file(ours, "label")  # replaced when asked
    with pytest.raises(ValueError, match="not written by rpt"):
        outputs.claim_file(theirs, "label", arg="quality")


def test_folders_that_only_look_like_an_output_are_not_taken_for_one(store, tmp_path, capsys):
    other = tmp_path / "other-run"  # another tool's run folder: a config.yaml and a log.jsonl of its own
    other.mkdir()
    (other / "config.yaml").write_text("lr: 0.1\nmodel: resnet\n")
    (other / "log.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    tokenizers = tmp_path / "tokenizers"  # a folder of the user's holding a tokenizer.json
    tokenizers.mkdir()
    (tokenizers / "tokenizer.json").write_text('{"mine": true}')
    before = snapshot(tmp_path)
    refused(capsys, train_args(store, other, "--steps", "2"), "did not write")
    refused(capsys, ["prepare", "--corpus", "stdlib:json", "--tokenizer", "bpe:300", "--out", tokenizers], "did not write")
    assert snapshot(tmp_path) == before


def test_only_a_first_line_marks_a_markdown_file_as_rpts(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# My notes\n\nA table:\n<!-- written by rpt (python -m lab compare) -->\n| a |\n")
    assert outputs.written_by(readme) is None
    ours = tmp_path / "t.md"
    ours.write_text("<!-- written by rpt (python -m lab compare) -->\n| a |\n")
    assert outputs.written_by(ours) is not None


def test_overlapping_folder_links_read_every_file_once(tmp_path):
    x = tmp_path / "X"
    (x / "sub").mkdir(parents=True)
    (x / "other").mkdir()
    (x / "sub" / "f1.txt").write_text("one")
    (x / "other" / "f2.txt").write_text("two")
    root = tmp_path / "root"
    root.mkdir()
    (root / "a").symlink_to(x / "sub")
    (root / "b").symlink_to(x)
    texts = sorted(d.text for s in ("train", "validation", "test") for d in TextFolderCorpus(root).documents(s))
    assert texts == ["one", "two"]


def test_numpy_numbers_and_arrays_are_arguments_of_the_right_type(run):
    import rpt

    model = rpt.load(run)
    ids = list(np.arange(1, 40) % 60)
    out = rpt.evaluate(model, [np.asarray(ids * 4)], n_neighbors=np.int64(2))
    assert out.n_tokens > 0
    with pytest.raises(Exception) as e:  # past the type checks: this run has no tokenizer to encode text with
        model.generate("a b", max_new_tokens=np.int64(2), top_p=np.float32(0.9))
    assert not isinstance(e.value, TypeError) and "tokenizer" in str(e.value)


def test_deeply_nested_yaml_is_one_line(tmp_path, capsys):
    deep = tmp_path / "deep.yaml"
    deep.write_text("train: " + "[" * 800 + "]" * 800 + "\n")  # deeper than the parser recurses
    refused(capsys, ["train", "--config", deep, "--print-config"], "nested too deeply")


def test_ctrl_c_during_label_leaves_nothing_taken_for_complete_and_says_how_to_resume(store, tmp_path, capsys,
                                                                                     monkeypatch):
    import rpt.labels.pipeline as pipeline

    real, calls = pipeline.label_document, []

    def interrupted_after_one(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "label_document", interrupted_after_one)
    out = tmp_path / "labels"
    assert main(["label", "--store", str(store), "--out", str(out), *LABEL]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "run the same command to resume" in err
    assert not out.exists() and (tmp_path / ".labels.partial").is_dir()  # the done document waits aside
    monkeypatch.setattr(pipeline, "label_document", real)
    assert main(["label", "--store", str(store), "--out", str(out), *LABEL]) == 0  # resumes, then publishes
    assert (out / "manifest.json").is_file() and not (tmp_path / ".labels.partial").exists()
