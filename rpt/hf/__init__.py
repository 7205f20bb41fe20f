"""Hugging Face: an RPT model as a transformers `AutoModelForCausalLM`, and `rpt export`.

    configuration.py   RPTHFConfig: the model section of a run as a transformers config
    modeling.py        RPTForCausalLM (generate() with the model's own document cache) and DocumentCache
    bundle.py          the model's code for an exported folder: configuration_rpt.py, modeling_rpt.py and the rpt
                       modules they import, their imports of rpt made relative, so that the folder loads without rpt
                       (`AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`)
    export.py          `rpt export`: a checkpoint as such a folder (weights, config, tokenizer, code, model card)

This module stays light: `import rpt` calls `install()`, which registers model_type "rpt" with transformers' Auto
classes without importing transformers. It registers at once when transformers is already imported, and otherwise hooks
its first import: once the `transformers` package has loaded, rpt.hf.modeling is imported, which registers
`RPTHFConfig` with AutoConfig and `RPTForCausalLM` with AutoModelForCausalLM. A failure there is a warning, never a
broken transformers import.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import Any

_PACKAGE = "transformers"
_MODELING = "rpt.hf.modeling"

# name -> module; imported on first use
_LAZY = {"RPTHFConfig": "rpt.hf.configuration", "MODEL_TYPE": "rpt.hf.configuration", "RPTForCausalLM": _MODELING,
         "DocumentCache": _MODELING, "hf_tokenizer": "rpt.hf.export", "write_code": "rpt.hf.bundle"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'rpt.hf' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)


def register_now() -> None:
    """Import rpt.hf.modeling (it registers when its import finishes); a no-op while it is itself being imported."""
    mod = sys.modules.get(_MODELING)
    if mod is not None and not getattr(mod, "_READY", False):
        return  # rpt.hf.modeling imported transformers: it registers itself at its end
    try:
        importlib.import_module(_MODELING)
    except Exception as e:  # an incompatible transformers: warn, never break the user's import
        from rpt.utils import RPTWarning, error_line

        warnings.warn(f"RPT models are not registered with transformers' Auto classes ({error_line(e)})", RPTWarning,
                      stacklevel=2)


class _LoaderThenRegister(importlib.abc.Loader):
    """Wraps the transformers package's loader: runs it, then registers."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        register_now()

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, resource readers: the inner loader's
        return getattr(self.inner, name)


class _WhenTransformersLoads(importlib.abc.MetaPathFinder):
    """A one-shot finder for the top-level transformers package."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _PACKAGE:
            return None
        uninstall()
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _LoaderThenRegister(spec.loader)
        return spec


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _WhenTransformersLoads)]


def install() -> None:
    if _PACKAGE in sys.modules:
        register_now()
    elif not any(isinstance(f, _WhenTransformersLoads) for f in sys.meta_path):
        sys.meta_path.insert(0, _WhenTransformersLoads())
