"""`rpt generate`: continue prompts with a trained checkpoint, retrieving at every chunk boundary (rpt/decoding.py)."""

from __future__ import annotations

import argparse
import dataclasses
import sys

HELP = "continue prompts with a checkpoint, retrieving from the prompt and the generated text at every chunk"
ORDER = 50


def add_arguments(p: argparse.ArgumentParser) -> None:
    from rpt.commands.options import add_device
    from rpt.config import MAX_NEIGHBORS

    p.add_argument("--checkpoint", required=True, help="a checkpoint folder (runs/<name>/checkpoints/step_00000050), its "
                   "model.safetensors, or a run folder (its newest checkpoint)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", action="append", help="prompt text; repeat for a batch of prompts")
    src.add_argument("--prompt-file", help="read the prompt(s) from a file (see --prompt-sep)")
    p.add_argument("--prompt-sep", choices=["none", "line", "blank"], default="none",
                   help="how --prompt-file holds several prompts: none (the whole file is one prompt), line (one per "
                   "non-empty line), blank (paragraphs separated by blank lines)")
    p.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate per prompt (default 200)")
    p.add_argument("--greedy", action="store_true", help="argmax decoding (ignores --temperature/--top-p/--top-k)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0; 0 = greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1.0 = off)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (default 0 = off)")
    p.add_argument("--seed", type=int, default=0, help="prompt i samples with seed + i (default 0)")
    p.add_argument("--stop-at-eos", action="store_true", help="stop a continuation at the end-of-text token")
    p.add_argument("--neighbors", type=int, help=f"K neighbours fed to CCA, 1..{MAX_NEIGHBORS} (default: the model's "
                   "n_neighbors; the paper uses 2 to 4)")
    p.add_argument("--retrieve-k", type=int, help="also report the retriever's top-R per chunk (rpt-* variants)")
    p.add_argument("--ragged", choices=["separate", "truncate"], default="separate",
                   help="prompts of different lengths: run each length as its own batch (default), or cut all on the "
                   "left to the shortest (the model runs a batch in lockstep, without padding)")
    p.add_argument("--memory", choices=["auto", "torch", "faiss"], default="auto",
                   help="document memory: torch matmul, Faiss on CPU, or auto (torch on GPU, Faiss on CPU if installed)")
    p.add_argument("--tokenizer", help="tokenizer.json (default: the checkpoint's, else the one beside data.store); "
                   "refused when the run recorded another one")
    p.add_argument("--allow-other-tokenizer", action="store_true", help="use --tokenizer even though the run recorded "
                   "another tokenizer (one you know maps the same ids to the same tokens)")
    add_device(p, "model")
    p.add_argument("--threads", type=int, help="torch CPU threads (set once, at start)")
    p.add_argument("--echo", action="store_true", help="print the prompt before its continuation")
    p.add_argument("--show-retrieval", action="store_true",
                   help="after each generated chunk, print (to stderr) the chunks it retrieved with a snippet of each")
    p.add_argument("--json", help="also write every result (prompt, tokens, text, retrieved ids per chunk) to this file")


_FLAGS = {"n_neighbors": "--neighbors"}  # GenerateConfig fields whose flag is not --<field with dashes>
FLAGS = _FLAGS  # the same for library arguments (rpt.utils.ArgumentError)


def sampling_config(args: argparse.Namespace):
    """The GenerateConfig of the command line, validated before the model loads (a NaN temperature would otherwise
    surface as a traceback from torch.multinomial, a huge K as minutes of work). GenerateConfig.validate does the
    checking; its message is prefixed with the flag and the value given. The tokenizer's eos_id and vocab_size are
    filled in once it is loaded."""
    from rpt.decoding import GenerateConfig
    from rpt.utils import UserError

    cfg = GenerateConfig(max_new_tokens=args.max_new_tokens, greedy=args.greedy, temperature=args.temperature,
                         top_p=args.top_p, top_k=args.top_k, seed=args.seed, stop_at_eos=False,
                         n_neighbors=args.neighbors, retrieve_k=args.retrieve_k, ragged=args.ragged)
    try:
        cfg.validate()
    except ValueError as e:
        field = str(e).split()[0]
        flag = _FLAGS.get(field, "--" + field.replace("_", "-"))
        value = getattr(args, flag[2:].replace("-", "_"), None)
        shown = format(value, "g") if isinstance(value, (int, float)) else value
        raise UserError(f"{flag} {shown}: {e}") from None
    return cfg


def read_prompts(args: argparse.Namespace) -> list[str]:
    from rpt.decoding import read_text_file
    from rpt.utils import UserError

    if args.prompt is not None:
        prompts = list(args.prompt)
    else:
        text = read_text_file(args.prompt_file, "--prompt-file")
        if args.prompt_sep == "line":
            prompts = [line for line in text.splitlines() if line.strip()]
        elif args.prompt_sep == "blank":
            prompts = [p.strip("\n") for p in text.split("\n\n") if p.strip()]
        else:
            prompts = [text]
    if not prompts or any(not p.strip() for p in prompts):
        raise UserError("empty prompt: give some text to continue")
    return prompts


def _snippet(text: str, n: int = 70) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= n else flat[: n - 1] + "…"


def run(args: argparse.Namespace) -> int:
    import torch

    from rpt.utils import resolve_device

    if args.threads:
        torch.set_num_threads(args.threads)
    from rpt.api import encode_prompts, load_model
    from rpt.chunks import last_retrievable
    from rpt.decoding import ChunkEvent, TokenEvent, generate, memory_factory

    if args.json:  # before any work: never over a file of the user's
        from rpt.outputs import claim_file

        claim_file(args.json, "generate", arg="json", inputs={"checkpoint": args.checkpoint})
    cfg = sampling_config(args)
    prompts = read_prompts(args)
    device = str(resolve_device(args.device))
    loaded = load_model(args.checkpoint, device, args.tokenizer, allow_other_tokenizer=args.allow_other_tokenizer)
    ids, cfg = encode_prompts(loaded, prompts, dataclasses.replace(cfg, stop_at_eos=args.stop_at_eos))
    tok = loaded.tokenizer
    M, S = loaded.config.model.chunk_size, loaded.config.model.segment_len
    history = [list(x) for x in ids]  # per prompt: the document so far, to show retrieved chunks' text
    single = len(prompts) == 1

    def on_event(ev) -> None:
        if isinstance(ev, TokenEvent):
            history[ev.row].append(ev.token)
            if single:
                sys.stdout.write(ev.text)
                sys.stdout.flush()
        elif isinstance(ev, ChunkEvent) and args.show_retrieval and ev.retrieval.generated:
            r = ev.retrieval
            doc = history[ev.row]
            parts = []
            for k, j in enumerate(r.neighbor_ids):
                if j < 0:
                    continue
                gate = f" gate {r.gates[k]:.2f}" if r.gates is not None else ""
                parts.append(f"  #{j}{gate}: {_snippet(tok.decode(doc[j * M : (j + 2) * M]))!r}")
            head = f"[prompt {ev.row}] " if not single else ""
            first = next(i for i in range(1 << 20) if last_retrievable(i, M, S) >= 0)  # the first chunk that retrieves
            body = "\n".join(parts) if parts else (
                f"  (nothing retrievable yet: a chunk retrieves only what lies beyond its attention window; retrieval "
                f"starts at chunk {first}, token {first * M}: give a longer prompt, e.g. --prompt-file)")
            print(f"\n{head}chunk {r.chunk} finished; its neighbours for chunk {r.chunk + 1}:\n{body}", file=sys.stderr)

    if single and args.echo:
        sys.stdout.write(prompts[0])
    results = generate(loaded.model, ids, cfg, tokenizer=tok, memory=memory_factory(args.memory, device), on_event=on_event)
    if single:
        sys.stdout.write("\n")
    else:
        for i, g in enumerate(results):
            print(f"=== prompt {i} ({len(g.prompt)} tokens{f', {g.truncated} cut on the left' if g.truncated else ''}) ===")
            if args.echo:
                print(tok.decode(g.prompt), end="")
            print(g.text)
    if args.json:
        from dataclasses import asdict

        from rpt.utils import write_json_atomic

        out = [{"prompt": p, **asdict(g)} for p, g in zip(prompts, results, strict=True)]
        write_json_atomic(args.json, {"checkpoint": str(loaded.path), "variant": loaded.config.model.variant,
                                      "chunk_size": M, "results": out}, "generate")
    return 0
