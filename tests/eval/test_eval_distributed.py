"""Two ranks (gloo on CPU, as torchrun would start them) shard the documents and give the single-process result."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from eval_helpers import M, make_model, make_root, save_checkpoint, tiny_config, word_tokenizer, write_doc_labels

LENGTHS = [26 * M + 3, 18 * M, 30 * M + 5, 9 * M + 1, 21 * M]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_ranks_equal_one_process(tmp_path):
    tok = word_tokenizer()
    root = make_root(tmp_path / "store", LENGTHS, tokenizer=tok)
    labels = write_doc_labels(root / "labels" / "test-sem-doc", LENGTHS, tok.identity)
    ckpt = save_checkpoint(tmp_path / "run", make_model("rpt-sem"), tiny_config(), tokenizer=tok)
    args = [sys.executable, "-m", "rpt.cli", "eval", "--checkpoint", str(ckpt), "--store", str(root), "--labels",
            str(labels), "--metrics", "--device", "cpu", "--no-progress", "--threads", "1"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    one = subprocess.run([*args, "--out", str(tmp_path / "one.json")], env=env, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    port = str(_free_port())
    procs = [subprocess.Popen([*args, "--out", str(tmp_path / "two.json")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                                              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}) for r in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "perplexity" in outs[0][0] and outs[1][0] == ""  # rank 0 prints, rank 1 stays quiet
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    assert b["eval"]["world_size"] == 2 and [d["index"] for d in b["documents"]] == list(range(len(LENGTHS)))
    assert b["total"]["n_targets"] == a["total"]["n_targets"]
    assert b["total"]["perplexity"] == pytest.approx(a["total"]["perplexity"], rel=1e-9)
    for name in ("model", "bm25"):
        assert b["retrieval"][name] == pytest.approx(a["retrieval"][name], rel=1e-9)
