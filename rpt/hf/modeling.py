"""Hugging Face `transformers` integration: every variant as an `AutoModelForCausalLM`.

    import rpt  # registers model_type "rpt" with AutoConfig and AutoModelForCausalLM
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("exported/")   # written by `rpt export` or save_pretrained
    tok = AutoTokenizer.from_pretrained("exported/")
    out = model.generate(tok("def f(x):", return_tensors="pt").input_ids, max_new_tokens=50, do_sample=False)

Without rpt, the folder's own copy of this code loads instead: `from_pretrained("exported/", trust_remote_code=True)`
(rpt.hf.bundle writes it; this file is its modeling_rpt.py and imports only torch, transformers, numpy and the model's
own code).

`RPTForCausalLM` wraps the model that `rpt.model.registry.build_model` builds (`.model`) and computes what it computes:

    no cache         `model.forward` over the whole sequence (differentiable: training, scoring)
    cache            `model.step` continuing the batch's own document cache (`DocumentCache`: the sliding-window K/V,
                     the document memory, the gating window, a recurrent state or a token memory), so generation
                     retrieves at every chunk boundary exactly as `rpt.generate` does; `generate()` feeds the cache
                     only the tokens it has not seen yet

Refused, with one ValueError line naming the argument: beam search (num_beams > 1: a document cache cannot be split
into beams and reordered), an attention_mask with zeros (left padding, prompts of different lengths in one batch: the
model runs a batch in lockstep and a pad token would enter the document and its memory; generate such prompts one
length at a time), inputs_embeds, and attention / hidden-state outputs.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from rpt.config import ModelConfig, check_neighbors
from rpt.hf.configuration import MODEL_TYPE, RPTHFConfig
from rpt.model.decoder import label_targets
from rpt.model.loss import lm_loss
from rpt.model.registry import build_model

# this module inside rpt (True), or the copy in an exported folder, loaded by transformers as remote code (False)
IN_RPT = __name__ == "rpt.hf.modeling"
# the name of the cache in model outputs and generate's model kwargs: "cache" in recent transformers, "past_key_values"
# before
CACHE_KEY = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
_IGNORED_INPUTS = ("position_ids", "cache_position", "token_type_ids", "logits_to_keep", "num_logits_to_keep")


class DocumentCache:
    """One batch of documents being continued: the model's own cache (`model.new_cache()`), plus, for retro, the
    token history its BM25 neighbours are computed from (those of `rpt generate`, with NumPy alone:
    `rpt.labels.bm25.bm25_neighbors_dense`).

    Rows advance in lockstep; the cache cannot be cropped, split into beams or reordered."""

    is_compileable = False
    is_croppable = False
    is_linear = (True,)  # transformers: do not slice inputs by a K/V length (prepare_inputs_for_generation does)

    def __init__(self, model: torch.nn.Module, batch_size: int, n_neighbors: int | None = None,
                 memory: Any = None) -> None:
        cfg = model.cfg
        self.batch_size = batch_size
        self.n_neighbors = n_neighbors or cfg.n_neighbors
        self.state = model.new_cache(memory)
        self.retro = cfg.variant == "retro"
        self.M, self.S = cfg.chunk_size, cfg.segment_len
        self.history: list[list[int]] = [[] for _ in range(batch_size)]
        self.bm25: list[np.ndarray] = [np.full((0, self.n_neighbors), -1, np.int64) for _ in range(batch_size)]

    @property
    def pos(self) -> int:
        """Tokens of each document the cache holds."""
        return int(self.state.pos)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.pos

    def memory_bytes(self) -> int:
        return self.state.memory_bytes()

    def window_bytes(self) -> int:
        return self.state.window_bytes()

    def neighbor_ids(self, input_ids: torch.Tensor) -> torch.Tensor | None:
        """retro: the BM25 neighbour ids covering every chunk that input_ids (about to be stepped) finish."""
        if not self.retro:
            return None
        n_chunks = (self.pos + input_ids.shape[1]) // self.M
        for b, (row, ids) in enumerate(zip(self.history, input_ids.tolist(), strict=True)):
            row.extend(ids)
            have = len(self.bm25[b])
            if have < n_chunks:  # a chunk's neighbours depend only on the text up to its end: computed once
                from rpt.labels.bm25 import bm25_neighbors_dense  # (rpt's module imports SciPy: not at import time)

                new = bm25_neighbors_dense(np.asarray(row[: n_chunks * self.M], dtype=np.int64), self.M, self.S,
                                           self.n_neighbors, first=have)
                self.bm25[b] = np.concatenate([self.bm25[b], new])
        return torch.from_numpy(np.stack(self.bm25)).to(input_ids.device)  # [B, C, K]


def _bm25_forward_ids(input_ids: torch.Tensor, cfg: ModelConfig, k: int) -> torch.Tensor:
    """retro without a cache: each row's BM25 neighbours over its whole sequence ([B, C, k], causal statistics, as
    `rpt eval --source bm25`; a chunk's ids depend only on the text up to its end)."""
    from rpt.labels.bm25 import bm25_neighbors_dense

    rows = [bm25_neighbors_dense(np.asarray(r, dtype=np.int64), cfg.chunk_size, cfg.segment_len, k)
            for r in input_ids.tolist()]
    return torch.from_numpy(np.stack(rows)).long().to(input_ids.device)


def check_attention_mask(attention_mask: torch.Tensor | None) -> None:
    if attention_mask is not None and not bool((attention_mask != 0).all()):
        raise ValueError("attention_mask: padding (a 0 in the mask) is not supported: the model advances a batch in "
                         "lockstep without padding, so left padding or prompts of different lengths would put pad tokens "
                         "into the documents and their memory; pass prompts of one length per batch")


class RPTForCausalLM(PreTrainedModel, GenerationMixin):
    """Any RPT variant as a causal LM for transformers; `.model` is the rpt model itself (see the module docstring)."""

    config_class = RPTHFConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = False
    _no_split_modules: list[str] = []
    _is_stateful = True  # the document cache cannot be rolled back (no assisted decoding)

    def __init__(self, config: RPTHFConfig, model: torch.nn.Module | None = None) -> None:
        """model: an rpt model built from config.to_model_config() (e.g. loaded from a checkpoint); None builds one
        (initialised from seed 0; from_pretrained then loads the weights)."""
        super().__init__(config)
        self.model = model if model is not None else build_model(config.to_model_config(), seed=0)
        self.post_init()

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
        """transformers' `from_pretrained`; a retrofit (config.backbone set) is then rebuilt around its backbone, whose
        weights are read from that path: transformers builds the model on the meta device, and the folder holds only
        the parts the retrofit adds."""
        model = super().from_pretrained(*args, **kwargs)
        if getattr(model.config, "backbone", ""):
            new = model.model.state_dict()  # the retrofit's own tensors (RetrofitRPT.state_dict), loaded
            full = build_model(model.config.to_model_config(), seed=0)
            full.load_state_dict(new)
            first = next(iter(new.values()), None)
            if first is not None:
                full.to(device=first.device, dtype=first.dtype)
            model.model = full.train(model.model.training)
        return model

    # -- transformers hooks ------------------------------------------------------------------------------------
    def _init_weights(self, module: torch.nn.Module) -> None:
        # the rpt model initialises its own weights; only non-persistent buffers (never saved) are rebuilt here
        pos = getattr(module, "_pos", None)
        if isinstance(pos, torch.Tensor) and not pos.is_floating_point():
            with torch.no_grad():
                pos.copy_(torch.arange(pos.numel(), device=pos.device, dtype=pos.dtype))

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model brings its own cache (DocumentCache)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.embed

    def get_output_embeddings(self) -> None:
        return None  # the output layer is the input embedding, read directly

    @property
    def rpt_config(self) -> ModelConfig:
        return self.model.cfg

    # -- forward -----------------------------------------------------------------------------------------------
    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                labels: torch.LongTensor | None = None, past_key_values: DocumentCache | None = None,
                use_cache: bool | None = None, inputs_embeds: torch.Tensor | None = None,
                output_attentions: bool | None = None, output_hidden_states: bool | None = None,
                return_dict: bool | None = None, n_neighbors: int | None = None, memory: Any = None,
                cache: DocumentCache | None = None, **kwargs: Any) -> CausalLMOutputWithPast | tuple:
        """input_ids [B, T] -> logits [B, T, V]; with labels [B, T] (usually input_ids) also `loss`: the mean
        next-token cross-entropy, position t scored on labels[t + 1], -100 ignored.

        past_key_values (or `cache`): a DocumentCache; input_ids then continue its documents (`model.step`).
        use_cache=True without one starts a new DocumentCache (no gradient: `step` is for inference) and returns it;
        otherwise (the default) `model.forward` runs over the whole sequence from the documents' start.
        n_neighbors: K neighbours per chunk fed to CCA (default: the model's); memory: the document memory of a new
        cache (see `model.new_cache`; default exact torch)."""
        cache = cache if past_key_values is None else past_key_values
        for name in _IGNORED_INPUTS:
            kwargs.pop(name, None)
        if kwargs:
            raise TypeError(f"RPTForCausalLM.forward got unexpected argument(s) {', '.join(sorted(kwargs))}")
        if inputs_embeds is not None:
            raise ValueError("inputs_embeds: not supported; pass input_ids (the model reads token ids: retrieval and "
                             "BM25 work on them)")
        if output_attentions or output_hidden_states:
            flag = "output_attentions" if output_attentions else "output_hidden_states"
            raise ValueError(f"{flag}: not available for RPT models")
        if input_ids is None:
            raise ValueError("input_ids: required")
        check_attention_mask(attention_mask)
        if n_neighbors is not None:
            check_neighbors(n_neighbors, "n_neighbors")
        model, cfg = self.model, self.model.cfg
        if cache is not None and not isinstance(cache, DocumentCache):
            if getattr(cache, "get_seq_length", lambda: 1)() != 0:
                raise ValueError(f"{CACHE_KEY}: must be a DocumentCache returned by this model, not "
                                 f"{type(cache).__name__}")
            cache = None  # an empty cache of another kind: start a document cache instead
            use_cache = True
        if cache is None and use_cache:
            cache = DocumentCache(model, input_ids.shape[0], n_neighbors, memory)
        if cache is not None:
            if input_ids.shape[0] != cache.batch_size:
                raise ValueError(f"input_ids: batch of {input_ids.shape[0]} rows continuing a cache of "
                                 f"{cache.batch_size} (beam search and reordering are not supported)")
            K = n_neighbors or cache.n_neighbors
            nb = cache.neighbor_ids(input_ids)
            retrieval = {"n_neighbors": K} if cfg.uses_retrieval else {}
            if nb is not None:
                retrieval["neighbor_ids"] = nb
            logits = model.step(input_ids, cache.state, **retrieval).logits
        else:
            retrieval = {}
            if cfg.uses_retrieval:
                K = n_neighbors or cfg.n_neighbors
                retrieval["n_neighbors"] = K
                if cfg.variant == "retro":
                    retrieval["neighbor_ids"] = _bm25_forward_ids(input_ids, cfg, K)
            logits = model(input_ids, **retrieval).logits
        loss = None
        if labels is not None:
            targets, mask = label_targets(labels, input_ids, None)  # the model's own loss (`forward(labels=)`)
            loss = lm_loss(logits, targets, mask).mean()
        out = CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_KEY: cache})
        if return_dict is False:
            return out.to_tuple()
        return out

    # -- generation --------------------------------------------------------------------------------------------
    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, past_key_values: Any = None,
                                      attention_mask: torch.Tensor | None = None,
                                      inputs_embeds: torch.Tensor | None = None, use_cache: bool | None = None,
                                      cache: Any = None, **kwargs: Any) -> dict[str, Any]:
        """The tokens the document cache has not seen yet (all of them at the first step, then the newest one)."""
        cache = cache if past_key_values is None else past_key_values
        for name in ("next_sequence_length", "is_first_iteration", *_IGNORED_INPUTS):
            kwargs.pop(name, None)
        if inputs_embeds is not None:
            raise ValueError("inputs_embeds: not supported; pass input_ids")
        check_attention_mask(attention_mask)
        if use_cache is None:
            use_cache = True
        if isinstance(cache, DocumentCache):
            input_ids = input_ids[:, cache.pos:]
        return {"input_ids": input_ids, CACHE_KEY: cache if isinstance(cache, DocumentCache) else None,
                "use_cache": use_cache, "attention_mask": attention_mask, **kwargs}

    def _reorder_cache(self, past_key_values: Any, beam_idx: torch.Tensor) -> Any:
        raise ValueError("num_beams: beam search is not supported (a document cache cannot be reordered); use greedy "
                         "decoding or sampling (num_beams=1)")

    @torch.no_grad()
    def generate(self, inputs: torch.Tensor | None = None, generation_config: Any = None, **kwargs: Any) -> Any:
        """transformers' generate with the document cache; refuses beam search, assisted decoding and padding."""
        gen = generation_config if generation_config is not None else self.generation_config
        for name in ("num_beams", "num_beam_groups"):
            value = kwargs.get(name, getattr(gen, name, 1))
            if value is not None and value > 1:
                raise ValueError(f"{name}={value}: beam search is not supported (a document cache cannot be split into "
                                 "beams and reordered); use greedy decoding or sampling with num_beams=1")
        if kwargs.get("penalty_alpha") or getattr(gen, "penalty_alpha", None):
            raise ValueError("penalty_alpha: contrastive search is not supported (it rolls the cache back)")
        if kwargs.get("assistant_model") is not None or kwargs.get("prompt_lookup_num_tokens"):
            raise ValueError("assistant_model: assisted decoding is not supported (it rolls the cache back)")
        if kwargs.get("inputs_embeds") is not None:
            raise ValueError("inputs_embeds: not supported; pass input_ids")
        check_attention_mask(kwargs.get("attention_mask"))
        ids = inputs if inputs is not None else kwargs.get("input_ids")
        if kwargs.get("attention_mask") is None and isinstance(ids, torch.Tensor):
            # every prompt token is real (there is no padding): without this, transformers would guess a mask from
            # pad_token_id and read a pad id inside a prompt as padding
            kwargs["attention_mask"] = torch.ones_like(ids)
        return super().generate(inputs, generation_config, **kwargs)

    def save_pretrained(self, save_directory: Any, *args: Any, **kwargs: Any) -> None:
        """transformers' `save_pretrained`; the folder also gets the model's code (configuration_rpt.py,
        modeling_rpt.py and what they import, with `auto_map` in config.json: rpt.hf.bundle), so that it loads
        without rpt, with trust_remote_code=True. (The copy in such a folder is saved with its code by transformers.)"""
        super().save_pretrained(save_directory, *args, **kwargs)
        if IN_RPT and kwargs.get("is_main_process", True):
            # by name: the copy of this file in an exported folder must not import rpt
            importlib.import_module("rpt.hf.bundle").write_code(save_directory)

    # -- construction from rpt models ----------------------------------------------------------------------------
    @classmethod
    def from_rpt_model(cls, model: torch.nn.Module, **config_kwargs: Any) -> RPTForCausalLM:
        """Wrap an rpt model (its weights are shared, not copied)."""
        config = RPTHFConfig.from_model_config(model.cfg, **config_kwargs)
        hf = cls(config, model=model)
        return hf.to(next(model.parameters()).device).eval()


if IN_RPT:  # not in the copy of an exported folder: that would claim model type "rpt" for every folder loaded after it
    AutoConfig.register(MODEL_TYPE, RPTHFConfig, exist_ok=True)
    AutoModelForCausalLM.register(RPTHFConfig, RPTForCausalLM, exist_ok=True)
_READY = True  # read by rpt.hf.register_now: this module has finished importing (and registered)
