"""Typed configuration: model, data, training and evaluation, with named presets and a YAML round trip.

YAML only serialises these dataclasses. Loading validates every key and type: an unknown key or a value of the wrong
type is a `ConfigError` naming the dotted key (``model.d_model``), never a silent default.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, get_args, get_origin, get_type_hints

import yaml

from rpt.utils import load_yaml, short_repr

VARIANTS = ("xl", "retro", "rpt-lex", "rpt-sem", "memorizing", "block-recurrent", "griffin")
Variant = Literal["xl", "retro", "rpt-lex", "rpt-sem", "memorizing", "block-recurrent", "griffin"]
RETRIEVING = ("retro", "rpt-lex", "rpt-sem")  # the variants with chunked cross-attention (the rest read no neighbours)
QK_MATCH_GAP = 2.56  # nats an identical state scores above an orthogonal one under the copy prior (ModelConfig.qk_match_std)
RPT_VARIANTS = ("xl", *RETRIEVING)  # the variants of the one RPT class (rpt.model.rpt); the rest are the baselines


class ConfigError(ValueError):
    """A configuration value or key is invalid; the message names the dotted key."""


# K, neighbours per chunk at inference (`--neighbors` of eval, generate, explore). Cost grows linearly with K: every
# query chunk gathers K neighbours of 2M tokens ([B, Q, K, 2M, D], kept per segment in the cache) and each CCA layer
# attends over those K * 2M keys. At K = 16 with M = 64 that is 2048 keys per chunk, the whole 2S self-attention
# window of the paper's model (S = 1024): retrieval then costs as much as the decoder itself. The paper uses 2 to 4;
# K = 1000 ran for minutes and took 1 GB for what K = 5 does in seconds.
MAX_NEIGHBORS = 16
# the linear layers of a Llama-family decoder layer (rpt.model.backbone.SUPPORTED), which LoRA may adapt
# (model.lora_targets): the attention's projections, then the MLP's
LORA_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
LORA_TARGETS = (*LORA_ATTENTION, "gate_proj", "up_proj", "down_proj")


def check_neighbors(k: int | None, flag: str = "--neighbors") -> None:
    """The one check of K at inference (None = the model's own n_neighbors): 1 <= K <= MAX_NEIGHBORS."""
    if k is not None and not 1 <= k <= MAX_NEIGHBORS:
        raise ValueError(f"{flag} must be >= 1 and <= {MAX_NEIGHBORS} (neighbours per chunk; the paper uses 2 to 4), "
                         f"not {k}")


@dataclass
class CCAConfig:
    """Chunked cross-attention (§3.1): how CCA reads the neighbour chunks (model.cca). Named settings: `paper` (the
    model as printed) and `default` (this code's); `model.cca: paper` selects one whole, `model.cca.rel_bias` one field."""

    SETTINGS: ClassVar[dict[str, dict[str, Any]]] = {
        # the paper as printed: independent random projections, no learned relative-offset bias, keys reading their
        # own values, neighbour states fed to CCA without a norm (docs/design.md#chunked-cross-attention)
        "paper": {"qk_init": "random", "ov_init": "random", "rel_bias": False, "shift_values": False,
                  "context_norm": False},
        "default": {},
    }

    context_norm: bool = True  # RMSNorm on neighbour states before CCA's key/value projection
    rel_bias: bool = True  # a learned CCA logit bias per head and relative offset (neighbour index - query offset)
    rel_bias_init: Literal["alibi", "zero"] = "alibi"  # its start: ALiBi slopes around the aligned offset | flat
    rel_bias_scale: float = 16.0  # multiplies the ALiBi slopes of that start: 16: head 0 one-hot (docs/results/copy-test.md)
    shift_values: bool = True  # CCA key k of a neighbour reads the value of its next token k + 1
    # The copy prior: CCA starts out able to find and copy a neighbour token like its own, so it reads neighbours that
    # share tokens with the query at arbitrary offsets (code) without first discovering that circuit
    # (docs/results/code.md#the-copy-prior):
    # CCA's query and key projections: one shared draw of std qk_match_std, so that a query token starts out
    # attending to neighbour tokens whose (normalised) states resemble its own ("find my token") | independent draws
    qk_init: Literal["random", "match"] = "match"
    qk_match_std: float = 0.0  # 0: scaled with the width so an identical state scores 2.56 nats above an orthogonal
    #                            one at every width (0.1 at the tiny preset, where the prior was measured)
    # CCA's value and output projections: "identity": out @ value = ov_scale * I (an orthogonal draw and its
    # transpose), so a read neighbour token's state is added to the query's residual as it is | independent draws
    ov_init: Literal["random", "identity"] = "identity"
    ov_scale: float = 0.05  # that identity's scale: how much of a read neighbour state the first update adds
    positions: bool = True  # rotary positions in CCA (neighbour token k at k, query offset u at M - 1 + u)
    # what CCA's queries are made from: the reading token's state in the layer that holds CCA (the paper's) | its
    # lower-decoder state, the space the neighbours' keys come from (docs/retrofit.md#the-query-of-chunked-cross-attention)
    query: Literal["upper", "lower"] = "upper"


@dataclass
class GateConfig:
    """The neighbour gate (§3.1): how much of what CCA read reaches the residual (model.gate). Named settings: `paper`
    (as printed: the gate scales the neighbour states, C^g = g * C) and `default` (this code's)."""

    SETTINGS: ClassVar[dict[str, dict[str, Any]]] = {"paper": {"on": "states"}, "default": {}}

    # max(eta, sigmoid) with a gradient below eta | max(eta, sigmoid), dead below eta (as printed) |
    # 0.1 + 0.9 sigmoid (authors' code) | additive logit bias (their 1B model) | off
    kind: Literal["paper", "clamp", "official", "bias", "none"] = "paper"
    eta: float = 0.1  # eta, the gate's lower bound (§3.1 footnote)
    on: Literal["values", "states"] = "values"  # what a multiplicative gate scales: CCA's values | the states (C^g)


@dataclass
class MemorizingConfig:
    """The memorizing transformer baseline (Wu et al. 2022; variant memorizing reads it only)."""

    layer: int = -1  # the layer that also reads the kNN memory (-1: n_layers - 4, Wu et al.'s 9th of 12)
    topk: int = 32  # memory entries each query token reads (Wu et al.: 32)
    tokens: int = 65536  # tokens the memory keeps, oldest dropped first (the paper's rows: 32K and 65K)


@dataclass
class BlockRecurrentConfig:
    """The block-recurrent transformer baseline (Hutchins et al. 2022; variant block-recurrent reads it only)."""

    layer: int = -1  # the recurrent layer (-1: n_layers - 3, as Hutchins et al.'s 10th of 12)
    state: int = 512  # state vectors carried from block to block (blocks are segments)
    gate: Literal["fixed", "learned"] = "fixed"  # the state update's gate (fixed | LSTM-style)


@dataclass
class GriffinConfig:
    """The Griffin baseline (De et al. 2024; variant griffin reads it only)."""

    pattern: str = "RRA"  # block types repeated over the layers: R recurrent (RG-LRU), A local attention
    rnn_width: int = 0  # the RG-LRU width (0: 4/3 d_model, as De et al.)
    conv: int = 4  # width of the temporal convolution before the RG-LRU


@dataclass
class ModelConfig:
    """The RPT architecture (§3.1, docs/design.md#model). One config serves all four variants."""

    # xl (no retrieval) | retro (BM25 neighbours) | rpt-lex | rpt-sem | the baselines of Table 2: memorizing (Wu et al.
    # 2022), block-recurrent (Hutchins et al. 2022), griffin (De et al. 2024); rpt.model.registry maps each to its class
    variant: Variant = "rpt-sem"
    vocab_size: int = 50277  # GPT-NeoX vocabulary, as in the paper
    d_model: int = 1024  # width D
    n_layers: int = 12  # total decoder layers; the lower decoder is the first n_layers // 2
    n_heads: int = 8  # attention heads H; head_dim = d_model // n_heads
    mlp_hidden: int = 2730  # SwiGLU hidden width (8/3 * D)
    chunk_size: int = 64  # M, tokens per chunk
    segment_len: int = 1024  # S, sliding-window stride; each segment also sees the previous one (window 2S)
    cca_layers: list[int] = field(default_factory=lambda: [7, 8, 9, 10, 11])  # upper-decoder layers with CCA
    n_neighbors: int = 2  # K, neighbours per chunk fed to CCA (can be raised at inference)
    cca: CCAConfig = field(default_factory=CCAConfig)  # chunked cross-attention's options (paper | default | fields)
    gate: GateConfig = field(default_factory=GateConfig)  # the neighbour gate's options (paper | default | fields)
    query_augmentation: bool = True  # neighbour tokens cross-attend to the query chunk (paper footnote)
    dropout: float = 0.05  # residual dropout of every sublayer (and of attention, with attn_dropout -1)
    # dropout on the attention probabilities (-1: `dropout`, the paper's one rate). 0 keeps every attention call on a
    # fused kernel on a CPU, which has none with attention dropout: xl's step at the small preset ~2x faster there
    # (docs/results/speed.md#attention-kernels); GPUs' fused kernels take dropout
    attn_dropout: float = -1.0
    rope_base: float = 10000.0  # rotary position embedding's base (RoFormer's theta)
    norm_eps: float = 1e-6  # RMSNorm's epsilon
    init_std: float = 0.02  # std of the normal draws of the weights (output projections: / sqrt(2 n_layers), GPT-2 style)
    # --- the baselines (Table 2); each field is read by its own variant only -------------------------------------
    memorizing: MemorizingConfig = field(default_factory=MemorizingConfig)  # memorizing's kNN memory
    block_recurrent: BlockRecurrentConfig = field(default_factory=BlockRecurrentConfig)  # block-recurrent's cell
    griffin: GriffinConfig = field(default_factory=GriffinConfig)  # griffin's blocks
    # --- retrofitting a pretrained LM (docs/retrofit.md) ---------------------------------------------------------
    # a Hugging Face causal-LM folder or .gguf file (Llama family) whose embeddings, layers and output head are the
    # trunk, frozen; its shape sets d_model, n_layers, n_heads, vocab_size. Empty: RPT from scratch
    backbone: str = ""
    backbone_lower: int = 0  # with a backbone: how many of its first layers form the lower decoder (0: half)
    # with a backbone: the rank of LoRA adapters (Hu et al. 2022, through peft: pip install 'rpt[peft]') on the linear
    # layers named by lora_targets in every backbone layer; they train with the new parts, the backbone's own weights
    # stay frozen (docs/retrofit.md#lora-on-the-backbone). 0: off
    lora_rank: int = 0
    lora_alpha: float = 16.0  # the adapters' output is scaled by lora_alpha / lora_rank
    # the backbone layers' linear layers that get adapters, of q_proj, k_proj, v_proj, o_proj (attention), gate_proj,
    # up_proj, down_proj (MLP)
    lora_targets: list[str] = field(default_factory=lambda: list(LORA_ATTENTION))
    lora_dropout: float = 0.0  # dropout on the adapters' input in training

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def attention_dropout(self) -> float:
        """The dropout rate on attention probabilities in training: attn_dropout, or dropout where that is -1."""
        return self.dropout if self.attn_dropout < 0 else self.attn_dropout

    @property
    def memory_layer_index(self) -> int:
        """The memorizing layer: as configured, else n_layers - 4 (index 8 of 12, as Wu et al.'s official config), never
        below the middle layer (index 2 of the tiny preset's 4)."""
        return self.memorizing.layer if self.memorizing.layer >= 0 else max(self.n_layers // 2, self.n_layers - 4)

    @property
    def recurrent_layer_index(self) -> int:
        """The block-recurrent layer: as configured, else n_layers - 3 (index 9 of 12, as Hutchins et al.), never below
        the middle layer."""
        return self.block_recurrent.layer if self.block_recurrent.layer >= 0 else max(self.n_layers // 2, self.n_layers - 3)

    @property
    def qk_match_std(self) -> float:
        """The std of the copy prior's shared query/key draw. A logit between normalised states x, y (|x|^2 = D) is
        about sqrt(E) std^2 <x, y> for head width E, so an identical state scores sqrt(E) std^2 D above an orthogonal
        one: the automatic std keeps that at 2.56 nats (std 0.1 at D = 64, E = 16) instead of letting it grow with
        the width (41 nats at the small preset with a fixed 0.1, a near-hard argmax)."""
        if self.cca.qk_match_std > 0:
            return self.cca.qk_match_std
        return math.sqrt(QK_MATCH_GAP / (math.sqrt(self.head_dim) * self.d_model))

    @property
    def n_lower(self) -> int:
        return self.backbone_lower if self.backbone and self.backbone_lower else self.n_layers // 2

    @property
    def uses_retrieval(self) -> bool:
        """True for the variants with chunked cross-attention over neighbour chunks (retro, rpt-lex, rpt-sem)."""
        return self.variant in RETRIEVING

    @property
    def has_retriever(self) -> bool:
        """True when the model scores chunks itself (rpt-lex, rpt-sem); retro takes neighbour ids from outside."""
        return self.variant in ("rpt-lex", "rpt-sem")

    def validate(self) -> None:
        if self.d_model % self.n_heads:
            raise ConfigError(f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}")
        if self.segment_len % self.chunk_size:
            raise ConfigError(f"model.segment_len={self.segment_len} is not a multiple of model.chunk_size={self.chunk_size}")
        bad = [i for i in self.cca_layers if not self.n_lower <= i < self.n_layers]
        if bad and self.uses_retrieval:  # the other variants have no CCA: cca_layers is not read
            raise ConfigError(f"model.cca_layers {bad} are not upper-decoder layers [{self.n_lower}, {self.n_layers})")
        if not (0 <= self.dropout < 1 and (self.attn_dropout == -1 or 0 <= self.attn_dropout < 1)):
            raise ConfigError(f"model.dropout={self.dropout} and model.attn_dropout={self.attn_dropout} must be in [0, 1) "
                              "(attn_dropout -1: the same as dropout)")
        if self.n_neighbors < 1:
            raise ConfigError("model.n_neighbors must be >= 1")
        if self.cca.qk_match_std < 0:
            raise ConfigError(f"model.cca.qk_match_std must be >= 0 (0: scaled with the width), not {self.cca.qk_match_std}")
        for key, i in (("memorizing.layer", self.memorizing.layer), ("block_recurrent.layer", self.block_recurrent.layer)):
            if not -1 <= i < self.n_layers:
                raise ConfigError(f"model.{key}={i} is not a layer index in [0, {self.n_layers}) (or -1 for the default)")
        for key, v in (("memorizing.topk", self.memorizing.topk), ("memorizing.tokens", self.memorizing.tokens),
                       ("block_recurrent.state", self.block_recurrent.state), ("griffin.conv", self.griffin.conv)):
            if v < 1:
                raise ConfigError(f"model.{key} must be >= 1, not {v}")
        if not 0 <= self.backbone_lower < self.n_layers:
            raise ConfigError(f"model.backbone_lower={self.backbone_lower} is not in [0, {self.n_layers}) (0: half)")
        self._validate_lora()
        if self.griffin.rnn_width < 0:
            raise ConfigError(f"model.griffin.rnn_width must be >= 0 (0: 4/3 d_model), not {self.griffin.rnn_width}")
        if not self.griffin.pattern or set(self.griffin.pattern) - {"R", "A"}:
            raise ConfigError(f"model.griffin.pattern={self.griffin.pattern!r} must be a non-empty string of R "
                              "(recurrent block) and A (local attention block)")

    def _validate_lora(self) -> None:
        if self.lora_rank < 0:
            raise ConfigError(f"model.lora_rank must be >= 0 (0: no LoRA), not {self.lora_rank}")
        if not self.lora_rank:
            return
        if not self.backbone:
            raise ConfigError(f"model.lora_rank={self.lora_rank} adapts a pretrained backbone: set model.backbone too "
                              "(rpt train --backbone PATH), or model.lora_rank=0")
        if self.lora_alpha <= 0:
            raise ConfigError(f"model.lora_alpha must be > 0 (the adapters' scale is lora_alpha / lora_rank), not "
                              f"{self.lora_alpha}")
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"model.lora_dropout={self.lora_dropout} must be in [0, 1)")
        bad = [t for t in self.lora_targets if t not in LORA_TARGETS]
        if bad or not self.lora_targets or len(set(self.lora_targets)) != len(self.lora_targets):
            what = f"names {bad}, not linear layers of a backbone layer" if bad else "must name each layer once"
            raise ConfigError(f"model.lora_targets {what}: choose from {', '.join(LORA_TARGETS)}")


@dataclass
class DataConfig:
    """Where documents come from and how they become token sequences."""

    corpus: str = "stdlib"  # stdlib | a folder | a .jsonl file | code:<folder> | hf:pg19 | hf:codeparrot | hf:proof-pile
    tokenizer: str = "bpe:8192"  # bpe:<vocab> (trained on the corpus, cached) | a tokenizer.json path | a HF name
    store: str = "data/stdlib"  # token store folder
    seq_len: int = 16384  # training sequence length L (retrieval happens inside one sequence during training)


@dataclass
class TrainConfig:
    """The optimisation of §3.3-3.4 and App. A."""

    steps: int = 1000  # optimiser updates of the run
    batch_size: int = 1  # sequences per micro-batch
    grad_accum: int = 1  # micro-batches per update
    lr: float = 5e-3  # peak learning rate (App. A)
    min_lr_ratio: float = 0.1  # cosine decay to 0.1 x peak
    warmup_steps: int = 100  # linear learning-rate warm-up from 0 to lr, then the cosine decay
    optimizer: Literal["adamw", "adabelief"] = "adabelief"
    weight_decay: float = 1e-8  # decoupled weight decay of both optimisers (App. A)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # the optimiser's moment decays (beta1, beta2)
    grad_clip: float = 1.0  # the global gradient norm is clipped to this
    tau_max: float = 2.0  # LambdaRank margin at the end of training (2 for code, 4 PG19, 8 ArXiv, 128 Books3)
    # LambdaRank's gains: linear (g = s_t, or the BM25 score for rpt-lex) | exponential (2^g - 1, the authors' code)
    lambdarank_gain: Literal["linear", "exponential"] = "linear"
    alpha_ret: float = 0.1  # final retrieval-loss weight (ramped linearly from 0)
    alpha_ramp_steps: int = 200  # steps of the linear alpha_ret ramp (paper: first 100K of 500K)
    ss_fraction: float = 0.9  # scheduled sampling anneals p_ss 1 -> 0 over this fraction of steps
    # p_ss over training: the paper's cosine anneal | 1 throughout (teacher forcing only: CCA always reads the gold
    # neighbours) | 0 throughout (no teacher forcing: always the retriever's own) — the two ablations of Table 4
    ss_schedule: Literal["anneal", "gold", "own"] = "anneal"
    # negatives from beyond the span (rpt-lex, rpt-sem): this many tokens of the document before each training
    # sequence, a multiple of model.segment_len, run through the lower decoder and chunk encoder without gradient; their
    # chunks join every query chunk's ranking pool as non-candidates, under the retrievable rule, so the ranking loss
    # sees pools nearer the size of whole-document evaluation's. Only the ranking loss reads them: CCA's neighbours
    # stay inside the sequence. 0: the paper, pools inside the sequence
    prefix_negatives: int = 0
    loss_chunk: int = 1024  # LM loss over this many target tokens at a time (no [B, T, V] logits); 0 = full logits
    # (the tiny preset uses 0)
    neighbor_lr_scale: float = 1.0  # learning-rate multiplier of CCA, the neighbour gate and the query augmentation
    gate_hold_steps: int = 0  # the neighbour gate's parameters stay at their initial values for this many updates
    seed: int = 0  # weights, data order, scheduled sampling and dropout: one seed, one run
    precision: Literal["fp32", "bf16"] = "fp32"  # bf16 autocast is for GPUs
    # torch.compile the model in place (its state_dict keys do not change); the first update pays the compilation
    compile: bool = False
    # run each decoder layer under torch.utils.checkpoint: a layer keeps only its input for the backward pass and
    # computes its forward again there (the same loss and gradients; about a third more compute per step)
    activation_checkpointing: bool = False
    # start from another run's weights: a run folder (its newest checkpoint), a checkpoint folder or its
    # model.safetensors; the tensors whose name and shape match are loaded (not the optimiser, step or RNG), the rest
    # initialised as usual. A run that resumes from checkpoints in out_dir ignores it. Empty: from scratch
    init_from: str = ""
    out_dir: str = "runs/rpt"  # the run folder: config.yaml, log.jsonl, checkpoints/, best/
    checkpoint_every: int = 100  # updates between checkpoints (and one at the end)
    keep_last: int = 3  # checkpoints kept in checkpoints/; older ones are deleted (best/ stays)
    # validation: the LM loss on the first val_sequences sequences of the store's validation split every val_every
    # updates and at the end, each with a checkpoint; the one of the lowest loss is kept in <out_dir>/best.
    # -1 (default): at every checkpoint when the store has a validation split, else never; 0: never
    val_every: int = -1
    val_sequences: int = 16  # sequences of the validation split the validation loss is measured on
    log_every: int = 10  # updates per line of log.jsonl (means over those updates)
    tensorboard: bool = False  # also write the log's scalars as TensorBoard events into <out_dir>/tensorboard
    # log the scalars of log.jsonl to Weights & Biases too (pip install 'rpt[wandb]'): online when logged in, else
    # offline (and with WANDB_MODE=offline); an unreachable W&B falls back to offline, never stops the run
    wandb: bool = False
    wandb_project: str = "rpt"  # the W&B project of wandb


@dataclass
class EvalConfig:
    """Long-document evaluation (§3.4 'Retrieval at inference time'): the defaults of `rpt eval --config`."""

    split: str = "test"  # the store's split evaluated
    n_neighbors: int = 2  # K at inference: 1 .. MAX_NEIGHBORS (the paper: 2, 3 or 4)
    # neighbours fed to CCA; auto: the variant's own (model for rpt-*, bm25 for retro, none for the rest)
    source: Literal["auto", "model", "bm25", "oracle", "dpr", "random", "none"] = "auto"
    memory: Literal["auto", "faiss", "torch"] = "auto"  # faiss on CPU, torch matmul on GPU
    max_documents: int = 0  # 0 = all
    # a sem label store of the split with span doc (`rpt label --kind sem --span doc`): the oracle's neighbours, the
    # retrieval metrics, the scored-chunk figures and the subgroup analysis read it. Empty: none
    labels: str = ""
    with_metrics: bool = False  # retrieval metrics against labels (the retriever, BM25, recency, random, oracle)
    per_chunk: bool = False  # keep each chunk's loss and neighbours in the result (baseline needs it on both sides)
    baseline: str = ""  # a result JSON of the same split made with per_chunk: the gain per chunk with / without gold
    # BM25's idf and length statistics at inference: of the retrievable chunks so far | of the whole document (as the
    # training labels)
    bm25_statistics: Literal["causal", "document"] = "causal"
    precision: Literal["fp32", "bf16"] = "fp32"  # bf16: the model under autocast on GPUs (the NLL in fp32)
    retriever: str = ""  # a DPR-style retriever (`rpt dpr`) or hf:NAME: the neighbours of source dpr
    memory_tokens: int = 0  # memorizing: its kNN memory's size at evaluation (0: the checkpoint's model setting)
    # what source oracle feeds: the scorer's top K of the scored candidates, positives first (the paper's "best
    # neighbours according to the scoring LM") | only its positives (s_t > 0): fewer than K where fewer exist
    oracle: Literal["top-k", "positives"] = "top-k"


@dataclass
class RPTConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    @classmethod
    def from_preset(cls, name: str, **model_overrides: Any) -> RPTConfig:
        """A named preset; keyword arguments override model fields (``variant=``, ``vocab_size=``, a nested one as
        ``**{"cca.rel_bias": False}``, a named setting as ``cca="paper"``)."""
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
        cfg = from_dict(RPTConfig, _merge(PRESETS[name](), {"model": model_overrides}))
        cfg.validate()
        return cfg

    def validate(self) -> None:
        check_ranges(self)
        self.model.validate()
        if self.data.seq_len % self.model.segment_len:
            raise ConfigError(f"data.seq_len={self.data.seq_len} is not a multiple of model.segment_len={self.model.segment_len}")
        if self.train.wandb and not self.train.wandb_project.strip():
            raise ConfigError("train.wandb_project must name a W&B project when train.wandb is on")
        if self.train.prefix_negatives % self.model.segment_len:
            raise ConfigError(f"train.prefix_negatives={self.train.prefix_negatives} is not a multiple of "
                              f"model.segment_len={self.model.segment_len}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self, path: str | Path | None = None) -> str:
        text = yaml.safe_dump(self.to_dict(), sort_keys=False)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_yaml(cls, path_or_text: str | Path, recorded: bool = False) -> RPTConfig:
        """A YAML file, or YAML text (anything with a newline); a `preset:` key starts from that preset. `recorded`: a
        config.yaml that rpt wrote into a run or checkpoint folder, perhaps an earlier version of rpt with keys that
        have moved since (read through `upgrade_config`); a config someone writes gets no such leniency."""
        is_text = isinstance(path_or_text, str) and "\n" in path_or_text
        if not is_text and not Path(path_or_text).is_file():
            raise ConfigError(f"config file {path_or_text} not found")
        text = str(path_or_text) if is_text else Path(path_or_text).read_text()
        data = load_yaml(text, "config text" if is_text else f"config {path_or_text}", ConfigError) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"config {path_or_text} is not a mapping")
        if recorded:
            data = upgrade_config(data)
        base = data.pop("preset", None)
        if base is not None and base not in PRESETS:
            raise ConfigError(f"unknown preset {base!r}; choose from {', '.join(PRESETS)}")
        cfg_dict = PRESETS[base]() if base else {}
        cfg = from_dict(RPTConfig, _merge(cfg_dict, data))
        cfg.validate()
        return cfg


def shipped_configs() -> list[str]:
    """Names of the configs shipped in rpt/configs (not the presets): `--config NAME` loads one."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if p.stem not in SIZE_NAMES)


def config_file(ref: str | Path, name: str = "config") -> Path:
    """The YAML file a config reference names: a YAML file, a run folder or a checkpoint folder (its config.yaml), or
    the name of a shipped config (`shipped_configs()`). `name` is how the caller's argument is called in the error."""
    path = Path(ref)
    if path.is_file():
        return path
    if path.is_dir():
        for cand in (path / "config.yaml", path.parent.parent / "config.yaml"):  # a run, or one of its checkpoints
            if cand.is_file():
                return cand
        raise ConfigError(f"{name} {ref}: a folder without config.yaml (expected a run or checkpoint folder)")
    shipped = CONFIG_DIR / f"{ref}.yaml"
    if "/" not in str(ref) and shipped.is_file() and str(ref) not in SIZE_NAMES:
        return shipped
    raise ConfigError(f"{name} {ref}: no such file or folder, nor a shipped config (shipped: "
                      f"{', '.join(shipped_configs())})")


def load_config(ref: str | Path, name: str = "config") -> RPTConfig:
    """The validated RPTConfig of a config reference (see `config_file`); a run or checkpoint folder's is read as
    recorded (`RPTConfig.from_yaml(..., recorded=True)`: also one written by an earlier version of rpt)."""
    return RPTConfig.from_yaml(config_file(ref, name), recorded=Path(ref).is_dir())


def check_ranges(cfg: RPTConfig) -> None:
    """A ConfigError naming the key of the first numeric field whose value is meaningless (a negative learning rate, a
    zero batch, a dropout of 1), before anything divides by it or hands it to torch."""
    at_least = lambda lo: (lambda v: v >= lo, f">= {lo}")  # noqa: E731
    positive = (lambda v: v > 0, "> 0")
    unit = (lambda v: 0 <= v <= 1, "in [0, 1]")
    below_one = (lambda v: 0 <= v < 1, "in [0, 1)")
    rules = {
        "model.vocab_size": at_least(1), "model.d_model": at_least(1), "model.n_layers": at_least(1),
        "model.n_heads": at_least(1), "model.mlp_hidden": at_least(1), "model.chunk_size": at_least(1),
        "model.segment_len": at_least(1), "model.gate.eta": below_one, "model.rope_base": positive,
        "model.norm_eps": positive, "model.init_std": positive, "model.cca.ov_scale": at_least(0),
        "data.seq_len": at_least(1),
        "train.steps": at_least(1), "train.batch_size": at_least(1), "train.grad_accum": at_least(1),
        "train.lr": positive, "train.min_lr_ratio": unit, "train.warmup_steps": at_least(0),
        "train.weight_decay": at_least(0), "train.tau_max": positive, "train.alpha_ret": at_least(0),
        "train.alpha_ramp_steps": at_least(0), "train.ss_fraction": unit, "train.loss_chunk": at_least(0),
        "train.neighbor_lr_scale": at_least(0), "train.gate_hold_steps": at_least(0),
        "train.prefix_negatives": at_least(0),
        "train.checkpoint_every": at_least(1), "train.keep_last": at_least(0), "train.log_every": at_least(1),
        "train.val_every": at_least(-1), "train.val_sequences": at_least(1),
        "eval.n_neighbors": (lambda v: 1 <= v <= MAX_NEIGHBORS, f"in [1, {MAX_NEIGHBORS}]"),
        "eval.max_documents": at_least(0), "eval.memory_tokens": at_least(0),
    }
    for key, (ok, wanted) in rules.items():
        value = cfg
        for name in key.split("."):
            value = getattr(value, name)
        if not (math.isfinite(value) and ok(value)):
            raise ConfigError(f"{key} must be {wanted}, not {value}")
    betas = cfg.train.betas
    if len(betas) != 2 or not all(math.isfinite(b) and 0 <= b < 1 for b in betas):
        raise ConfigError(f"train.betas must be two numbers in [0, 1) (the optimiser's moment decays), not {betas}")


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict as {"section.key": value}, lists as JSON text (comparable, hashable)."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_config(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, list) else v
    return out


# what only some variants read ("section.key" prefixes): two runs that differ only in fields their variant never reads
# computed the same thing (resume, the sweep's check and `python -m lab compare` treat them as one setting)
_READ_ONLY_BY = {
    RETRIEVING: ("model.cca.", "model.cca_layers", "model.gate.", "model.query_augmentation", "model.n_neighbors",
                 "train.neighbor_lr_scale", "train.gate_hold_steps"),  # these two touch only CCA and the gate
    # the retrieval loss, scheduled sampling
    ("rpt-lex", "rpt-sem"): ("train.tau_max", "train.alpha_", "train.ss_", "train.lambdarank_",
                              "train.prefix_negatives"),
    ("memorizing",): ("model.memorizing.",),
    ("block-recurrent",): ("model.block_recurrent.",),
    ("griffin",): ("model.griffin.",),
}


# config fields that name a folder: two configs naming it by a relative and an absolute path are the same setting
# config keys that change no weight of a run (logging, checkpoint cadence, recomputation, and what the store was built
# from, which a run records from the store's prepare.json: the store is what it trains on): two runs that differ only
# in these are the same setting (`python -m lab sweep` resumes across them, `python -m lab compare` pools them)
BOOKKEEPING = ("train.log_every", "train.checkpoint_every", "train.keep_last", "train.tensorboard", "train.wandb",
               "train.wandb_project", "train.activation_checkpointing", "data.corpus", "data.tokenizer")
PATH_FIELDS = ("data.store", "train.out_dir", "train.init_from", "model.backbone")


def resolve_paths(flat: dict[str, Any]) -> dict[str, Any]:
    """A flat config with its PATH_FIELDS resolved against the working directory (runs/x -> /abs/runs/x)."""
    return {k: str(Path(v).resolve()) if k in PATH_FIELDS and isinstance(v, str) and v else v for k, v in flat.items()}


def effective_fields(flat: dict[str, Any]) -> dict[str, Any]:
    """A flat config (`flat_config`) without the fields its variant never reads, and with automatic values resolved:
    what decides what the run computes."""
    variant = flat["model.variant"]
    unread = tuple(p for readers, prefixes in _READ_ONLY_BY.items() if variant not in readers for p in prefixes)
    out = {k: v for k, v in flat.items() if not k.startswith(unread)}
    if out.get("model.cca.qk_init") != "match":
        out.pop("model.cca.qk_match_std", None)
    elif not out.get("model.cca.qk_match_std"):  # 0: the width's automatic std, compared as its value
        out["model.cca.qk_match_std"] = ModelConfig(d_model=out["model.d_model"], n_heads=out["model.n_heads"]).qk_match_std
    if out.get("model.cca.ov_init") != "identity":
        out.pop("model.cca.ov_scale", None)
    return out


def config_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The keys in which two flat configs differ, each as "key old -> new", sorted."""
    return [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


T = TypeVar("T")


# Keys of earlier versions of rpt, each with the key that holds its value now. A config file or --set naming one is
# refused with the new name; `upgrade_config` reads a recorded config (a run folder's config.yaml) that has them.
MOVED = {
    **{f"model.cca_{k}": f"model.cca.{k}" for k in ("context_norm", "rel_bias", "rel_bias_init", "rel_bias_scale",
                                                    "shift_values", "qk_init", "qk_match_std", "ov_init", "ov_scale",
                                                    "positions")},
    "model.gate_eta": "model.gate.eta", "model.gate_on": "model.gate.on",
    **{f"model.memory_{k}": f"model.memorizing.{k}" for k in ("layer", "topk", "tokens")},
    **{f"model.recurrent_{k}": f"model.block_recurrent.{k}" for k in ("layer", "state", "gate")},
    **{f"model.griffin_{k}": f"model.griffin.{k}" for k in ("pattern", "rnn_width", "conv")},
    "data.chunk_size": "model.chunk_size",
}


def upgrade_config(data: dict[str, Any]) -> dict[str, Any]:
    """A recorded config (nested dict) written by an earlier version of rpt, in the current layout: each key of MOVED
    under its new name (data.chunk_size, which had to equal model.chunk_size, dropped) and the former string
    `model.gate` (the gate's kind) as model.gate.kind. A current config comes back unchanged. Used where rpt reads the
    config a run or checkpoint folder recorded (`RPTConfig.from_...(recorded=True)`) and an export's config;
    config files and --set get no such leniency."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    model = out.get("model")
    if isinstance(model, dict) and isinstance(model.get("gate"), str):
        model["gate"] = {"kind": model["gate"]}
    for old, new in MOVED.items():
        (section, name), (new_section, *path) = old.split("."), new.split(".")
        part = out.get(section)
        if not isinstance(part, dict) or name not in part:
            continue
        value = part.pop(name)
        target = out.setdefault(new_section, {})
        for key in path[:-1]:
            target = target.setdefault(key, {})
        target.setdefault(path[-1], value)
    return out


def _setting(tp: Any, name: str, key: str) -> dict[str, Any]:
    """The named setting `name` of a nested config class (its SETTINGS): every field, as a dict."""
    settings = getattr(tp, "SETTINGS", {})
    if name not in settings:
        hint = (f"; the gate's kind is {key}.kind now ({key}.kind={name})"
                if tp is GateConfig and name in get_args(get_type_hints(GateConfig)["kind"]) else "")
        raise ConfigError(f"{key}={short_repr(name)} is not a named setting of {key} (choose from "
                          f"{', '.join(settings) or 'none'}, or set its fields: {key}.FIELD){hint}")
    return dataclasses.asdict(tp(**settings[name]))


def _normalise(cls: type, data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`data` for dataclass `cls` with each nested section as a dict: a named setting (`cca: paper`) as its fields, a
    dotted key (`cca.rel_bias: false`, as --set and rpt.train(**{"model.cca.rel_bias": False}) give) inside its
    section. Keys apply in order, so a setting named after a field's value replaces it, and the field after it
    changes the setting."""
    hints = get_type_hints(cls)
    out: dict[str, Any] = {}
    for key, value in data.items():
        head, dot, rest = key.partition(".") if isinstance(key, str) else (key, "", "")
        tp = hints.get(head)
        where = f"{prefix}.{head}" if prefix else head
        if not (tp is not None and dataclasses.is_dataclass(tp)):
            out[key] = value  # unknown keys and dotted keys of plain fields: from_dict names them
            continue
        current = out.get(head, {})
        if isinstance(current, str):
            current = _setting(tp, current, where)
        elif not isinstance(current, dict):
            current = {}
        if dot:
            out[head] = _normalise(tp, {**current, rest: value}, where)
        elif isinstance(value, str):
            out[head] = _setting(tp, value, where)
        elif isinstance(value, dict):
            out[head] = _normalise(tp, value, where)
        else:
            out[head] = value  # not a mapping: _check says so
    return out


def _merge(a: dict, b: dict) -> dict:
    """RPTConfig dict `b` over `a`: nested sections merge field by field, a named setting or dotted key in either is
    read first (`_normalise`)."""
    return _deep_merge(_normalise(RPTConfig, a), _normalise(RPTConfig, b))


def _deep_merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# a number as people write it: 2e-3, 1E-4, 1e4, .5, 1_000 (Python decides what the underscores may be)
_NUMERIC = re.compile(r"[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?")


def _as_number(value: Any) -> Any:
    """A string in a common numeric notation as an int or float; anything else unchanged.

    PyYAML reads YAML 1.1, whose floats need a dot and a signed exponent: 2e-3, 1E-4, 1e4 and 1.0e4 load as strings
    (1.0e-3 and 1_000 load as numbers). Config files and --set values are written by people, so these are numbers
    here; "nan" and "inf" are not accepted this way (YAML's .nan and .inf still are)."""
    if not isinstance(value, str) or not _NUMERIC.fullmatch(value):
        return value
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            continue
    return value


def _check(value: Any, tp: Any, key: str) -> Any:
    """Validate `value` against the annotation `tp`; return it (ints are accepted for floats, integral numbers for
    ints, and numbers written as strings for both: see `_as_number`)."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):  # a named setting is a dict by now (from_dict's `_normalise`)
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {type(value).__name__}")
        return from_dict(tp, value, prefix=key)
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"{key}={short_repr(value)} is not one of {list(get_args(tp))}")
        return value
    if origin in (typing.Union, types.UnionType):
        for arg in get_args(tp):
            try:
                return _check(value, arg, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}={short_repr(value)} matches none of {get_args(tp)}")
    if tp is type(None):
        if value is not None:
            raise ConfigError(f"{key} must be null")
        return None
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {type(value).__name__}")
        (item,) = get_args(tp)
        return [_check(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is float:
        value = _as_number(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number, got {type(value).__name__} {short_repr(value)}")
        return float(value)
    if tp is int:
        value = _as_number(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # 1e4 steps
    if tp is int or tp is bool or tp is str:
        if type(value) is not tp:
            raise ConfigError(f"{key} must be {tp.__name__}, got {type(value).__name__} {short_repr(value)}")
        return value
    raise ConfigError(f"{key}: unsupported annotation {tp}")


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    """Build dataclass `cls` from a mapping, rejecting unknown keys and wrong types with the dotted key."""
    data = _normalise(cls, data, prefix)
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    where = f"{prefix}." if prefix else ""
    for k in unknown:
        if where + k in MOVED:
            if where + k == "data.chunk_size":
                raise ConfigError("data.chunk_size is gone (a key of an earlier version of rpt): model.chunk_size sets "
                                  "the chunk size of the model and of the data")
            raise ConfigError(f"{where}{k} is {MOVED[where + k]} now (a key of an earlier version of rpt)")
    if unknown:
        raise ConfigError(f"unknown config key(s) {', '.join(where + k for k in unknown)}")
    kwargs = {k: _check(v, hints[k], f"{prefix}.{k}" if prefix else k) for k, v in data.items()}
    return cls(**kwargs)


# ---------------------------------------------------------------------------------------------------------------
# Presets and shipped configs: YAML files in rpt/configs. A preset file (tiny ... 1b) lists the fields that differ from
# the defaults above; `250m` is the paper's model (12 layers, D=1024, 8 heads of 128, GPT-NeoX vocabulary, CCA in 5 of
# the 6 upper layers), and smaller presets keep the same shape rules so every code path is exercised on CPU. The other
# files are configs (a `preset:` and overrides): the paper's settings per domain, and the CPU settings behind docs/.

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
SIZE_NAMES = ("tiny", "small", "70m", "250m", "1b")


def _preset_file(name: str) -> typing.Callable[[], dict]:
    def preset() -> dict:
        path = CONFIG_DIR / f"{name}.yaml"
        data = load_yaml(path.read_text(), f"preset {path}", ConfigError) or {}
        if not isinstance(data, dict) or "preset" in data:
            raise ConfigError(f"preset {path} must be a mapping of sections without a `preset:` key")
        return data

    return preset


SIZES: dict[str, typing.Callable[[], dict]] = {name: _preset_file(name) for name in SIZE_NAMES}

# The paper's model (§3.1) as printed: the named setting `paper` of model.cca and of model.gate (CCA with independent
# random projections, no learned relative-offset bias, keys reading their own values, neighbour states fed to CCA
# without a norm, and the gate scaling the neighbour states, C^g = g * C). The default ModelConfig adds each of these;
# `--set model.cca=paper --set model.gate=paper` turns them all off, and `--set model.cca.FIELD=...` turns one back on
# (docs/design.md#chunked-cross-attention says what each buys).
PAPER_MODEL: dict[str, Any] = {"cca": "paper", "gate": "paper"}

# the sizes tiny ... 1b
PRESETS: dict[str, typing.Callable[[], dict]] = dict(SIZES)
