"""`rpt export`: a checkpoint as a self-contained Hugging Face folder, without optimizer state.

    <out>/config.json              RPTHFConfig: the model section of the run's config, every field; `rpt`: what the
                                   export recorded of the run (its corpus and tokenizer as the token store's
                                   prepare.json names them); `auto_map`: the code below
    <out>/generation_config.json   eos = the tokenizer's end-of-text token; ids past the tokenizer's vocabulary (spare
                                   embedding rows) suppressed, as `rpt generate` never samples them
    <out>/model.safetensors        the weights
    <out>/tokenizer.json, tokenizer_config.json, special_tokens_map.json
                                   the run's tokenizer as a PreTrainedTokenizerFast (AutoTokenizer loads it)
    <out>/configuration_rpt.py, modeling_rpt.py, rpt_*.py
                                   the model's code (rpt.hf.bundle), so that the folder loads without rpt:
                                   `AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)`
    <out>/README.md                a model card: variant, preset, parameters, training data and steps, and the
                                   figures of any `rpt eval` result found beside the checkpoint

The folder is written under a temporary name and renamed into place, so <out> is either complete or untouched.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

from rpt.outputs import Owner, claim_folder, mark_folder
from rpt.utils import RPTWarning, UserError, argument_error

ARG = "RUN_OR_CHECKPOINT"  # the CLI's name for argument `path`


def preset_name(mcfg: Any) -> str:
    """The preset whose shape the model has (d_model, n_layers, n_heads, mlp_hidden, segment_len), with -paper when it
    also has the paper's CCA and gate (model.cca and model.gate: paper); "custom" when none matches."""
    from rpt.config import PAPER_MODEL, PRESETS, SIZES, ModelConfig, RPTConfig, from_dict

    shape = ("d_model", "n_layers", "n_heads", "mlp_hidden", "segment_len")
    for name in SIZES:
        ref = from_dict(RPTConfig, PRESETS[name]()).model
        if all(getattr(ref, k) == getattr(mcfg, k) for k in shape):
            paper = all(getattr(mcfg, k) == getattr(from_dict(ModelConfig, {k: v}), k) for k, v in PAPER_MODEL.items())
            return f"{name}-paper" if paper else name
    return "custom"


def find_eval_results(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    """`rpt eval` result JSONs in the checkpoint folder, its run folder and the run's eval/ folder."""
    run = folder.parent.parent if folder.parent.name == "checkpoints" else folder
    found: list[tuple[Path, dict[str, Any]]] = []
    seen: set[Path] = set()
    for d in (folder, run, run / "eval"):
        if not d.is_dir():
            continue
        for p in sorted(d.glob("*.json")):
            if p.resolve() in seen:
                continue
            seen.add(p.resolve())
            try:
                r = json.loads(p.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                continue
            if isinstance(r, dict) and isinstance(r.get("total"), dict) and isinstance(r.get("eval"), dict):
                found.append((p, r))
    return found


def _fmt(v: Any, spec: str = ".4f") -> str:
    return "-" if v is None else format(v, spec) if isinstance(v, float) else str(v)


def model_card(info: dict[str, Any], results: list[tuple[Path, dict[str, Any]]], out_name: str) -> str:
    v = info["variant"]
    corpus = f"corpus `{info['corpus']}`, " if info.get("corpus") else ""
    lines = [
        "---",
        "library_name: transformers",
        "tags:",
        "- rpt",
        "- retrieval",
        "- long-context",
        f"- {v}",
        "---",
        "",
        f"# RPT ({v})",
        "",
        "A Retrieval-Pretrained Transformer (Rubin & Berant): a decoder that retrieves earlier chunks of the document "
        "it is reading and attends to them with chunked cross-attention, exported from an `rpt` checkpoint.",
        "",
        "| | |",
        "|---|---|",
        f"| variant | `{v}` ({info['paper_row']}) |",
        f"| preset | `{info['preset']}` |",
        f"| parameters | {info['parameters']:,} |",
        f"| width / layers / heads | {info['d_model']} / {info['n_layers']} / {info['n_heads']} |",
        f"| chunk / segment | {info['chunk_size']} / {info['segment_len']} tokens |",
        f"| vocabulary | {info['vocab_size']:,} (tokenizer `{info['tokenizer'] or 'not found'}`) |",
        f"| training data | {corpus}store `{info['store']}`, spans of {info['seq_len']:,} tokens |",
        f"| training steps | {_fmt(info['step'])} of {info['planned_steps']:,} planned |",
        f"| checkpoint | `{info['checkpoint']}` |",
        *([f"| backbone | `{info['backbone']}`: a pretrained model retrofitted with retrieval; its weights are not in "
           "this folder but read from that path when the model loads (keep it there), under the backbone's own "
           "licence |"] if info.get("backbone") else []),
        "",
        "## Evaluation",
        "",
    ]
    if results:
        lines += ["| result | step | split | source | K | documents | tokens | NLL / token | perplexity |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for p, r in results:
            t, ev = r["total"], r["eval"]
            lines.append(f"| `{p.name}` | {_fmt(r.get('step'))} | {_fmt(ev.get('split'))} | {_fmt(ev.get('source'))} | "
                         f"{_fmt(ev.get('n_neighbors'))} | {_fmt(t.get('n_documents'))} | {_fmt(t.get('n_tokens'))} | "
                         f"{_fmt(t.get('nll_mean'))} | {_fmt(t.get('perplexity'))} |")
        ret = [(p, r["retrieval"]["model"]) for p, r in results if isinstance(r.get("retrieval"), dict)
               and isinstance(r["retrieval"].get("model"), dict)]
        if ret:
            lines += ["", "Retrieval (the model's own ranking against the scoring LM's labels):", "",
                      "| result | precision@2 | recall@10 | nDCG@20 |", "|---|---|---|---|"]
            for p, m in ret:
                lines.append(f"| `{p.name}` | {_fmt(m.get('precision@2'))} | {_fmt(m.get('recall@10'))} | "
                             f"{_fmt(m.get('ndcg@20'))} |")
    else:
        lines.append("No `rpt eval` result was found beside the checkpoint.")
    lines += [
        "",
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f'model = AutoModelForCausalLM.from_pretrained("{out_name}", trust_remote_code=True)',
        f'tokenizer = AutoTokenizer.from_pretrained("{out_name}", trust_remote_code=True)',
        'ids = tokenizer("def parse(text):", return_tensors="pt").input_ids',
        "print(tokenizer.decode(model.generate(ids, max_new_tokens=100, do_sample=False)[0]))",
        "```",
        "",
        "The folder carries the model's code (`configuration_rpt.py`, `modeling_rpt.py` and the `rpt_*.py` files they "
        "import: torch, transformers and numpy only), hence `trust_remote_code=True`; where `rpt` is installed and "
        "imported, transformers uses rpt's own classes instead and the flag is not needed.",
        "",
        "Generation continues the model's own document cache: every finished chunk enters the document memory and "
        "retrieves, as `rpt generate` does. Beam search and padded batches (an attention mask with zeros) are refused: "
        "pass prompts of one length per batch.",
        "",
    ]
    return "\n".join(lines)


def prepared_data(store: str, tokenizer_hash: str | None) -> dict[str, str]:
    """The corpus and tokenizer of the token store a run trained on, as `rpt prepare` recorded them in the store's
    prepare.json ({"corpus": spec, "tokenizer": name}), where that store is still there and holds tokens of the run's
    tokenizer (same hash); {} otherwise. A run's config may not say them: `rpt train` on a store takes the store as it
    is, whatever data.corpus and data.tokenizer hold (their defaults, stdlib and bpe:8192, or a preset's)."""
    from rpt.data.prepare import store_source

    if not store or tokenizer_hash is None:
        return {}
    source = store_source(store, tokenizer_hash)
    return {k: source[k] for k in ("corpus", "tokenizer")} if source else {}


def hf_tokenizer(tokenizer: Any) -> Any:
    """An rpt tokenizer (rpt.data.tokenizer.Tokenizer), a tokenizers.Tokenizer or a tokenizer.json path as a
    PreTrainedTokenizerFast (what AutoTokenizer loads back), its end-of-text token as eos when it has one."""
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    from rpt.data.tokenizer import EOS

    if isinstance(tokenizer, (str, Path)):
        tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer))
    tok = getattr(tokenizer, "tok", tokenizer)  # our Tokenizer wraps a tokenizers.Tokenizer
    special = {"eos_token": EOS} if tok.token_to_id(EOS) is not None else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False, **special)


def _is_export(folder: Path) -> bool:
    try:
        return json.loads((folder / "config.json").read_text()).get("model_type") == "rpt"
    except (OSError, ValueError, AttributeError, RecursionError):
        return False


# What `rpt export` writes (rpt.outputs): a Hugging Face folder
OWNER = Owner("export", ("config.json", "generation_config.json", "model*.safetensors", "model.safetensors.index.json",
                         "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "README.md", "*.py",
                         "LICENSE*", ".*.tmp"), _is_export)


def export(path: str | Path, out: str | Path, force: bool = False) -> Path:
    """Write the checkpoint at `path` (a checkpoint folder, its model.safetensors, or a run folder: its newest
    checkpoint) as a Hugging Face folder at `out`; returns `out`. `force` replaces an earlier export at `out`; a
    folder holding anything else, or the checkpoint itself, is refused."""
    from rpt.checkpoint import missing_checkpoint, read_state
    from rpt.decoding import load_checkpoint
    from rpt.hf.modeling import RPTForCausalLM
    from rpt.model.registry import spec

    path, out = Path(path), Path(out)
    if not path.exists():
        raise argument_error("path", path, missing_checkpoint(path))
    # before any work: never over a folder of the user's, nor the run or checkpoint being exported
    if claim_folder(out, OWNER, arg="out", inputs={"path": path}) and not force:
        raise argument_error("out", out, "holds an earlier export (pass {force=True} to replace it)")
    try:
        model, cfg, tok, folder = load_checkpoint(path)
    except UserError as e:
        raise argument_error("path", path, str(e)) from None
    mcfg = model.cfg
    state = read_state(folder)
    info = {"variant": mcfg.variant, "paper_row": spec(mcfg.variant).paper, "preset": preset_name(mcfg),
            "parameters": model.num_parameters(), **{k: getattr(mcfg, k) for k in
                                                      ("d_model", "n_layers", "n_heads", "chunk_size", "segment_len",
                                                       "vocab_size")},
            "tokenizer": tok.name if tok is not None else None, "store": cfg.data.store, "seq_len": cfg.data.seq_len,
            "step": state.get("step"), "planned_steps": cfg.train.steps, "checkpoint": str(folder),
            "backbone": mcfg.backbone}
    if tok is None:
        warnings.warn(f"no tokenizer found for {folder} (neither beside it nor beside its store {cfg.data.store}): "
                      f"{out} holds no tokenizer", RPTWarning, stacklevel=2)
    prepared = prepared_data(cfg.data.store, tok.hash if tok is not None else None)
    data = {**dataclasses.asdict(cfg.data), **prepared}
    if tok is not None:
        info["tokenizer"] = prepared.get("tokenizer", tok.name)
    info["corpus"] = prepared.get("corpus")
    record = {k: info[k] for k in ("variant", "preset", "store", "step", "checkpoint")}
    record["tokenizer"] = {**tok.identity, "name": info["tokenizer"]} if tok is not None else None
    record["train"] = dataclasses.asdict(cfg.train)
    record["data"] = data
    hf = RPTForCausalLM.from_rpt_model(model, rpt=record)
    if tok is not None:
        eos = tok.tok.token_to_id("<|endoftext|>")
        if eos is not None:
            hf.config.eos_token_id = eos
            hf.generation_config.eos_token_id = eos
            hf.generation_config.pad_token_id = eos
        if tok.vocab_size < mcfg.vocab_size:  # spare embedding rows: ids the tokenizer cannot decode
            hf.generation_config.suppress_tokens = list(range(tok.vocab_size, mcfg.vocab_size))

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        mark_folder(tmp, OWNER)
        hf.save_pretrained(tmp)
        if tok is not None:
            hf_tokenizer(tok).save_pretrained(tmp)
        (tmp / "README.md").write_text(model_card(info, find_eval_results(folder), str(out)))
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise argument_error("out", out, f"cannot write it ({e.strerror or e})") from None
    if out.exists():
        claim_folder(out, OWNER, arg="out")  # still only an export (checked again: the work took a while)
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)
    return out
