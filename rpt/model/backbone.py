"""A pretrained Hugging Face causal LM as the trunk of RPT (docs/retrofit.md; RETRO §4 "RETROfitting").

The backbone's decoder layers are run here, not through their own `forward`, so that they attend within RPT's
sliding segment window (§3.4: a token of segment s sees segment s - 1 and, causally, its own) and continue a
`KVCache` segment by segment, exactly as RPT's own layers do. Only the weights are the backbone's: the function
of one layer (pre-norm attention with grouped key/value heads and rotary positions, then the pre-norm MLP) is the
Llama family's, checked against the backbone's own forward in tests/retrofit/test_retrofit_model.py.

Supported: the Llama family and its look-alikes (`SUPPORTED`: Llama, Mistral, Qwen2 with its q/k/v biases, ...);
anything else is refused with its model type named, never run wrongly.

Dimension letters: B batch, T tokens, S segment length, H query heads, G key/value heads, E head dim, D width,
P prefix (cached) tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rpt.model.layers import KVCache, apply_rotary, segment_window_mask

SUPPORTED = ("llama", "mistral", "qwen2", "smollm3", "granite")  # model_type values with Llama's layer function


@dataclass
class SinkCache(KVCache):
    """A `KVCache` that also counts the tokens it has seen (the position of the sink before each window)."""

    pos: int = 0


def load_backbone(path: str | Path, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A Hugging Face causal LM from a local folder (config.json + weights) or a .gguf file (dequantised by
    transformers' GGUF support: needs `pip install 'rpt[gguf]'`), in `dtype`, in eval mode. Nothing is downloaded."""
    from transformers import AutoModelForCausalLM

    from rpt.utils import UserError, require

    p = Path(path).expanduser()
    if not p.exists():
        raise UserError(f"backbone {path}: no such folder or .gguf file (a local Hugging Face causal-LM folder, or a "
                        "GGUF file)")
    if torch.empty(0).device.type == "meta":  # built for its shapes only (parameter counts): no weights to read
        return AutoModelForCausalLM.from_config(backbone_config(p)).eval()
    kwargs: dict[str, Any] = {"local_files_only": True}
    if p.suffix == ".gguf":
        require("gguf", "loading a GGUF backbone")
        kwargs["gguf_file"] = p.name
        p = p.parent
    try:
        model = AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype, **kwargs)
    except (OSError, ValueError) as e:
        raise UserError(f"backbone {path}: cannot load it as a causal LM ({str(e).splitlines()[0]})") from None
    check_supported(model)
    return model.eval()


def load_tokenizer(path: str | Path):
    """The backbone's own tokenizer (a folder, or the tokenizer inside a .gguf file)."""
    from transformers import AutoTokenizer

    p = Path(path).expanduser()
    if p.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name, local_files_only=True)
    return AutoTokenizer.from_pretrained(str(p), local_files_only=True)


def backbone_config(path: str | Path) -> Any:
    """The backbone's transformers config, read without its weights."""
    from transformers import AutoConfig

    p = Path(path).expanduser()
    if p.suffix == ".gguf":
        return AutoConfig.from_pretrained(str(p.parent), gguf_file=p.name, local_files_only=True)
    return AutoConfig.from_pretrained(str(p), local_files_only=True)


def check_supported(model: nn.Module) -> None:
    """A ValueError unless `model` is a causal LM whose decoder layers compute Llama's function (`SUPPORTED`)."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", type(model).__name__)
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if kind not in SUPPORTED or layers is None or not len(layers):
        raise ValueError(f"backbone of model type {kind!r}: retrofitting supports {', '.join(SUPPORTED)} (decoder "
                         "layers of the Llama family)")
    attn = layers[0].self_attn
    if hasattr(attn, "q_norm") or getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", False):
        raise ValueError(f"backbone of model type {kind!r}: its attention (query/key norms or its own sliding window) "
                         "is not Llama's; retrofitting supports plain Llama-family attention")


def describe(model: nn.Module) -> dict[str, int]:
    """The shape of a backbone: layers, width, heads, key/value heads, head dim, vocabulary, MLP width."""
    c = model.config
    heads = int(c.num_attention_heads)
    return {"n_layers": int(c.num_hidden_layers), "d_model": int(c.hidden_size), "n_heads": heads,
            "n_kv_heads": int(getattr(c, "num_key_value_heads", None) or heads),
            "head_dim": int(getattr(c, "head_dim", None) or c.hidden_size // heads), "vocab_size": int(c.vocab_size),
            "mlp_hidden": int(c.intermediate_size)}


def rotary(model_rotary: nn.Module, start: int, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [n, E] of absolute positions start .. start + n - 1 from the backbone's own rotary embedding (its
    rope scaling and attention scaling included), fp32."""
    pos = torch.arange(start, start + n, device=device)[None]
    cos, sin = model_rotary(torch.empty(0, device=device, dtype=torch.float32), pos)
    return cos[0].float(), sin[0].float()


class BackboneAttention:
    """The self-attention of one backbone layer over RPT's sliding segment window (training: whole sequence; inference:
    a `KVCache`), or after a shared cached prefix (`with_prefix`, the scorer's). It computes with the backbone's
    projections and owns no parameter (not a Module: the weights are registered once, where the layer is)."""

    def __init__(self, attn: nn.Module, n_heads: int, n_kv_heads: int, head_dim: int) -> None:
        self.attn = attn
        self.H, self.G, self.E = n_heads, n_kv_heads, head_dim
        self.scale = float(getattr(attn, "scaling", head_dim**-0.5))

    def qkv(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h [B, T, D] normed -> q [B, H, T, E], k, v [B, H, T, E] (key/value heads repeated to H), rotary applied."""
        B, T, _ = h.shape
        a = self.attn
        q = a.q_proj(h).view(B, T, self.H, self.E).transpose(1, 2)
        k = a.k_proj(h).view(B, T, self.G, self.E).transpose(1, 2)
        v = a.v_proj(h).view(B, T, self.G, self.E).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.G != self.H:
            k, v = k.repeat_interleave(self.H // self.G, 1), v.repeat_interleave(self.H // self.G, 1)
        return q, k, v

    def out(self, y: torch.Tensor) -> torch.Tensor:
        """y [B, H, T, E] -> [B, T, D] through the output projection."""
        B, _, T, _ = y.shape
        return self.attn.o_proj(y.transpose(1, 2).reshape(B, T, self.H * self.E))

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segment_len: int,
                 cache: KVCache | None = None, sink: tuple[torch.Tensor, torch.Tensor] | None = None,
                 rope: nn.Module | None = None) -> torch.Tensor:
        """h [B, T, D] (normed). Without cache: T a multiple of S, segment s attends to segments s-1 and s (causally
        in its own). With cache: T new tokens inside one segment, continuing it (the cache is updated; a `SinkCache`
        when `sink` is given).

        sink: the attention sink, (k, v) [H, E] of the beginning-of-sequence token at this layer (pre-rotary): every
        window also sees it, one position before the window's first token, as the backbone saw BOS before every text
        it was trained on (Xiao et al. 2024: attention without its sink collapses once the first tokens leave the
        window). rope: the backbone's rotary embedding, for the sink's positions."""
        q, k, v = self.qkv(h, cos, sin)
        B, H, T, E = q.shape
        if cache is not None:
            ck, cv = cache.context()
            L = 0 if ck is None else ck.shape[2]
            keys = k if ck is None else torch.cat([ck, k], 2)
            values = v if cv is None else torch.cat([cv, v], 2)
            mask = torch.arange(L + T, device=h.device)[None, :] <= torch.arange(T, device=h.device)[:, None] + L
            if sink is not None:
                assert rope is not None and isinstance(cache, SinkCache)
                sk, sv = self._sink(sink, rope, torch.tensor([cache.pos - L - 1], device=h.device))  # [1, H, 1, E]
                keys, values = torch.cat([sk.expand(B, -1, -1, -1), keys], 2), torch.cat([sv.expand(B, -1, -1, -1), values], 2)
                mask = F.pad(mask, (1, 0), value=True)
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale)
            cache.append(k, v, segment_len)
            if isinstance(cache, SinkCache):
                cache.pos += T
            return self.out(y)
        S = segment_len
        nS = T // S
        q, k, v = (t.view(B, H, nS, S, E).transpose(1, 2) for t in (q, k, v))  # [B, nS, H, S, E]
        k = torch.cat([F.pad(k, (0, 0, 0, 0, 0, 0, 1, 0))[:, :-1], k], dim=3)  # [B, nS, H, 2S, E]
        v = torch.cat([F.pad(v, (0, 0, 0, 0, 0, 0, 1, 0))[:, :-1], v], dim=3)
        mask = segment_window_mask(nS, S, h.device)  # [nS, S, 2S]
        if sink is not None:
            assert rope is not None
            first = ((torch.arange(nS, device=h.device) - 1).clamp(min=0)) * S  # each window's first position
            sk, sv = self._sink(sink, rope, first - 1)  # [nS, H, 1, E]
            k = torch.cat([sk[None].expand(B, -1, -1, -1, -1), k], 3)  # [B, nS, H, 1 + 2S, E]
            v = torch.cat([sv[None].expand(B, -1, -1, -1, -1), v], 3)
            mask = F.pad(mask, (1, 0), value=True)
        W = k.shape[3]
        mask = mask[:, None].repeat(B, 1, 1, 1)  # [B*nS, 1, S, W]
        y = F.scaled_dot_product_attention(q.reshape(B * nS, H, S, E), k.reshape(B * nS, H, W, E),
                                           v.reshape(B * nS, H, W, E), attn_mask=mask, scale=self.scale)
        return self.out(y.view(B, nS, H, S, E).permute(0, 2, 1, 3, 4).reshape(B, H, T, E))

    def _sink(self, sink: tuple[torch.Tensor, torch.Tensor], rope: nn.Module,
              positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The sink's key (rotated to each of `positions` [N]) and value: [N, H, 1, E] each."""
        k, v = sink  # [H, E]
        pos = positions[None].to(torch.long)
        cos, sin = rope(torch.empty(0, device=k.device, dtype=torch.float32), pos)  # [1, N, E]
        kr = apply_rotary(k[None].expand(len(positions), -1, -1), cos[0][:, None].float(), sin[0][:, None].float())
        return kr[:, :, None], v[None, :, None].expand(len(positions), -1, -1, -1)

    def with_prefix(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, prefix: tuple[torch.Tensor, torch.Tensor],
                    keep: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Full causal attention of h [B, T, D] after cached prefix keys/values ([B, H, P, E] each, rotary applied)
        with key mask keep [B, P + T] (False: padding). Returns (output [B, T, D], this call's (k, v))."""
        q, k, v = self.qkv(h, cos, sin)
        pk, pv = prefix
        P, T = pk.shape[2], q.shape[2]
        causal = torch.arange(P + T, device=h.device)[None, :] <= torch.arange(T, device=h.device)[:, None] + P
        mask = causal[None] & keep[:, None, :]  # [B, T, P + T]
        y = F.scaled_dot_product_attention(q, torch.cat([pk, k], 2), torch.cat([pv, v], 2), attn_mask=mask[:, None],
                                           scale=self.scale)
        return self.out(y), (k, v)
