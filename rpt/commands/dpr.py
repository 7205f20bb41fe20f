"""`rpt dpr`: train the DPR-style retriever of the Table 4 ablation (rpt/retrievers/dpr.py), for `rpt eval --source dpr`."""

from __future__ import annotations

import argparse

HELP = "train a DPR-style dual encoder (App. C: BM25 rank 1 positive, rank 5 hard negative) to swap in at evaluation " \
       "(rpt eval --source dpr --retriever FOLDER)"
FLAGS = {"out_dir": "--out"}  # argument -> flag (rpt.utils.ArgumentError)
ORDER = 47


def add_arguments(p: argparse.ArgumentParser) -> None:
    from rpt.commands.options import add_config, add_device

    add_config(p, "the store (data.store) and the segment length (model.segment_len) of the LM the retriever serves; "
               "a --segment-len that contradicts it is refused")
    p.add_argument("--store", help="token store root written by `rpt prepare` (or one split's folder; default: "
                   "--config's data.store)")
    p.add_argument("--out", required=True, help="retriever folder to write (refused if it exists, unless --force)")
    p.add_argument("--split", default="train", help="split the training pairs come from (default train)")
    p.add_argument("--segment-len", type=int,
                   help="the LM's model.segment_len: the retrievable rule the pairs obey (default: --config's, else 1024)")
    p.add_argument("--steps", type=int, default=2000, help="updates (default 2000)")
    p.add_argument("--batch-size", type=int, default=64, help="queries per update; in-batch negatives (default 64)")
    p.add_argument("--lr", type=float, default=3e-4, help="peak learning rate (default 3e-4)")
    p.add_argument("--seed", type=int, default=0, help="pair shuffling, held-out split and initialisation (default 0)")
    p.add_argument("--shared", action="store_true", help="one encoder for queries and passages (default: two, as DPR)")
    p.add_argument("--d-model", type=int, help="encoder width (default 256)")
    p.add_argument("--layers", type=int, help="encoder layers (default 4)")
    p.add_argument("--max-documents", type=int, default=0, help="mine pairs from at most N documents (default all)")
    p.add_argument("--heldout", type=int, default=1000, help="pairs kept out and scored at the end (default 1000)")
    add_device(p, "training")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("--force", action="store_true", help="replace an existing retriever folder at --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    import torch

    from rpt.commands.options import agree, config_of
    from rpt.retrievers.dpr import describe, train_dpr
    from rpt.utils import UserError, resolve_device

    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = {"shared": args.shared}
    if args.d_model:
        overrides["d_model"] = args.d_model
    if args.layers:
        overrides["n_layers"] = args.layers
    cfg = config_of(args)
    store = args.store or (cfg and cfg.data.store)
    if store is None:
        raise UserError("--store is required (or a --config whose data.store names the store)")
    segment_len = agree("--segment-len", args.segment_len, "model.segment_len", cfg and cfg.model.segment_len) or 1024
    res = train_dpr(store, args.out, steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                    split=args.split, segment_len=segment_len, config=overrides, max_documents=args.max_documents,
                    heldout=args.heldout, device=resolve_device(args.device), progress=not args.no_progress, overwrite=args.force)
    acc = res.metrics.get("heldout_hard_acc")
    print(describe(res.retriever))
    print(f"  written to {res.path}" + ("" if acc is None else f"; held-out pairs ranked right: {100 * acc:.1f}% "
                                         "(positive above the hard negative; 50% = chance)"))
    return 0
