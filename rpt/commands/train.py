"""`rpt train`: train RPT (or the xl / retro baselines) on a token store, resuming where a run left off (rpt/training/)."""

from __future__ import annotations

import argparse
import math
import os

HELP = ("train a model (xl, retro, rpt-lex, rpt-sem or a baseline: memorizing, block-recurrent, griffin) on a token "
        "store; resumes an interrupted run")
ORDER = 30
FLAGS = {"out_dir": "--out", "labels_path": "--labels", "store_root": "--store"}  # argument -> flag (ArgumentError)


def _flags() -> dict[str, str]:
    """command-line flag (argparse dest) -> dotted config key: rpt.train's short names and the run's folders"""
    from rpt.api import TRAIN_ARGS

    return {**TRAIN_ARGS, "out": "train.out_dir", "store": "data.store", "init_from": "train.init_from",
            "activation_checkpointing": "train.activation_checkpointing", "wandb": "train.wandb",
            "lora_rank": "model.lora_rank"}


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
                   "updates and at the end, the best checkpoint kept in <out>/best (train.val_every; default -1: at "
                   "every checkpoint when the store has a validation split; 0: never)")
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
    p.add_argument("--backbone", metavar="PATH", help="retrofit a pretrained causal LM: a local Hugging Face folder or "
                   ".gguf file (Llama family) becomes the frozen trunk, its shape the model's (model.backbone; "
                   "docs/retrofit.md)")
    p.add_argument("--lora-rank", type=int, metavar="R",
                   help="with --backbone: LoRA adapters of rank R on the backbone's linear layers named by "
                   "model.lora_targets (default: its attention projections) train with the new parts; its own weights "
                   "stay frozen (model.lora_rank; 0: off; lora_alpha, lora_dropout and lora_targets via --set; pip "
                   "install 'rpt[peft]')")
    p.add_argument("--vocab-size", type=int, help="model.vocab_size (default with --preset, or a --config naming a preset: the "
                   "store's tokenizer's)")
    add_set(p)
    p.add_argument("--print-config", action="store_true", help="print the run's full config (YAML) and exit")
    p.add_argument("--no-resume", action="store_true", help="start afresh; refused if --out already holds checkpoints")
    p.add_argument("--allow-changes", action="store_true",
                   help="resume although training or data settings (lr, schedules, batch, ...) differ from the checkpoint's "
                   "(refused otherwise; another --steps is accepted and named); changes are recorded in "
                   "<out>/changes.json and config.yaml")
    p.add_argument("--stop-after", type=int, help="stop (with a checkpoint) after this many updates of this call")
    p.add_argument("--fsdp", action="store_true", help="shard with FSDP (torchrun on GPUs, for the 1b preset)")
    add_device(p, "training")
    p.add_argument("--threads", type=int, help="torch CPU threads (set once, at start)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-memory-check", action="store_true",
                   help="skip the pre-flight check that refuses a config whose training step cannot fit in memory")


def config_from_args(args: argparse.Namespace):
    """The run's RPTConfig: the preset or config, then the flags, then --set overrides (validated once)."""
    from rpt.api import build_train_config
    from rpt.commands.options import parse_sets

    values = {key: getattr(args, flag) for flag, key in _flags().items() if getattr(args, flag, None) is not None}
    values.update(parse_sets(args.set))
    return build_train_config(args.config or args.preset, values, "--config",
                              placeholder_vocab=getattr(args, "print_config", False))


def run(args: argparse.Namespace) -> int:
    import torch

    from rpt.data.store import StoreError
    from rpt.training.loop import NonFiniteLoss, train
    from rpt.utils import UserError, resolve_device

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = config_from_args(args)
    if args.print_config:
        print(cfg.to_yaml(), end="")
        return 0
    device = str(resolve_device(args.device))
    labels = args.labels
    if labels is None and cfg.model.uses_retrieval:
        from rpt.labels.store import default_labels

        labels = default_labels(cfg.data.store, cfg.model.variant, cfg.data.seq_len)
        if labels is None:
            raise UserError(f"variant {cfg.model.variant} needs retrieval labels: pass --labels (made by `rpt label` "
                            f"with span {cfg.data.seq_len})")
    try:
        result = train(cfg, cfg.data.store, labels, resume=not args.no_resume, fsdp=args.fsdp, device=device,
                       memory_check=not args.no_memory_check, allow_changes=args.allow_changes,
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
    best = ""
    if result.best is not None:
        b = result.best
        best = f"; best {b['path']} (step {b['step']}, validation ppl {math.exp(min(b['val_loss'], 700.0)):.2f})"
    print(f"trained {cfg.model.variant} to step {result.step}{loss}; checkpoint {result.checkpoint}; "
          f"log {result.out_dir / 'log.jsonl'}{best}")
    return 0
