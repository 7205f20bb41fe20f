"""The language-model loss of §3.3 as the model computes it: a `Sum` (total, count), never a mean, so that the training
loop divides once by the global batch's count (`normalise`; rpt/training/losses.py adds LambdaRank and the rest).

`lm_loss` takes full logits; `lm_loss_chunked` takes the final states and the output projection and never
materialises the [B, T, V] logits.

Dimension letters: B batch, T tokens, D width, V vocabulary.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class Sum(NamedTuple):
    """An un-normalised loss or metric: `total` summed over `count` items (both tensors, reduce-able by all-reduce)."""

    total: torch.Tensor
    count: torch.Tensor

    def mean(self) -> torch.Tensor:
        return normalise(self.total, self.count)


def normalise(total: torch.Tensor, count: torch.Tensor | float, world_size: int = 1) -> torch.Tensor:
    """The one place where sums become means: ``total * world_size / max(count, 1)``.

    `count` is the denominator of the whole global batch (summed over micro-batches and ranks), so each micro-batch
    contributes its share of the global mean. DDP averages gradients over ranks; multiplying by `world_size` turns
    that average back into the sum we want. With nothing to count (count == 0) the total is 0 and so is the mean.
    Metrics use the same function after an all-reduce of numerator and denominator (world_size = 1).
    """
    if not torch.is_tensor(count):
        count = torch.tensor(float(count), device=total.device)
    return total * world_size / count.to(total.dtype).clamp_min(1)


# --------------------------------------------------------------------------------------------------------------
# Language modelling


def lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor | None = None) -> Sum:
    """Next-token cross-entropy summed over real target tokens.

    logits [B, T, V] predict input_ids shifted by one: position t is scored on token t+1, so T-1 targets per row.
    loss_mask [B, T] bool marks real tokens (False = right padding); a target counts iff its token is real.
    Returns Sum(total nats, number of target tokens). Computed in fp32 whatever the logits' dtype.
    """
    B, T, V = logits.shape
    targets = input_ids[:, 1:]  # [B, T-1]
    nll = F.cross_entropy(logits[:, :-1].reshape(-1, V).float(), targets.reshape(-1), reduction="none").view(B, T - 1)
    if loss_mask is None:
        return Sum(nll.sum(), torch.tensor(float(nll.numel()), device=nll.device))
    m = loss_mask[:, 1:].to(nll.dtype)
    return Sum((nll * m).sum(), m.sum())


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of softmax(h W^T) against targets, never holding more than `chunk` rows of logits.

    The forward pass computes, chunk by chunk, the loss and at once its gradients with respect to h and W (softmax
    minus one-hot, times the mask); backward only scales them by the incoming gradient. Peak extra memory is one
    [chunk, V] fp32 block (the logits, turned into their softmax in place) plus grad buffers the size of h and W,
    instead of [N, V] logits, their log-softmax and their gradient (three [N, V] fp32 tensors: ~10 GB for 16K tokens
    at V = 50K).
    """

    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
                chunk: int) -> torch.Tensor:  # type: ignore[override]
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        dev = h.device.type
        # the matmuls run in the autocast dtype where autocast is on (bf16 on GPUs), else in h's; softmax and sums in fp32
        cdt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        grad_h = torch.zeros_like(h) if need_grad else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_grad else None
        with torch.autocast(dev, enabled=False):
            w = weight.to(cdt)
            for i in range(0, h.shape[0], chunk):
                hc, tc, mc = h[i : i + chunk].to(cdt), targets[i : i + chunk], mask[i : i + chunk]
                logits = (hc @ w.t()).float()  # [n, V]
                lse = torch.logsumexp(logits, dim=-1)
                picked = logits.gather(1, tc[:, None]).squeeze(1)
                total += ((lse - picked) * mc).sum()
                if need_grad:
                    g = logits.sub_(lse[:, None]).exp_()  # softmax in place: d(lse - picked)/d logits = softmax - onehot
                    g[torch.arange(len(tc), device=g.device), tc] -= 1.0
                    g *= mc[:, None]
                    gc = g.to(cdt)
                    grad_h[i : i + chunk] = (gc @ w).to(h.dtype)
                    grad_w += (gc.t() @ hc).float()
                    del g, gc
                del logits
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        grad_h, grad_w = ctx.saved_tensors
        gh = grad_h * grad_out.to(grad_h.dtype) if ctx.needs_input_grad[0] else None
        gw = (grad_w * grad_out).to(ctx.weight_dtype) if ctx.needs_input_grad[1] else None
        return gh, gw, None, None, None


def lm_loss_chunked(hidden: torch.Tensor, weight: torch.Tensor, input_ids: torch.Tensor,
                    loss_mask: torch.Tensor | None = None, chunk: int = 4096) -> Sum:
    """`lm_loss(hidden @ weight.T, input_ids, loss_mask)` without ever materialising the [B, T, V] logits.

    hidden [B, T, D] final (normalised) states, weight [V, D] the output projection; `chunk` target tokens at a time.
    Equal to `lm_loss` on the full logits up to float rounding (tests/train/test_train_losses.py).
    """
    B, T, D = hidden.shape
    h = hidden[:, :-1].reshape(-1, D)
    targets = input_ids[:, 1:].reshape(-1)
    m = (torch.ones_like(targets, dtype=torch.float32) if loss_mask is None
         else loss_mask[:, 1:].reshape(-1).to(torch.float32))
    total = _ChunkedLinearCrossEntropy.apply(h, weight, targets, m, max(1, int(chunk)))
    return Sum(total, m.sum())
