"""`rpt train`: train RPT (or the xl / retro baselines) on a token store, resuming where a run left off (rpt/train/)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

HELP = ("train a model (xl, retro, rpt-lex, rpt-sem or a baseline: memorizing, block-recurrent, griffin) on a token "
        "store; resumes an interrupted run")
ORDER = 30

# command-line flag -> dotted config key (applied on top of the preset / config file, before --set)
_FLAGS = {
    "variant": "model.variant", "vocab_size": "model.vocab_size", "seq_len": "data.seq_len", "steps": "train.steps",
    "batch_size": "train.batch_size", "grad_accum": "train.grad_accum", "lr": "train.lr", "seed": "train.seed",
    "optimizer": "train.optimizer", "precision": "train.precision", "out": "train.out_dir", "store": "data.store",
    "val_every": "train.val_every", "init_from": "train.init_from",
    "activation_checkpointing": "train.activation_checkpointing", "wandb": "train.wandb",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from rpt.commands.options import CONFIG_HELP, add_device, add_set
    from rpt.config import PRESETS, VARIANTS

    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help=f"{CONFIG_HELP}; a YAML config may name a `preset:` and override parts of it")
    src.add_argument("--preset", choices=list(PRESETS), help="a named preset")
    p.add_argument("--variant", choices=VARIANTS, help="model.variant")
    p.add_argument("--store", help="token store root written by `rpt prepare` (trains on <store>/train; default data.store)")
    p.add_argument("--labels", help="label store of the train split, span = data.seq_len (retro, rpt-lex, rpt-sem; "
                   "default: <store>/labels/train-<kind>-<seq_len> when it exists)")
    p.add_argument("--steps", type=int, help="train.steps")
    p.add_argument("--out", help="run folder: checkpoints, log.jsonl, config.yaml (train.out_dir)")
    p.add_argument("--batch-size", type=int, help="sequences per micro-batch per process (train.batch_size)")
    p.add_argument("--grad-accum", type=int, help="micro-batches per update (train.grad_accum)")
    p.add_argument("--lr", type=float, help="peak learning rate (train.lr)")
    p.add_argument("--seq-len", type=int, help="training sequence length (data.seq_len)")
    p.add_argument("--seed", type=int, help="train.seed")
    p.add_argument("--val-every", type=int, metavar="N", help="validation loss on the store's validation split every N "
                   "updates and at the end, the best checkpoint kept in <out>/best (train.val_every; default 0: never)")
    p.add_argument("--init-from", metavar="RUN_OR_CHECKPOINT",
                   help="start from another run's weights (its newest checkpoint, or the checkpoint named): those whose "
                   "name and shape match this model's are loaded, the rest initialised; not its optimiser, step or RNG. "
                   "Ignored when --out holds checkpoints (the run resumes) (train.init_from)")
    p.add_argument("--activation-checkpointing", action="store_true", default=None,
                   help="recompute each decoder layer's activations in the backward pass instead of keeping them: far "
                   "less memory, about a third more compute (train.activation_checkpointing)")
    p.add_argument("--wandb", action="store_true", default=None,
                   help="log the scalars of log.jsonl to Weights & Biases too, offline without a login or with "
                   "WANDB_MODE=offline (train.wandb; project train.wandb_project; pip install 'rpt[wandb]')")
    p.add_argument("--optimizer", choices=["adamw", "adabelief"], help="train.optimizer")
    p.add_argument("--precision", choices=["fp32", "bf16"], help="train.precision (bf16 autocast on GPUs)")
    p.add_argument("--vocab-size", type=int, help="model.vocab_size (default with --preset, or a --config naming a preset: the "
                   "store's tokenizer's)")
    add_set(p)
    p.add_argument("--print-config", action="store_true", help="print the run's full config (YAML) and exit")
    p.add_argument("--no-resume", action="store_true", help="start afresh; refused if --out already holds checkpoints")
    p.add_argument("--stop-after", type=int, help="stop (with a checkpoint) after this many updates of this call")
    p.add_argument("--fsdp", action="store_true", help="shard with FSDP (torchrun on GPUs, for the 1b preset)")
    add_device(p, "training")
    p.add_argument("--threads", type=int, help="torch CPU threads (set once, at start)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-memory-check", action="store_true",
                   help="skip the pre-flight check that refuses a config whose training step cannot fit in memory")


def _set(doc: dict[str, Any], dotted: str, value: Any) -> None:
    section, _, key = dotted.partition(".")
    doc.setdefault(section, {})[key] = value


def config_from_args(args: argparse.Namespace):
    """The run's RPTConfig: the preset or config file, then the flags, then --set overrides (validated once)."""
    import yaml

    from rpt.cli import UserError
    from rpt.commands.options import parse_sets
    from rpt.config import ConfigError, RPTConfig, config_file, with_former_defaults
    from rpt.utils import load_yaml

    if args.config:
        try:
            path, recorded = config_file(args.config, "--config")
        except ConfigError as e:
            raise UserError(str(e)) from None
        doc = load_yaml(path.read_text(), f"--config {path}") or {}
        if not isinstance(doc, dict):
            raise UserError(f"--config {path} is not a YAML mapping")
        if recorded:  # another run's config: its missing fields take the defaults of its time
            doc = with_former_defaults(doc)
    else:
        doc = {"preset": args.preset}
    for flag, key in _FLAGS.items():
        if getattr(args, flag, None) is not None:
            _set(doc, key, getattr(args, flag))
    for key, value in parse_sets(args.set).items():
        _set(doc, key, value)
    preset = doc.get("preset")
    if preset and "vocab_size" not in doc.get("model", {}):
        # a preset's vocabulary is a placeholder: take the store's tokenizer's (--preset, or a config naming a preset)
        store = doc.get("data", {}).get("store") or RPTConfig.from_preset(preset).data.store
        try:
            _set(doc, "model.vocab_size", _store_vocab(store))
        except UserError:
            if not getattr(args, "print_config", False):
                raise  # --print-config shows the preset's placeholder until the store exists
    return RPTConfig.from_yaml(yaml.safe_dump(doc, sort_keys=False))


def _store_vocab(store_root: str) -> int:
    from rpt.train.loop import store_vocab

    return store_vocab(store_root)


def default_labels(store_root: str, variant: str, seq_len: int, given: dict[str, Path] | None = None) -> Path | None:
    """`rpt.labels.store.default_labels` (the library's; kept here for callers of this module)."""
    from rpt.labels.store import default_labels as library_default_labels

    return library_default_labels(store_root, variant, seq_len, given)


def run(args: argparse.Namespace) -> int:
    import torch

    from rpt.cli import UserError
    from rpt.commands.options import resolve_device
    from rpt.data.store import StoreError
    from rpt.train.loop import NonFiniteLoss, train

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = config_from_args(args)
    if args.print_config:
        print(cfg.to_yaml(), end="")
        return 0
    device = resolve_device(args.device)
    labels = args.labels
    if labels is None and cfg.model.uses_retrieval:
        labels = default_labels(cfg.data.store, cfg.model.variant, cfg.data.seq_len)
        if labels is None:
            raise UserError(f"variant {cfg.model.variant} needs retrieval labels: pass --labels (made by `rpt label` "
                            f"with span {cfg.data.seq_len})")
    try:
        result = train(cfg, cfg.data.store, labels, resume=not args.no_resume, fsdp=args.fsdp, device=device,
                       memory_check=not args.no_memory_check,
                       stop_after=args.stop_after, progress=not args.no_progress)
    except StoreError as e:
        raise UserError(str(e)) from None
    except NonFiniteLoss as e:
        print(f"rpt train: stopped: {e}")
        return 1
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    m = result.metrics
    loss = f", lm loss {m['lm_loss']:.4f}" if "lm_loss" in m else ""
    print(f"trained {cfg.model.variant} to step {result.step}{loss}; checkpoint {result.checkpoint}; "
          f"log {result.out_dir / 'log.jsonl'}")
    return 0
