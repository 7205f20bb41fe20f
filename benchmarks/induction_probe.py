"""When does a sliding-window model learn to copy by content? xl (or a minimal reference transformer) trained on
near repeats of varying length, with the copy advantage logged as it trains (docs/results/copy-test.md).

    python benchmarks/induction_probe.py --steps 3000 --json out.json              # rpt's xl, tiny width
    python benchmarks/induction_probe.py --model reference --steps 1000            # the same data, a plain transformer
    python benchmarks/induction_probe.py --plot curve.png out.json ref.json        # plot logs written by --json

Documents are the copy corpus's near setting (`rpt.data.synthetic`): passages of `--passage` random words from 256,
each with probability `--near-p` a copy of the passage before. With one passage length (`--passage 100`) a copy
always lies the same distance back and a model can copy by position; with a range (`--passage 96-160`, the unaligned
copy test's) the distance varies and only copying by content works (an induction mechanism: find the earlier
occurrence of the current token, predict what followed it). Every update draws fresh documents. Logged every
`--log-every` updates, on that batch before the update: the mean loss of copied targets (the target and the token
before it are consecutive tokens of one copied run, `copy_runs`), of the rest, and their difference (the copy
advantage, nats; ln 256 = 5.545 is the loss of a model that knows nothing).

`--model reference` is a plain pre-norm causal transformer written here (full causal attention over the whole
sequence, rotary positions, GELU MLP), sharing nothing with rpt's model: if it stays on the same plateau as xl for as
long, the plateau belongs to the task and the budget, not to rpt's implementation.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Reference(nn.Module):
    """A minimal causal transformer: pre-RMSNorm blocks, rotary positions, full causal attention, GELU MLP."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int) -> None:
        super().__init__()
        self.h, self.hd = heads, d // heads
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "n1": nn.RMSNorm(d), "qkv": nn.Linear(d, 3 * d, bias=False), "o": nn.Linear(d, d, bias=False),
            "n2": nn.RMSNorm(d), "up": nn.Linear(d, 4 * d), "down": nn.Linear(4 * d, d)}) for _ in range(layers))
        self.norm, self.head = nn.RMSNorm(d), nn.Linear(d, vocab, bias=False)

    def _rotate(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[-2]
        freq = 10000.0 ** (-torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd)
        angle = torch.arange(t, dtype=torch.float32)[:, None] * freq[None]
        cos, sin = angle.cos(), angle.sin()
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        b, t, d = x.shape
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["n1"](x)).view(b, t, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(self._rotate(q), self._rotate(k), v, is_causal=True)
            x = x + blk["o"](a.transpose(1, 2).reshape(b, t, d))
            x = x + blk["down"](F.gelu(blk["up"](blk["n2"](x))))
        return self.head(self.norm(x))


def copied_targets(tokens: np.ndarray) -> np.ndarray:
    """[T - 1] True where target t + 1 continues, from token t, one copied run: copying by content can predict it."""
    from rpt.data.synthetic import copy_runs

    src = copy_runs(tokens)
    return (src[1:] >= 0) & (src[:-1] >= 0) & (src[1:] == src[:-1] + 1)


def plot(logs: list[str], path: str) -> None:
    """The copy advantage of each log (a --json output) against updates, one line per log."""
    from rpt.eval.plots import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for name in logs:
        with open(name) as f:
            d = json.load(f)
        a = d["args"]
        label = f"{a['model']}, width {a['width']}, passages {a['passage']}, near p {a['near_p']}"
        ax.plot([r["step"] for r in d["log"]], [r["advantage"] for r in d["log"]], label=label)
    ax.axhline(math.log(256), color="grey", lw=0.8, ls=":")
    ax.set_xlabel(f"updates ({a['batch_size']} x {a['seq_len']} tokens of fresh documents each)")
    ax.set_ylabel("copy advantage (nats)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("xl", "reference"), default="xl")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--segment-len", type=int, default=256, help="xl's segment (its window is two)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--passage", default="96-160", help="words per passage: N or LO-HI")
    ap.add_argument("--near-p", type=float, default=1.0, help="probability that a passage copies the one before")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="write the log here")
    ap.add_argument("--plot", metavar="PNG", help="plot the logs named after it (--json outputs) instead of training")
    ap.add_argument("logs", nargs="*", help="with --plot: the logs to plot")
    a = ap.parse_args(argv)
    if a.plot or a.logs:
        if not (a.plot and a.logs):
            ap.error("--plot PNG takes the logs to plot after it, and logs are read only with --plot")
        plot(a.logs, a.plot)
        return 0
    from rpt.data.synthetic import copy_document, parse_spec

    try:  # the copy corpus's own parser and checks; enough passages of the shortest length to fill a sequence
        spec = parse_spec(f"synthetic:copy-near?passage={a.passage}&p={a.near_p}")
        spec = dataclasses.replace(spec, passages=max(2, math.ceil((a.seq_len + 1) / spec.passage)))
        spec.validate()
    except ValueError as e:
        ap.error(f"--passage {a.passage!r} / --near-p {a.near_p}: {e}")

    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    vocab = spec.vocab
    if a.model == "xl":
        from rpt.config import ModelConfig
        from rpt.model.rpt import RPT

        cfg = ModelConfig(variant="xl", vocab_size=vocab, d_model=a.width, n_layers=a.layers, n_heads=a.heads,
                          mlp_hidden=int(a.width * 8 / 3) // 4 * 4, segment_len=a.segment_len, cca_layers=[],
                          dropout=0.0)
        model: nn.Module = RPT(cfg, seed=a.seed)

        def logits_of(x: torch.Tensor) -> torch.Tensor:
            return model(x).logits
    else:
        model = Reference(vocab, a.width, a.layers, a.heads)

        def logits_of(x: torch.Tensor) -> torch.Tensor:
            return model(x)

    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1, betas=(0.9, 0.95))
    rng = np.random.default_rng([a.seed, 11])
    log, t0 = [], time.perf_counter()
    for step in range(1, a.steps + 1):
        docs = [copy_document(rng, spec)[: a.seq_len + 1] for _ in range(a.batch_size)]
        x = torch.from_numpy(np.stack(docs))
        copied = torch.from_numpy(np.stack([copied_targets(d) for d in docs]))
        for g in opt.param_groups:
            g["lr"] = a.lr * min(1.0, step / a.warmup)
        logits = logits_of(x[:, :-1])
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="none")
        nll = nll.view_as(copied)
        opt.zero_grad()
        nll.mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % a.log_every == 0 or step == a.steps:
            c, f = nll[copied].mean().item(), nll[~copied].mean().item()
            row = {"step": step, "copied": round(c, 4), "rest": round(f, 4), "advantage": round(f - c, 4),
                   "s": round(time.perf_counter() - t0, 1)}
            log.append(row)
            print(json.dumps(row), flush=True)
    if a.json:
        from rpt.utils import write_json_atomic

        write_json_atomic(a.json, {"args": vars(a), "log": log})
    return 0


if __name__ == "__main__":
    sys.exit(main())
