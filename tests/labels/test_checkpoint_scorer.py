"""Our own checkpoints as scoring LMs (`rpt label --scorer runs/<name>`), as the demo uses them."""

import numpy as np
import pytest
import torch

from rpt import RPT, RPTConfig
from rpt import checkpoint as ckpt_io
from rpt.labels.scorer import is_rpt_checkpoint, load_scorer, target_scores


@pytest.fixture
def run_dir(tmp_path):
    cfg = RPTConfig.from_preset("tiny", variant="xl", vocab_size=97)
    torch.manual_seed(0)
    model = RPT(cfg.model)
    ckpt_io.save(tmp_path, 1, model.state_dict(), {"state": {}, "param_groups": []}, cfg, [ckpt_io.rng_state()], {})
    return tmp_path, model.eval()


def test_checkpoint_scorer_matches_brute_force(run_dir):
    path, model = run_dir
    assert is_rpt_checkpoint(path)
    scorer = load_scorer(str(path), device="cpu")
    rng = np.random.default_rng(0)
    chunks = rng.integers(0, 97, size=(12, 64))
    queries = np.array([6, 8])
    cands = np.array([[0, 2, -1], [1, 3, 4]])
    got = target_scores(scorer, chunks, queries, cands)

    def logp(ctx_chunks, target):
        ids = torch.tensor(np.concatenate([chunks[c] for c in [*ctx_chunks, target]]))[None]
        with torch.no_grad():
            lp = torch.log_softmax(model(ids).logits[0].double(), -1)
        n = len(ctx_chunks) * 64
        return sum(lp[n - 1 + t, ids[0, n + t]].item() for t in range(64))

    for r, i in enumerate(queries):
        base = logp([i - 2, i - 1, i], i + 1)
        for s, j in enumerate(cands[r]):
            if j < 0:
                assert np.isnan(got[r, s])
            else:
                assert got[r, s] == pytest.approx(logp([j, j + 1, i], i + 1) - base, abs=2e-3)


def test_checkpoint_scorer_refuses_another_tokenizer(run_dir, monkeypatch):
    import rpt.checkpoint as c
    from rpt.labels.scorer import rpt_checkpoint_scorer

    path, _ = run_dir
    monkeypatch.setattr(c, "checkpoint_tokenizer", lambda *a, **k: {"name": "a", "hash": "1"})
    with pytest.raises(ValueError, match="must share the store's tokenizer"):
        rpt_checkpoint_scorer(path, device="cpu", store_tokenizer={"name": "b", "hash": "2"})
    rpt_checkpoint_scorer(path, device="cpu", store_tokenizer={"name": "a", "hash": "1"})  # same tokenizer: fine
