"""The Python API: rpt as a library, one function per step of the CLI, each over the code its `rpt <verb>` runs.

    import rpt
    rpt.prepare("docs/", "data/mine", tokenizer="bpe:2048")                  # rpt prepare
    rpt.train("tiny", "data/mine", "runs/mine", steps=200)                   # rpt train
    m = rpt.load("runs/mine")                                                # a run, checkpoint or exported folder
    print(m.generate("def parse(text):", max_new_tokens=50, greedy=True))    # rpt generate
    print(m.evaluate("data/mine", max_documents=10).perplexity)              # rpt eval
    m.export("exported/mine")                                                # rpt export

Errors about an argument name the argument as passed here (``checkpoint='runs/x': no such file or folder``); the CLI
prints the same errors with its flags. The functions import torch when called, never when `rpt` is imported.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rpt.utils import UserError, argument_error, checked

if TYPE_CHECKING:
    import torch

    from rpt.config import RPTConfig
    from rpt.data.prepare import PrepareSummary
    from rpt.data.tokenizer import Tokenizer
    from rpt.decoding import GenerateConfig
    from rpt.model.rpt import RPT
    from rpt.training.loop import TrainResult

__all__ = ["EvalResult", "LoadedModel", "evaluate", "generate", "is_exported", "label", "load", "prepare", "train"]


# --------------------------------------------------------------------------------------------------------------
# loading


@dataclass
class LoadedModel:
    """A trained model ready for inference (`rpt.load`): the model (eval mode), its run config, its tokenizer (None
    when none was found) and the folder it came from (a checkpoint folder, or an exported Hugging Face folder)."""

    model: RPT
    config: RPTConfig
    tokenizer: Tokenizer | None
    path: Path  # the checkpoint folder

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @checked
    def generate(self, prompt: str | Sequence[str], max_new_tokens: int = 200, **options) -> str | list[str]:
        """Continue `prompt` (text; a list of texts gives a list): `rpt.generate` with this model."""
        return generate(self, prompt, max_new_tokens=max_new_tokens, **options)

    @checked
    def evaluate(self, store_or_documents, **options):
        """Perplexity over a token store's split or a list of documents: `rpt.evaluate` with this model."""
        return evaluate(self, store_or_documents, **options)

    @checked
    def export(self, out: str | Path, force: bool = False) -> Path:
        """Write this checkpoint as a Hugging Face folder (`rpt.export`); returns `out`."""
        from rpt.hf.export import export

        return export(self.path, out, force=force)


def encode_prompts(loaded: LoadedModel, prompts: Sequence[str], cfg: GenerateConfig) -> tuple[list[list[int]], GenerateConfig]:
    """(token ids of each text prompt, `cfg` with the tokenizer's end-of-text id and vocabulary size filled in): the
    checks `rpt generate` and `rpt.generate` share (a tokenizer to encode with, prompts that encode to tokens)."""
    tok = loaded.tokenizer
    if tok is None:
        raise argument_error("tokenizer", problem=f"cannot find the tokenizer of {loaded.path} (no tokenizer.json in "
                             f"the checkpoint or run folder, nor beside data.store {loaded.config.data.store}): pass one")
    if not prompts or any(not p.strip() for p in prompts):
        raise UserError("empty prompt: give some text to continue")
    ids = [tok.encode(p) for p in prompts]
    if any(not x for x in ids):
        raise UserError("empty prompt: it encodes to no tokens")
    cfg = dataclasses.replace(cfg, eos_id=tok.eos_id, vocab_size=tok.vocab_size)
    if cfg.stop_at_eos and cfg.eos_id is None:
        raise argument_error("stop_at_eos", True, "the tokenizer has no end-of-text token")
    return ids, cfg


def load_model(path: str | Path, device: str = "cpu", tokenizer: str | Path | None = None,
               allow_other_tokenizer: bool = False) -> LoadedModel:
    """A checkpoint (its folder, its model.safetensors, or a run folder: the newest checkpoint) as a LoadedModel, in
    eval mode on `device` (`rpt.decoding.load_checkpoint`: the tokenizer found and checked). The one place
    generation and the explorer load models."""
    from rpt.decoding import load_checkpoint

    return LoadedModel(*load_checkpoint(path, device, tokenizer, allow_other_tokenizer))


def is_exported(path: str | Path) -> bool:
    """Whether `path` is a Hugging Face folder written by `rpt export` (config.json with model_type "rpt")."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        return json.loads(config.read_text()).get("model_type") == "rpt"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False


@checked
def load(path: str | Path, device: str | None = None, *, tokenizer: str | Path | None = None,
         allow_other_tokenizer: bool = False) -> LoadedModel:
    """A trained model with its tokenizer and config, in eval mode on `device` (default: cuda when available).

    path: a run folder (its newest intact checkpoint), a checkpoint folder (runs/<name>/checkpoints/step_00000050), its
    model.safetensors, or a folder written by `rpt export` (Hugging Face layout). tokenizer: a tokenizer.json to use
    instead of the one found beside the checkpoint (refused unless it is the one the run recorded, or
    allow_other_tokenizer=True). Returns a `LoadedModel`: `.model`, `.tokenizer`, `.config`, `.path`,
    and `.generate(text)`, `.evaluate(store_or_documents)`, `.export(out)`."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if not Path(path).exists():
        raise argument_error("path", path, "no such file or folder")
    if is_exported(path):
        return _load_exported(Path(path), device, tokenizer)
    return load_model(path, device, tokenizer, allow_other_tokenizer=allow_other_tokenizer)


def _load_exported(path: Path, device: str, tokenizer: str | Path | None) -> LoadedModel:
    """An `rpt export` folder as a LoadedModel: the rpt model inside RPTForCausalLM, the run's data and train sections
    as the export recorded them (defaults where it did not)."""
    from rpt.config import ConfigError, RPTConfig, from_dict
    from rpt.data.tokenizer import Tokenizer
    from rpt.hf.modeling import RPTForCausalLM

    hf = RPTForCausalLM.from_pretrained(str(path))
    model = hf.model.to(device).eval()
    record = getattr(hf.config, "rpt", None) or {}
    doc: dict[str, Any] = {"model": dataclasses.asdict(model.cfg)}
    for section in ("data", "train"):
        if isinstance(record.get(section), dict):
            doc[section] = record[section]
    try:
        cfg = from_dict(RPTConfig, doc)
    except ConfigError:  # recorded by another version of rpt: keep the model, default the rest
        cfg = from_dict(RPTConfig, {"model": doc["model"]})
    tok_file = Path(tokenizer) if tokenizer is not None else path / "tokenizer.json"
    tok = Tokenizer.from_file(tok_file, name=str(path)) if tok_file.is_file() else None
    return LoadedModel(model, cfg, tok, path)


def _loaded(model_or_path: Any, device: str | None = None, tokenizer: Any = None) -> LoadedModel:
    """A LoadedModel from what a caller passed: one already (returned as is), a path (`load`), or a bare model
    (an nn.Module from `rpt.build_model`, with `tokenizer`: an rpt Tokenizer or a tokenizer.json)."""

    if isinstance(model_or_path, LoadedModel):
        return model_or_path
    if isinstance(model_or_path, (str, Path)):
        return load(model_or_path, device, tokenizer=tokenizer)
    if hasattr(model_or_path, "cfg") and hasattr(model_or_path, "new_cache"):
        from rpt.config import RPTConfig
        from rpt.data.tokenizer import Tokenizer

        tok = Tokenizer.from_file(tokenizer) if isinstance(tokenizer, (str, Path)) else tokenizer
        return LoadedModel(model_or_path, RPTConfig(model=model_or_path.cfg), tok, Path("."))
    raise argument_error("model", type(model_or_path).__name__, "expected a path, rpt.load()'s result or an rpt model")


# --------------------------------------------------------------------------------------------------------------
# generation


@checked
def generate(model: Any, prompt: str | Sequence[str], *, max_new_tokens: int = 200, greedy: bool = False,
             temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0, stop_at_eos: bool = False,
             n_neighbors: int | None = None, ragged: str = "separate", memory: str = "auto", device: str | None = None,
             tokenizer: Any = None) -> str | list[str]:
    """Continue `prompt` (text) and return the generated text (a list of texts for a list of prompts), retrieving at
    every chunk boundary from the prompt and the text generated so far, as `rpt generate` does.

    model: `rpt.load`'s result, a path `load` accepts (loaded on `device`), or a model with `tokenizer`.
    greedy (or temperature 0) takes the argmax; otherwise temperature, then top_k (0: off), then top_p (1: off), with
    prompt i sampled from seed + i. stop_at_eos: stop at the tokenizer's end-of-text token. n_neighbors: K neighbours
    per chunk fed to CCA (default: the model's). ragged: prompts of different lengths run as separate batches
    ("separate") or are cut on the left to the shortest ("truncate"). memory: the document memory, "auto", "torch"
    or "faiss"."""
    from rpt.decoding import GenerateConfig, memory_factory
    from rpt.decoding import generate as generate_ids

    loaded = _loaded(model, device, tokenizer)
    cfg = GenerateConfig(max_new_tokens=max_new_tokens, greedy=greedy, temperature=temperature, top_p=top_p,
                         top_k=top_k, seed=seed, stop_at_eos=stop_at_eos, n_neighbors=n_neighbors,
                         ragged=ragged)  # type: ignore[arg-type]
    try:  # the end-of-text id comes with the tokenizer (encode_prompts, which checks stop_at_eos against it)
        dataclasses.replace(cfg, stop_at_eos=False).validate()
    except ValueError as e:  # "<field> must be ...": the field is the argument of the same name
        field, _, problem = str(e).partition(" ")
        raise argument_error(field, getattr(cfg, field, None), problem) from None
    single = isinstance(prompt, str)
    prompts = [prompt] if single else list(prompt)
    ids, cfg = encode_prompts(loaded, prompts, cfg)
    results = generate_ids(loaded.model, ids, cfg, tokenizer=loaded.tokenizer,
                           memory=memory_factory(memory, loaded.device))
    texts = [g.text or "" for g in results]
    return texts[0] if single else texts


# --------------------------------------------------------------------------------------------------------------
# evaluation


class EvalResult(dict):
    """The result of `rpt eval` (layout: `rpt.eval.perplexity.run_eval`), with its headline figures as attributes."""

    @property
    def perplexity(self) -> float | None:
        """exp(mean NLL per predicted token) over every document (None with no predicted token)."""
        return self["total"]["perplexity"]

    @property
    def nll(self) -> float | None:
        """Mean NLL per predicted token, in nats."""
        return self["total"]["nll_mean"]

    @property
    def n_tokens(self) -> int:
        return self["total"]["n_tokens"]

    @property
    def documents(self) -> list[dict[str, Any]]:
        """One record per document: index, id, n_tokens, nll_sum, n_targets, perplexity, memory_bytes, ..."""
        return self["documents"]


class DocumentList:
    """Documents given as texts (tokenized with the model's tokenizer) or token-id lists, read as a token store."""

    def __init__(self, documents: Sequence[str] | Sequence[Sequence[int]], tokenizer: Any = None) -> None:
        import numpy as np

        docs = list(documents)
        if not docs:
            raise argument_error("documents", [], "no documents to evaluate")
        if any(isinstance(d, str) for d in docs):
            if tokenizer is None:
                raise argument_error("tokenizer", problem="documents given as text need the model's tokenizer")
            docs = tokenizer.encode_batch([str(d) for d in docs])
        self.docs = [np.asarray(d, dtype=np.int64) for d in docs]
        self.doc_ids = [f"document {i}" for i in range(len(self.docs))]
        self.path = "<documents>"

    def __len__(self) -> int:
        return len(self.docs)

    def document(self, d: int) -> Any:
        return self.docs[d]

    def doc_lengths(self) -> Any:
        import numpy as np

        return np.asarray([len(d) for d in self.docs], dtype=np.int64)

    def check_compatible(self, tokenizer_id: Any = None, chunk_size: int | None = None,
                         vocab_size: int | None = None) -> None:
        if vocab_size is not None:
            bad = [int(d.max()) for d in self.docs if len(d) and (d.max() >= vocab_size or d.min() < 0)]
            if bad:
                raise argument_error("documents", problem=f"token id {bad[0]} is outside the model's vocabulary "
                                     f"[0, {vocab_size})")


@checked
def evaluate(model: Any, store_or_documents: str | Path | Sequence[str] | Sequence[Sequence[int]], *,
             split: str = "test", n_neighbors: int = 2, source: str | None = None, labels: str | Path | None = None,
             max_documents: int = 0, memory: str = "auto", with_metrics: bool = False, per_chunk: bool = False,
             precision: str = "fp32", out: str | Path | None = None, device: str | None = None,
             progress: bool = False, tokenizer: Any = None) -> EvalResult:
    """Long-document perplexity (and, with labels, retrieval metrics), as `rpt eval` computes it: each document is read
    segment by segment with a fresh cache, every chunk retrieving from the document so far.

    model: `rpt.load`'s result, a path `load` accepts (loaded on `device`), or a model with `tokenizer`.
    store_or_documents: a token store written by `rpt.prepare` (its `split`), or documents: texts (encoded with the
    model's tokenizer) or lists of token ids. source: the neighbours fed to CCA (default: the variant's own; see
    `rpt.eval.perplexity`); labels: a sem label store with span doc, for source "oracle" and with_metrics.
    out: also write the result JSON there. Returns an `EvalResult` (a dict; `.perplexity`, `.nll`, `.documents`)."""
    from rpt.config import EvalConfig
    from rpt.eval.perplexity import run_eval

    loaded = _loaded(model, device, tokenizer)
    store: Any = store_or_documents
    if not isinstance(store_or_documents, (str, Path)):
        store = DocumentList(store_or_documents, loaded.tokenizer)
    settings = EvalConfig(split=split, n_neighbors=n_neighbors, source=source or "auto",  # type: ignore[arg-type]
                          labels=str(labels or ""), memory=memory, max_documents=max_documents,  # type: ignore[arg-type]
                          with_metrics=with_metrics, per_chunk=per_chunk, precision=precision)  # type: ignore[arg-type]
    result = run_eval(None, store, settings, out=out, progress=progress, loaded=loaded)
    return EvalResult(result)


# --------------------------------------------------------------------------------------------------------------
# data and training


@checked
def prepare(source: str | Path, out: str | Path, *, tokenizer: str = "bpe:8192", chunk_size: int = 64,
            splits: Sequence[str] | None = None, max_documents: int | None = None, min_chunks: int = 2,
            force: bool = False, progress: bool = False) -> PrepareSummary:
    """Tokenize a corpus into one token store per split under `out` (with its tokenizer.json), as `rpt prepare` does.

    source: a folder of text files or of JSONL files, a .jsonl file, or any corpus name `rpt prepare --corpus`
    accepts (stdlib, hf:pg19, ...). Documents are assigned to train / validation / test by a hash of their name
    unless the corpus defines its splits. tokenizer: bpe:<vocab> (trained on the train split and cached), a
    tokenizer.json, or a Hugging Face name. Documents shorter than min_chunks chunks of chunk_size tokens are skipped
    (and counted). Returns the summary (`.splits`, `.documents`, `.tokens`)."""
    from rpt.data.prepare import prepare as prepare_store

    return prepare_store(str(source), tokenizer, out, chunk_size=chunk_size, splits=list(splits) if splits else None,
                         max_documents=max_documents, min_chunks=min_chunks, force=force, progress=progress)


@checked
def label(store: str | Path, split: str = "train", *, kind: str = "lex", span: int | str = 16384,
          segment_len: int = 1024, k: int = 20, scorer: str | None = None, candidates: str = "bm25",
          query_fraction: float = 1.0, query: str = "pair", k1: float = 1.5, b: float = 0.75, out: str | Path | None = None,
          overwrite: bool = False, max_documents: int | None = None, shard: tuple[int, int] | None = None,
          batch_size: int = 32, gguf_file: str | None = None, device: str | None = None,
          progress: bool = False) -> Path:
    """Label a token store's split for retrieval training, as `rpt label` does; returns the label folder (or this
    shard's folder while other shards are unfinished).

    store: a store root written by `prepare`. kind: "lex" (BM25's top k candidates of each chunk) or "sem" (also the
    scoring LM's target scores, §3.2: `scorer` is one of our runs or checkpoints, an `rpt export` folder, "induction",
    "smollm2", a .gguf file, a Hugging Face folder or name). span: tokens per training sequence (the model's
    data.seq_len) or "doc" (whole documents, for evaluation); segment_len: the model's. candidates "all" scores every
    retrievable chunk (exhaustive gold for evaluation), for a `query_fraction` of the query chunks. out: default
    <store>/labels/<split>-<kind>-<span>; an existing label folder of other settings is replaced only with overwrite."""
    from rpt.data.store import StoreError, TokenStore
    from rpt.labels.pipeline import LabelSpec, label_split, store_decoder
    from rpt.labels.scorer import is_rpt_export, load_scorer, model_scorer
    from rpt.labels.store import default_label_path, parse_span
    from rpt.utils import resolve_device

    root = Path(store)
    tokenizer_file = next((p for p in (root / "tokenizer.json", root / split / "tokenizer.json") if p.exists()),
                          root / "tokenizer.json")
    try:
        token_store = TokenStore.open(root / split)
        if tokenizer_file.exists():  # labels are only as right as the tokens: no mixture of two prepare runs
            token_store.check_tokenizer_file(tokenizer_file)
    except StoreError as e:
        raise argument_error("store", store, str(e), ValueError) from None
    parsed = parse_span(str(span))
    spec = LabelSpec(kind=kind, span=parsed, chunk_size=token_store.chunk_size, segment_len=segment_len, k=k, k1=k1,
                     b=b, query=query, candidates=candidates, query_fraction=query_fraction)  # type: ignore[arg-type]
    spec.validate()
    folder = Path(out) if out is not None else default_label_path(root, split, kind, parsed)
    score = decode = None
    if kind == "sem":
        if not scorer:
            raise argument_error("scorer", problem="needed with kind sem: a run or checkpoint of a model trained on "
                                 "this store (e.g. an xl), induction, smollm2, or a Hugging Face model")
        dev = resolve_device(device)
        if is_rpt_export(scorer):  # an `rpt export` folder: the rpt model inside, its tokenizer beside it
            loaded = load(scorer, device=str(dev))
            score = model_scorer(loaded.model, scorer, loaded.tokenizer and loaded.tokenizer.identity,
                                 token_store.tokenizer_id, batch_size)
        else:
            score = load_scorer(scorer, gguf_file=gguf_file, device=dev, batch_size=batch_size,
                                store_tokenizer=token_store.tokenizer_id)
        # the chunks as text, for scorers with a tokenizer of their own (ours and the copier read token ids)
        decode = store_decoder(tokenizer_file) if getattr(score, "tokenizer", None) is not None else None
    return label_split(token_store, folder, spec, scorer=score, decode=decode, shard=shard,
                       max_documents=max_documents, progress=progress, overwrite=overwrite)


# short names of train's overrides, as `rpt train` has them as flags (anything else: a unique field name or a dotted key)
TRAIN_ARGS = {"variant": "model.variant", "vocab_size": "model.vocab_size", "seq_len": "data.seq_len",
              "steps": "train.steps", "batch_size": "train.batch_size", "grad_accum": "train.grad_accum",
              "lr": "train.lr", "seed": "train.seed", "optimizer": "train.optimizer", "precision": "train.precision",
              "val_every": "train.val_every", "backbone": "model.backbone"}


def config_key(name: str) -> str:
    """The dotted config key of an override `name`: a TRAIN_ARGS short name, a dotted key (model.d_model) or a field
    name found in exactly one section (d_model, tau_max, ...)."""
    from rpt.config import RPTConfig

    if name in TRAIN_ARGS:
        return TRAIN_ARGS[name]
    sections = {f.name: f.type for f in dataclasses.fields(RPTConfig)}
    if "." in name:
        return name
    defaults = RPTConfig()
    found = [s for s in sections if name in {f.name for f in dataclasses.fields(getattr(defaults, s))}]
    if len(found) == 1:
        return f"{found[0]}.{name}"
    if found:
        raise argument_error(name, problem=f"a field of {' and '.join(found)}: pass it dotted, e.g. "
                             f"**{{'{found[0]}.{name}': value}}")
    raise argument_error(name, problem="not a config field (overrides are fields such as d_model, lr, tau_max, or "
                         "dotted keys such as model.d_model)")


def train_config(config: str | Path | RPTConfig, store: str | Path | None = None, out: str | Path | None = None,
                 **overrides: Any) -> RPTConfig:
    """The RPTConfig `train` runs: `config` (a preset name, a YAML file, a run or checkpoint folder, the name of a
    config shipped in rpt/configs, or an RPTConfig), then store / out, then `overrides` (see `config_key`). With a
    preset, the vocabulary is the store's tokenizer's unless overridden."""
    values = {key: str(v) for key, v in (("data.store", store), ("train.out_dir", out)) if v is not None}
    values.update({config_key(k): v for k, v in overrides.items()})
    return build_train_config(config, values)


def build_train_config(config: str | Path | RPTConfig, values: dict[str, Any], name: str = "config",
                       placeholder_vocab: bool = False) -> RPTConfig:
    """The one assembly of a training config, for `train` and `rpt train`: `config` (an RPTConfig, a preset name, or
    what `rpt.config.config_file` accepts), then `values` (dotted key -> value, in order), validated once. A preset's
    placeholder vocabulary becomes the store's tokenizer's; with `placeholder_vocab` a store that does not exist yet
    leaves it (to print the config). `name`: how errors call the config argument (config, --config)."""
    import yaml

    from rpt.config import PRESETS, ConfigError, RPTConfig, config_file
    from rpt.utils import load_yaml

    if isinstance(config, RPTConfig):
        doc = config.to_dict()
    elif isinstance(config, str) and config in PRESETS:
        doc = {"preset": config}
    else:
        path = config_file(config, name)
        doc = load_yaml(path.read_text(), f"{name} {path}", ConfigError) or {}
        if not isinstance(doc, dict):
            raise ConfigError(f"{name} {path} is not a YAML mapping")
    for key, value in values.items():
        section, _, field = key.partition(".")
        doc.setdefault(section, {})[field] = value
    if doc.get("model", {}).get("backbone"):  # a retrofit: the backbone's shape (rpt/retrofit.py)
        from rpt.retrofit import apply_backbone

        apply_backbone(doc, set(values))
    if doc.get("preset") and "vocab_size" not in doc.get("model", {}):
        from rpt.training.loop import store_vocab

        store_root = doc.get("data", {}).get("store") or RPTConfig.from_preset(doc["preset"]).data.store
        try:
            doc.setdefault("model", {})["vocab_size"] = store_vocab(store_root)
        except UserError:
            if not placeholder_vocab:
                raise
    return RPTConfig.from_yaml(yaml.safe_dump(doc, sort_keys=False))


@checked
def train(config: str | Path | RPTConfig, store: str | Path | None = None, out: str | Path | None = None, *,
          labels: str | Path | None = None, resume: bool = True, device: str | None = None,
          stop_after: int | None = None, progress: bool = False, memory_check: bool = True,
          allow_changes: bool = False, **overrides: Any) -> TrainResult:
    """Train a model on the token store `store` (written by `prepare`) into the run folder `out`, as `rpt train` does;
    an interrupted run resumes where it stopped (resume=False refuses a folder with checkpoints); a resumed run with
    other training settings (lr, batch, ...) than its checkpoint's is refused unless allow_changes=True (another
    number of steps is accepted and named).

    config: a preset name ("tiny", "small", ...), a YAML config file or an RPTConfig. overrides: config fields,
    e.g. steps=50, variant="rpt-sem", lr=1e-3, d_model=64, or dotted keys via **{"model.cca_layers": [2, 3]}.
    labels: the retrieval labels of the train split (retro, rpt-lex, rpt-sem; default: the ones `rpt label` writes
    beside the store). Returns a `TrainResult` (`.step`, `.checkpoint`, `.out_dir`, `.metrics`)."""
    from rpt.labels.store import default_labels
    from rpt.training.loop import train as run_training

    cfg = train_config(config, store, out, **overrides)
    if labels is None and cfg.model.uses_retrieval:
        labels = default_labels(cfg.data.store, cfg.model.variant, cfg.data.seq_len)
        if labels is None:
            raise argument_error("labels", problem=f"variant {cfg.model.variant} needs retrieval labels, made by "
                                 f"`rpt label` with span {cfg.data.seq_len}")
    return run_training(cfg, cfg.data.store, labels, resume=resume, device=device, stop_after=stop_after,
                        progress=progress, memory_check=memory_check, allow_changes=allow_changes)
