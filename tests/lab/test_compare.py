"""`python -m lab compare`: settings grouped over seeds, paired gains, labels by what differs, the paper's rows, bad input."""

import json

import pytest

from lab.cli import main
from lab.compare import _fmt, compare, group_settings, load_results, paper_row, to_markdown
from rpt.config import RPTConfig
from rpt.utils import UserError


def result(variant: str, seed: int, source: str, ppl: float, step: int = 100, k: int = 2, metrics=None, **train):
    cfg = RPTConfig.from_preset("tiny", variant=variant)
    cfg.train.seed, cfg.train.out_dir = seed, f"runs/x/{variant}-seed{seed}"
    for key, v in train.items():
        *path, name = key.split("__")
        part = cfg
        for sub in path:
            part = getattr(part, sub)
        setattr(part, name, v)
    r = {"config": cfg.to_dict(), "step": step, "eval": {"source": source, "n_neighbors": k, "split": "test"},
         "total": {"perplexity": ppl}}
    if metrics is not None:
        r["retrieval"] = {"model": dict(zip(("precision@2", "recall@10", "ndcg@20"), metrics, strict=True)),
                          "bm25": {"precision@2": 0.5, "recall@10": 0.8, "ndcg@20": 0.6}}
    r["_path"] = f"{variant}-{seed}-{source}.json"
    return r


def test_rows_pair_seeds_for_gains_and_the_xl_ratio():
    rs = [result("xl", 0, "none", 100.0), result("xl", 1, "none", 200.0),
          result("retro", 0, "bm25", 90.0), result("retro", 0, "none", 99.0),
          result("retro", 1, "bm25", 160.0), result("retro", 1, "none", 200.0)]
    rows = {r["label"]: r for r in compare(rs)["rows"]}
    assert list(rows) == ["xl", "retro"]
    retro = rows["retro"]
    assert retro["seeds"] == [0, 1] and retro["ppl"][0] == pytest.approx(125.0)
    # paired: 99/90 = 1.1 and 200/160 = 1.25 (not the ratio of the means, 149.5 / 125)
    assert retro["gain"][0] == pytest.approx((1.1 + 1.25) / 2) and retro["gain"][2] == 2
    assert retro["vs_xl"][0] == pytest.approx((0.9 + 0.8) / 2)
    assert retro["gain"][1] == pytest.approx(0.10606601717798213)  # sd of (1.1, 1.25)
    assert "gain" not in rows["xl"] and rows["xl"]["source"] == "none"


def test_settings_are_labelled_by_what_sets_them_apart_and_matched_to_the_paper():
    rs = [result("rpt-sem", 0, "model", 50.0), result("rpt-sem", 0, "oracle", 45.0),
          result("rpt-sem", 0, "model", 60.0, train__ss_schedule="gold"),
          result("rpt-sem", 0, "model", 55.0, model__gate__kind="none"),
          result("memorizing", 0, "none", 70.0, model__memorizing__tokens=32768)]
    settings = group_settings(rs)
    labels = sorted(s.label for s in settings)
    assert labels == ["memorizing", "rpt-sem (gate.kind=none, ss_schedule=anneal)",
                      "rpt-sem (gate.kind=paper, ss_schedule=anneal)", "rpt-sem (gate.kind=paper, ss_schedule=gold)"]
    rows = {paper_row(s): s for s in settings}
    assert set(rows) == {"RPT-Sem", "RPT-Sem - Only Teacher forcing", "RPT-Sem - No Neighbor Gating",
                         "Memorizing Transformer (32K)"}
    table = compare(rs, "code")
    sem = next(r for r in table["rows"] if r["paper"]["row"] == "RPT-Sem")
    assert sem["paper"] == {"row": "RPT-Sem", "ppl": 2.17, "oracle": 2.10, "metrics": (0.34, 0.56, 0.30)}
    assert sem["oracle"][0] == 45.0


def test_markdown_shows_spread_metrics_and_one_bm25_row():
    rs = [result("rpt-lex", s, "model", 100.0 + s, metrics=(0.1 + s / 100, 0.2, 0.3)) for s in range(3)]
    rs += [result("rpt-lex", s, "none", 101.0 + s) for s in range(3)]
    rs += [result("rpt-sem", s, "model", 90.0, metrics=(0.2, 0.3, 0.4)) for s in range(2)]
    text = to_markdown(compare(rs, "code"))
    assert "| rpt-lex | 3 | 101.0 ± 1.0 |" in text
    assert "| rpt-lex | 3 | 11.0% ± 1.0 | 20.0% ± 0.0 | 30.0% ± 0.0 |  | 26% / 52% / 23% |" in text
    assert text.count("| BM25 |") == 1 and "BM25 (with" not in text
    bm25 = next(line for line in text.splitlines() if line.startswith("| BM25 |"))
    assert "(same ranking)" in bm25 and "±" not in bm25  # the labels' ranking, identical for every seed: no "± 0.0"


def test_files_and_folders_and_errors(tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    for r in (result("xl", 0, "none", 10.0), result("xl", 1, "none", 12.0)):
        (tmp_path / "runs" / r["_path"]).write_text(json.dumps(r))
    (tmp_path / "runs" / "other.json").write_text('{"not": "a result"}')  # skipped inside a folder
    assert len(load_results([tmp_path / "runs"])) == 2
    with pytest.raises(UserError, match="other.json: not an `rpt eval` result"):
        load_results([tmp_path / "runs" / "other.json"])
    with pytest.raises(UserError, match="missing.json: no such file"):
        load_results([tmp_path / "missing.json"])
    dup = result("xl", 0, "none", 11.0)
    with pytest.raises(UserError, match="a second, different result for xl seed 0"):
        compare([result("xl", 0, "none", 10.0), dup])
    with pytest.raises(UserError, match="--paper 'wiki'"):
        compare([dup], "wiki")
    assert main(["compare", str(tmp_path / "runs"), "--paper", "code", "--out", str(tmp_path / "t.json"),
                 "--markdown", str(tmp_path / "t.md")]) == 0
    out = capsys.readouterr().out
    assert "| xl | 2 | 11.0 ± 1.4 |" in out
    assert (tmp_path / "t.md").read_text() == "<!-- written by rpt (python -m lab compare) -->\n" + out.strip() + "\n"
    assert json.loads((tmp_path / "t.json").read_text())["rows"][0]["paper"]["ppl"] == 2.3


def test_step_filter_defaults_for_old_results_and_unpaired_ratios():
    old = result("retro", 0, "bm25", 90.0, step=200)
    del old["config"]["model"]["cca"]["positions"]  # written before the field existed: it ran with the default
    rs = [old, result("retro", 0, "none", 99.0, step=200), result("retro", 1, "bm25", 80.0, step=200),
          result("retro", 1, "none", 96.0, step=200), result("xl", 0, "none", 100.0, step=200),
          result("retro", 0, "bm25", 50.0, step=400, train__loss_chunk=0)]
    assert [r["label"] for r in compare(rs)["rows"]] == ["xl", "retro (step 200)", "retro (step 400)"]
    table = compare(rs, step=200)
    assert [r["label"] for r in table["rows"]] == ["xl", "retro"]  # one setting: old and new configs agree
    assert "| retro | 2 | 85.0 ± 7.1 | 0.900 (n=1) |" in to_markdown(table)
    with pytest.raises(UserError, match=r"--step 300: no result .*steps found: \[200, 400\]"):
        compare(rs, step=300)


def test_an_own_retriever_model_read_with_bm25_neighbours_gets_its_own_columns():
    rs = [result("rpt-sem", 0, "model", 90.0), result("rpt-sem", 0, "none", 99.0), result("rpt-sem", 0, "bm25", 88.0),
          result("retro", 0, "bm25", 80.0), result("retro", 0, "none", 88.0)]
    rows = {r["label"]: r for r in compare(rs)["rows"]}
    assert rows["rpt-sem"]["bm25_gain"][0] == pytest.approx(1.125) and "bm25" not in rows["retro"]
    text = to_markdown(compare(rs))
    assert "BM25 gain" in text and "| rpt-sem | 1 | 90.0 |" in text and "| 88.0 | 1.125 |" in text


def test_the_compute_and_parameter_matched_xl_rows_are_recognised_and_paired_with_plain_xl():
    plain = [result("xl", s, "none", p, step=100, train__steps=100) for s, p in ((0, 100.0), (1, 110.0))]
    deeper = [result("xl", s, "none", p, step=100, train__steps=100, model__n_layers=6) for s, p in ((0, 90.0), (1, 99.0))]
    longer = [result("xl", s, "none", p, step=150, train__steps=150) for s, p in ((0, 95.0), (1, 99.0))]
    partial = [result("xl", 0, "none", 120.0, step=50, train__steps=150)]  # not a final checkpoint: left out
    table = compare(plain + deeper + longer + partial, "code", step="final")
    rows = {r["label"]: r for r in table["rows"]}
    assert set(rows) == {"xl (n_layers=4, steps=100)", "xl (n_layers=6, steps=100)", "xl (n_layers=4, steps=150)"}
    assert rows["xl (n_layers=6, steps=100)"]["paper"]["row"] == "Transformer-XL +2 layers"
    assert rows["xl (n_layers=4, steps=150)"]["paper"]["row"] == "Transformer-XL 1.5x steps"
    assert rows["xl (n_layers=4, steps=100)"]["paper"]["row"] == "Transformer-XL"
    # paired with plain xl per seed, across the steps (each run's final checkpoint)
    assert rows["xl (n_layers=6, steps=100)"]["vs_xl"][0] == pytest.approx(0.9)
    assert rows["xl (n_layers=4, steps=150)"]["vs_xl"][0] == pytest.approx((0.95 + 0.9) / 2)
    assert "vs_xl" not in rows["xl (n_layers=4, steps=100)"]
    with pytest.raises(UserError, match="--step final: no result"):
        compare(partial, step="final")


def test_compare_cli_takes_final_as_a_step(tmp_path, capsys):
    path = tmp_path / "r.json"
    r = result("xl", 0, "none", 100.0, step=100, train__steps=100)
    r.pop("_path")
    path.write_text(json.dumps(r))
    assert main(["compare", str(path), "--step", "final"]) == 0
    assert "| xl | 1 | 100.0 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["compare", str(path), "--step", "last"])


def test_final_pairs_a_model_with_the_xl_trained_as_long_and_other_xl_settings_get_no_paper_row():
    xl100 = result("xl", 0, "none", 100.0, step=100, train__steps=100)
    xl200 = result("xl", 0, "none", 80.0, step=200, train__steps=200)
    retro200 = [result("retro", 0, "bm25", 72.0, step=200, train__steps=200),
                result("retro", 0, "none", 76.0, step=200, train__steps=200)]
    deeper_other_lr = result("xl", 0, "none", 90.0, step=100, train__steps=100, model__n_layers=6, train__lr=0.5)
    rows = {r["label"]: r for r in compare([xl100, xl200, *retro200, deeper_other_lr], "code", step="final")["rows"]}
    assert rows["retro"]["vs_xl"][0] == pytest.approx(72.0 / 80.0)  # the 200-update xl, not the plain 100-update one
    other = next(r for label, r in rows.items() if "n_layers=6" in label)
    assert "paper" not in other  # two more layers, but another lr too: not the paper's "+2 layers" row
    lex_gold = result("rpt-lex", 0, "model", 60.0, train__ss_schedule="gold")
    assert paper_row(group_settings([lex_gold])[0]) is None  # Table 4's ablations are of RPT-Sem only


def test_fields_a_variant_never_reads_and_changed_defaults_do_not_split_a_setting():
    """CCA's init is not read by xl or a baseline: runs made before and after the copy prior became the default are
    one setting. A retro result written before the init fields existed ran with the former default (random), so it
    stays apart from a retro run with the prior; an automatic q/k std (0) equals the explicit 0.1 it resolves to."""
    def old(r):  # a config written before the copy prior's fields existed
        model = r["config"]["model"]
        for key in ("qk_init", "ov_init", "qk_match_std", "query"):
            model["cca"].pop(key)
        model.update({f"cca_{k}": v for k, v in model.pop("cca").items()})  # and flat, as rpt wrote it then
        model.update({"gate": model["gate"]["kind"], "gate_eta": model["gate"]["eta"], "gate_on": model["gate"]["on"]})
        r["config"]["data"]["chunk_size"] = model["chunk_size"]
        return r

    rs = [old(result("griffin", 0, "none", 60.0)), result("griffin", 1, "none", 62.0),
          old(result("xl", 0, "none", 100.0)), result("xl", 1, "none", 104.0, model__gate__kind="clamp"),
          old(result("retro", 0, "bm25", 90.0)), result("retro", 1, "bm25", 95.0),
          result("retro", 2, "bm25", 97.0, model__cca__qk_match_std=0.1)]
    settings = {s.label: sorted(seed for seed, _ in s.ppl[next(iter(s.ppl))]) for s in group_settings(rs)}
    assert settings == {"griffin": [0, 1], "xl": [0, 1],
                        "retro (cca.ov_init=random, cca.qk_init=random)": [0],
                        "retro (cca.ov_init=identity, cca.qk_init=match)": [1, 2]}


def test_init_scales_that_their_init_does_not_read_and_losses_retro_does_not_have_do_not_split():
    rs = [result("retro", 0, "bm25", 90.0, model__cca__qk_init="random", model__cca__ov_init="random"),
          result("retro", 1, "bm25", 95.0, model__cca__qk_init="random", model__cca__ov_init="random",
                 model__cca__qk_match_std=0.3, model__cca__ov_scale=0.2, train__alpha_ret=0.5, train__ss_schedule="gold")]
    assert [sorted(s.ppl["bm25"]) for s in group_settings(rs)] == [[(0, 0), (1, 0)]]  # (seed, repeat)


def test_one_seed_has_no_spread():
    """One seed prints its value alone, percentages too: '± 0.0' would claim a spread nobody measured."""
    assert _fmt((0.109, 0.0, 1), pct=True) == "10.9%"
    assert _fmt((0.109, 0.004, 2), pct=True) == "10.9% ± 0.4"
    assert _fmt((126.84, 0.0, 1)) == "126.8"
    assert _fmt((1.0114, 0.0021, 3), digits=3, n_row=3) == "1.011 ± 0.002"


def test_a_relative_and_an_absolute_store_path_are_one_setting(tmp_path, monkeypatch):
    """Runs made with --store runs/s and with --store /abs/runs/s are paired and grouped as one setting."""
    monkeypatch.chdir(tmp_path)
    rs = [result("xl", 0, "none", 100.0), result("xl", 1, "none", 90.0)]
    rs[0]["config"]["data"]["store"], rs[1]["config"]["data"]["store"] = "runs/s", str(tmp_path / "runs" / "s")
    rows = compare(rs)["rows"]
    assert len(rows) == 1 and rows[0]["seeds"] == [0, 1]


def test_chance_rows_buckets_the_random_control_and_training_recall(tmp_path):
    rs = []
    for seed in range(2):
        run = tmp_path / f"rpt-sem-seed{seed}"
        (run / "checkpoints" / "step_00000100").mkdir(parents=True)
        log = [{"step": st, "lm_loss": 3.0, "recall@2": 0.1 * seed + st / 1000} for st in (10, 50, 100, 150)]
        (run / "log.jsonl").write_text("\n".join(json.dumps(x) for x in log) + "\n")
        r = result("rpt-sem", seed, "model", 90.0 + seed, metrics=(0.2, 0.3, 0.4))
        r["checkpoint"] = str(run / "checkpoints" / "step_00000100")
        bucket = {"precision@2": 0.1, "recall@10": 0.2, "ndcg@20": 0.3, "n_queries": 5}
        r["retrieval"]["model"]["buckets"] = {"pool 1-27": bucket, "pool 28-128": {**bucket, "precision@2": 0.05}}
        r["retrieval"]["random"] = {"precision@2": 0.04, "recall@10": 0.1, "ndcg@20": 0.05,
                                    "buckets": {"pool 1-27": {**bucket, "precision@2": 0.06}}}
        r["retrieval"]["gold"] = "exhaustive"
        rs += [r, result("rpt-sem", seed, "none", 99.0 + seed), result("rpt-sem", seed, "random", 98.0 + seed)]
    row = compare(rs)["rows"][0]
    assert row["random_gain"][0] == pytest.approx((99 / 98 + 100 / 99) / 2) and row["random_gain"][2] == 2
    assert row["gold"] == ["exhaustive"]
    # the mean of the logged recall over the last 100 updates up to step 100 (steps 10 and 50 and 100)
    assert row["train_recall"][0] == pytest.approx(((0.01 + 0.05 + 0.1) / 3 + (0.11 + 0.15 + 0.2) / 3) / 2)
    assert row["buckets_model"]["pool 28-128"][0] == pytest.approx(0.05)
    text = to_markdown(compare(rs))
    assert "gold: exhaustive" in text and "| random (chance, expected) | 2 (same ranking) | 4.0% |" in text
    assert "| ppl, random neighbours | random gain |" in text
    assert "| pool 1-27 | pool 28-128 |" in text and "| rpt-sem | 10.0% ± 0.0 | 5.0% ± 0.0 |" in text
    assert "| random (chance, expected) | " in text
    assert "| random (chance, expected) | 6.0% |  |" in text  # a fixed ranking's bucket value once, no "± 0.0"


def with_docs(r, docs):
    """A result with per-document records: docs = [(NLL sum, tokens), ...]."""
    r["documents"] = [{"index": i, "nll_sum": nll, "n_targets": n} for i, (nll, n) in enumerate(docs)]
    return r


def test_bootstrap_interval_of_a_constant_ratio_is_that_ratio():
    """Every document 10% more likely with neighbours, on both seeds: every resample gives exactly that gain."""
    import math

    from lab.compare import bootstrap_ratio

    none = {s: {d: (2.0 * (d + 1) * 100, 100 * (d + 1)) for d in range(8)} for s in (0, 1)}
    own = {s: {d: ((2.0 - math.log(1.1)) * (d + 1) * 100, 100 * (d + 1)) for d in range(8)} for s in (0, 1)}
    lo, hi, n = bootstrap_ratio(none, own)
    assert n == 8 and lo == pytest.approx(1.1) and hi == pytest.approx(1.1)
    assert bootstrap_ratio({0: {0: (1.0, 1)}}, {0: {0: (1.0, 1)}}) is None  # one document: no interval
    assert bootstrap_ratio({0: none[0]}, {1: own[1]}) is None  # no seed on both sides


def test_bootstrap_interval_covers_one_when_documents_disagree_and_not_when_they_agree():
    import numpy as np

    from lab.compare import bootstrap_ratio

    rng = np.random.default_rng(1)
    base = {0: {d: (5.0 * 200, 200) for d in range(30)}}
    noisy = {0: {d: ((5.0 + rng.normal(0, 0.2)) * 200, 200) for d in range(30)}}  # no effect, per-document noise
    lo, hi, _ = bootstrap_ratio(base, noisy)
    assert lo < 1 < hi
    better = {0: {d: ((5.0 - 0.1 + rng.normal(0, 0.02)) * 200, 200) for d in range(30)}}  # a real 0.1-nat gain
    lo, hi, _ = bootstrap_ratio(base, better)
    assert 1.08 < lo < hi < 1.13


def test_rows_and_markdown_carry_the_document_intervals():
    docs_xl = [(500.0, 100), (600.0, 100), (550.0, 100)]
    docs_own = [(450.0, 100), (560.0, 100), (500.0, 100)]
    docs_none = [(510.0, 100), (610.0, 100), (560.0, 100)]
    docs_rand = [(505.0, 100), (605.0, 100), (555.0, 100)]
    rs = [with_docs(result("xl", 0, "none", 100.0), docs_xl),
          with_docs(result("rpt-sem", 0, "model", 90.0), docs_own), with_docs(result("rpt-sem", 0, "none", 99.0), docs_none),
          with_docs(result("rpt-sem", 0, "random", 98.0), docs_rand)]
    rows = {r["label"]: r for r in compare(rs)["rows"]}
    sem = rows["rpt-sem"]
    assert sem["vs_xl_ci"][2] == 3 and sem["vs_xl_ci"][0] <= sem["vs_xl_ci"][1] < 1  # every document better than xl's
    assert sem["gain_ci"][0] > 1 and sem["own_vs_random_ci"][0] > 1
    md = to_markdown(compare(rs))
    assert "own vs random" in md and f"[{sem['gain_ci'][0]:.3f}, {sem['gain_ci'][1]:.3f}]" in md
    assert "resampling runs (seeds first where a seed has several) and test documents together" in md


def test_the_papers_figures_beside_another_corpus_are_marked_not_comparable():
    rs = [result("xl", 0, "none", 100.0, data__corpus="pari"), result("xl", 1, "none", 104.0, data__corpus="pari")]
    table = compare(rs, "arxiv")
    assert table["paper_note"].startswith("Not comparable: these results are on pari, not the paper's arxiv dataset")
    assert to_markdown(table).startswith("Not comparable: these results are on pari")
    same = [result("xl", 0, "none", 100.0, data__corpus="hf:codeparrot")]
    assert compare(same, "code")["paper_note"] is None and compare(rs)["paper_note"] is None  # no --paper: no note


def test_against_pairs_every_ablation_with_the_reference_setting_per_seed(tmp_path, capsys):
    """An ablation table: each row / the named setting's row, paired by seed, with a two-level interval; BM25, oracle
    and DPR gains get theirs too; another store is not paired; a name that matches no setting or several, or results
    at several steps without --step, is one clear error."""
    import math
    import random

    noise = random.Random(0)

    def run(schedule, seed, own_nll, none_nll, step=100, **kw):
        def docs(nll):  # per-document NLL with noise, so that an interval is not one point
            return [((nll + noise.gauss(0, 0.01)) * 100 * (d + 1), 100 * (d + 1)) for d in range(6)]

        kw = {"train__ss_schedule": schedule, **kw}
        sources = {"model": own_nll, "none": none_nll, "bm25": own_nll - 0.02, "oracle": own_nll - 0.03,
                   "dpr": own_nll - 0.01}
        out = []
        for src, nll in sources.items():
            d = docs(nll)
            ppl = math.exp(sum(x for x, _ in d) / sum(n for _, n in d))
            out.append(with_docs(result("rpt-sem", seed, src, ppl, step=step, **kw), d))
        return out

    gaps = {0: 0.08, 1: 0.02}  # the gold schedule's NLL over the annealed one's, per seed
    rs = [r for seed in (0, 1) for r in run("anneal", seed, 4.60 + 0.1 * seed, 4.61 + 0.1 * seed)
          + run("gold", seed, 4.60 + 0.1 * seed + gaps[seed], 4.66 + 0.1 * seed + gaps[seed])]
    other = run("own", 0, 4.0, 4.0, data__store="elsewhere")  # another store: never paired with the reference
    table = compare(rs + other, against="ss_schedule=anneal")
    rows = {r["label"]: r for r in table["rows"]}
    assert "ss_schedule=anneal" in table["against"]
    gold = next(r for label, r in rows.items() if "gold" in label)
    anneal = next(r for label, r in rows.items() if "anneal" in label)
    own = next(r for label, r in rows.items() if "=own" in label)
    assert "vs_ref" not in anneal and "vs_ref" not in own
    want = [gold_ppl / anneal_ppl for gold_ppl, anneal_ppl in  # paired per seed, not a ratio of means
            ((r_g["total"]["perplexity"], r_a["total"]["perplexity"]) for r_g, r_a in
             ((next(r for r in rs if r["eval"]["source"] == "model" and r["config"]["train"]["seed"] == sd
                    and r["config"]["train"]["ss_schedule"] == sch) for sch in ("gold", "anneal")) for sd in (0, 1)))]
    assert gold["vs_ref"][0] == pytest.approx(sum(want) / 2) and gold["vs_ref"][2] == 2
    lo, hi, n = gold["vs_ref_ci"]
    assert n == 6 and 1 < lo < math.exp(0.03) and math.exp(0.07) < hi < math.exp(0.09) and lo < hi  # seeds' spread in it
    assert 1 < gold["bm25_gain_ci"][0] < gold["bm25_gain_ci"][1] and anneal["oracle_gain_ci"][0] > 1
    assert anneal["dpr_gain"][0] == pytest.approx(math.exp(0.02), rel=0.01) and anneal["dpr_gain_ci"][0] > 1
    md = to_markdown(table).splitlines()
    header = next(line for line in md if line.startswith("| model |")).split(" | ")
    col = header.index(f"vs {table['against']}")
    cell = next(line for line in md if line.startswith(f"| {gold['label']} |")).split(" | ")[col]
    assert cell == f"{gold['vs_ref'][0]:.3f} ± {gold['vs_ref'][1]:.3f} [{lo:.3f}, {hi:.3f}]"
    assert next(line for line in md if line.startswith(f"| {anneal['label']} |")).split(" | ")[col] == ""
    with pytest.raises(UserError, match="no setting match; the settings are: rpt-sem"):
        compare(rs, against="ss_schedule=none")
    with pytest.raises(UserError, match="2 settings match"):
        compare(rs, against="rpt-sem")
    later = run("anneal", 0, 4.5, 4.5, step=200)
    with pytest.raises(UserError, match="several steps .*--step N"):
        compare(rs + later, against="ss_schedule=anneal")
    assert compare(rs + later, step=100, against="ss_schedule=anneal")["against"] == "rpt-sem (ss_schedule=anneal)"
    paths = []
    for i, r in enumerate(rs):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps({k: v for k, v in r.items() if k != "_path"}))
    out = tmp_path / "t.json"
    assert main(["compare", *map(str, paths), "--against", "ss_schedule=anneal", "--out", str(out)]) == 0
    assert "vs rpt-sem (ss_schedule=anneal)" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["against"] == "rpt-sem (ss_schedule=anneal)"
    assert [r["label"] for r in saved["rows"] if r.get("vs_ref")] == ["rpt-sem (ss_schedule=gold)"]
