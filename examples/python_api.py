"""The Python API end to end on a tiny corpus: prepare, train, evaluate, generate, export, reload with transformers.

    python examples/python_api.py [work folder]      (default: a temporary folder, removed at the end)

Runs in well under a minute on two CPU cores: a tiny model trained for a few steps, so its text is not yet English.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
from pathlib import Path

import rpt

WORDS = ("the model reads a long document and retrieves earlier chunks that help it predict the next one; "
         "each chunk of sixty four tokens is scored against the chunks before it").split()


def write_corpus(folder: Path, n_docs: int = 24) -> Path:
    """A few documents as JSONL (one {"id", "text"} per line) and as plain text files, in one folder."""
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    docs = [" ".join(rng.choice(WORDS) for _ in range(900)) for _ in range(n_docs)]
    with open(folder / "documents.jsonl", "w") as f:
        for i, text in enumerate(docs[: n_docs // 2]):
            f.write(json.dumps({"id": f"doc{i}", "text": text}) + "\n")
    for i, text in enumerate(docs[n_docs // 2 :]):
        (folder / f"doc{i}.txt").write_text(text)
    return folder


def main(work: Path) -> None:
    corpus = write_corpus(work / "corpus")
    summary = rpt.prepare(corpus, work / "store", tokenizer="bpe:300", chunk_size=64)
    print(f"prepared {summary.documents} documents, {summary.tokens:,} tokens")

    result = rpt.train("tiny", work / "store", work / "run", variant="xl", steps=4, batch_size=2, seq_len=512, segment_len=128,
                       checkpoint_every=4, log_every=2)
    print(f"trained to step {result.step}: {result.checkpoint}")

    model = rpt.load(work / "run", device="cpu")  # the run's newest checkpoint, with its tokenizer
    documents = [(corpus / "doc0.txt").read_text(), (corpus / "doc1.txt").read_text()]
    ev = model.evaluate(documents)  # or a token store: model.evaluate(work / "store", split="test")
    print(f"perplexity {ev.perplexity:.1f} over {ev.n_tokens:,} tokens")

    text = model.generate("the model reads", max_new_tokens=20, greedy=True)
    print(f"generated: {text!r}")
    assert text == rpt.generate(work / "run", "the model reads", max_new_tokens=20, greedy=True, device="cpu")

    exported = model.export(work / "exported")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(exported)
    tok = AutoTokenizer.from_pretrained(exported)
    ids = tok("the model reads", return_tensors="pt").input_ids
    out = hf.generate(ids, max_new_tokens=20, do_sample=False)
    hf_text = tok.decode(out[0, ids.shape[1]:])
    print(f"transformers: {hf_text!r}")
    assert rpt.load(exported, device="cpu").generate("the model reads", max_new_tokens=20, greedy=True) == text


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
