"""`RPTHFConfig`: the model section of an RPT run (rpt.config.ModelConfig) as a transformers config.

Every ModelConfig field is one attribute, saved with its value even where it is the default (a config keeps its meaning
when the defaults change); `to_model_config` gives the ModelConfig back exactly. This file also runs without rpt: an
exported folder carries a copy (configuration_rpt.py, rpt.hf.bundle).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from transformers import PretrainedConfig

from rpt.config import ModelConfig, from_dict, upgrade_config

MODEL_TYPE = "rpt"
_MODEL_FIELDS = tuple(f.name for f in dataclasses.fields(ModelConfig))


class RPTHFConfig(PretrainedConfig):
    """The model section of an RPTConfig (rpt.config.ModelConfig), one attribute per field, plus what transformers
    reads. `rpt` holds what the export recorded about the run (variant, preset, store, step), for information only."""

    model_type = MODEL_TYPE
    attribute_map = {"hidden_size": "d_model", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
                     "intermediate_size": "mlp_hidden"}

    def __init__(self, **kwargs: Any) -> None:
        kwargs = upgrade_config({"model": kwargs})["model"]  # an export by an earlier rpt: flat keys (cca_rel_bias)
        defaults = dataclasses.asdict(ModelConfig())
        for name in _MODEL_FIELDS:
            value = kwargs.pop(name, defaults[name])
            setattr(self, name, list(value) if isinstance(value, (list, tuple)) else value)
        self.rpt = kwargs.pop("rpt", None) or {}
        kwargs.setdefault("tie_word_embeddings", False)  # the model reads its embedding as the output layer itself
        kwargs.setdefault("is_decoder", True)
        super().__init__(**kwargs)

    @classmethod
    def from_model_config(cls, mcfg: ModelConfig, **kwargs: Any) -> RPTHFConfig:
        return cls(**dataclasses.asdict(mcfg), **kwargs)

    def to_model_config(self) -> ModelConfig:
        """The ModelConfig, type-checked and validated as a config file would be."""
        mcfg = from_dict(ModelConfig, {name: getattr(self, name) for name in _MODEL_FIELDS}, "model")
        mcfg.validate()
        return mcfg

    def to_diff_dict(self) -> dict[str, Any]:
        # every model field, defaults included: a config must keep its meaning when ModelConfig's defaults change
        d = super().to_diff_dict()
        d.update({name: getattr(self, name) for name in _MODEL_FIELDS})
        if self.rpt:
            d["rpt"] = self.rpt
        return d
