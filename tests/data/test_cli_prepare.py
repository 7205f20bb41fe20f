"""`rpt prepare` end to end on a tiny corpus, and its answers to bad input (exit code 2, one clear line)."""

import json

import pytest

from rpt.cli import main
from rpt.data.store import TokenStore
from rpt.data.tokenizer import Tokenizer


def run(*args, cache):
    return main(["prepare", *args, "--tokenizer-cache", str(cache), "--no-progress"])


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "tok-cache"


def test_end_to_end(split_folder, tmp_path, cache, capsys):
    out = tmp_path / "store"
    assert run("--corpus", str(split_folder), "--tokenizer", "bpe:300", "--out", str(out), cache=cache) == 0
    printed = capsys.readouterr().out
    assert "tokenizer bpe:300/" in printed and "trained" in printed and "time" in printed
    tok = Tokenizer.from_file(out / "tokenizer.json")
    for split, n in (("train", 4), ("validation", 2), ("test", 2)):
        store = TokenStore.open(out / split)
        assert len(store) == n and store.tokenizer_id["hash"] == tok.hash and store.chunk_size == 64
        assert f"{split:<11}{n:>10,}" in printed
        assert tok.decode(store.document(0)) == (split_folder / split / f"{split}_0.txt").read_text()
    # Second run: the tokenizer comes from the cache and the stores are reused.
    assert run("--corpus", str(split_folder), "--tokenizer", "bpe:300", "--out", str(out), cache=cache) == 0
    printed = capsys.readouterr().out
    assert "from cache" in printed and printed.count("reused") == 3


def test_config_gives_the_defaults(split_folder, tmp_path, cache, capsys):
    out = tmp_path / "from-config"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"preset: tiny\ndata:\n  corpus: {split_folder}\n  tokenizer: bpe:300\n  store: {out}\n")
    assert run("--config", str(cfg), "--splits", "train", "--max-documents", "2", cache=cache) == 0
    m = json.loads((out / "train" / "manifest.json").read_text())
    assert m["n_documents"] == 2 and m["corpus"]["spec"] == str(split_folder) and m["tokenizer"]["vocab_size"] == 300
    assert not (out / "test").exists()


@pytest.mark.parametrize("args, message", [
    (["--corpus", "{tmp}/missing-folder"], "missing-folder"),
    (["--corpus", "code:{tmp}/missing-code"], "missing-code"),
    (["--corpus", "{books}", "--tokenizer", "bpe:lots"], "bpe:<vocab size>"),
    (["--corpus", "{books}", "--tokenizer", "{tmp}/nope/tokenizer.json"], "does not exist"),
    (["--corpus", "{books}", "--tokenizer", "bpe:100"], "at least"),
    (["--corpus", "{books}", "--splits", "train,holdout"], "unknown split 'holdout'"),
    (["--corpus", "{books}", "--max-documents", "0"], "max_documents must be >= 1"),
    (["--corpus", "stdlib:json,no_such_package"], "no_such_package"),
    (["--config", "{tmp}/absent.yaml"], "absent.yaml"),
])
def test_bad_input_exits_2_with_a_clear_message(split_folder, tmp_path, cache, capsys, args, message):
    args = [a.format(tmp=tmp_path, books=split_folder) for a in args]
    assert run(*args, "--out", str(tmp_path / "out"), cache=cache) == 2
    err = capsys.readouterr().err
    assert err.startswith("rpt prepare: error: ") and message in err and "Traceback" not in err
    assert not (tmp_path / "out" / "train").exists()


def test_mismatch_needs_force(split_folder, tmp_path, cache, capsys):
    out = str(tmp_path / "out")
    assert run("--corpus", str(split_folder), "--tokenizer", "bpe:300", "--out", out, cache=cache) == 0
    assert run("--corpus", str(split_folder), "--tokenizer", "bpe:300", "--out", out, "--chunk-size", "32", cache=cache) == 2
    err = capsys.readouterr().err
    assert "chunk_size 64, config asks for 32" in err and "--force" in err
    assert run("--corpus", str(split_folder), "--tokenizer", "bpe:300", "--out", out, "--chunk-size", "32", "--force",
               cache=cache) == 0
    assert TokenStore.open(tmp_path / "out" / "train").chunk_size == 32
