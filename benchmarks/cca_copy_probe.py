"""CCA copy probe: can CCA learn to copy from oracle neighbours?
(docs/results/archive.md#cca-changes-and-probe-settings-for-the-copy-test-one-at-a-time)

A plain training loop (no labels, no scheduled sampling) on fresh synthetic copy documents every step, feeding retro
the oracle neighbour of every repeated chunk, so only CCA is on trial. Prints the loss per chunk class every 25 steps.

    python benchmarks/cca_copy_probe.py steps=300 lr=1e-2                      # CCA as shipped
    python benchmarks/cca_copy_probe.py steps=150 lr=3e-3 cca.rel_bias=False   # any model field=value (ablations)
    python benchmarks/cca_copy_probe.py steps=300 lr=1e-2 variant=xl near=1    # the control: xl on near repeats
    python benchmarks/cca_copy_probe.py align=first                            # oracle neighbour = the target chunk
    python benchmarks/cca_copy_probe.py steps=200 align=tail p=1               # only what c_q retrieval can find;
                                                                               # every far passage repeated
    python benchmarks/cca_copy_probe.py align=tail p=1 cca.rel_bias_init=zero  # without the relative-bias prior
    python benchmarks/cca_copy_probe.py align=tail bias_lr=30                  # the bias learning 30x faster instead
    python benchmarks/cca_copy_probe.py align=tail p=1 passages=8 distance=3-6 segment_len=64 batch=2
                                                    # 1,024-token documents, the demo's copy size (repeats 384+ back)
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
import yaml

from rpt.config import RPTConfig
from rpt.data.synthetic import CLASSES, CopySpec, copy_classes, copy_document
from rpt.model.rpt import RPT

M, VOCAB = 64, 258  # chunk size; 256 words + <unk> + end of text


def oracle(docs: np.ndarray, align: str) -> np.ndarray:
    """[B, C, 2] neighbour ids: for query chunk c (serving c + 1), the chunk j whose continuation j + 1 is chunk c + 1
    (align=cont), only where chunk j is also a copy of chunk c (align=tail: what c_q-only retrieval can find), or whose
    own tokens are chunk c + 1 (align=first)."""
    B, T = docs.shape
    C = T // M
    nb = np.full((B, C, 2), -1)
    for b in range(B):
        ch = docs[b].reshape(C, M)
        for c in range(C - 1):
            for j in range(c):
                if align in ("cont", "tail") and j + 1 < c and np.array_equal(ch[j + 1], ch[c + 1]):
                    if align == "tail" and not np.array_equal(ch[j], ch[c]):
                        continue  # c_q-only retrieval finds the source only where the query chunk is a copy too
                    nb[b, c, 0] = j
                if align == "first" and np.array_equal(ch[j], ch[c + 1]):
                    nb[b, c, 0] = j
    return nb


def main(argv: list[str]) -> None:
    kw = dict(a.split("=", 1) for a in argv)
    steps, lr = int(kw.pop("steps", 300)), float(kw.pop("lr", 1e-2))
    variant, near, align = kw.pop("variant", "retro"), kw.pop("near", "0") == "1", kw.pop("align", "cont")
    batch, threads = int(kw.pop("batch", 4)), int(kw.pop("threads", 2))
    seed = int(kw.pop("seed", 0))  # starting weights and documents
    bias_lr = float(kw.pop("bias_lr", 1))  # learning-rate multiplier of CCA's relative-offset bias
    torch.set_num_threads(threads)
    p_repeat = float(kw.pop("p", 0.5))
    passages = int(kw.pop("passages", 16))  # 128-token passages per document (16: 2,048-token documents)
    lo, hi = (int(v) for v in kw.pop("distance", "1-1" if near else "6-12").split("-"))  # repeat distance, passages
    cfg = RPTConfig.from_preset("tiny", variant=variant, vocab_size=VOCAB, **{k: yaml.safe_load(v) for k, v in kw.items()})
    model = RPT(cfg, seed=seed)
    fast = [p for n, p in model.named_parameters() if n.endswith("rel_bias")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("rel_bias")]
    opt = torch.optim.AdamW([{"params": rest}, {"params": fast, "lr": lr * bias_lr}], lr=lr, betas=(0.9, 0.95))
    spec = CopySpec(passages=passages, min_distance=lo, max_distance=hi, p_repeat=p_repeat)
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    for s in range(steps):
        docs = np.stack([copy_document(rng, spec) for _ in range(batch)])
        x = torch.tensor(docs)
        out = model(x, neighbor_ids=torch.tensor(oracle(docs, align))) if variant != "xl" else model(x)
        nll = F.cross_entropy(out.logits[:, :-1].reshape(-1, VOCAB), x[:, 1:].reshape(-1), reduction="none")
        nll = nll.view(batch, -1)  # [B, T-1]: position t predicts token t + 1
        opt.zero_grad()
        nll.mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (s + 1) % 25 == 0 or s == steps - 1:
            cls = np.repeat(np.stack([copy_classes(d, spec.passage, M) for d in docs]), M, axis=1)[:, 1:]  # by target
            parts = " ".join(f"{n}={nll[torch.tensor(cls == c)].mean():.3f}" for c, n in enumerate(CLASSES))
            print(f"{s + 1:5d} loss {nll.mean().item():.3f}  {parts}  {time.perf_counter() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
