"""One table from variant name to model class and what the variant needs; train, eval, generate and bench read it.

Every model class keeps one contract, so the training loop, the long-document evaluation, generation and the bench
serve all of them without asking which one they hold:

    Model(cfg: ModelConfig, seed: int | None = None)   paired initialisation (`init_weights`): modules named alike in
                                                     two variants start from the same weights for one seed
    model.cfg                                         the ModelConfig
    model.forward(input_ids [B, T], *, loss_chunk=0, loss_mask=None, **retrieval) -> RPTOutput
                                                     the whole sequence at once (training); `retrieval` holds the
                                                     neighbour arguments of `RPT.forward`, which the other variants
                                                     never receive
    model.new_cache(memory=None) -> cache             a fresh cache for one batch of documents
    model.step(input_ids [B, n], cache, **retrieval) -> RPTOutput
                                                     continue the documents of `cache` by n >= 1 tokens; must compute
                                                     what `forward` computes (tests/model/model_contract.py)
    cache.memory_bytes() / cache.window_bytes()       what the cache holds beyond the sliding window (the document
                                                     memory, a recurrent state) and the window's K/V
    model.num_parameters()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from torch import nn

from rpt.config import VARIANTS, ModelConfig


@dataclass(frozen=True)
class VariantSpec:
    """name: the `model.variant` value. module / cls: where its model class lives (imported when built).
    neighbours: what CCA reads: nothing (no CCA), BM25's neighbours supplied from outside, or the model's own retriever.
    labels: the retrieval labels training needs (None: trains on tokens alone; "any": lex or sem, whichever exists).
    state: what carries a document past the sliding window at evaluation: nothing, a chunk memory (retrieval), a
    token kNN memory, or a recurrent state.
    paper: the row of the paper's Table 2 it reproduces."""

    name: str
    module: str
    cls: str
    neighbours: Literal["none", "bm25", "own"]
    labels: Literal["lex", "sem", "any"] | None
    state: Literal["window", "chunk-memory", "token-memory", "recurrent"]
    paper: str


REGISTRY: dict[str, VariantSpec] = {s.name: s for s in (
    VariantSpec("xl", "rpt.model.rpt", "RPT", "none", None, "window", "Transformer-XL"),
    VariantSpec("retro", "rpt.model.rpt", "RPT", "bm25", "any", "chunk-memory", "RETRO"),
    VariantSpec("rpt-lex", "rpt.model.rpt", "RPT", "own", "any", "chunk-memory", "RPT-Lex"),
    VariantSpec("rpt-sem", "rpt.model.rpt", "RPT", "own", "sem", "chunk-memory", "RPT-Sem"),
    VariantSpec("memorizing", "rpt.model.memorizing", "MemorizingTransformer", "none", None, "token-memory",
                "Memorizing Transformer"),
    VariantSpec("block-recurrent", "rpt.model.block_recurrent", "BlockRecurrentTransformer", "none", None, "recurrent",
                "Block-Recurrent Transformer"),
    VariantSpec("griffin", "rpt.model.griffin", "Griffin", "none", None, "recurrent", "Griffin"),
)}
assert tuple(REGISTRY) == VARIANTS, "rpt.config.VARIANTS and the registry list the same variants, in one order"


def spec(variant: str) -> VariantSpec:
    if variant not in REGISTRY:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(REGISTRY)}")
    return REGISTRY[variant]


def model_class(variant: str) -> type[nn.Module]:
    # imported by name, not through `importlib` and the module path: an exported model's copy of this code
    # (rpt.hf.bundle) finds every model module by its imports
    from rpt.model.block_recurrent import BlockRecurrentTransformer
    from rpt.model.griffin import Griffin
    from rpt.model.memorizing import MemorizingTransformer
    from rpt.model.rpt import RPT

    s = spec(variant)
    return {c.__name__: c for c in (RPT, MemorizingTransformer, BlockRecurrentTransformer, Griffin)}[s.cls]


def build_model(cfg: ModelConfig | str, seed: int | None = None, **fields: Any) -> nn.Module:
    """The model of `cfg.variant`, initialised from `seed` (None: drawn from torch's global generator); with
    cfg.backbone, that pretrained LM retrofitted (`rpt.model.retrofit.RetrofitRPT`).

    cfg: a ModelConfig, or a preset name with model fields, e.g.
    ``build_model("tiny", variant="griffin", vocab_size=1000)`` (every variant, the baselines included)."""
    if isinstance(cfg, str):
        from rpt.config import RPTConfig

        cfg = RPTConfig.from_preset(cfg, **fields).model
        cfg.validate()
    elif fields:
        raise TypeError("build_model: model fields go with a preset name; a ModelConfig carries its own")
    if cfg.backbone:
        from rpt.model.retrofit import RetrofitRPT

        return RetrofitRPT(cfg, seed=seed)
    return model_class(cfg.variant)(cfg, seed=seed)
