"""`rpt eval` end to end on a tiny store with tiny checkpoints written by rpt.checkpoint, and its answers to bad
input (exit code 2, one clear line)."""

import json
import math

import pytest
from eval_helpers import M, make_model, make_root, save_checkpoint, tiny_config, word_tokenizer, write_doc_labels

from rpt.cli import main

LENGTHS = [26 * M + 3, 18 * M, 30 * M + 5]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval")
    tok = word_tokenizer()
    root = make_root(tmp / "store", LENGTHS, tokenizer=tok)
    labels = write_doc_labels(root / "labels" / "test-sem-doc", LENGTHS, tok.identity)
    runs = {}
    for variant in ("rpt-sem", "xl", "retro"):
        runs[variant] = save_checkpoint(tmp / f"run-{variant}", make_model(variant), tiny_config(variant), tokenizer=tok)
    return {"tmp": tmp, "root": root, "labels": labels, "runs": runs, "tok": tok}


def run(*args):
    return main(["eval", *map(str, args), "--no-progress"])


def test_end_to_end_with_metrics_plots_and_baseline(setup, tmp_path, capsys):
    s = setup
    xl_out = tmp_path / "xl.json"
    assert run("--checkpoint", s["runs"]["xl"], "--store", s["root"], "--per-chunk", "--out", xl_out) == 0
    capsys.readouterr()
    out = tmp_path / "sem.json"
    assert run("--checkpoint", s["runs"]["rpt-sem"], "--store", s["root"], "--split", "test", "--neighbors", 3,
               "--labels", s["labels"], "--metrics", "--memory", "faiss", "--baseline", xl_out, "--plots",
               tmp_path / "plots", "--compare", xl_out, "--out", out) == 0
    printed = capsys.readouterr().out
    assert "rpt-sem  source model  K 3  memory faiss" in printed and "perplexity" in printed
    assert "precision@2" in printed and "bm25" in printed and "gold" in printed
    assert "on scored gold" in printed  # with labels: the perplexity where the gold was scored, too
    r = json.loads(out.read_text())
    assert r["format_version"] == 1 and r["step"] == 7 and r["config"]["model"]["variant"] == "rpt-sem"
    assert r["eval"]["source"] == "model" and r["eval"]["n_neighbors"] == 3 and r["eval"]["tokenizer_checked"]
    docs, t = r["documents"], r["total"]
    assert [d["index"] for d in docs] == [0, 1, 2] and [d["n_tokens"] for d in docs] == LENGTHS
    assert t["n_targets"] == sum(n - 1 for n in LENGTHS) == sum(d["n_targets"] for d in docs)
    assert t["perplexity"] == pytest.approx(math.exp(sum(d["nll_sum"] for d in docs) / t["n_targets"]))
    assert t["peak_memory_bytes"] == max(d["memory_bytes"] for d in docs) > 0
    assert 0 < t["scored"]["n_targets"] == sum(d["scored"]["n_targets"] for d in docs) < t["n_targets"]
    env = r["environment"]  # what a rerun must match: machine, threads, versions
    assert env["threads"] >= 1 and env["rpt"] and env["torch"] and env["python"] and env["platform"] and env["cpu_count"]
    (trained,) = r["train_environments"]  # and where the checkpoint's updates ran
    assert trained["from_step"] == 0 and trained["threads"] >= 1 and trained["cpu"] and trained["torch"] == env["torch"]
    assert all(len(d["chunks"]["neighbors"][0]) == 3 for d in docs)  # --baseline turned per-chunk data on
    for name in ("model", "bm25"):
        m = r["retrieval"][name]
        assert m["n_queries"] > 0 and all(0 <= m[k] <= 1 for k in ("precision@2", "recall@10", "ndcg@20"))
        assert r["overlap"][name]["n"] > 0
    sg = r["subgroups"]
    assert sg["gold"]["n"] > 0 and sg["no_gold"]["n"] > 0 and sg["all"]["n"] == sg["gold"]["n"] + sg["no_gold"]["n"]
    for png in ("token_overlap.png", "subgroups.png", "supervision_quality.png"):
        assert (tmp_path / "plots" / png).read_bytes()[:4] == b"\x89PNG"
    xl = json.loads(xl_out.read_text())
    assert xl["eval"]["source"] == "none" and xl["eval"]["memory"] is None and xl["total"]["peak_memory_bytes"] == 0


def test_sources_and_run_folder(setup, tmp_path, capsys):
    s = setup
    res = {}
    for name, ckpt, extra in [("retro", s["runs"]["retro"], []),
                              ("oracle", s["runs"]["rpt-sem"].parent.parent, ["--source", "oracle", "--labels",
                                                                                      s["labels"]]),
                              ("none", s["runs"]["rpt-sem"], ["--source", "none", "--memory", "torch"])]:
        out = tmp_path / f"{name}.json"
        assert run("--checkpoint", ckpt, "--store", s["root"], "--max-documents", 2, "--out", out, *extra) == 0
        res[name] = json.loads(out.read_text())
    assert res["retro"]["eval"]["source"] == "bm25" and res["retro"]["total"]["n_documents"] == 2
    assert res["oracle"]["checkpoint"] == str(s["runs"]["rpt-sem"])  # the run folder resolved to its newest step
    assert len({r["total"]["perplexity"] for r in res.values()}) == 3


def test_default_output_path(setup, capsys):
    s = setup
    assert run("--checkpoint", s["runs"]["xl"], "--store", s["root"] / "test", "--max-documents", 1) == 0
    assert (s["runs"]["xl"] / "eval-test-none-k2.json").is_file()


@pytest.mark.parametrize("case, message", [
    ("missing-checkpoint", "no checkpoint at"),
    ("missing-split", "no token store at"),
    ("other-tokenizer", "does not match the token store"),
    ("labels-span", "span"),
    ("labels-tokenizer", "tokenizer"),
    ("oracle-without-labels", "needs --labels"),
    ("metrics-without-labels", "needs --labels"),
    ("xl-bm25", "xl has no chunked cross-attention"),
    ("retro-model", "retro has no retriever"),
    ("neighbors-0", "--neighbors must be >= 1"),
    ("missing-baseline", "no such result file"),
    ("dpr-without-retriever", "--source dpr: needs --retriever"),
    ("xl-dpr", "xl has no chunked cross-attention"),
    ("missing-retriever", "nowhere-dpr"),
])
def test_bad_input_exits_2_with_a_clear_message(setup, tmp_path, capsys, case, message):
    s = setup
    sem, root = s["runs"]["rpt-sem"], s["root"]
    base = ["--store", root, "--out", tmp_path / "r.json"]
    if case == "missing-checkpoint":
        args = ["--checkpoint", tmp_path / "nowhere", *base]
    elif case == "missing-split":
        args = ["--checkpoint", sem, "--store", root, "--split", "validation"]
    elif case == "other-tokenizer":
        other = save_checkpoint(tmp_path / "other", make_model("rpt-sem"), tiny_config(), tokenizer=word_tokenizer(tag="x"))
        args = ["--checkpoint", other, *base]
    elif case == "labels-span":
        bad = write_doc_labels(tmp_path / "labels16", LENGTHS, s["tok"].identity, span="16")
        args = ["--checkpoint", sem, *base, "--labels", bad, "--metrics"]
    elif case == "labels-tokenizer":
        bad = write_doc_labels(tmp_path / "labels-x", LENGTHS, word_tokenizer(tag="x").identity)
        args = ["--checkpoint", sem, *base, "--labels", bad, "--source", "oracle"]
    elif case == "oracle-without-labels":
        args = ["--checkpoint", sem, *base, "--source", "oracle"]
    elif case == "metrics-without-labels":
        args = ["--checkpoint", sem, *base, "--metrics"]
    elif case == "xl-bm25":
        args = ["--checkpoint", s["runs"]["xl"], *base, "--source", "bm25"]
    elif case == "retro-model":
        args = ["--checkpoint", s["runs"]["retro"], *base, "--source", "model"]
    elif case == "neighbors-0":
        args = ["--checkpoint", sem, *base, "--neighbors", 0]
    elif case == "dpr-without-retriever":
        args = ["--checkpoint", s["runs"]["retro"], *base, "--source", "dpr"]
    elif case == "xl-dpr":
        args = ["--checkpoint", s["runs"]["xl"], *base, "--source", "dpr", "--retriever", tmp_path]
    elif case == "missing-retriever":
        args = ["--checkpoint", sem, *base, "--source", "dpr", "--retriever", tmp_path / "nowhere-dpr"]
    else:
        args = ["--checkpoint", sem, *base, "--baseline", tmp_path / "absent.json"]
    assert run(*args) == 2
    err = capsys.readouterr().err
    assert err.startswith("rpt eval: error:") and message in err and "Traceback" not in err
    assert not (tmp_path / "r.json").exists()


def test_checkpoint_tokenizer_lookup(setup, tmp_path, capsys):
    import rpt.eval.perplexity as P

    s = setup
    bare = save_checkpoint(tmp_path / "bare", make_model("xl"), tiny_config("xl"))  # no tokenizer anywhere
    assert P.checkpoint_tokenizer(bare) is None
    assert run("--checkpoint", bare, "--store", s["root"], "--max-documents", 1, "--out", tmp_path / "r.json") == 0
    assert "only chunk size and vocabulary size were checked" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["eval"]["tokenizer_checked"] is False
    state = json.loads((bare / "state.json").read_text())
    (bare / "state.json").write_text(json.dumps({**state, "tokenizer": word_tokenizer(tag="x").identity}))
    assert run("--checkpoint", bare, "--store", s["root"], "--out", tmp_path / "r2.json") == 2
    assert "does not match the token store" in capsys.readouterr().err
    assert P.checkpoint_tokenizer(s["runs"]["xl"])["hash"] == s["tok"].hash


def test_memory_tokens_resizes_the_memorizing_memory(setup, tmp_path, capsys):
    """--memory-tokens: one memorizing checkpoint evaluated with a memory that binds (one segment of tokens) differs
    from the full memory and equals it exactly when the size does not bind. The result keeps the trained size in its
    config and the size used in eval.memory_tokens; the default output name says it (no overwrite of the plain
    result); `python -m lab compare` makes each size its own row, labelled by it. Other variants refuse it with one line."""
    from lab.compare import group_settings, load_results, paper_row
    from rpt.model.registry import build_model

    s = setup
    cfg = tiny_config("memorizing")
    ckpt = save_checkpoint(tmp_path / "mem", build_model(cfg.model, seed=0).eval(), cfg, tokenizer=s["tok"])
    res = {}
    for n in (None, 16, 10_000, 32768):
        out = tmp_path / "results" / f"mem-{n}.json"
        extra = [] if n is None else ["--memory-tokens", n]
        assert run("--checkpoint", ckpt, "--store", s["root"], "--max-documents", 1, "--memory", "torch", "--out", out,
                   *extra) == 0
        res[n] = json.loads(out.read_text())
    assert {r["config"]["model"]["memorizing"]["tokens"] for r in res.values()} == {65536}  # what it was trained with
    assert res[None]["eval"]["memory_tokens"] is None and res[16]["eval"]["memory_tokens"] == 16
    assert "memory torch of 16 tokens" in capsys.readouterr().out  # the summary names the size used
    assert res[10_000]["total"]["nll_sum"] == res[None]["total"]["nll_sum"]  # LENGTHS[0] < 10,000: never binds
    assert res[16]["total"]["nll_sum"] != res[None]["total"]["nll_sum"]

    rows = {st.label: st for st in group_settings(load_results([tmp_path / "results"]))}
    assert set(rows) == {f"memorizing (memory_tokens={n} at eval)" for n in (65536, 16, 10000, 32768)}
    assert paper_row(rows["memorizing (memory_tokens=32768 at eval)"]) == "Memorizing Transformer (32K)"
    assert paper_row(rows["memorizing (memory_tokens=65536 at eval)"]) == "Memorizing Transformer (65K)"

    assert run("--checkpoint", ckpt, "--store", s["root"], "--max-documents", 1, "--memory-tokens", 16) == 0
    assert (ckpt / "eval-test-none-k2-mem16.json").is_file() and not (ckpt / "eval-test-none-k2.json").exists()
    capsys.readouterr()
    assert run("--checkpoint", s["runs"]["rpt-sem"], "--store", s["root"], "--memory-tokens", 16,
               "--out", tmp_path / "x.json") == 2
    assert "memory_tokens is for the memorizing variant" in capsys.readouterr().err
    assert run("--checkpoint", ckpt, "--store", s["root"], "--memory-tokens", 0, "--out", tmp_path / "x.json") == 2
    assert "--memory-tokens must be >= 1, not 0" in capsys.readouterr().err


def test_a_configs_eval_section_sets_every_evaluation_setting_and_flags_win(setup, tmp_path):
    """EvalConfig carries what an evaluation is (labels, metrics, per-chunk data, precision, ...): `rpt eval --config`
    reads them from its eval section, a flag given wins, and the Python entry point takes the same object."""
    from rpt.config import EvalConfig
    from rpt.eval.perplexity import run_eval
    from rpt.utils import ArgumentError

    s = setup
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(f"data:\n  store: {s['root']}\neval:\n  n_neighbors: 3\n  labels: {s['labels']}\n"
                   "  with_metrics: true\n  per_chunk: true\n  max_documents: 2\n")
    out = tmp_path / "r.json"
    assert run("--checkpoint", s["runs"]["rpt-sem"], "--config", cfg, "--neighbors", 1, "--out", out) == 0
    r = json.loads(out.read_text())
    assert r["eval"]["n_neighbors"] == 1 and r["eval"]["labels"] and r["eval"]["per_chunk"]  # the flag won for K
    assert "retrieval" in r and len(r["documents"]) == 2
    same = run_eval(s["runs"]["rpt-sem"], s["root"], EvalConfig(n_neighbors=1, labels=str(s["labels"]),
                                                                 with_metrics=True, per_chunk=True, max_documents=2),
                    progress=False)
    assert same["total"]["nll_sum"] == pytest.approx(r["total"]["nll_sum"])
    with pytest.raises(ArgumentError, match="settings"):
        run_eval(s["runs"]["rpt-sem"], s["root"], {"n_neighbors": 1})
