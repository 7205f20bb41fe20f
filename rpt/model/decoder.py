"""The frame every variant shares: token embedding -> decoder layers over sliding segment windows -> norm -> the tied
output embedding, with the `rpt.model.registry` contract (forward over a whole sequence, step over a cache).

`TiedLM` holds what RPT and the baselines compute alike (rotary angles at absolute positions, the tied output, the
parameter count). `SegmentDecoder` is the whole model for the variants that read no neighbours (the baselines of
Table 2): a subclass says which layers it stacks (`build_layers`), may draw parameters `init_weights` leaves alone
(`init_extra`), and may replace how one piece of a document continues its cache (`_step_piece`).

Dimension letters: B batch, T tokens, S segment length, D width, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from rpt.config import ModelConfig, RPTConfig
from rpt.model.layers import RMSNorm, init_weights, rotary_cos_sin, set_attention_dropout
from rpt.model.loss import Sum, lm_loss, lm_loss_chunked


@dataclass
class RPTOutput:
    """What `forward` / `step` of every variant return (`SegmentDecoder`, `rpt.model.rpt.RPT`); the fields a
    variant does not compute stay None.

    logits            [B, T, V]; None when forward computed the LM loss itself (loss_chunk > 0)
    lm                (summed NLL, number of targets) of the LM loss, computed in chunks (forward with loss_chunk)
    retrieval_scores  [B, C, C] s_q(c_j) for query chunk i, -inf where j is not retrievable (forward, rpt-* only)
    prefix_scores     [B, C, Cp] s_q of the chunks before the sequence (forward with prefix_ids: training's negatives
                      from beyond the span), -inf where not retrievable or padding
    neighbor_ids      [B, C, K] chunk ids CCA used (-1 = empty slot); None for xl
    top_ids/top_scores [B, C, R] the retriever's own top-R (R = retrieve_k), rpt-* only
    gates             [B, C, K] neighbour gate values
    chunk_start       index of the first chunk the per-chunk fields describe (0 for forward)
    loss              forward with labels: the mean next-token cross-entropy (a scalar), else None
    """

    logits: torch.Tensor | None
    lm: Sum | None = None
    retrieval_scores: torch.Tensor | None = None
    prefix_scores: torch.Tensor | None = None
    neighbor_ids: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None
    top_scores: torch.Tensor | None = None
    gates: torch.Tensor | None = None
    chunk_start: int = 0
    loss: torch.Tensor | None = None


class TiedLM:
    """Mixin for an nn.Module with `cfg`, `embed`, `drop` and `norm`: the padded input embedding, rotary angles, the
    tied output (logits or the chunked LM loss), the parameter count."""

    cfg: ModelConfig
    embed: nn.Embedding
    drop: nn.Dropout
    norm: RMSNorm
    # run each decoder layer under torch.utils.checkpoint in training (`set_activation_checkpointing`)
    activation_checkpointing: bool = False

    def _run_layer(self, layer: nn.Module, *args: Any) -> torch.Tensor:
        """layer(*args); with activation checkpointing on, in training with gradients enabled, through the
        non-reentrant torch.utils.checkpoint: the layer keeps only its inputs for the backward pass and runs its
        forward again there (the RNG state replayed, so dropout draws the same masks)."""
        if self.activation_checkpointing and self.training and torch.is_grad_enabled():  # type: ignore[attr-defined]
            return torch.utils.checkpoint.checkpoint(layer, *args, use_reentrant=False)
        return layer(*args)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())  # type: ignore[attr-defined]

    @staticmethod
    def attention_layer_elements(cfg: ModelConfig, math_attention: bool) -> int:
        """Elements one token keeps for the backward pass in one pre-norm SwiGLU layer with sliding-window attention,
        as counted with saved-tensor hooks (tests/train/test_memory_estimate.py): 4 F in the MLP; 12 D in the norms,
        q/k/v with their rotary products, the attention output and the residuals; D for each of the two residual
        dropouts when model.dropout > 0. Then the attention's own. `math_attention`: the unfused path, which a CPU
        takes whenever the attention probabilities take dropout (no fused CPU kernel does); it keeps three [H, 2S]
        rows per token (the probabilities, the dropout mask, the dropped probabilities). A fused kernel keeps none,
        only the boolean window mask made float: 2S."""
        D, H, S = cfg.d_model, cfg.n_heads, cfg.segment_len
        dropouts = 2 * D if cfg.dropout > 0 else 0
        return 4 * cfg.mlp_hidden + 12 * D + dropouts + (3 * H * 2 * S if math_attention else 2 * S)

    @classmethod
    def layer_activation_elements(cls, cfg: ModelConfig, T: int, math_attention: bool) -> int:
        """Activation elements one sequence of T tokens keeps for the backward pass in the decoder layers (the
        pre-flight memory estimate, rpt.training.footprint). xl's layers; a variant with other layers says what they keep
        (the retrieval path of retro / rpt is counted apart, by the estimate)."""
        return T * cfg.n_layers * cls.attention_layer_elements(cfg, math_attention)

    @classmethod
    def largest_layer_elements(cls, cfg: ModelConfig, T: int, math_attention: bool) -> int:
        """What the one layer keeping most keeps of `layer_activation_elements`: xl's layers are alike, and a variant
        whose layers are xl's but one (memorizing's kNN layer, block-recurrent's recurrent layer) counts everything
        beyond xl's in that one. A variant with other layers says so."""
        xl_layer = T * cls.attention_layer_elements(cfg, math_attention)
        return cls.layer_activation_elements(cfg, T, math_attention) - (cfg.n_layers - 1) * xl_layer

    @classmethod
    def checkpointed_layer_elements(cls, cfg: ModelConfig, T: int, math_attention: bool) -> int:
        """`layer_activation_elements` under activation checkpointing: every layer keeps only its input, D per token
        at each of the n_layers boundaries, and in the backward pass one layer at a time runs again and holds what it
        keeps without checkpointing: the largest layer's, at the peak."""
        return T * cfg.n_layers * cfg.d_model + cls.largest_layer_elements(cfg, T, math_attention)

    @classmethod
    def temporary_bytes(cls, cfg: ModelConfig, batch: int, T: int) -> int:
        """The largest working set a layer allocates and frees within its own forward or backward, on top of what is
        saved (the pre-flight estimate): none for xl's layers; Griffin's scan transients, the kNN layer's search scores."""
        return 0

    def _rot(self, start: int, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary_cos_sin(torch.arange(start, start + n, device=device), self.cfg.head_dim, self.cfg.rope_base)

    def _output_weight(self) -> torch.Tensor:
        """The output embedding [V, D]: the input embedding (tied)."""
        return self.embed.weight

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(x), self._output_weight())

    def _embed_segments(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """input_ids [B, T] -> (embeddings [B, Tp, D], rotary angles of positions 0..Tp-1), right-padded to whole
        segments (Tp = T rounded up to S): the padding comes after every real token, so it is inert."""
        T, S = input_ids.shape[1], self.cfg.segment_len
        ids = F.pad(input_ids, (0, -(-T // S) * S - T))
        return self.drop(self.embed(ids)), self._rot(0, ids.shape[1], ids.device)

    def _lm_head(self, x: torch.Tensor, input_ids: torch.Tensor, loss_chunk: int,
                 loss_mask: torch.Tensor | None, labels: torch.Tensor | None = None) -> tuple[torch.Tensor | None, Any]:
        """(logits [B, T, V], None) of the final states x [B, Tp, D]; with loss_chunk > 0 (None, the LM loss over
        input_ids computed `loss_chunk` targets at a time): the [B, T, V] logits are never materialised.
        labels [B, T]: the LM loss (a `Sum`) is over labels instead of input_ids (see `label_targets`), with the
        logits too unless loss_chunk > 0."""
        T = input_ids.shape[1]
        targets = input_ids
        if labels is not None:
            targets, loss_mask = label_targets(labels, input_ids, loss_mask)
        if loss_chunk > 0:
            return None, lm_loss_chunked(self.norm(x[:, :T]), self._output_weight(), targets, loss_mask, loss_chunk)
        logits = self._logits(x)[:, :T]
        return logits, (lm_loss(logits, targets, loss_mask) if labels is not None else None)


def set_activation_checkpointing(model: nn.Module, on: bool = True) -> None:
    """Turn activation checkpointing of the decoder layers on or off (train.activation_checkpointing) in the model of
    any variant (`TiedLM`), also inside a wrapper (DDP, torch.compile). The function the model computes, and its
    gradients, stay the same; a training step keeps one layer's activations instead of all of them and runs each
    layer's forward twice. A model without decoder layers of this package is a ValueError."""
    found = [m for m in model.modules() if isinstance(m, TiedLM)]
    if not found:
        raise ValueError(f"activation checkpointing: {type(model).__name__} is not a model of rpt.model (no decoder "
                         "layers to checkpoint)")
    for m in found:
        m.activation_checkpointing = on


def label_targets(labels: torch.Tensor, input_ids: torch.Tensor,
                  loss_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(targets, mask) of `labels` [B, T] for `lm_loss`: position t is scored on labels[t + 1] (the shift of the
    training loss); a label of -100 is not scored (transformers' convention), nor a position loss_mask marks False."""
    if labels.shape != input_ids.shape:
        raise ValueError(f"labels: shape {tuple(labels.shape)} differs from input_ids {tuple(input_ids.shape)}")
    labels = labels.to(input_ids.device)
    mask = labels != -100
    if loss_mask is not None:
        mask = mask & loss_mask.bool()
    return labels.masked_fill(~mask, 0), mask


def mean_loss(lm: Sum | None) -> torch.Tensor | None:
    """The mean of an LM loss `Sum` (nats per scored target; 0 with no target), or None."""
    return None if lm is None else lm.mean()


def draw_seed(seed: int | None) -> int:
    """The initialisation seed: as given, or drawn from torch's global generator (so `torch.manual_seed(s)` before
    building a model does the same as passing a seed)."""
    return int(torch.randint(0, 2**62, (), dtype=torch.int64, device="cpu")) if seed is None else seed


class SegmentDecoder(TiedLM, nn.Module):
    """A decoder without chunked cross-attention, built by `build_layers`; see the module docstring."""

    def __init__(self, cfg: ModelConfig | RPTConfig, seed: int | None = None) -> None:
        """seed: the initialisation seed (`init_weights`: every tensor named as in xl starts from xl's value for the
        same seed); None draws it from torch's global generator."""
        super().__init__()
        cfg = cfg.model if isinstance(cfg, RPTConfig) else cfg
        cfg.validate()
        seed = draw_seed(seed)
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(self.build_layers(cfg))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        init_weights(self, cfg.init_std, cfg.n_layers, seed)
        set_attention_dropout(self, cfg.attn_dropout)
        self.init_extra(seed)

    def build_layers(self, cfg: ModelConfig) -> list[nn.Module]:
        raise NotImplementedError

    def init_extra(self, seed: int) -> None:
        """Draw the parameters `init_weights` keeps as constructed (1-D ones), from keyed generators."""

    def new_cache(self, memory: Any = None) -> Any:
        raise NotImplementedError

    def _no_neighbors(self, neighbor_ids: torch.Tensor | None, use_supplied: torch.Tensor | None) -> None:
        if neighbor_ids is not None or use_supplied is not None:
            raise ValueError(f"variant {self.cfg.variant!r} reads no neighbours (it has no chunked cross-attention): "
                             "neighbor_ids and use_supplied must be None")

    def forward(self, input_ids: torch.Tensor, neighbor_ids: torch.Tensor | None = None,
                use_supplied: torch.Tensor | None = None, n_neighbors: int | None = None,
                retrieve_k: int | None = None, loss_chunk: int = 0, loss_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None):
        """input_ids [B, T], any T, from the documents' start -> logits [B, T, V]; loss_chunk > 0: the LM loss over
        input_ids (real tokens marked by loss_mask [B, T]) in `out.lm`, `loss_chunk` targets at a time, and no logits
        (as `RPT.forward`). labels [B, T] (usually input_ids): `out.loss` is the mean next-token cross-entropy,
        position t scored on labels[t + 1], -100 not scored. The retrieval arguments exist for the common contract:
        neighbour ids are refused, n_neighbors / retrieve_k ignored (evaluation passes n_neighbors to every variant)."""
        self._no_neighbors(neighbor_ids, use_supplied)
        x, rot = self._embed_segments(input_ids)  # [B, Tp, D]
        for layer in self.layers:
            x = self._run_layer(layer, x, rot)
        logits, lm = self._lm_head(x, input_ids, loss_chunk, loss_mask, labels)
        return RPTOutput(logits=logits, lm=lm, loss=mean_loss(lm) if labels is not None else None)

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor, cache: Any, neighbor_ids: torch.Tensor | None = None,
             use_supplied: torch.Tensor | None = None, n_neighbors: int | None = None,
             retrieve_k: int | None = None):
        """Continue the documents in `cache` with input_ids [B, n] (any n >= 1) -> logits [B, n, V]. Pieces never
        cross a segment boundary (the windows roll there, and memories and states move on): n / S pieces."""
        self._no_neighbors(neighbor_ids, use_supplied)
        S = self.cfg.segment_len
        logits = []
        i, n = 0, input_ids.shape[1]
        while i < n:
            take = min(n - i, S - cache.pos % S)
            logits.append(self._step_piece(input_ids[:, i : i + take], cache))
            cache.pos += take
            i += take
        return RPTOutput(logits=logits[0] if len(logits) == 1 else torch.cat(logits, 1))

    def _step_piece(self, input_ids: torch.Tensor, cache: Any) -> torch.Tensor:
        """One piece inside one segment: every layer continues its own cache entry (`cache.layers[i]`)."""
        rot = self._rot(cache.pos, input_ids.shape[1], input_ids.device)
        x = self.embed(input_ids)
        for layer, lc in zip(self.layers, cache.layers, strict=True):
            x = layer(x, rot, cache=lc)
        return self._logits(x)
