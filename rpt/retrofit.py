"""Retrofitting a pretrained causal LM (docs/retrofit.md): the config a backbone implies.

`rpt train --backbone PATH` (and `rpt.train(..., backbone=PATH)`) sets model.backbone; `apply_backbone` then takes the
backbone's width, depth and vocabulary into the config, the new modules' head count from the backbone's, and places
chunked cross-attention in the upper layers unless the caller chose them. The model itself is
`rpt.model.retrofit.RetrofitRPT`, built by `rpt.model.registry.build_model` whenever model.backbone is set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    return {"model.backbone": str(path), "model.d_model": int(c.hidden_size), "model.n_layers": n_layers,
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
