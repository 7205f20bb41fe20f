"""Time Griffin's linear recurrence h_t = a_t h_{t-1} + b_t three ways, forward and backward, on this machine.

    python benchmarks/griffin_scan.py [T=2048] [batch=2] [rounds=5] [out=docs/data/griffin_scan_cpu.json]

- `scan`: rpt's two-level scan (`rpt.model.griffin.linear_scan`, ~2 sqrt(T) sequential steps, its own backward);
- `loop`: one autograd step per token;
- `closed L`: a chunked scan that computes each chunk of L tokens in closed form through an [L, L, R] matrix of
  decays (O(L) work per token), then carries the state over the chunks; for each L in 4, 8, 16, 64.

R is the RG-LRU width of the tiny preset's Griffin. Every method runs once per round, in an order that rotates from
round to round, on the same inputs; the report gives each method's median over the rounds and its ratio to the scan's.
All three agree with each other (the largest difference is printed). One process, the torch threads of this machine.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from rpt.config import RPTConfig
from rpt.model.griffin import linear_scan, rnn_width


def loop(log_a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, h, out = log_a.exp(), b.new_zeros(b[:, 0].shape), []
    for t in range(b.shape[1]):
        h = a[:, t] * h + b[:, t]
        out.append(h)
    return torch.stack(out, 1)


def closed(log_a: torch.Tensor, b: torch.Tensor, L: int) -> torch.Tensor:
    B, T, R = b.shape
    N = -(-T // L)
    pad = N * L - T
    la = torch.nn.functional.pad(log_a, (0, 0, 0, pad)).view(B, N, L, R)
    bb = torch.nn.functional.pad(b, (0, 0, 0, pad)).view(B, N, L, R)
    cum = la.cumsum(2)  # [B, N, L, R]
    diff = cum[:, :, :, None] - cum[:, :, None]  # [B, N, t, s, R]: sum of log a over (s, t]
    lower = torch.ones(L, L, dtype=torch.bool).tril()[None, None, :, :, None]
    decay = torch.where(lower, diff, torch.full_like(diff, -torch.inf)).exp()
    intra = (decay * bb[:, :, None]).sum(3)  # [B, N, L, R]: each chunk from a zero state
    h, states = b.new_zeros(B, R), []
    for n in range(N):
        states.append(intra[:, n] + cum[:, n].exp() * h[:, None])
        h = states[-1][:, -1]
    return torch.stack(states, 1).view(B, N * L, R)[:, :T]


def main(argv: list[str]) -> int:
    opts = dict(a.split("=", 1) for a in argv)
    T, batch, rounds = int(opts.get("T", 2048)), int(opts.get("batch", 2)), int(opts.get("rounds", 5))
    out = opts.get("out")
    R = rnn_width(RPTConfig.from_preset("tiny", variant="griffin").model)
    g = torch.Generator().manual_seed(0)
    log_a = -torch.rand(batch, T, R, generator=g) * 0.1
    b = torch.randn(batch, T, R, generator=g)
    methods = {"scan": lambda la, x: linear_scan(la, x), "loop": loop}
    for L in (4, 8, 16, 64):
        methods[f"closed {L}"] = lambda la, x, L=L: closed(la, x, L)

    def run(fn):
        la, x = log_a.clone().requires_grad_(), b.clone().requires_grad_()
        t0 = time.perf_counter()
        h = fn(la, x)
        h.square().sum().backward()
        return time.perf_counter() - t0, h.detach()

    ref = run(methods["scan"])[1]
    worst = max((run(fn)[1] - ref).abs().max().item() for fn in methods.values())
    names, times = list(methods), {n: [] for n in methods}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            times[n].append(run(methods[n])[0])
    med = {n: statistics.median(v) for n, v in times.items()}
    report = {"T": T, "batch": batch, "R": R, "rounds": rounds, "threads": torch.get_num_threads(),
              "torch": torch.__version__, "largest_difference": worst,
              "median_ms": {n: round(1000 * v, 2) for n, v in med.items()},
              "vs_scan": {n: round(v / med["scan"], 2) for n, v in med.items()}}
    print(f"T = {T}, batch {batch}, R = {R}, {rounds} rounds, {report['threads']} threads, torch {torch.__version__}; "
          f"largest difference from the scan {worst:.1e}")
    for n in names:
        print(f"  {n:10s} {1000 * med[n]:9.1f} ms   {med[n] / med['scan']:7.1f}x the scan")
    if out:
        Path(out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
