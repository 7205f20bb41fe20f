"""`rpt export`: write a checkpoint as a self-contained Hugging Face folder (weights, config, tokenizer, model card)."""

from __future__ import annotations

import argparse

HELP = ("write a checkpoint as a Hugging Face folder (safetensors weights, config.json, tokenizer, the model's code, "
        "README.md model card) that AutoModelForCausalLM and AutoTokenizer load, without rpt with "
        "trust_remote_code=True")
ORDER = 56
FLAGS = {"path": "RUN_OR_CHECKPOINT"}  # library argument -> flag, where not --<argument> (rpt.utils.ArgumentError)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", metavar="RUN_OR_CHECKPOINT",
                   help="a run folder (its newest checkpoint), a checkpoint folder (runs/<name>/checkpoints/step_00000050) or "
                   "its model.safetensors")
    p.add_argument("--out", required=True, help="the folder to write (must be new or empty, unless --force)")
    p.add_argument("--force", action="store_true", help="replace --out when it already holds files")


def run(args: argparse.Namespace) -> int:
    from rpt.hf.export import export

    out = export(args.checkpoint, args.out, force=args.force)
    print(f"exported {args.checkpoint} to {out}")
    return 0
