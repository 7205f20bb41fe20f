"""Retrofitting a pretrained causal LM (docs/retrofit.md): the config a backbone implies.

`rpt train --backbone PATH` (and `rpt.train(..., backbone=PATH)`) sets model.backbone; `apply_backbone` then takes the
backbone's width, depth and vocabulary into the config, the new modules' head count from the backbone's, and places
chunked cross-attention in the upper layers unless the caller chose them. The model itself is
`rpt.model.retrofit.RetrofitRPT`, built by `rpt.model.registry.build_model` whenever model.backbone is set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rpt.utils import UserError


def default_cca_layers(n_layers: int, n_lower: int, every: int = 3) -> list[int]:
    """CCA in every `every`-th upper layer from the first one (RETRO placed it every third layer from the sixth)."""
    return list(range(n_lower, n_layers, every))


def backbone_fields(path: str | Path, lower: int = 0, cca_layers: list[int] | None = None) -> dict[str, Any]:
    """The model fields (dotted keys) a backbone implies: model.backbone, d_model, n_layers, n_heads (the new modules
    use the backbone's head count), vocab_size, mlp_hidden (unused by the backbone's own MLPs: recorded), and
    cca_layers (given, else `default_cca_layers`). Reads the backbone's config only, not its weights."""
    from rpt.model.backbone import backbone_config

    if not Path(path).expanduser().exists():
        raise UserError(f"backbone {path}: no such folder or .gguf file (a local Hugging Face causal-LM folder, or a "
                        "GGUF file)")
    try:
        c = backbone_config(path)
    except (OSError, ValueError) as e:
        raise UserError(f"backbone {path}: cannot read its config ({str(e).splitlines()[0]})") from None
    n_layers = int(c.num_hidden_layers)
    n_lower = lower or n_layers // 2
    # recorded as an absolute path: a checkpoint names its backbone, and is read from any working directory
    return {"model.backbone": str(Path(path).expanduser().absolute()), "model.d_model": int(c.hidden_size),
            "model.n_layers": n_layers,
            "model.n_heads": int(c.num_attention_heads), "model.vocab_size": int(c.vocab_size),
            "model.mlp_hidden": int(c.intermediate_size),
            "model.cca_layers": list(cca_layers) if cca_layers is not None else default_cca_layers(n_layers, n_lower)}


def apply_backbone(doc: dict[str, Any], given: set[str]) -> None:
    """Fill the model section of a config document (nested dict, before validation) from its model.backbone.
    `given`: the dotted keys the caller set explicitly; model.cca_layers among them is kept, every other shape field
    is the backbone's."""
    model = doc.setdefault("model", {})
    cca = model.get("cca_layers") if "model.cca_layers" in given else None
    fields = backbone_fields(model["backbone"], int(model.get("backbone_lower", 0) or 0), cca)
    for key, value in fields.items():
        model[key.split(".", 1)[1]] = value


# ---------------------------------------------------------------------------------------------------------------
# what a user would try without training: the backbone over its window, its full context, retrieved text in context


CONTEXT_ROWS = ("full", "window", "in-context none", "in-context bm25", "in-context random")


def target_chunks(n_tokens: int, chunk_size: int, first: int, n_targets: int) -> list[int]:
    """The chunks whose tokens are scored: those starting at token `first` or later, `n_targets` tokens in all (or to
    the document's end)."""
    lo = -(-first // chunk_size)
    hi = min(n_tokens, first + n_targets) // chunk_size
    return list(range(lo, hi))


@torch.no_grad()
def context_rows(backbone: Any, tokens: Any, segment_len: int, chunk_size: int, k: int, targets: list[int],
                 rows: tuple[str, ...] = CONTEXT_ROWS, doc: int = 0, retrofit: Any = None) -> dict[str, tuple[float, int]]:
    """Summed NLL (nats) and token count of the tokens of the `targets` chunks of one document [T] under the backbone
    (a Hugging Face causal LM) read five ways, each context starting with BOS:

        full               every earlier token of the document
        window             the retrofitted model at initialisation over the sliding window (`retrofit`, a RetrofitRPT
                           of variant xl over this backbone; the carried states of RPT's segment window)
        in-context none    the tokens of the target's window alone (from the first token of the previous segment)
        in-context bm25    BM25's top-k chunks with their continuations (`rpt.labels.bm25.bm25_neighbors`, query =
                           the chunk before the target, the retrievable rule) placed before the window, best last
        in-context random  k random retrievable chunks of the document with their continuations, the same way

    The in-context rows are In-Context RALM's (Ram et al. 2023) with RPT's window: no training at all."""
    import numpy as np
    import torch.nn.functional as F

    from rpt.eval.perplexity import random_neighbors
    from rpt.labels.bm25 import bm25_neighbors

    toks = np.asarray(tokens, dtype=np.int64)
    M, S = chunk_size, segment_len
    end = (max(targets) + 1) * M
    bos = int(backbone.config.bos_token_id)
    dev = next(backbone.parameters()).device
    out: dict[str, tuple[float, int]] = {}

    def nll_of_last(ids: list[int], n: int) -> float:
        x = torch.tensor([ids], device=dev)
        logits = backbone(x).logits[0, -n - 1 : -1].float()
        return float(F.cross_entropy(logits, x[0, -n:], reduction="sum"))

    scored = torch.zeros(end, dtype=torch.bool)
    for t in targets:
        scored[t * M : (t + 1) * M] = True
    if "full" in rows:
        x = torch.tensor([[bos, *toks[:end].tolist()]], device=dev)
        nll = F.cross_entropy(backbone(x).logits[0, :-1].float(), x[0, 1:], reduction="none")
        out["full"] = (float(nll[scored.to(dev)].sum()), int(scored.sum()))
    if "window" in rows:
        if retrofit is None:
            raise ValueError("the window row needs `retrofit`: a RetrofitRPT of variant xl over this backbone")
        x = torch.tensor([toks[:end].tolist()], device=dev)
        logits = retrofit(x).logits[0, :-1].float()
        nll = F.cross_entropy(logits, x[0, 1:], reduction="none")
        out["window"] = (float(nll[scored[1:].to(dev)].sum()), int(scored.sum()))
    sources = {"in-context bm25": lambda: bm25_neighbors(toks, M, S, k),
               "in-context random": lambda: random_neighbors(len(toks) // M, M, S, k, doc=doc),
               "in-context none": lambda: np.full((len(toks) // M, k), -1)}
    for name in rows:
        if name not in sources:
            continue
        ids = sources[name]()
        total = 0.0
        for t in targets:
            start = max(0, (t * M // S - 1) * S)  # the target's window: the previous segment and its own
            neighbours = [int(j) for j in ids[t - 1] if j >= 0][::-1]  # best last, nearest the window
            ctx = [bos] + [int(v) for j in neighbours for v in toks[j * M : (j + 2) * M]]
            total += nll_of_last(ctx + toks[start : (t + 1) * M].tolist(), M)
        out[name] = (total, len(targets) * M)
    return out
