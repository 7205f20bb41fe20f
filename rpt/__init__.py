"""RPT: the Retrieval-Pretrained Transformer (Rubin & Berant, TACL) in PyTorch.

    import rpt
    rpt.prepare("my_docs/", "data/mine", tokenizer="bpe:2048")      # a folder of text / JSONL -> token stores
    rpt.label("data/mine", kind="lex", span=1024, segment_len=128)   # BM25 candidates for training
    rpt.train("tiny", "data/mine", "runs/mine", steps=200)           # a preset (or YAML / RPTConfig) + overrides
    model = rpt.load("runs/mine")                                    # a run, a checkpoint or an exported folder
    print(model.generate("Once upon a time", max_new_tokens=50))     # text in, text out
    print(model.evaluate("data/mine").perplexity)                    # long-document perplexity

    from rpt import RPTConfig, build_model
    net = build_model("tiny", variant="rpt-sem", vocab_size=V)       # any variant by name, the baselines too
    out = net(input_ids, labels=input_ids)                           # out.logits [B, T, V], out.loss

Exported models (`rpt export`, `rpt.export(run, out)`, `model.export(out)`) load with transformers'
AutoModelForCausalLM: with trust_remote_code=True anywhere (the folder carries the model's code), without it once rpt
is imported (rpt.hf). `import rpt` stays light: torch loads when a function below is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rpt import hf
from rpt.config import RPTConfig
from rpt.version import __version__

if TYPE_CHECKING:  # what the lazy names below are, for type checkers
    from rpt.api import EvalResult, LoadedModel, evaluate, label, load, prepare
    from rpt.api import generate as generate
    from rpt.api import train as train
    from rpt.hf.export import export
    from rpt.model.registry import build_model
    from rpt.model.rpt import RPT

__all__ = ["RPT", "EvalResult", "LoadedModel", "RPTConfig", "__version__", "build_model", "evaluate", "export", "generate",
           "label", "load", "prepare", "train"]

hf.install()  # registers with transformers' Auto classes when transformers loads (rpt/hf/__init__.py)

# name -> (module, attribute); imported on first use
_LAZY = {"RPT": ("rpt.model.rpt", "RPT"), "build_model": ("rpt.model.registry", "build_model"),
         "load": ("rpt.api", "load"), "label": ("rpt.api", "label"), "evaluate": ("rpt.api", "evaluate"),
         "prepare": ("rpt.api", "prepare"),
         "EvalResult": ("rpt.api", "EvalResult"), "LoadedModel": ("rpt.api", "LoadedModel"),
         "generate": ("rpt.api", "generate"), "train": ("rpt.api", "train"), "export": ("rpt.hf.export", "export")}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'rpt' has no attribute {name!r}")
    import importlib

    module, attr = _LAZY[name]
    mod = importlib.import_module(module)
    return mod if attr is None else getattr(mod, attr)
