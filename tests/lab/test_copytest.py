"""The copy test: the machinery always, the measurement itself under -m slow (minutes on 2 cores)."""

import json
from pathlib import Path

import numpy as np
import pytest

from lab.cli import main
from lab.copytest import CopyTestSettings, far_distance, run_copytest


@pytest.mark.slow  # 11 s; tests/lab/test_demo.py runs the copy test end to end at a smaller size
def test_copytest_runs_end_to_end_and_reports_every_check(tmp_path):
    s = CopyTestSettings(out=tmp_path / "ct", steps=3, warmup=1, batch_size=1, eval_docs=1, scorer_k=2, progress=False,
                         variants=("retro", "rpt-lex", "rpt-sem"), near_steps=4)
    summary = run_copytest(s)
    runs = {(r["setting"], r["variant"]) for r in summary["runs"]}
    assert runs == {("near", "xl"), ("far", "xl"), ("far", "retro"), ("far", "rpt-lex"), ("far", "rpt-sem")}
    far_lex = next(r for r in summary["runs"] if r["variant"] == "rpt-lex")  # its own retriever, and BM25's beside it
    assert {"model", "bm25", "random", "none"} <= set(far_lex["eval"]) and "hit@1" in far_lex["eval"]["model"]
    assert "rpt-lex's retriever ranks the source first for most far repeats" in summary["verdict"]["checks"]
    far_sem = next(r for r in summary["runs"] if r["variant"] == "rpt-sem")
    assert set(far_sem["eval"]) == {"model", "none", "random", "bm25", "oracle"} and "hit@1" in far_sem["eval"]["model"]
    assert all(set(e) >= {"fresh", "repeat-head", "repeat-tail", "all", "advantage"} for e in far_sem["eval"].values())
    assert set(summary["verdict"]["checks"]) >= {"xl copies near repeats", "retro far gain comes from its neighbours",
                                                 "rpt-sem's retriever ranks the source first for most far repeats",
                                                 "retro's own neighbours beat random chunks of the document"}
    assert {"retro far ppl gain", "rpt-sem far ppl gain, oracle", "rpt-sem far ppl gain, random chunks",
            "rpt-sem far gain over random chunks"} <= set(summary["verdict"])
    far_cmd, near_cmd = (next(c for c in summary["commands"] if f"synthetic:{k}" in c) for k in ("copy-far", "copy-near"))
    assert "p=1" in far_cmd and "p=" not in near_cmd  # far repeats every passage from the 7th on; near keeps 0.5
    assert "docs=4&" in near_cmd and "docs=3&" in far_cmd  # updates x batch: the near control's 4 see fresh ones too
    # rpt-sem's labels and the oracle are scored by the (first) near control, and say so in their folder name
    sem = [c for c in summary["commands"] if "--kind sem" in c]
    assert len(sem) == 2 and all("--scorer " + str(tmp_path / "ct" / "runs" / "near-xl-seed0-4steps") in c for c in sem)
    # runs of other lengths never mix; rpt-sem's names its scorer's updates (another scorer, other labels)
    assert (tmp_path / "ct" / "runs" / "far-rpt-sem-seed0-3steps-scorer4steps").is_dir()
    assert (tmp_path / "ct" / "runs" / "far-retro-seed0-3steps").is_dir()
    assert not summary["verdict"]["passed"]  # 3 updates teach nothing: the test can fail
    assert json.loads(Path(summary["path"]).read_text())["verdict"]["passed"] is False
    assert Path(summary["path"]).name == "copytest-3steps-near4steps.json"


def test_far_repeats_lie_beyond_xl_reach_for_any_segment_and_span():
    # tiny: 4 layers; reach (4 + 1) x segment tokens; a repeat d passages back copies a token d x 128 - 1 back
    assert far_distance(CopyTestSettings()) == (6, 12)  # 640 tokens: 768-1,536 back, inside 2,048
    assert far_distance(CopyTestSettings(seq_len=1024, segment_len=64)) == (3, 6)  # 320 tokens: 384-768 back
    with pytest.raises(ValueError, match="longer --seq-len"):
        far_distance(CopyTestSettings(seq_len=768, segment_len=128))


def test_a_far_or_near_corpus_other_than_the_default_gets_its_own_store_and_runs():
    from lab.copytest import _far_tag, _near_tag, _spec, summary_path

    assert _far_tag(CopyTestSettings()) == "" and _far_tag(CopyTestSettings(far_p=0.5)) == "-p0.5"
    near = CopyTestSettings(near_p=1.0)
    assert _near_tag(CopyTestSettings()) == "" and _near_tag(near) == "-p1"
    assert "&p=1" in _spec("copy-near", near) and "&p=" not in _spec("copy-near", CopyTestSettings())
    assert summary_path(near).name == "copytest-nearp1.json"
    # runs of other lengths write their own summaries, as they train their own runs
    assert summary_path(CopyTestSettings(steps=100, near_steps=400)).name == "copytest-100steps-near400steps.json"
    assert summary_path(CopyTestSettings(steps=200, near_steps=200)).name == "copytest-200steps.json"


def test_copytest_cli_rejects_bad_input_in_one_line(tmp_path, capsys):
    for argv, flag in [(["--variants", "xl"], "--variants"), (["--far-p", "1.5"], "--far-p"),
                       (["--seq-len", "1000"], "--seq-len"), (["--segment-len", "96"], "--segment-len"),
                       (["--seq-len", "768"], "--seq-len"), (["--min-lr-ratio", "0"], "--min-lr-ratio"),
                       (["--scorer-k", "0"], "--scorer-k"), (["--passage", "160-96"], "--passage"),
                       (["--passage", "a-b"], "--passage"), (["--passage", "0"], "--passage"),
                       (["--passage", "80"], "--passage"),
                       (["--tokenizer", "bpe:512"], "--tokenizer"), (["--vocab", "1"], "--vocab"),
                       (["--near-lr", "-1"], "--near-lr"), (["--lr", "0"], "--lr"), (["--near-p", "-0.1"], "--near-p"),
                       (["--scorer", str(tmp_path / "no-such-model")], "--scorer")]:
        assert main(["copytest", "--out", str(tmp_path), *argv]) == 2
        err = capsys.readouterr().err
        assert flag in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert not (tmp_path / "stores").exists()  # every refusal comes before any corpus is made


@pytest.mark.slow
def test_copy_test_passes(tmp_path):
    """The documented CPU setting at the demo's size (docs/results/copy-test.md): xl copies near repeats; retro and
    rpt-sem copy far ones through their neighbours on each of three paired seeds, rpt-sem's own retriever finding the
    source; xl cannot. The near control trains 1,000 updates: at 400 it reaches a copy advantage of 1.1 nats, at 600
    1.4, at 1,000 2.2, above the check's 2.0 (`python -m lab copytest --near-steps N --variants ""`, one seed)."""
    s = CopyTestSettings(out=tmp_path / "ct", seq_len=1024, segment_len=64, batch_size=2, eval_docs=6, min_lr_ratio=1.0,
                         scorer_k=2, steps=150, near_steps=1000, variants=("retro", "rpt-sem"), seeds=(0, 1, 2),
                         near_every_seed=False, progress=False)
    summary = run_copytest(s)
    assert summary["verdict"]["passed"], summary["verdict"]


@pytest.mark.slow
def test_copy_test_passes_with_repeats_at_any_offset_to_the_chunk_grid(tmp_path):
    """The unaligned copy test of docs/results/copy-test.md: passages of 96-160 words, so copies sit at every offset to
    the chunk grid; rpt-sem's labels from a copying LM. The near control needs 4,000 updates: xl learns to copy by
    content only after a plateau (+1.8 nats at 3,000, +3.4 at 4,000). About 1.5 hours on 2 cores."""
    s = CopyTestSettings(out=tmp_path / "ct", seq_len=2048, segment_len=64, batch_size=2, eval_docs=8, min_lr_ratio=1.0,
                         scorer_k=2, steps=200, near_steps=4000, near_lr=3e-3, near_p=1.0, passage=96, passage_max=160,
                         variants=("retro", "rpt-sem"), seeds=(0, 1, 2), near_every_seed=False, scorer="induction",
                         threads=1, progress=False)
    summary = run_copytest(s)
    assert summary["verdict"]["passed"], summary["verdict"]


def test_seed_lists_are_checked_by_demo_and_copytest(tmp_path, capsys):
    for verb in ("copytest", "demo"):
        for bad in ("a", "1,1", ","):
            assert main([verb, "--out", str(tmp_path), "--seeds", bad]) == 2
            assert "--seeds" in capsys.readouterr().err


@pytest.mark.slow  # seconds to tens of seconds: -m slow runs it
def test_the_unaligned_copy_test_sizes_its_corpus_from_the_passage_range_and_scores_unaligned_hits(tmp_path):
    s = CopyTestSettings(out=tmp_path / "ct", steps=2, near_steps=2, warmup=1, batch_size=2, eval_docs=2, progress=False,
                         variants=("retro", "rpt-sem"), seq_len=1024, segment_len=64, passage=96, passage_max=160,
                         scorer="induction")
    # reach (4 + 1) x 64 = 320 tokens: 4 passages of at least 96 words lie beyond it; 1024 // 160 = 6 passages
    assert far_distance(s) == (4, 5)
    summary = run_copytest(s)
    far_cmd = next(c for c in summary["commands"] if "synthetic:copy-far" in c)
    assert "passage=96-160" in far_cmd and "passages=6" in far_cmd
    assert any("passage96-160" in p.name for p in (tmp_path / "ct" / "stores").iterdir())  # never mixed with aligned
    near = next(r for r in summary["runs"] if r["setting"] == "near")
    assert "segment_len: 256" in (Path(near["run"]) / "config.yaml").read_text()  # a whole passage fits its window
    retro = next(r for r in summary["runs"] if r["variant"] == "retro")
    assert "hit@1" in retro["eval"]["bm25"] and 0 <= retro["eval"]["bm25"]["hit@1"] <= 1
    # rpt-sem's labels and the oracle come from the induction scorer, which copies by content: among BM25's
    # candidates it picks one holding the chunk to predict at least as often as BM25's own first choice
    sem = next(r for r in summary["runs"] if r["variant"] == "rpt-sem")
    assert sem["run"].endswith("-scorer=induction")
    assert any(c.endswith("by-induction") and "--scorer induction" in c for c in summary["commands"])
    assert sem["eval"]["oracle"]["hit@1"] >= max(0.5, sem["eval"]["bm25"]["hit@1"])
    assert summary["path"].endswith("copytest-1024x64-passage96-160-2steps-scorer=induction.json")


@pytest.mark.slow  # seconds to tens of seconds: -m slow runs it
def test_the_text_copy_test_trains_one_bpe_for_both_corpora_and_sizes_them_in_tokens(tmp_path):
    from lab.copytest import passage_tokens, text_tokenizer
    from rpt.training.data import open_store

    s = CopyTestSettings(out=tmp_path / "ct", steps=2, near_steps=2, warmup=1, batch_size=2, eval_docs=2, progress=False,
                         variants=("retro",), seq_len=2048, segment_len=64, passage=48, passage_max=72, words="text")
    path, per_word = text_tokenizer(s)
    assert path.is_file() and 1.5 < per_word < 3.0  # bpe:2048 on 1,024 pseudo-words of 3-8 letters: about two
    s.tokens_per_word = per_word
    shortest, longest = passage_tokens(s)
    assert shortest <= 48 * per_word <= 72 * per_word <= longest
    summary = run_copytest(s)
    near_store, far_store = (next((tmp_path / "ct" / "stores").glob(f"{k}-*")) for k in ("copy-near", "copy-far"))
    near, far = open_store(near_store, "test"), open_store(far_store, "test")
    assert near.tokenizer_id == far.tokenizer_id and far.tokenizer_id["vocab_size"] > 1024  # one BPE, both stores
    lengths = [len(far.document(i)) for i in range(len(far))]
    assert max(lengths) <= 2048 and min(lengths) > 1024  # sized in tokens: each document fits one span
    far_cmd = next(c for c in summary["commands"] if "synthetic:copy-far" in c)
    assert "words=text" in far_cmd and "vocab=1024" in far_cmd and f"--tokenizer {path}" in far_cmd
    assert summary["settings"]["tokens_per_word"] == pytest.approx(per_word)
    retro = next(r for r in summary["runs"] if r["variant"] == "retro")
    assert "-text-bpe2048" in retro["run"]  # never mixed with the ids corpus's runs
    assert 0 <= retro["eval"]["bm25"]["hit@1"] <= 1  # scored as the unaligned corpus: runs of copied tokens


def test_a_tokenizer_file_names_the_text_runs_without_folders():
    from lab.copytest import _size_tag

    tag = _size_tag(CopyTestSettings(words="text", tokenizer="/data/tok/my tokenizer.json"))
    assert "/" not in tag and " " not in tag and tag.endswith("-text-data-tok-my-tokenizer.json")
    assert _size_tag(CopyTestSettings(words="text")) == "-text-bpe2048"  # the runs measured so far keep their names


def test_the_unaligned_hit_counts_a_neighbour_holding_the_chunk_at_any_offset():
    from lab.copytest import _holds

    window = np.arange(128)
    assert _holds(window, np.arange(37, 101)) and _holds(window, np.arange(0, 64)) and _holds(window, np.arange(64, 128))
    assert not _holds(window, np.arange(65, 129)) and not _holds(window, np.r_[np.arange(10, 73), 5])


def test_a_near_control_learning_rate_of_its_own_names_its_runs_and_summary():
    from lab.copytest import _lr, _lr_tag, summary_path

    d, own, both = CopyTestSettings(), CopyTestSettings(near_lr=3e-3), CopyTestSettings(lr=3e-3)
    assert (_lr("near", own), _lr("far", own), _lr("near", d)) == (3e-3, 1e-2, 1e-2)
    assert _lr_tag(d, "near") == _lr_tag(d, "far") == "" and summary_path(d).name == "copytest.json"
    assert (_lr_tag(own, "near"), _lr_tag(own, "far")) == ("-lr0.003", "")  # the far runs are the default's
    assert summary_path(own).name == "copytest-nearlr0.003.json"
    assert _lr_tag(both, "far") == "-lr0.003" and summary_path(both).name == "copytest-lr0.003.json"


def test_rpt_sem_runs_are_named_by_their_scorer_so_another_scorer_never_resumes_them():
    from lab.copytest import _scorer_tag

    assert _scorer_tag(CopyTestSettings()) == ""  # the near control trains as the far runs do
    assert _scorer_tag(CopyTestSettings(steps=100, near_steps=400)) == "-scorer400steps"
    assert _scorer_tag(CopyTestSettings(near_lr=3e-3)) == "-scorerlr0.003"
    assert _scorer_tag(CopyTestSettings(near_p=1.0)) == "-scorerp1"  # trained on another near corpus
    # a named scorer: the near control's training no longer matters to rpt-sem
    assert _scorer_tag(CopyTestSettings(scorer="induction", near_lr=3e-3)) == "-scorer=induction"
    assert _scorer_tag(CopyTestSettings(scorer="/models/SmolLM2.gguf")) == "-scorer=SmolLM2.gguf"


def test_a_near_control_that_learned_nothing_does_not_lower_the_far_checks():
    from lab.copytest import verdict

    def run(setting, variant, own_adv, none_tail, own_tail):
        ev = {"none": {"advantage": own_adv if variant == "xl" else 0.0, "repeat-tail": none_tail, "all": 5.5}}
        if variant != "xl":
            ev["bm25"] = {"advantage": own_adv, "repeat-tail": own_tail, "all": 5.0}
        return {"setting": setting, "variant": variant, "eval": ev}

    s = CopyTestSettings(variants=("retro",))
    weak_retro = run("far", "retro", 0.4, 5.5, 5.1)  # reads a little: 0.4 nats
    for near_adv in (0.0, 0.6, 3.0):  # the bar is half of 2.0 (the near floor) or of 3.0: 0.4 nats never meets it
        v = verdict([run("near", "xl", near_adv, 5.5, 5.5), run("far", "xl", 0.0, 5.5, 5.5), weak_retro], s)
        assert v["checks"]["retro far gain comes from its neighbours"] is False, near_adv
    # a retro that reads (4 nats) passes its checks whatever the near control learned; the near check alone fails
    strong = verdict([run("near", "xl", 0.0, 5.5, 5.5), run("far", "xl", 0.0, 5.5, 5.5), run("far", "retro", 4.0, 5.5, 1.5)], s)
    assert strong["checks"]["retro far gain comes from its neighbours"] and strong["checks"][
        "retro reaches half of xl's near advantage on far repeats"]
    assert not strong["checks"]["xl copies near repeats"] and not strong["passed"]


def test_a_gain_that_random_chunks_of_the_document_give_too_is_not_reading():
    from lab.copytest import verdict

    def run(setting, variant, tail, random_tail=None):  # repeat-tail losses: none 5.5, own `tail`, random `random_tail`
        ev = {"none": {"advantage": 3.0 if setting == "near" else 0.0, "repeat-tail": 5.5, "all": 5.5}}
        if variant != "xl":
            ev["bm25"] = {"advantage": 5.5 - tail, "repeat-tail": tail, "all": 5.0}
            if random_tail is not None:
                ev["random"] = {"advantage": 5.5 - random_tail, "repeat-tail": random_tail, "all": 5.1}
        return {"setting": setting, "variant": variant, "eval": ev}

    s = CopyTestSettings(variants=("retro",))
    xl = [run("near", "xl", 5.5), run("far", "xl", 5.5)]
    name = "retro's own neighbours beat random chunks of the document"
    primed = verdict(xl + [run("far", "retro", 1.5, random_tail=1.6)], s)  # any chunk of the document gives the gain
    assert primed["checks"]["retro far gain comes from its neighbours"] and not primed["checks"][name]
    assert not primed["passed"]
    reads = verdict(xl + [run("far", "retro", 1.5, random_tail=5.4)], s)
    assert reads["checks"][name] and reads["passed"]
    assert reads["retro far ppl gain, random chunks"][0] == pytest.approx(np.exp(0.4))
    # a summary recorded before the control existed keeps its checks
    assert name not in verdict(xl + [run("far", "retro", 1.5)], s)["checks"]


def test_chance_only_prints_what_a_retriever_that_knows_nothing_scores_and_trains_nothing(tmp_path, capsys):
    out = tmp_path / "ct"
    assert main(["copytest", "--out", str(out), "--seq-len", "1024", "--segment-len", "64", "--eval-docs", "16",
                 "--steps", "2", "--batch-size", "1", "--chance-only", "--no-progress"]) == 0
    line = capsys.readouterr().out
    assert "source@1 of a retriever that knows nothing" in line and not (out / "runs").exists()
    from lab.copytest import source_chance
    from rpt.data.synthetic import CopySpec, copy_classes
    from rpt.eval.perplexity import random_neighbors
    from rpt.training.data import open_store

    s = CopyTestSettings(out=out, seq_len=1024, segment_len=64, eval_docs=16, steps=2, batch_size=1)
    root = next(p for p in (out / "stores").iterdir() if p.name.startswith("copy-far"))
    chance = source_chance(root, s)
    assert chance["recency"] == 0.0  # far sources lie passages back, never in the chunk just before the query's segment
    # the exact expectation against what uniformly drawn chunks (rpt eval's random neighbours, column 0) hit
    store = open_store(root, "test")
    spec = CopySpec(**store.manifest["corpus"]["synthetic"])
    assert spec.aligned(64)  # a hit: the neighbour's continuation is the chunk to predict
    hits = tails = 0
    for d in range(16):
        toks = np.asarray(store.document(d), dtype=np.int64)
        C = len(toks) // 64
        for draw in range(20):
            nb = random_neighbors(C, 64, 64, 1, doc=1000 * draw + d)
            for t in np.nonzero(copy_classes(toks, spec.passage, 64) == 2)[0]:
                j = int(nb[t - 1, 0])
                if j >= 0:
                    tails += 1
                    hits += int(j < C - 1 and np.array_equal(toks[(j + 1) * 64 : (j + 2) * 64], toks[t * 64 : (t + 1) * 64]))
    assert chance["repeat_tail_chunks"] * 20 == tails
    assert abs(hits / tails - chance["random"]) < 0.03 and 0 < chance["random"] < 0.5
