"""Hugging Face integration (rpt/hf/): `rpt export` writes a folder that AutoModelForCausalLM and
AutoTokenizer load; greedy generate() equals `rpt.generate` token for token (retrieval at every chunk boundary through
the model's own document cache); the loss with labels equals our LM loss; save/load keeps the logits; what cannot work
is refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import rpt
from rpt import RPTConfig
from rpt.decoding import GenerateConfig, generate

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from rpt.hf import DocumentCache, RPTForCausalLM, RPTHFConfig  # noqa: E402

M = 64  # the tiny preset's chunk; segments of 128: chunk 4 (tokens 256..319) is the first to retrieve
TEXT = "\n".join(f"def f{i}(x):\n    return x * {i} + value_{i % 7}  # {'abcdefg'[i % 7] * (i % 5)}" for i in range(300))


def varied(model: torch.nn.Module) -> torch.nn.Module:
    """Move 1-D parameters (gates, norms, biases) off their initial values, so every retrieval path changes the logits
    and greedy continuations vary (as tests/test_generate.py's models)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() < 2:
                p.add_(torch.randn_like(p) * (2.0 if name.endswith("gate.w") else 0.1))
    return model.eval()


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict:
    from rpt.data.store import StoreWriter
    from rpt.data.tokenizer import Tokenizer

    tmp = tmp_path_factory.mktemp("hf_store")
    tok = Tokenizer.train_bpe([TEXT], 400, cache_dir=tmp / "tok")
    store = tmp / "store"
    tok.save(store / "tokenizer.json")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = StoreWriter(store / "test", tok.identity, M)
        w.add("doc0", tok.encode(TEXT)[:900])
        w.close()
    return {"tmp": tmp, "store": store, "tok": tok}


def make_run(store: dict, variant: str) -> Path:
    """A run folder with one checkpoint (step 7) of a tiny model whose vocabulary (512) exceeds the tokenizer's (400)."""
    from rpt import checkpoint as ckpt
    from rpt.model.registry import build_model

    run = store["tmp"] / f"run-{variant}"
    if not run.exists():
        torch.manual_seed(0)
        cfg = RPTConfig.from_preset("tiny", variant=variant, vocab_size=512, init_std=0.3)
        cfg.data.store = str(store["store"])
        model = varied(build_model(cfg.model, seed=0))
        ckpt.save(run, 7, model.state_dict(), {}, cfg, [ckpt.rng_state()], {})
    return run


@pytest.fixture(scope="module")
def exported(store) -> dict:
    """xl and rpt-sem runs exported with `rpt export`."""
    from rpt.cli import main

    out = {}
    for variant in ("xl", "rpt-sem"):
        run = make_run(store, variant)
        folder = store["tmp"] / f"hf-{variant}"
        assert main(["export", str(run), "--out", str(folder)]) == 0
        out[variant] = {"run": run, "folder": folder}
    return out


def prompt_ids(store: dict, n: int = 300) -> list[int]:
    return store["tok"].encode(TEXT)[:n]


def rpt_greedy(run: Path, ids: list[int], n_new: int):
    """`rpt.generate`'s greedy continuation of ids by the run's checkpoint, stopping at the end-of-text token (id 0)
    and never sampling an id past the tokenizer's, as the export's generation config does."""
    from rpt.api import load_model

    ours = load_model(run)
    cfg = GenerateConfig(max_new_tokens=n_new, greedy=True, vocab_size=ours.tokenizer.vocab_size, stop_at_eos=True,
                         eos_id=0)
    return generate(ours.model, [ids], cfg)[0]


# ----------------------------------------------------------------------------------------------------------------
# export and Auto loading


def test_export_folder_is_self_contained(exported, store):
    folder = exported["rpt-sem"]["folder"]
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md"} <= names
    assert not any("optimizer" in n or n.endswith(".pt") for n in names)  # no optimizer state, no pickles
    assert json.loads((folder / "config.json").read_text())["model_type"] == "rpt"
    # the config round trip is exact: the ModelConfig the checkpoint was trained with
    from rpt.checkpoint import checkpoint_config, resolve_checkpoint

    trained = checkpoint_config(resolve_checkpoint(exported["rpt-sem"]["run"])).model
    loaded = AutoConfig.from_pretrained(folder)
    assert isinstance(loaded, RPTHFConfig) and loaded.to_model_config() == trained
    assert RPTHFConfig.from_model_config(trained).to_model_config() == trained
    # the tokenizer is the run's, with its end-of-text token
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok(TEXT[:2000]).input_ids == store["tok"].encode(TEXT[:2000])
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 0
    assert tok.decode(store["tok"].encode(TEXT[:500])) == store["tok"].decode(store["tok"].encode(TEXT[:500]))


def test_model_card(exported, store):
    card = (exported["xl"]["folder"] / "README.md").read_text()
    for text in ("`xl`", "Transformer-XL", "`tiny`", "230,976", str(store["store"]), "| training steps | 7 of 200 planned |",
                 "AutoModelForCausalLM.from_pretrained", "No `rpt eval` result"):
        assert text in card, text
    # an `rpt eval` result in the run's eval/ folder appears in the card
    from rpt.cli import main

    run = exported["xl"]["run"]
    (run / "eval").mkdir(exist_ok=True)
    result = {"format_version": 1, "step": 7, "eval": {"split": "test", "source": "none", "n_neighbors": 2},
              "total": {"n_documents": 3, "n_tokens": 2700, "nll_mean": 4.25, "perplexity": 70.1054}}
    (run / "eval" / "eval-test-none-k2.json").write_text(json.dumps(result))
    folder = store["tmp"] / "hf-xl-card"
    assert main(["export", str(run), "--out", str(folder)]) == 0
    card = (folder / "README.md").read_text()
    assert "| `eval-test-none-k2.json` | 7 | test | none | 2 | 3 | 2700 | 4.2500 | 70.1054 |" in card


@pytest.mark.parametrize("variant, n_new", [("xl", 60), ("rpt-sem", 100)])
def test_auto_greedy_generate_equals_rpt_generate(exported, store, variant, n_new):
    """A 300-token prompt (chunk 4 retrieves at prefill) and n_new tokens crossing the chunk boundaries at 320 and
    384 (also a segment boundary): generate() through the document cache gives our greedy tokens, one for one."""
    folder = exported[variant]["folder"]
    model = AutoModelForCausalLM.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    assert isinstance(model, RPTForCausalLM) and not model.training
    ids = prompt_ids(store)
    got = model.generate(torch.tensor([ids]), max_new_tokens=n_new, do_sample=False)[0, len(ids):].tolist()
    assert tok.eos_token_id == 0
    ref = rpt_greedy(exported[variant]["run"], ids, n_new)
    assert got == ref.tokens
    assert len(set(got)) > 10 and max(got) < store["tok"].vocab_size < 512  # varied; never an id past the tokenizer's
    if variant == "rpt-sem":  # retrieval happened, at prefill and on generated chunks
        assert [r.chunk for r in ref.retrievals] == list(range((len(ids) + n_new - 1) // M))
        assert any(n >= 0 for r in ref.generated_retrievals for n in r.neighbor_ids)


@pytest.mark.parametrize("variant", ["retro", "rpt-lex", "memorizing", "block-recurrent", "griffin"])
def test_every_variant_generates_as_rpt_generate(variant):
    """The other variants through the same wrapper (wrapped in memory, not exported): greedy tokens equal ours."""
    from rpt.model.registry import build_model

    torch.manual_seed(0)
    model = varied(build_model(RPTConfig.from_preset("tiny", variant=variant, vocab_size=101, init_std=0.3).model, seed=0))
    hf = RPTForCausalLM.from_rpt_model(model)
    ids = torch.randint(0, 101, (1, 250), generator=torch.Generator().manual_seed(1))
    n_new = 12 if variant == "retro" else 20  # 250 + 12 crosses the chunk boundary at 256
    got = hf.generate(ids, max_new_tokens=n_new, do_sample=False, pad_token_id=0)[0, 250:].tolist()
    assert got == generate(model, ids, GenerateConfig(max_new_tokens=n_new, greedy=True))[0].tokens
    # the document cache's step and the whole-sequence forward (retro: BM25 over the whole sequence) agree
    with torch.no_grad():
        torch.testing.assert_close(hf(ids, use_cache=True).logits, hf(ids).logits, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------------------------------------
# the folder's own code: loading without rpt (trust_remote_code=True)


def test_export_carries_its_code(exported):
    """config.json's auto_map names the folder's configuration_rpt.py and modeling_rpt.py, which import nothing of rpt;
    in a process that imported rpt, the Auto classes still use rpt's own, with or without trust_remote_code."""
    import ast

    folder = exported["rpt-sem"]["folder"]
    assert json.loads((folder / "config.json").read_text())["auto_map"] == {
        "AutoConfig": "configuration_rpt.RPTHFConfig", "AutoModelForCausalLM": "modeling_rpt.RPTForCausalLM"}
    files = {p.name: p.read_text() for p in folder.glob("*.py")}
    assert {"configuration_rpt.py", "modeling_rpt.py", "rpt_model_rpt.py", "rpt_model_griffin.py", "rpt_config.py",
            "rpt_labels_bm25.py"} <= set(files)
    for name, text in files.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
                roots = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                assert all(r.split(".")[0] != "rpt" for r in roots), (name, node.lineno)
    assert "scipy" not in files["rpt_labels_bm25.py"] and "yaml" not in files["rpt_config.py"]
    for trust in (False, True):
        assert type(AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=trust)) is RPTForCausalLM


def test_the_folder_s_own_code_generates_as_rpt(exported, store, tmp_path, monkeypatch):
    """The tiny rpt-sem run's export, loaded by the folder's own code (as with trust_remote_code=True, rpt's modules
    out of reach): greedy generate() retrieves and gives `rpt.generate`'s tokens."""
    from hf_helpers import load_copy

    folder = exported["rpt-sem"]["folder"]
    code = load_copy(folder, tmp_path, monkeypatch)
    model = code.RPTForCausalLM.from_pretrained(folder)
    assert type(model.model).__module__.endswith(".rpt_model_rpt") and not model.training
    ids = prompt_ids(store)
    got = model.generate(torch.tensor([ids]), max_new_tokens=90, do_sample=False)[0, len(ids):].tolist()
    ref = rpt_greedy(exported["rpt-sem"]["run"], ids, 90)
    assert got == ref.tokens and any(n >= 0 for r in ref.generated_retrievals for n in r.neighbor_ids)


@pytest.mark.parametrize("variant", ["retro", "memorizing", "block-recurrent", "griffin"])
def test_the_saved_code_serves_every_variant(variant, tmp_path, monkeypatch):
    """save_pretrained writes the code too; the copy builds every variant (retro's BM25 with NumPy alone) and
    generates rpt's tokens."""
    from hf_helpers import load_copy

    from rpt.model.registry import build_model

    torch.manual_seed(0)
    model = varied(build_model(RPTConfig.from_preset("tiny", variant=variant, vocab_size=101, init_std=0.3).model, seed=0))
    RPTForCausalLM.from_rpt_model(model).save_pretrained(tmp_path / "saved")
    code = load_copy(tmp_path / "saved", tmp_path / "code", monkeypatch)
    copy = code.RPTForCausalLM.from_pretrained(tmp_path / "saved")
    ids = torch.randint(0, 101, (1, 250), generator=torch.Generator().manual_seed(1))
    n_new = 12 if variant == "retro" else 8  # 250 + 12 crosses the chunk boundary at 256
    got = copy.generate(ids, max_new_tokens=n_new, do_sample=False, pad_token_id=0)[0, 250:].tolist()
    assert got == generate(model, ids, GenerateConfig(max_new_tokens=n_new, greedy=True))[0].tokens
    if variant == "retro":  # BM25 over the whole sequence (no cache): rpt's own logits
        with torch.no_grad():
            torch.testing.assert_close(copy(ids).logits, RPTForCausalLM.from_rpt_model(model)(ids).logits)


def test_the_code_may_import_only_torch_transformers_and_numpy():
    """The check every export runs on its code: the standard library, torch, numpy, transformers and the folder's own
    files; an optional package only after `require` in the same function (as rpt imports Faiss)."""
    from rpt.hf.bundle import check_imports

    check_imports({"a.py": "import torch\nfrom .b import x\n",
                   "b.py": "import numpy as np\nx = 1\ndef f():\n    require('faiss')\n    import faiss\n"})
    for bad in ("import scipy.sparse\n", "from rpt.config import ModelConfig\n", "from .missing import x\n",
                "def f():\n    import faiss\n"):
        with pytest.raises(ValueError):
            check_imports({"a.py": bad})


@pytest.mark.slow
def test_export_loads_and_generates_without_rpt(exported, store, tmp_path):
    """In a fresh Python where `import rpt` fails: AutoModelForCausalLM.from_pretrained(folder,
    trust_remote_code=True) loads the tiny rpt-sem run's export, and greedy generate() gives `rpt.generate`'s tokens;
    AutoTokenizer encodes as the run's tokenizer. (A fresh interpreter loading torch and transformers: ~15 s.)"""
    from hf_helpers import generate_without_rpt

    ids = prompt_ids(store)
    out = generate_without_rpt(exported["rpt-sem"]["folder"], ids, 90, tmp_path, text=TEXT[:500])
    assert out["module"].startswith("transformers_modules.") and out["rpt"] == []
    assert out["tokens"] == rpt_greedy(exported["rpt-sem"]["run"], ids, 90).tokens
    assert out["encoded"] == store["tok"].encode(TEXT[:500])


def test_the_record_names_the_store_s_corpus_and_tokenizer(store, tmp_path):
    """config.json's record of the run (`rpt`) takes the corpus and tokenizer from the prepare.json of the store the
    run trained on, where it holds the run's tokenizer; the run's config names neither here (the preset's)."""
    import shutil

    from rpt import checkpoint as ckpt
    from rpt.cli import main
    from rpt.hf.export import prepared_data
    from rpt.model.registry import build_model

    prepared = tmp_path / "prepared"
    shutil.copytree(store["store"], prepared)
    tok = store["tok"].identity
    (prepared / "prepare.json").write_text(json.dumps({"corpus": {"spec": "docs.jsonl"},
                                                       "tokenizer": {**tok, "name": "bpe:400/0123abcd"}}))
    cfg = RPTConfig.from_preset("tiny", variant="xl", vocab_size=512)
    cfg.data.store = str(prepared)
    assert (cfg.data.corpus, cfg.data.tokenizer) == ("stdlib", "bpe:2048")  # the preset's, not the store's
    ckpt.save(tmp_path / "run", 1, build_model(cfg.model, seed=0).state_dict(), {}, cfg, [ckpt.rng_state()], {})
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    record = json.loads((tmp_path / "hf" / "config.json").read_text())["rpt"]
    assert (record["data"]["corpus"], record["data"]["tokenizer"]) == ("docs.jsonl", "bpe:400/0123abcd")
    assert record["tokenizer"] == {**tok, "name": "bpe:400/0123abcd"}
    assert "corpus `docs.jsonl`" in (tmp_path / "hf" / "README.md").read_text()
    # another tokenizer's store (rebuilt since), no store, no prepare.json: the run's config as it is
    assert prepared_data(str(prepared), "another hash") == {}
    assert prepared_data(str(tmp_path / "nowhere"), tok["hash"]) == {}
    assert prepared_data(str(store["store"]), tok["hash"]) == {}
    assert prepared_data(str(prepared / "test"), tok["hash"]) == {"corpus": "docs.jsonl", "tokenizer": "bpe:400/0123abcd"}


def test_batch_sampling_and_uncached_generate():
    """Two prompts of one length (one holding the pad id, which is a real token here) in one batch give each prompt's
    own greedy tokens; use_cache=False (the whole forward at every step) gives them too; sampling runs with
    num_return_sequences (each sequence its own document cache row)."""
    from rpt.model.registry import build_model

    torch.manual_seed(0)
    model = varied(build_model(RPTConfig.from_preset("tiny", variant="rpt-sem", vocab_size=101, init_std=0.3).model, seed=0))
    hf = RPTForCausalLM.from_rpt_model(model)
    ids = torch.randint(1, 101, (2, 270), generator=torch.Generator().manual_seed(1))
    ids[0, 5] = 0
    ref = [g.tokens for g in generate(model, ids, GenerateConfig(max_new_tokens=20, greedy=True))]
    assert hf.generate(ids, max_new_tokens=20, do_sample=False, pad_token_id=0)[:, 270:].tolist() == ref
    uncached = hf.generate(ids[:1], max_new_tokens=20, do_sample=False, use_cache=False, pad_token_id=0)
    assert uncached[0, 270:].tolist() == ref[0]
    sampled = hf.generate(ids[:1], max_new_tokens=10, do_sample=True, top_k=5, num_return_sequences=3, pad_token_id=0)
    assert sampled.shape == (3, 280) and torch.equal(sampled[:, :270], ids[:1].expand(3, -1))
    # generation continues from a returned cache: the text so far plus more tokens, only the new ones are stepped
    first = hf.generate(ids[1:], max_new_tokens=8, do_sample=False, return_dict_in_generate=True, pad_token_id=0)
    cache = first.cache if hasattr(first, "cache") else first.past_key_values
    assert isinstance(cache, DocumentCache) and cache.pos == 270 + 7
    seq = torch.cat([first.sequences, ids.new_tensor([ref[1][8:12]])], 1)
    kw = {"cache" if hasattr(first, "cache") else "past_key_values": cache}
    assert hf.generate(seq, max_new_tokens=8, do_sample=False, pad_token_id=0, **kw)[0, 270:].tolist() == ref[1]


def test_loss_with_labels_equals_lm_loss(exported):
    from rpt.training.losses import lm_loss

    model = AutoModelForCausalLM.from_pretrained(exported["rpt-sem"]["folder"])
    ids = torch.randint(0, 400, (2, 200), generator=torch.Generator().manual_seed(2))
    out = model(ids, labels=ids)
    ref = lm_loss(model.model(ids).logits, ids)
    torch.testing.assert_close(out.loss, ref.mean(), rtol=1e-5, atol=1e-6)
    assert out.loss.requires_grad  # the whole-sequence forward: trainable
    # -100 labels are ignored: the mean over the remaining targets
    labels = ids.clone()
    labels[:, 150:] = -100
    masked = lm_loss(model.model(ids).logits, ids, loss_mask=labels != -100)
    torch.testing.assert_close(model(ids, labels=labels).loss, masked.mean(), rtol=1e-5, atol=1e-6)
    # the cached path computes the same logits (and loss) as the whole-sequence forward
    cached = model(ids, labels=ids, use_cache=True)
    assert isinstance(cached.cache if hasattr(cached, "cache") else cached.past_key_values, DocumentCache)
    torch.testing.assert_close(cached.logits, out.logits, rtol=1e-4, atol=1e-4)


def test_save_load_round_trip_gives_identical_logits(exported, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(exported["rpt-sem"]["folder"])
    model.save_pretrained(tmp_path / "again")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "again")
    ids = torch.randint(0, 400, (1, 300), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
    assert again.config.to_model_config() == model.config.to_model_config()
    a, b = model.state_dict(), again.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_refusals_are_one_line(exported):
    model = AutoModelForCausalLM.from_pretrained(exported["xl"]["folder"])
    ids = torch.randint(0, 400, (2, 20), generator=torch.Generator().manual_seed(4))
    padded = torch.ones_like(ids)
    padded[1, :3] = 0  # left padding of a shorter prompt
    cases = [
        ("num_beams", lambda: model.generate(ids, max_new_tokens=3, num_beams=2)),
        ("attention_mask", lambda: model.generate(ids, attention_mask=padded, max_new_tokens=3)),
        ("attention_mask", lambda: model(ids, attention_mask=padded)),
        ("inputs_embeds", lambda: model(inputs_embeds=torch.zeros(1, 3, 64))),
    ]
    for name, call in cases:
        with pytest.raises(ValueError) as e:
            call()
        assert name in str(e.value) and "\n" not in str(e.value)
    # an all-ones mask is fine
    assert model(ids, attention_mask=torch.ones_like(ids)).logits.shape == (2, 20, 512)


def test_export_errors_are_one_line(exported, tmp_path, capsys):
    from rpt.cli import main

    cases = [
        (["export", str(tmp_path / "nope"), "--out", str(tmp_path / "o1")], "RUN_OR_CHECKPOINT"),
        (["export", str(tmp_path), "--out", str(tmp_path / "o2")], "RUN_OR_CHECKPOINT"),
        (["export", str(exported["xl"]["run"]), "--out", str(exported["rpt-sem"]["folder"])], "--out"),
    ]
    (tmp_path / "afile").write_text("x")
    cases.append((["export", str(exported["xl"]["run"]), "--out", str(tmp_path / "afile")], "--out"))
    for argv, name in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert name in err and len(err.splitlines()) == 1, err
    assert (exported["rpt-sem"]["folder"] / "config.json").is_file()  # a refused export leaves --out as it was


@pytest.mark.slow
def test_import_rpt_registers_without_loading_transformers():
    """`import rpt` stays light; the Auto classes know "rpt" once transformers loads, in whichever order. A fresh
    interpreter loading transformers (8 s on 2 cores); by default tests/test_api.py checks in a fresh interpreter that
    `import rpt` loads neither torch nor transformers, and this file's tests load exported models through the Auto
    classes in a process that imported rpt first."""
    code = ("import sys, rpt; assert 'transformers' not in sys.modules and 'torch' not in sys.modules; "
            "from transformers import AutoConfig; print(type(AutoConfig.for_model('rpt')).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "RPTHFConfig"
    assert rpt.hf is not None
