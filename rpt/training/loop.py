"""The one training loop (§3.3-3.4, App. A): CPU, one GPU, or torchrun with DDP (FSDP behind a flag).

    loss = L_LM + alpha_ret * L_ret          (rpt-lex, rpt-sem; xl and retro train on L_LM alone)

Each step takes a global batch of batch_size * grad_accum * world_size sequences. Both losses are means over the
global batch (tokens for L_LM, LambdaRank pairs for L_ret): their denominators are summed over all micro-batches and
ranks *before* the forward passes (they depend on the data only), and every micro-batch's sum is divided by them in
`losses.normalise`. Metrics are reduced the same way: numerators and denominators summed over ranks, divided once.

Side effects (log, TensorBoard, W&B, progress bar, checkpoints) happen on rank 0 only.

train.init_from starts a new run from another run's weights (`rpt.checkpoint.load_matching`: the tensors whose name
and shape match); what was loaded, left initialised and dropped is printed and kept in <out_dir>/init.json.
train.activation_checkpointing runs each decoder layer under torch.utils.checkpoint (`set_activation_checkpointing`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import signal
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rpt import checkpoint as ckpt_io
from rpt.chunks import retrievable_mask
from rpt.config import ModelConfig, RPTConfig, TrainConfig, config_differences, effective_fields, flat_config
from rpt.data.prepare import store_source
from rpt.data.store import StoreError
from rpt.locks import folder_lock
from rpt.model.registry import spec
from rpt.outputs import Owner, claim_folder, mark_folder
from rpt.training import distributed as D
from rpt.training.data import Batch, BatchStream, SequenceDataset, check_labels, open_labels, open_store
from rpt.training.footprint import check_fits
from rpt.training.losses import (
    Sum,
    count_pairs,
    forward_lm,
    lambdarank_loss,
    lm_token_count,
    normalise,
    recall_at_k,
    relevance_from_candidates,
)
from rpt.training.optim import bare_name, build_optimizer, clip_gradients, set_lr
from rpt.training.schedules import gold_neighbors, learning_rate, margin, retrieval_weight, sample_gold_mask, sampling_probability
from rpt.utils import RPTWarning, UserError, argument_error, note_environment, write_text_atomic


def _is_run_folder(folder: Path) -> bool:
    """A run of an earlier rpt: its config.yaml reads as an RPTConfig and it holds a checkpoint of ours, or nothing
    but that config (a run stopped before its first checkpoint)."""
    try:
        RPTConfig.from_yaml(folder / "config.yaml", recorded=True)
    except Exception:  # not ours (or not readable): the folder is someone else's
        return False
    return (any((p / "state.json").is_file() for p in (folder / "checkpoints").glob("step_*"))
            or not (folder / "log.jsonl").exists())


# What `rpt train` writes into a run folder (rpt.outputs), and what the verbs that read a run write beside it by
# default (`rpt eval`'s result JSON)
OWNER = Owner("train", ("config.yaml", "log.jsonl", "checkpoints", "best", "tokenizer.json", "init.json", "changes.json",
                        "tensorboard", "wandb", "wandb.json", "eval-*.json", ".*.tmp", ".*.old"), _is_run_folder)

# Fields that do not change what a resumed run computes: they may differ from the checkpoint's without a word
RESUME_FREE = {"train.out_dir", "train.checkpoint_every", "train.keep_last", "train.log_every", "train.tensorboard",
               "train.wandb", "train.wandb_project", "train.init_from", "train.compile", "train.activation_checkpointing",
               "train.val_every", "train.val_sequences", "data.store", "data.corpus", "data.tokenizer"}

# Fields a resumed run may change without allow_changes: named when it resumes and recorded (more updates for a run)
RESUME_NAMED = {"train.steps"}


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped training after an update; the message names the checkpoint written then."""


class _StopRequests:
    """SIGINT / SIGTERM during training ask the loop to stop after the current update (with a checkpoint); a second
    SIGINT stops at once. Installed only in the main thread (signal handlers cannot be set elsewhere)."""

    def __init__(self) -> None:
        self.requested = False
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        note = (f"\nrpt train: {signal.Signals(signum).name}: stopping after this update with a checkpoint (Ctrl-C "
                "again to stop at once, without one)\n")
        os.write(2, note.encode())  # not print: the signal may land while the progress bar writes to stderr

    def __enter__(self) -> _StopRequests:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def settings_changed(recorded: RPTConfig, cfg: RPTConfig) -> list[str]:
    """The training and data settings (besides `RESUME_FREE`) in which a run's checkpoint and this call differ, as
    "key recorded -> now"."""
    old, new = ({k: v for k, v in flat_config(c.to_dict()).items() if k.startswith(("train.", "data."))
                 and k not in RESUME_FREE} for c in (recorded, cfg))
    return config_differences(old, new)


class NonFiniteLoss(RuntimeError):
    """The loss or gradient norm became inf/nan; the message names the step and the last good checkpoint."""


@dataclass
class TrainResult:
    step: int  # updates done
    out_dir: Path
    checkpoint: Path | None  # the newest checkpoint
    metrics: dict[str, float] = field(default_factory=dict)  # the last logged line
    init: ckpt_io.WeightInit | None = None  # what train.init_from loaded (None: from scratch, or a resumed run)
    best: dict[str, Any] | None = None  # the checkpoint of the lowest validation loss: step, val_loss, path


# --------------------------------------------------------------------------------------------------------------
# what the model and the losses get from a batch


@dataclass
class StepInputs:
    """A micro-batch on the device, with the model's retrieval inputs and the LambdaRank targets."""

    batch: Batch
    model_kwargs: dict[str, torch.Tensor]
    # with prefix negatives (train.prefix_negatives) the last dimension is Cp + C: the prefix's chunks first
    relevance: torch.Tensor | None = None  # [B, C, C] target relevance per (query chunk, chunk), -inf = not a candidate
    positive: torch.Tensor | None = None  # [B, C, C] bool, the gold set
    retrievable: torch.Tensor | None = None  # [C, C] bool ([B, C, Cp + C] with prefix negatives)
    best: torch.Tensor | None = None  # [B, C, C] bool, the gold's K best by relevance (the neighbours it would supply)


def prepare(batch: Batch, mcfg: ModelConfig, p_ss: float, seed: int, device: torch.device) -> StepInputs:
    """Move a micro-batch to `device` and build the variant's retrieval inputs.

    xl: none. retro: neighbor_ids = the BM25 top-K candidates (the query (c_q, c_t) of the label pipeline).
    rpt-lex / rpt-sem: LambdaRank targets (positives = all BM25 candidates with relevance BM25 / candidates with
    s_t > 0 with relevance s_t), and scheduled sampling: gold top-K neighbour ids + a per-chunk use_supplied draw,
    keyed by (seed, the sequence's stream position).
    """
    batch = batch.to(device)
    variant, K = mcfg.variant, mcfg.n_neighbors
    if not mcfg.uses_retrieval:  # xl and the baselines read no neighbours
        return StepInputs(batch, {})
    assert batch.candidates is not None and batch.bm25 is not None and batch.target is not None
    B, T = batch.input_ids.shape
    C = T // mcfg.chunk_size
    cands = batch.candidates
    if variant == "retro":
        rel, present = relevance_from_candidates(cands, batch.bm25, C)
        return StepInputs(batch, {"neighbor_ids": gold_neighbors(rel, present, K)})
    if spec(variant).labels == "sem":  # rpt-sem: relevance is the scorer's target score
        rel, pos = relevance_from_candidates(cands, batch.target, C, positive=batch.target > 0)  # NaN > 0 is False
    else:
        rel, pos = relevance_from_candidates(cands, batch.bm25, C)
    keys = [sampling_key(seed, int(p)) for p in batch.position.tolist()] if batch.position is not None else list(range(B))
    gold_ids = gold_neighbors(rel, pos, K)  # [B, C, K], -1 = fewer than K positives
    best = torch.zeros(B, C, C + 1, dtype=torch.bool, device=device).scatter_(-1, gold_ids % (C + 1), True)
    best = best[..., :C]  # the -1 ids went to the extra last column
    kwargs = {"neighbor_ids": gold_ids, "use_supplied": sample_gold_mask(keys, C, p_ss, device)}
    # negatives from beyond the span: the prefix's Cp chunks come first, as non-candidates
    Cp = 0 if batch.prefix_ids is None else batch.prefix_ids.shape[1] // mcfg.chunk_size
    retrievable = retrievable_mask(C, mcfg.chunk_size, mcfg.segment_len, device=device, n_before=Cp)  # [C, Cp + C]
    if batch.prefix_ids is not None:
        assert batch.prefix_mask is not None
        kwargs["prefix_ids"], kwargs["prefix_mask"] = batch.prefix_ids, batch.prefix_mask
        whole = batch.prefix_mask.view(B, Cp, mcfg.chunk_size).all(-1)  # [B, Cp]
        retrievable = retrievable[None] & torch.cat([whole, whole.new_ones(B, C)], 1)[:, None, :]  # [B, C, Cp + C]
        rel = torch.cat([rel.new_full((B, C, Cp), float("-inf")), rel], -1)
        pos = torch.cat([pos.new_zeros(B, C, Cp), pos], -1)
        best = torch.cat([best.new_zeros(B, C, Cp), best], -1)
    return StepInputs(batch, kwargs, rel, pos, retrievable, best)


def step_denominators(micro: list[StepInputs], retriever: bool) -> torch.Tensor:
    """[2]: the LM tokens and the LambdaRank pairs of this rank's micro-batches; summed over ranks, the denominators
    every micro-batch's loss is divided by, so that the update is the same however the global batch is split."""
    dev = micro[0].batch.input_ids.device
    denom = torch.zeros(2, device=dev)
    for x in micro:
        denom[0] += lm_token_count(x.batch.loss_mask)
        if retriever:
            denom[1] += count_pairs(x.relevance, x.positive, x.retrievable)
    return denom


def micro_loss(model: nn.Module, x: StepInputs, mcfg: ModelConfig, tc: TrainConfig, denom: torch.Tensor, alpha: float,
               tau: float, world_size: int = 1, check_scores: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The training loss of one micro-batch, as `rpt train` computes it, and the sums its log lines are made of.

    loss = LM loss summed over tokens / denom[0] + alpha * LambdaRank loss (§3.2, margin tau) summed over pairs /
    denom[1] (both per rank: × world_size, for DDP's gradient mean), ready for backward(). The sums [N_SUMS] float64,
    detached: LM loss and tokens, ranking loss and pairs, recall@K and gold_top@K with their query counts, real tokens.
    check_scores: check once that the model masks exactly the chunks the retrievable rule masks."""
    out, lm = forward_lm(model, x.batch.input_ids, x.model_kwargs, x.batch.loss_mask, tc.loss_chunk)
    loss = normalise(lm.total, denom[0], world_size)
    zero = lm.total.new_zeros(())
    ret = rec = top = Sum(zero, zero)
    if x.relevance is not None:
        scores = out.retrieval_scores
        prefix_scores = getattr(out, "prefix_scores", None)
        if prefix_scores is not None:  # chunks before the sequence: columns -Cp .. -1
            scores = torch.cat([prefix_scores, scores], -1)
        if check_scores:
            _check_scores(scores, x.retrievable)
        ret = lambdarank_loss(scores, x.relevance, x.positive, tau, x.retrievable, gain=tc.lambdarank_gain)
        loss = loss + alpha * normalise(ret.total, denom[1], world_size)
        rec = recall_at_k(scores, x.positive & x.retrievable, mcfg.n_neighbors)
        top = recall_at_k(scores, x.best & x.retrievable, mcfg.n_neighbors)
    sums = torch.stack([t.detach().double() for t in (*lm, *ret, *rec, *top, x.batch.loss_mask.sum())])
    return loss, sums


def sampling_key(seed: int, position: int) -> int:
    """The scheduled-sampling seed of the sequence at `position` in the data stream (each position is used once)."""
    return int(np.random.SeedSequence([seed, position]).generate_state(1, dtype=np.uint64)[0]) & ((1 << 63) - 1)


# --------------------------------------------------------------------------------------------------------------
# logging (rank 0)


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a run's log.jsonl. A torn last line (the run was killed while writing it) is skipped; a bad line
    anywhere else is a damaged log, reported with the file and line number."""
    path = Path(path)
    lines = path.read_text(errors="replace").splitlines()
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict):
            if i == len(lines):
                warnings.warn(f"{path}: skipping its torn last line {i} (the run was stopped while writing it)",
                              RPTWarning, stacklevel=2)
                continue
            raise UserError(f"{path}: line {i} is not a JSON object; the log is damaged (remove that line to resume)")
        rows.append(row)
    return rows


class RunLog:
    """JSONL always (``<out_dir>/log.jsonl``), TensorBoard and W&B (`rpt.training.tracking`) when asked, a tqdm bar when
    `progress`. `wandb`: the run's config, whose train.wandb_project names the W&B project (None: no W&B)."""

    def __init__(self, out_dir: Path, start: int, total: int, enabled: bool, tensorboard: bool, progress: bool,
                 wandb: RPTConfig | None = None) -> None:
        self.enabled = enabled
        self.path = out_dir / "log.jsonl"
        self.tb = None
        self.wandb = None
        self.bar = None
        if not enabled:
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        if self.path.exists():  # a resumed run: drop lines of steps after the checkpoint, they are about to be redone
            rows = read_log(self.path)
            self.path.write_text("".join(json.dumps(r) + "\n" for r in rows if r.get("step", 0) <= start))
        if tensorboard:
            from rpt.utils import require

            self.tb = require("torch.utils.tensorboard", "train.tensorboard").SummaryWriter(str(out_dir / "tensorboard"))
        if wandb is not None:
            from rpt.training.tracking import WandbLog

            self.wandb = WandbLog(out_dir, wandb, wandb.train.wandb_project)
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=start, desc="train", dynamic_ncols=True)

    def write(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.tb.add_scalar(f"train/{k}", v, row["step"])
        if self.wandb is not None:
            self.wandb.log(row)
        if self.bar is not None:
            self.bar.set_postfix(lm=f"{row['lm_loss']:.3f}", refresh=False)

    def tick(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.close()


# metric slots summed per step and over a log window: numerators and their denominators
_LM, _LM_N, _RET, _RET_N, _REC, _REC_N, _TOP, _TOP_N, _TOK = range(9)
N_SUMS = 9


# --------------------------------------------------------------------------------------------------------------
# the loop


def store_vocab(store_root: str | Path) -> int:
    """The vocabulary size of the tokenizer a token store was written with (a preset's vocabulary is a placeholder)."""
    try:
        tok = open_store(store_root).tokenizer_id
    except StoreError as e:
        raise UserError(str(e)) from None
    if "vocab_size" not in tok:
        raise argument_error("vocab_size", problem=f"the store {store_root} does not record its vocabulary size: "
                             "give it")
    return int(tok["vocab_size"])


def _default_model(mcfg: ModelConfig) -> nn.Module:
    from rpt.model.registry import build_model

    return build_model(mcfg)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def _param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Parameter names in the optimizer's order: index i of optimizer.state_dict() is names[i]."""
    name = {id(p): n for n, p in D.unwrap(model).named_parameters()}
    return [name[id(p)] for g in optimizer.param_groups for p in g["params"]]


def hold_gate(model: nn.Module) -> None:
    """Drop the neighbour gate's gradients, so the optimiser leaves its parameters (and their moments) as they are
    (train.gate_hold_steps). Why: early in training CCA cannot yet read its neighbours, so closing every gate lowers
    the loss; a closed gate then scales CCA's values, and with them the signal CCA learns from, by eta, and a run whose
    gates close to eta in its first few hundred updates may never read its neighbours (on code, docs/results/code.md)."""
    for name, p in model.named_parameters():
        if bare_name(name)[:1] == ["gate"]:
            p.grad = None


def _full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """(model state, optimizer state) of the whole model, in the single-process format (optimizer state keyed by
    parameter index). A collective under FSDP: the full tensors are gathered to rank 0 (the others get {})."""
    if not D.is_fsdp(model):
        return D.unwrap(model).state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd, osd = get_model_state_dict(model, options=opts), get_optimizer_state_dict(model, optimizer, options=opts)
    if not osd:
        return msd, {}
    index = {n: i for i, n in enumerate(_param_names(model, optimizer))}  # FQN-keyed -> index-keyed
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in osd["param_groups"]]
    return msd, {"state": {index[n]: s for n, s in osd["state"].items()}, "param_groups": groups}


def _load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, cp: ckpt_io.Checkpoint) -> None:
    if not D.is_fsdp(model):
        D.unwrap(model).load_state_dict(cp.model, strict=True)
        optimizer.load_state_dict(cp.optimizer)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, cp.model, options=opts)
    names = _param_names(model, optimizer)
    osd = cp.optimizer
    fqn = {"state": {names[int(i)]: s for i, s in osd["state"].items()},
           "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in osd["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, fqn, options=opts)


def _model_difference(recorded: RPTConfig, cfg: RPTConfig) -> str:
    """The model fields (those the variant reads, `effective_fields`) in which a run's recorded config and this one
    differ, as "key recorded -> now; ..."; empty if none."""
    old, new = ({k: v for k, v in effective_fields(flat_config(c.to_dict())).items() if k.startswith("model.")}
                for c in (recorded, cfg))
    return "; ".join(config_differences(old, new))


def train(cfg: RPTConfig, store_root: str | Path | None = None, labels_path: str | Path | None = None, resume: bool = True, *,
          fsdp: bool = False, device: str | None = None, stop_after: int | None = None, progress: bool = True,
          model_factory: Callable[[ModelConfig], nn.Module] | None = None,
          on_step: Callable[[int, dict[str, float]], None] | None = None, memory_check: bool = True,
          allow_changes: bool = False) -> TrainResult:
    """Train `cfg.model` on the token store under `store_root` (default cfg.data.store) for cfg.train.steps updates.

    labels_path: the label store of the training split (needed by retro, rpt-lex, rpt-sem; span = data.seq_len).
    resume: continue from the newest checkpoint in cfg.train.out_dir if there is one (exactly: same weights,
        optimiser, RNG and data position). With resume=False an out_dir that already holds checkpoints is refused.
        A resumed run says the step and checkpoint it resumes from.
    allow_changes: resume even though training or data settings (lr, schedules, batch, ...) differ from the
        checkpoint's (refused otherwise, naming them). Another number of steps is accepted without it, and named.
        Changes and the step they took effect are recorded in <out_dir>/changes.json and at the top of config.yaml.
    fsdp: shard with FullyShardedDataParallel (torchrun only; meant for the 1b preset on GPUs).
    device: "cpu" / "cuda" / None (= cuda when available). Under torchrun each rank takes cuda:LOCAL_RANK.
    stop_after: stop (with a checkpoint) after this many updates of this call, e.g. to fit a time budget.
    model_factory: builds the model from cfg.model (default rpt.RPT); the model must follow RPT's forward signature.
    on_step: called on every rank after each update with (updates done, that step's metrics).
    memory_check: refuse, before anything is built, a config whose step cannot fit in the memory available
        (rpt.training.footprint: the estimate and its parts are in the message).
    cfg.train.init_from: start from that run's or checkpoint's weights (those whose name and shape match; ignored when
        resuming); TrainResult.init says what was loaded.
    Raises LabelMismatch / ValueError before the first step on incompatible inputs, NonFiniteLoss on inf/nan.
    """
    cfg.validate()  # ranges included (rpt.config.check_ranges): a config changed after it was built is checked again
    store = store_root if store_root is not None else cfg.data.store
    # before any work: never into a folder of the user's, nor over the store, the labels or the run it starts from
    claim_folder(cfg.train.out_dir, OWNER, arg="out_dir",
                 inputs={"store": store, "labels_path": labels_path, "init_from": cfg.train.init_from or None})
    info = D.setup(device)
    try:
        # one run per folder: a second `rpt train --out` into it is refused while this one lives (the main rank locks)
        with folder_lock(cfg.train.out_dir, "written") if info.is_main else contextlib.nullcontext():
            return _train(cfg, info, store_root, labels_path, resume, fsdp, stop_after, progress,
                          model_factory or _default_model, on_step, memory_check, allow_changes)
    finally:
        D.teardown(info)


def _train(cfg: RPTConfig, info: D.DistInfo, store_root: str | Path | None, labels_path: str | Path | None, resume: bool,
           fsdp: bool, stop_after: int | None, progress: bool, model_factory: Callable[[ModelConfig], nn.Module],
           on_step: Callable[[int, dict[str, float]], None] | None, memory_check: bool = True,
           allow_changes: bool = False) -> TrainResult:
    tc, mcfg = cfg.train, cfg.model
    out_dir = Path(tc.out_dir)
    dev = info.device

    # ---- inputs, all checked before anything is built or written
    store = open_store(store_root if store_root is not None else cfg.data.store)
    try:
        store.check_compatible(chunk_size=cfg.model.chunk_size, vocab_size=mcfg.vocab_size)
    except StoreError as e:
        raise ValueError(str(e)) from e
    labels = None
    if mcfg.uses_retrieval:
        if labels_path is None:
            raise ValueError(f"variant {mcfg.variant} needs retrieval labels: pass labels_path (rpt train --labels PATH, "
                             f"built by `rpt label` with span = data.seq_len {cfg.data.seq_len})")
        labels = open_labels(labels_path)
        check_labels(labels, store, cfg)
    if memory_check and not fsdp:  # FSDP shards the states over ranks: the estimate is for one whole model
        check_fits(cfg, dev)
    dataset = SequenceDataset(store, cfg.data.seq_len, cfg.model.chunk_size, mcfg.segment_len, labels,
                              prefix_len=tc.prefix_negatives if mcfg.has_retriever else 0)
    stream = BatchStream(dataset, tc.batch_size, tc.grad_accum, info.rank, info.world_size, tc.seed)
    validation, val_every = _validation(store_root if store_root is not None else cfg.data.store, cfg, info.world_size)
    if tc.wandb and info.is_main:
        from rpt.training.tracking import require_wandb

        require_wandb()

    last = ckpt_io.latest_intact(out_dir)  # a damaged newer checkpoint is skipped with a warning naming it
    if last is not None and not resume:
        raise ValueError(f"{out_dir} already holds checkpoints (newest {last.name}): resume, or choose another out_dir")
    cp = ckpt_io.load(last) if last is not None else None
    if cp is not None and (diff := _model_difference(cp.config, cfg)):
        raise ValueError(f"{last} was trained with another model config ({diff}); resume with the same model or "
                         "another out_dir")
    changes = settings_changed(cp.config, cfg) if cp is not None else []
    cp_train = cp.config.train if cp is not None else tc
    refused = [c for c in changes if c.split(" ", 1)[0] not in RESUME_NAMED]
    if refused and not allow_changes:
        raise argument_error("out_dir", out_dir, f"resuming from {last.name} with settings other than the run's "
                             f"({'; '.join(refused)}): pass {{allow_changes=True}} to resume with them, or train into "
                             "another folder", ValueError)
    init_source = _init_source(tc.init_from, store) if tc.init_from and cp is None else None  # resuming ignores it

    # ---- model, optimiser, state
    _seed_everything(tc.seed)
    model = model_factory(mcfg).to(dev)
    init = None
    if init_source is not None:
        try:
            init = ckpt_io.load_matching(model, init_source)
        except UserError as e:
            raise UserError(f"train.init_from {tc.init_from}: {e}") from None
    if tc.activation_checkpointing:
        from rpt.model.decoder import set_activation_checkpointing

        set_activation_checkpointing(model)
    if tc.compile:
        if fsdp:
            raise ValueError("train.compile with fsdp is not supported: compile without fsdp (rpt train --fsdp), or turn "
                             "compile off")
        model.compile()  # in place: the wrapped model, its parameters and checkpoint keys stay the same objects
    model = D.wrap(model, info, fsdp=fsdp)
    optimizer = build_optimizer(model, tc)
    start = 0
    environments = list(cp.environments) if cp is not None else []  # where this run's updates ran, oldest first
    if cp is not None:
        _load_full_state(model, optimizer, cp)
        stream.load_state_dict(cp.data)
        start = cp.step
        if len(cp.rng) == info.world_size:
            ckpt_io.set_rng_state(cp.rng[info.rank])
        else:
            warnings.warn(f"{last} was written by {len(cp.rng)} ranks, this run has {info.world_size}: RNG streams reseeded",
                          stacklevel=2)
            _seed_everything(tc.seed + start * 7919 + info.rank)
    elif info.rank:
        torch.manual_seed(tc.seed + info.rank)  # dropout differs across ranks; weights were broadcast by DDP
    del cp
    note_environment(environments, "from_step", start)

    if mcfg.has_retriever and tc.alpha_ret > 0 and tc.alpha_ramp_steps > tc.steps:
        warnings.warn(f"train.alpha_ramp_steps={tc.alpha_ramp_steps} is longer than train.steps={tc.steps}: the retrieval "
                      f"loss weight reaches only {tc.alpha_ret * tc.steps / tc.alpha_ramp_steps:.3g} of its "
                      f"train.alpha_ret={tc.alpha_ret} (--set train.alpha_ramp_steps=N to ramp within the run)",
                      stacklevel=2)
    use_bf16 = tc.precision == "bf16" and dev.type == "cuda"
    if tc.precision == "bf16" and not use_bf16:
        warnings.warn("train.precision=bf16 is for GPUs (bf16 matmuls are ~600x slower on these CPUs): training in fp32",
                      stacklevel=2)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if use_bf16 else contextlib.nullcontext

    if info.is_main and start:
        lr_note = ""
        if changes:
            was, now = learning_rate(start, cp_train), learning_rate(start, tc)
            lr_note = f" (the learning rate at step {start}: {was:.3g} -> {now:.3g})" if abs(was - now) > 1e-12 else ""
        print(f"rpt train: resuming {out_dir} from step {start} of {tc.steps} ({last})"
              + (f"; changed settings: {'; '.join(changes)}{lr_note}" if changes else ""), flush=True)
    log = RunLog(out_dir, start, tc.steps, info.is_main, tc.tensorboard, progress, cfg if tc.wandb else None)
    # the run's config and every checkpoint's record what the store was built from (its prepare.json), not the
    # defaults of data.*: a result evaluated from a checkpoint names the corpus it was trained on
    source = store_source(store_root if store_root is not None else cfg.data.store)
    built_from = {k: v for k, v in source.items() if k != "store"}  # data.store stays as given: it is compared on resume
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **built_from))
    if info.is_main:
        mark_folder(out_dir, OWNER)
        _write_config(out_dir, dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **source)), start, changes)
        if init is not None:
            (out_dir / "init.json").write_text(json.dumps({"init_from": tc.init_from, **init.to_dict()}, indent=1) + "\n")
            print(f"rpt train: {init.summary()}", flush=True)
        # the run records its tokenizer, so eval/generate can refuse a store tokenized differently
        tok = next((p / "tokenizer.json" for p in (store.path, store.path.parent) if (p / "tokenizer.json").is_file()), None)
        if tok is not None:
            shutil.copyfile(tok, out_dir / "tokenizer.json")

    def save(step: int, metrics: dict[str, float]) -> Path | None:
        model_state, optim_state = _full_state(model, optimizer)
        rngs = D.all_gather_object(ckpt_io.rng_state(), info)
        path = None
        if info.is_main:
            path = ckpt_io.save(out_dir, step, model_state, optim_state, cfg, rngs, stream.state_dict(), metrics,
                                tc.keep_last, environments)
        D.barrier(info)
        return path

    best = _read_best(out_dir)

    retriever = mcfg.has_retriever
    window = torch.zeros(N_SUMS, dtype=torch.float64)
    window_grad, window_steps, t_window = 0.0, 0, time.perf_counter()
    last_row: dict[str, float] = {}
    step = start
    checked_scores = False
    stop = _StopRequests()
    interrupted = False
    try:
        stop.__enter__()
        while step < tc.steps:
            lr, tau = learning_rate(step, tc), margin(step, tc)
            alpha = retrieval_weight(step, tc) if retriever else 0.0
            p_ss = sampling_probability(step, tc) if retriever else 0.0
            set_lr(optimizer, lr)
            micro = [prepare(b, mcfg, p_ss, tc.seed, dev) for b in stream.next_step()]

            denom = step_denominators(micro, retriever)  # global: known before any forward pass
            D.all_reduce_sum(denom, info)

            model.train()
            sums = torch.zeros(N_SUMS, device=dev, dtype=torch.float64)
            for m, x in enumerate(micro):
                with D.maybe_no_sync(model, m < len(micro) - 1):
                    with autocast():
                        loss, got = micro_loss(model, x, mcfg, tc, denom, alpha, tau, info.world_size,
                                               check_scores=not checked_scores)
                    checked_scores = True
                    loss.backward()
                sums += got
                del loss
            D.all_reduce_sum(sums, info)
            s = sums.cpu()
            lm_mean, ret_mean = normalise(s[_LM], s[_LM_N]).item(), normalise(s[_RET], s[_RET_N]).item()
            if step < tc.gate_hold_steps:
                hold_gate(model)
            grad_norm = float(clip_gradients(model, tc.grad_clip))
            if not (math.isfinite(lm_mean) and math.isfinite(ret_mean) and math.isfinite(grad_norm)):
                optimizer.zero_grad(set_to_none=True)
                good = ckpt_io.latest(out_dir)
                raise NonFiniteLoss(f"non-finite loss at step {step + 1} (lm {lm_mean:.4g}, retrieval {ret_mean:.4g}, grad norm "
                                    f"{grad_norm:.4g}); the last good checkpoint is "
                                    f"{good if good is not None else 'none (no checkpoint was written yet)'}")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1

            window += s
            window_grad += grad_norm
            window_steps += 1
            step_metrics = {"lm_loss": lm_mean, "ret_loss": ret_mean, "lr": lr, "tau": tau, "alpha_ret": alpha, "p_ss": p_ss,
                            "grad_norm": grad_norm}
            log.tick()
            interrupted = _agreed(stop.requested, info, dev)
            done = step == tc.steps or (stop_after is not None and step - start >= stop_after) or interrupted
            validate_now = validation is not None and (step % val_every == 0 or step == tc.steps)
            checkpoint_now = step % tc.checkpoint_every == 0 or done or validate_now
            # a checkpoint also closes the log window, so a resumed run logs exactly what an uninterrupted one does
            if step % tc.log_every == 0 or checkpoint_now:
                now = time.perf_counter()
                last_row = _log_row(step, window, window_grad / window_steps, now - t_window, step_metrics, retriever,
                                    mcfg.n_neighbors)
                if validate_now:
                    val = validation_loss(model, validation, mcfg, dev, autocast, tc.batch_size, tc.loss_chunk, info,
                                          tc.val_sequences)
                    last_row["val_loss"], last_row["val_ppl"] = val, math.exp(min(val, 700.0))
                log.write(last_row)
                window.zero_()
                window_grad, window_steps, t_window = 0.0, 0, now
            if checkpoint_now:
                path = save(step, last_row)
                if validate_now and path is not None and (best is None or last_row["val_loss"] < best["val_loss"]):
                    best = {"step": step, "val_loss": last_row["val_loss"], "checkpoint": path.name}
                    _keep_best(out_dir, path, best)  # the main rank (the one that saved)
                t_window = time.perf_counter()  # tokens/s leaves the checkpoint's (and validation's) time out
            if on_step is not None:
                on_step(step, step_metrics)
            if done:
                break
    finally:
        stop.__exit__()
        log.close()
    if interrupted and step < tc.steps:  # agreed by every rank: all of them stop, and say so
        path = ckpt_io.latest(out_dir)
        raise TrainingInterrupted(f"stopped at step {step} of {tc.steps}; checkpoint {path}: run the same command to "
                                  "resume")
    best_info = None if best is None else {**best, "path": str(out_dir / "best")}
    return TrainResult(step=step, out_dir=out_dir, checkpoint=ckpt_io.latest(out_dir), metrics=last_row, init=init,
                       best=best_info)


def _agreed(flag: bool, info: D.DistInfo, dev: torch.device) -> bool:
    """`flag` on any rank (all ranks must stop at the same update); free on one process."""
    if info.world_size == 1:
        return flag
    t = torch.tensor([float(flag)], device=dev)
    D.all_reduce_sum(t, info)
    return bool(t.item() > 0)


def _write_config(out_dir: Path, cfg: RPTConfig, start: int, changes: list[str]) -> None:
    """config.yaml: the settings of this call; when a resumed call changed some, a header says from which step, and
    changes.json keeps every change with its step, so the file never claims a setting for updates that did not use
    it."""
    history_path = out_dir / "changes.json"
    try:
        history = json.loads(history_path.read_text()) if history_path.is_file() else []
    except (OSError, ValueError):
        history = []
    if changes:
        history.append({"from_step": start, "changed": changes})
        write_text_atomic(history_path, json.dumps(history, indent=1) + "\n")
    header = "".join(f"# from step {h['from_step']}: {'; '.join(h['changed'])} (recorded -> used from then on)\n"
                     for h in history)
    body = cfg.to_yaml()
    write_text_atomic(out_dir / "config.yaml", (f"# settings changed while the run was resumed:\n{header}" if header else "")
               + body)


def _init_source(init_from: str, store: Any) -> Path:
    """The checkpoint folder train.init_from names (`rpt.checkpoint.resolve_checkpoint`), checked before anything is
    built: it exists and is intact, and was trained on tokens of the store's tokenizer where both record theirs."""
    try:
        folder = ckpt_io.resolve_checkpoint(init_from)
        theirs = ckpt_io.checkpoint_tokenizer(folder)
    except UserError as e:
        raise UserError(f"train.init_from {init_from}: {e}") from None
    mine = store.tokenizer_id
    if theirs and mine.get("hash") and theirs.get("hash") and theirs["hash"] != mine["hash"]:
        raise UserError(f"train.init_from {init_from}: {folder} was trained on tokens of tokenizer {theirs.get('name')} "
                        f"({theirs['hash'][:12]}), the store {store.path} holds {mine.get('name')} "
                        f"({mine['hash'][:12]}): its embeddings would mean other tokens. Start from a run on this "
                        "tokenizer")
    return folder


# --------------------------------------------------------------------------------------------------------------
# validation and the best checkpoint


def _validation(store_root: str | Path, cfg: RPTConfig, world_size: int = 1) -> tuple[SequenceDataset | None, int]:
    """(the validation sequences, validate every this many updates), or (None, 0): train.val_every -1 validates at
    every checkpoint when the store has a usable validation split, and quietly never when it has none; under torchrun
    (several processes) only when asked for with val_every > 0."""
    every = cfg.train.val_every
    if every == 0 or (every < 0 and world_size > 1):
        return None, 0
    if every > 0:
        return _validation_set(store_root, cfg), every
    try:
        return _validation_set(store_root, cfg), cfg.train.checkpoint_every
    except ValueError:
        return None, 0


def _validation_set(store_root: str | Path, cfg: RPTConfig) -> SequenceDataset:
    """The validation split's sequences (no labels: retro reads BM25's neighbours of each query chunk, computed here),
    or a ValueError naming the missing split."""
    root = Path(store_root)
    try:
        store = open_store(root, "validation") if not (root / "manifest.json").exists() else None
    except StoreError as e:
        raise ValueError(f"train.val_every needs a validation split: {e}") from None
    if store is None:
        raise ValueError(f"train.val_every needs a validation split, and {root} is one split's store: pass the "
                         "`rpt prepare` root holding train/ and validation/")
    data = SequenceDataset(store, cfg.data.seq_len, cfg.model.chunk_size, cfg.model.segment_len)
    if len(data) == 0:
        raise ValueError(f"train.val_every: no validation sequences in {store.path} (every document is shorter than "
                         f"two segments)")
    return data


@torch.no_grad()
def validation_loss(model: nn.Module, data: SequenceDataset, mcfg: ModelConfig, device: torch.device, autocast,
                    batch_size: int, loss_chunk: int, info: D.DistInfo, n_sequences: int | None = None) -> float:
    """Mean LM loss (nats per token) over the first n_sequences (default train.val_sequences) validation sequences,
    sharded over ranks. The model reads what it reads at evaluation: its own retriever (rpt-lex, rpt-sem), BM25's
    neighbours of each query chunk (retro: `rpt.eval.perplexity.bm25_neighbors`, causal statistics), nothing (xl and
    the baselines). Leaves the model in train mode."""
    from rpt.labels.bm25 import bm25_neighbors

    n = min(len(data), n_sequences if n_sequences is not None else 16)
    mine = list(range(info.rank, n, info.world_size))
    total = torch.zeros(2, dtype=torch.float64, device=device)
    model.eval()
    try:
        for b in range(0, len(mine), batch_size):
            ids, masks = zip(*(data.tokens(i) for i in mine[b : b + batch_size]), strict=True)
            x = torch.as_tensor(np.stack(ids), device=device)
            mask = torch.as_tensor(np.stack(masks), device=device)
            kwargs: dict[str, Any] = {}
            if mcfg.variant == "retro":
                nb = [bm25_neighbors(t, mcfg.chunk_size, mcfg.segment_len, mcfg.n_neighbors) for t in ids]
                kwargs["neighbor_ids"] = torch.as_tensor(np.stack(nb), device=device)
            with autocast():
                _, lm = forward_lm(model, x, kwargs, mask, loss_chunk)
            total += torch.stack([lm.total.double(), lm.count.double()])
    finally:
        model.train()
    D.all_reduce_sum(total, info)
    return float(total[0] / total[1]) if total[1] > 0 else float("nan")


def _read_best(out_dir: Path) -> dict[str, Any] | None:
    p = out_dir / "best" / "best.json"
    try:
        return json.loads(p.read_text()) if p.is_file() else None
    except (OSError, json.JSONDecodeError):
        return None


def _keep_best(out_dir: Path, checkpoint: Path, best: dict[str, Any]) -> None:
    """Copy `checkpoint` to <out_dir>/best (a checkpoint folder like any other, plus best.json), replacing the older
    best only once the new copy is complete."""
    tmp = out_dir / ".best.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(checkpoint, tmp)
    (tmp / "best.json").write_text(json.dumps(best, indent=2))
    old = out_dir / ".best.old"
    shutil.rmtree(old, ignore_errors=True)
    if (out_dir / "best").exists():
        (out_dir / "best").rename(old)
    tmp.rename(out_dir / "best")
    shutil.rmtree(old, ignore_errors=True)


def _check_scores(scores: torch.Tensor, retrievable: torch.Tensor) -> None:
    """The model must mask exactly the chunks that rpt.chunks calls not retrievable (the pair count relies on it)."""
    if scores is None:
        raise ValueError("the model returned no retrieval_scores for a variant with a retriever")
    if not torch.equal(torch.isfinite(scores), retrievable.expand_as(scores)):
        raise RuntimeError("retrieval_scores are -inf on a different set of chunks than rpt.chunks.retrievable_mask: "
                           "the model and the retrievable rule disagree")


def _log_row(step: int, w: torch.Tensor, grad_norm: float, seconds: float, cur: dict[str, float], retriever: bool,
             k: int) -> dict[str, float]:
    """One log line: window means computed as summed numerators over summed denominators."""
    row: dict[str, Any] = {"step": step, "lm_loss": normalise(w[_LM], w[_LM_N]).item()}
    if retriever:
        row["ret_loss"] = normalise(w[_RET], w[_RET_N]).item()
        row[f"recall@{k}"] = normalise(w[_REC], w[_REC_N]).item()
        row[f"gold_top@{k}"] = normalise(w[_TOP], w[_TOP_N]).item()
        row["ret_pairs"] = w[_RET_N].item()
    row.update({"tokens": int(w[_TOK].item()), "tokens_per_s": w[_TOK].item() / max(seconds, 1e-9), "lr": cur["lr"],
                "tau": cur["tau"], "alpha_ret": cur["alpha_ret"], "p_ss": cur["p_ss"], "grad_norm": grad_norm})
    return row
