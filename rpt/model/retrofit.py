"""RPT retrofitted onto a pretrained causal LM (docs/retrofit.md): the backbone is the trunk, retrieval is added.

    backbone layers 0 .. n_lower-1      RPT's lower decoder: chunk representations come from their output states
    chunk encoder, retriever, query     new (§3.1 "Retriever", the footnote's query augmentation)
    augmentation, neighbour gate
    backbone layers n_lower .. L-1      RPT's upper decoder; chunked cross-attention with its neighbour gate inserted
                                        between attention and MLP of the layers in cfg.cca_layers, through a residual
                                        whose output projection starts at zero
    the backbone's norm and LM head     the output

At initialisation CCA adds exactly zero, so the model computes its backbone's function over the sliding window
(a test, to float tolerance). The backbone attends within RPT's sliding segment window (§3.4: a token of segment s sees
segments s - 1 and s, a window of S + 1 .. 2S tokens) and retrieves beyond it; the retrievable rule, labels, training
loop, long-document evaluation and generation are RPT's own, unchanged: `RetrofitRPT` keeps `RPT`'s contract
(rpt.model.registry) and its forward / step, and replaces only what the trunk is made of. The backbone is frozen
(requires_grad False); its weights are not written into checkpoints, which name the backbone by model.backbone.

With model.lora_rank > 0 the backbone's linear layers named by model.lora_targets carry LoRA adapters
(rpt.model.lora): they train and are saved with the new parts, the backbone's own weights stay frozen and unsaved. The
adapters start at zero (B = 0), so the identity at initialisation holds with them. What depends on the adapted weights
is never kept across an update: chunk representations are computed in each forward, and the attention sinks (the
BOS token's keys and values) are computed again whenever an adapter has changed, with gradients in training.

Dimension letters: B batch, T tokens, S segment length, C chunks, M chunk length, K neighbours, D width, V vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rpt.config import RPT_VARIANTS, ModelConfig, RPTConfig
from rpt.model.backbone import BackboneAttention, SinkCache, check_supported, describe, load_backbone, rotary
from rpt.model.cca import ChunkedCrossAttention, NeighborKV
from rpt.model.decoder import draw_seed
from rpt.model.layers import KVCache, RMSNorm, init_weights, set_attention_dropout
from rpt.model.rpt import RPT


class RetrofitLayer(nn.Module):
    """One backbone decoder layer over the sliding segment window, with chunked cross-attention between its attention
    and its MLP when `with_cca` (§3.1, RETRO §2.4). The call is RPT's DecoderLayer's."""

    def __init__(self, layer: nn.Module, shape: dict[str, int], cfg: ModelConfig, with_cca: bool) -> None:
        super().__init__()
        self.layer = layer  # the backbone's decoder layer: its weights, registered here once
        self.attn = BackboneAttention(layer.self_attn, shape["n_heads"], shape["n_kv_heads"], shape["head_dim"])
        self.cca_norm = RMSNorm(cfg.d_model, cfg.norm_eps) if with_cca else None
        self.cca = (ChunkedCrossAttention(cfg.d_model, cfg.n_heads, cfg.chunk_size, cfg.dropout, cfg.rope_base,
                                          cfg.cca.positions, cfg.norm_eps, cfg.cca.context_norm, cfg.cca.rel_bias,
                                          cfg.cca.shift_values, cfg.cca.rel_bias_init, cfg.cca.rel_bias_scale)
                    if with_cca else None)
        self.segment_len = cfg.segment_len
        self.rope: nn.Module | None = None  # the backbone's rotary embedding (set by RetrofitRPT with the sink)
        # the attention sink of this layer: key (pre-rotary) and value [H, E] of BOS (`BackboneAttention`); derived
        # from the frozen backbone, so not saved
        self.register_buffer("sink_k", None, persistent=False)
        self.register_buffer("sink_v", None, persistent=False)

    def forward(self, x: torch.Tensor, rot: tuple[torch.Tensor, torch.Tensor], nkv: NeighborKV | None = None,
                start: int = 0, cache: KVCache | None = None, query: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, D] (tokens start .. start + T - 1) -> [B, T, D]; query as RPT's DecoderLayer."""
        layer = self.layer
        sink = None if self.sink_k is None else (self.sink_k, self.sink_v)
        x = x + self.attn(layer.input_layernorm(x), *rot, self.segment_len, cache, sink, self.rope)
        if self.cca is not None and nkv is not None:
            x = x + self.cca(self.cca_norm(x if query is None else query), nkv, start)
        return x + layer.mlp(layer.post_attention_layernorm(x))


class RetrofitRPT(RPT):
    """RPT whose trunk is a pretrained Hugging Face causal LM (module docstring; docs/retrofit.md).

    cfg.backbone names the backbone (a folder or a .gguf file), loaded here; `backbone` passes a loaded one instead
    (tests build a tiny random Llama). cfg's d_model, n_layers and vocab_size must be the backbone's
    (`rpt.retrofit.backbone_fields` sets them); n_heads is the new modules' head count.
    """

    def __init__(self, cfg: ModelConfig | RPTConfig, seed: int | None = None, backbone: nn.Module | None = None) -> None:
        nn.Module.__init__(self)
        cfg = cfg.model if isinstance(cfg, RPTConfig) else cfg
        if cfg.variant not in RPT_VARIANTS:
            raise ValueError(f"variant {cfg.variant!r}: a backbone is retrofitted as {', '.join(RPT_VARIANTS)} (xl: the "
                             "backbone over the sliding window alone)")
        cfg.validate()
        seed = draw_seed(seed)
        hf = backbone if backbone is not None else load_backbone(cfg.backbone)
        check_supported(hf)
        shape = describe(hf)
        wrong = [f"model.{k}={getattr(cfg, k)} (backbone: {shape[k]})" for k in ("d_model", "n_layers", "vocab_size")
                 if getattr(cfg, k) != shape[k]]
        if wrong:
            raise ValueError(f"the config does not describe its backbone: {', '.join(wrong)}; rpt.retrofit."
                             "backbone_fields gives the backbone's values")
        for p in hf.parameters():
            p.requires_grad_(False)
        self._backbone_ids = {id(t) for t in (*hf.parameters(), *hf.buffers())}
        self._lora: list[nn.Module] = []
        if cfg.lora_rank:
            from rpt.model.lora import add_adapters

            self._lora = add_adapters(hf, cfg, seed)
        self.__dict__["_hf"] = hf  # not a module: its parts are registered below (`merged_backbone`)
        inner = hf.model
        self.cfg = cfg
        self.__dict__["hf_config"] = hf.config  # not a module: exported with the weights (rpt.retrofit.export_retrofit)
        self.embed = inner.embed_tokens
        self.drop = nn.Identity()  # the backbone was trained without embedding dropout
        self.norm = inner.norm
        tied = hf.lm_head.weight is inner.embed_tokens.weight
        self.lm_head = None if tied else hf.lm_head
        self.rotary_emb = inner.rotary_emb
        retrieval = cfg.uses_retrieval
        self.layers = nn.ModuleList(RetrofitLayer(layer, shape, cfg, retrieval and i in cfg.cca_layers)
                                    for i, layer in enumerate(inner.layers))
        self._build_retrieval(cfg)
        bos = getattr(hf.config, "bos_token_id", None)
        self._bos = None if bos is None else int(bos)
        self._sinks_of: tuple | None = None  # the adapters' (storage, version) the sinks were computed from
        if self._bos is not None:
            with torch.no_grad():
                self._attention_sinks(self._bos)
            if self._lora:  # every forward first brings the sinks up to date with the adapters
                self.register_forward_pre_hook(_refresh_sinks_hook)
        new = self._new_modules()
        init_weights(new, cfg.init_std, cfg.n_layers, seed)
        set_attention_dropout(new, cfg.attn_dropout)
        if retrieval and (cfg.cca.qk_init == "match" or cfg.cca.ov_init == "identity"):
            self._cca_copy_prior(seed)
        with torch.no_grad():  # the residual that starts at zero: CCA's output projection (the copy prior's half too)
            for layer in self.layers:
                if layer.cca is not None:
                    layer.cca.attn.out.weight.zero_()

    def _attention_sinks(self, bos: int) -> None:
        """Each layer's key and value of the BOS token at the start of a text (it attends to itself alone), for the
        sink every window sees (`BackboneAttention`); differentiable where gradients are enabled."""
        x = self.embed(torch.tensor([[bos]], device=self.embed.weight.device))  # [1, 1, D]
        rot = self._rot(0, 1, x.device)
        for layer in self.layers:
            a, lay = layer.attn, layer.layer
            h = lay.input_layernorm(x)
            rep = a.H // a.G
            k = a.attn.k_proj(h).view(a.G, a.E).repeat_interleave(rep, 0)  # [H, E] before rotary
            v = a.attn.v_proj(h).view(a.G, a.E).repeat_interleave(rep, 0)
            layer.sink_k, layer.sink_v = k, v
            object.__setattr__(layer, "rope", self.rotary_emb)  # a reference, not a submodule (registered once above)
            _, _, vv = a.qkv(h, *rot)
            x = x + a.out(vv)  # one key: the attention output is its value
            x = x + lay.mlp(lay.post_attention_layernorm(x))

    def _adapter_state(self) -> tuple:
        return tuple((p.data_ptr(), p._version) for p in self.lora_parameters())

    def _refresh_sinks(self) -> None:
        """With LoRA, the sinks of the adapted weights: in training with gradients, computed again in every forward
        (their graph is the adapters' too); otherwise again whenever an adapter tensor has changed (an update, a
        load, a move) since they were computed."""
        if not self._lora or self._bos is None:
            return
        if torch.is_grad_enabled() and any(p.requires_grad for p in self.lora_parameters()):
            self._attention_sinks(self._bos)
            self._sinks_of = None
            return
        state = self._adapter_state()
        if state != self._sinks_of:
            with torch.no_grad():
                self._attention_sinks(self._bos)
            self._sinks_of = state

    def step(self, input_ids: torch.Tensor, cache: Any, *args: Any, **kwargs: Any) -> Any:
        """RPT's step (`RPT.step`), after the attention sinks are brought up to date with the adapters (forward does
        the same through a pre-hook, registered with LoRA)."""
        with torch.no_grad():
            self._refresh_sinks()
        return super().step(input_ids, cache, *args, **kwargs)

    def new_cache(self, memory: Any = None) -> Any:
        """RPT's cache, with layer caches that count positions (the sink's)."""
        cache = super().new_cache(memory)
        cache.layers = [SinkCache() for _ in self.layers]
        return cache

    def _new_modules(self) -> nn.Module:
        """A container of the parts the retrofit adds (each under a distinct name, so `init_weights` draws each from
        its own keyed generator)."""
        box = nn.Module()
        for name in ("encoder", "retriever", "query_aug", "gate"):
            if getattr(self, name) is not None:
                box.add_module(name, getattr(self, name))
        for i, layer in enumerate(self.layers):
            if layer.cca is not None:
                box.add_module(f"layer{i}_cca", layer.cca)
                box.add_module(f"layer{i}_cca_norm", layer.cca_norm)
        return box

    def new_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """(name, parameter) of everything the retrofit adds (the LoRA adapters too, with model.lora_rank > 0): what
        trains with the backbone frozen."""
        return [(n, p) for n, p in self.named_parameters() if id(p) not in self._backbone_ids]

    def lora_parameters(self) -> list[nn.Parameter]:
        """The LoRA adapters' A and B of every adapted layer (none with model.lora_rank = 0)."""
        return [p for m in self._lora for p in (*m.lora_A.parameters(), *m.lora_B.parameters())]

    def merged_backbone(self) -> nn.Module:
        """The backbone as this model computes it: a copy of the Hugging Face causal LM with the LoRA adapters merged
        into its weights (W + (lora_alpha / lora_rank) B A), of the backbone's own class, ready for its
        `save_pretrained`; without LoRA, a copy of the backbone. This model is unchanged."""
        from rpt.model.lora import merged

        return merged(self._hf)

    # ---- the backbone's positions and output -------------------------------------------------------------------
    def _rot(self, start: int, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary(self.rotary_emb, start, n, device)

    def _output_weight(self) -> torch.Tensor:
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(x), self._output_weight())

    # ---- checkpoints hold what the retrofit adds; the backbone is named by model.backbone -----------------------
    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        """The new parts' tensors only (the frozen backbone is rebuilt from model.backbone)."""
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
        out = super().state_dict(*args, **kwargs)
        for key in self._backbone_keys(prefix):
            out.pop(key, None)
        return out

    def _backbone_keys(self, prefix: str = "") -> list[str]:
        named = [*self.named_parameters(remove_duplicate=False), *self.named_buffers(remove_duplicate=False)]
        return [prefix + n for n, t in named if id(t) in self._backbone_ids]

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Load the new parts' tensors; the backbone's keys, when absent, keep the loaded backbone's values."""
        full = dict(state_dict)
        own = nn.Module.state_dict(self)
        for key in self._backbone_keys():
            if key not in full and key in own:
                full[key] = own[key]
        return super().load_state_dict(full, strict=strict, assign=assign)


def _refresh_sinks_hook(model: RetrofitRPT, args: Any) -> None:
    """The forward pre-hook of a RetrofitRPT with LoRA: its attention sinks brought up to date with the adapters."""
    model._refresh_sinks()
