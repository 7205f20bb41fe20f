import json
import os
import socket

import pytest
import torch
from train_helpers import StandIn, make_labels, tiny_config, write_label_store

from rpt import checkpoint as ck
from rpt.training.data import LabelMismatch, SequenceDataset, open_store
from rpt.training.loop import NonFiniteLoss, prepare, train


def read_log(out_dir) -> list[dict]:
    return [json.loads(x) for x in (out_dir / "log.jsonl").read_text().splitlines()]


def weights(path) -> dict[str, torch.Tensor]:
    return ck.read_weights(path / "model.safetensors")


class Killed(Exception):
    pass


def kill_at(step_to_kill: int):
    def hook(step, metrics):
        if step == step_to_kill:
            raise Killed

    return hook


@pytest.mark.parametrize("variant", ["memorizing", "block-recurrent", "griffin"])
def test_the_baselines_resume_exactly_and_need_no_labels(corpus, variant):
    """A baseline trains through the same loop without labels (labels given are not read), and a killed run resumes
    to the same weights as an uninterrupted one."""
    tmp = corpus["tmp"]
    kw = dict(model={"dropout": 0.1}, variant=variant, steps=4, batch_size=1, grad_accum=2, checkpoint_every=2,
              log_every=2)
    full = train(tiny_config(tmp, out_dir=str(tmp / f"{variant}-a"), **kw), corpus["root"], None, progress=False)
    b = tiny_config(tmp, out_dir=str(tmp / f"{variant}-b"), **kw)
    with pytest.raises(Killed):
        train(b, corpus["root"], None, progress=False, on_step=kill_at(3))
    resumed = train(b, corpus["root"], None, progress=False)
    wa, wb = weights(full.checkpoint), weights(resumed.checkpoint)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    model, cfg = ck.load_model(resumed.checkpoint)
    assert type(model).__name__ != "RPT" and cfg.model.variant == variant


@pytest.mark.parametrize("optimizer", ["adabelief", "adamw"])
def test_resume_after_a_kill_equals_an_uninterrupted_run(corpus, optimizer):
    tmp = corpus["tmp"]
    # the real RPT with dropout, scheduled sampling and accumulation: every source of state is exercised
    kw = dict(model={"dropout": 0.1}, steps=6, batch_size=1, grad_accum=2, checkpoint_every=2, log_every=3,
              optimizer=optimizer, ss_fraction=1.0)
    a = tiny_config(tmp, out_dir=str(tmp / "a"), **kw)
    full = train(a, corpus["root"], corpus["labels"], progress=False)
    b = tiny_config(tmp, out_dir=str(tmp / "b"), **kw)
    with pytest.raises(Killed):  # killed after update 3, one step past the checkpoint of step 2
        train(b, corpus["root"], corpus["labels"], progress=False, on_step=kill_at(3))
    assert ck.latest(tmp / "b").name == "step_00000002"
    resumed = train(b, corpus["root"], corpus["labels"], progress=False)
    assert full.step == resumed.step == 6
    wa, wb = weights(full.checkpoint), weights(resumed.checkpoint)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    oa, ob = ck.load(full.checkpoint).optimizer, ck.load(resumed.checkpoint).optimizer
    assert all(torch.equal(oa["state"][i][n], ob["state"][i][n]) for i in oa["state"] for n in oa["state"][i])
    la, lb = read_log(tmp / "a"), read_log(tmp / "b")
    # log windows close at checkpoints too (2, 3, 4, 6), and the redone step 3 is logged once
    assert [r["step"] for r in la] == [r["step"] for r in lb] == [2, 3, 4, 6]
    for key in ("lm_loss", "ret_loss", "recall@2", "grad_norm", "p_ss", "lr", "tokens"):
        assert [r[key] for r in la] == [r[key] for r in lb], key


def test_checkpoints_record_where_their_updates_ran(corpus, monkeypatch):
    """Each checkpoint records the environment of its updates, one entry per stretch: a run resumed in another
    environment (here: another thread count) adds one from the step it resumed at, one resumed in the same adds none."""
    import rpt.utils

    tmp = corpus["tmp"]
    cfg = tiny_config(tmp, out_dir=str(tmp / "env"), steps=4, batch_size=1, checkpoint_every=2, log_every=2)
    with pytest.raises(Killed):
        train(cfg, corpus["root"], corpus["labels"], progress=False, on_step=kill_at(3))
    first = ck.load(ck.latest(tmp / "env")).environments
    assert [e["from_step"] for e in first] == [0] and first[0]["threads"] == torch.get_num_threads()
    assert {"machine", "cpu", "cpu_count", "torch", "python", "rpt", "platform"} <= set(first[0])
    here = {k: v for k, v in first[0].items() if k != "from_step"}
    monkeypatch.setattr(rpt.utils, "environment", lambda: {**here, "threads": here["threads"] + 1})
    done = train(cfg, corpus["root"], corpus["labels"], progress=False)
    envs = ck.load(done.checkpoint).environments
    assert [(e["from_step"], e["threads"]) for e in envs] == [(0, here["threads"]), (2, here["threads"] + 1)]
    cfg.train.steps = 6  # resumed in the same environment as the last stretch: nothing added
    again = train(cfg, corpus["root"], corpus["labels"], progress=False, allow_changes=True)
    assert ck.load(again.checkpoint).environments == envs


def test_the_environment_names_the_kernels_and_what_overrode_them(monkeypatch):
    """Hosts whose CPUs a virtual machine names alike can run kernels of other vector extensions, whose rounding makes
    a training run another draw: the environment tells them apart."""
    import rpt.utils

    for name in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    e = rpt.utils.environment()
    assert isinstance(e["cpu_capability"], str) and e["cpu_capability"]  # torch's own name for its kernels
    assert e["isa_variables"] == {"MKL_CBWR": "AVX2"}
    assert set(e["cpu_flags"]) <= {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile"}
    # an entry written before these fields were recorded is the same environment, not a new stretch
    old = [{"from_step": 0, **{k: v for k, v in e.items() if k not in ("cpu_flags", "cpu_capability", "isa_variables")}}]
    monkeypatch.setattr(rpt.utils, "environment", lambda: e)
    assert not rpt.utils.note_environment(old, "from_step", 10) and len(old) == 1
    e2 = {**e, "threads": e["threads"] + 1}
    monkeypatch.setattr(rpt.utils, "environment", lambda: e2)
    assert rpt.utils.note_environment(old, "from_step", 30) and old[-1]["from_step"] == 30


def test_gradient_accumulation_equals_one_big_batch(corpus):
    tmp = corpus["tmp"]
    runs = {}
    for name, (bs, acc) in {"big": (4, 1), "acc": (1, 4), "mixed": (2, 2)}.items():
        cfg = tiny_config(tmp, out_dir=str(tmp / name), steps=3, batch_size=bs, grad_accum=acc, ss_fraction=1.0)
        runs[name] = train(cfg, corpus["root"], corpus["labels"], progress=False)
    ref = weights(runs["big"].checkpoint)
    for name in ("acc", "mixed"):
        for r0, r1 in zip(read_log(tmp / "big"), read_log(tmp / name), strict=True):
            for key in ("lm_loss", "ret_loss", "grad_norm"):
                assert r0[key] == pytest.approx(r1[key], rel=1e-5), (name, key)  # fp32 sums in another order
        w = weights(runs[name].checkpoint)
        bad = {k: (ref[k] - w[k]).abs().max().item() for k in ref if not torch.allclose(ref[k], w[k], atol=1e-4)}
        assert not bad, (name, bad)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, world: int, port: int, cfg, root, labels, fsdp: bool = False) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    train(cfg, root, labels, device="cpu", progress=False, fsdp=fsdp)


def _forked_ranks(world: int, cfg, root, labels, limit_s: float = 300) -> None:
    """Train on `world` gloo ranks forked from this process (they start with its imports: a second each, where spawned
    processes each import torch again; the -m slow FSDP test below spawns them), failing after `limit_s`."""
    import time

    import torch.multiprocessing as mp

    ctx = mp.start_processes(_ddp_worker, args=(world, _free_port(), cfg, root, labels), nprocs=world, join=False,
                             start_method="fork")
    deadline = time.monotonic() + limit_s
    while not ctx.join(timeout=1):  # raises if a rank failed
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the {world} ranks did not finish in {limit_s:.0f} s")


def test_two_gloo_processes_give_the_loss_of_one(corpus):
    tmp = corpus["tmp"]
    kw = dict(steps=3, ss_fraction=1.0, checkpoint_every=3)
    one = tiny_config(tmp, out_dir=str(tmp / "one"), batch_size=2, grad_accum=2, **kw)
    single = train(one, corpus["root"], corpus["labels"], progress=False)
    two = tiny_config(tmp, out_dir=str(tmp / "two"), batch_size=1, grad_accum=2, **kw)  # 2 ranks x 2 x 1 = 4 as well
    _forked_ranks(2, two, corpus["root"], corpus["labels"])
    l1, l2 = read_log(tmp / "one"), read_log(tmp / "two")
    assert len(l1) == len(l2) == 3
    for a, b in zip(l1, l2, strict=True):
        for key in ("lm_loss", "ret_loss", "grad_norm", "recall@2"):
            assert a[key] == pytest.approx(b[key], rel=1e-6), key
        assert a["tokens"] == b["tokens"] and a["ret_pairs"] == b["ret_pairs"]
    w1, w2 = weights(single.checkpoint), weights(ck.latest(tmp / "two"))
    assert all(torch.allclose(w1[k], w2[k], atol=1e-4) for k in w1)
    assert len(ck.load(ck.latest(tmp / "two")).rng) == 2  # both ranks' RNG states are saved


@pytest.mark.slow
def test_fsdp_on_two_gloo_processes_matches_one_process_and_resumes_exactly(corpus):
    import shutil

    import torch.multiprocessing as mp

    tmp = corpus["tmp"]
    kw = dict(steps=3, ss_fraction=1.0, checkpoint_every=2, optimizer="adabelief")  # our optimiser on sharded DTensors
    single = train(tiny_config(tmp, out_dir=str(tmp / "one"), batch_size=2, grad_accum=2, **kw), corpus["root"],
                   corpus["labels"], progress=False)
    two = tiny_config(tmp, out_dir=str(tmp / "fsdp"), batch_size=1, grad_accum=2, **kw)
    mp.spawn(_ddp_worker, args=(2, _free_port(), two, corpus["root"], corpus["labels"], True), nprocs=2, join=True)
    for a, b in zip(read_log(tmp / "one"), read_log(tmp / "fsdp"), strict=True):
        for key in ("lm_loss", "ret_loss", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-6), key
    end = ck.latest(tmp / "fsdp")
    w_fsdp, w1 = weights(end), weights(single.checkpoint)
    assert w_fsdp.keys() == w1.keys() and all(torch.allclose(w1[k], w_fsdp[k], atol=1e-4) for k in w1)
    # a checkpoint written under FSDP has the single-process layout, and an FSDP run resumes from it exactly
    assert ck.load(end).optimizer["state"].keys() == ck.load(single.checkpoint).optimizer["state"].keys()
    shutil.rmtree(end)
    mp.spawn(_ddp_worker, args=(2, _free_port(), two, corpus["root"], corpus["labels"], True), nprocs=2, join=True)
    again = weights(ck.latest(tmp / "fsdp"))
    assert all(torch.equal(again[k], w_fsdp[k]) for k in w_fsdp)


def test_mismatched_labels_are_refused_before_the_first_step(corpus):
    tmp = corpus["tmp"]
    built = []

    def factory(mcfg):
        built.append(1)
        return StandIn(mcfg)

    for change in ({"span": "doc"}, {"chunk_size": 16}, {"tokenizer": {"name": "x", "hash": "y"}}):
        labels = make_labels(corpus["lengths"], 64, 8, 16)
        labels.manifest.update(change)
        path = write_label_store(tmp / "bad", labels)
        with pytest.raises(LabelMismatch, match=next(iter(change))):
            train(tiny_config(tmp), corpus["root"], path, progress=False, model_factory=factory)
    assert not built and not (tmp / "run").exists()


def test_variants_that_retrieve_need_labels(corpus):
    with pytest.raises(ValueError, match="needs retrieval labels"):
        train(tiny_config(corpus["tmp"], variant="retro"), corpus["root"], None, progress=False)


class NaNAfter(StandIn):
    def __init__(self, mcfg, n):
        super().__init__(mcfg)
        self.n, self.calls = n, 0

    def forward(self, *a, **k):
        out = super().forward(*a, **k)
        self.calls += 1
        if self.calls > self.n:
            if out.lm is not None:  # the loss computed in chunks by the model
                out.lm = out.lm._replace(total=out.lm.total * float("nan"))
            else:
                out.logits = out.logits * float("nan")
        return out


def test_non_finite_loss_stops_naming_the_step_and_the_last_good_checkpoint(corpus):
    cfg = tiny_config(corpus["tmp"], checkpoint_every=2)
    with pytest.raises(NonFiniteLoss, match=r"step 3 .*step_00000002"):
        train(cfg, corpus["root"], corpus["labels"], progress=False, model_factory=lambda m: NaNAfter(m, 2))
    assert ck.latest(cfg.train.out_dir).name == "step_00000002"  # nothing after the bad step was written
    assert [r["step"] for r in read_log(corpus["tmp"] / "run")] == [1, 2]


def test_prepare_feeds_gold_neighbours_and_the_sampling_mask(corpus):
    cfg = tiny_config(corpus["tmp"])
    ds = SequenceDataset(open_store(corpus["root"]), 64, 8, 16, make_labels(corpus["lengths"], 64, 8, 16))
    batch = ds.collate([0, 4])
    x = prepare(batch, cfg.model, 1.0, 0, torch.device("cpu"))
    assert x.model_kwargs["use_supplied"].all()
    # gold for query chunk 7 of sequence 0: its positive candidates (s_t > 0) by s_t, best first
    cand, _, target = ds.labels_of(0)
    pos = [(t, c) for c, t in zip(cand[7], target[7], strict=True) if c >= 0 and t > 0]
    want = [c for _, c in sorted(pos, reverse=True)][:2]
    assert x.model_kwargs["neighbor_ids"][0, 7].tolist() == want + [-1] * (2 - len(want))
    assert (x.model_kwargs["neighbor_ids"][:, :4] == -1).all()  # nothing is retrievable in the first two segments
    # the gold's K best as a mask (what gold_top@K is measured against): exactly the supplied neighbours
    ids = x.model_kwargs["neighbor_ids"]
    for b in range(2):
        for i in range(8):
            assert set(x.best[b, i].nonzero().flatten().tolist()) == {c for c in ids[b, i].tolist() if c >= 0}
    assert not prepare(batch, cfg.model, 0.0, 0, torch.device("cpu")).model_kwargs["use_supplied"].any()
    # retro: the BM25 top-K candidates, no sampling; xl: nothing
    retro = prepare(batch, tiny_config(corpus["tmp"], variant="retro").model, 1.0, 0, torch.device("cpu"))
    assert set(retro.model_kwargs) == {"neighbor_ids"}
    for b in range(2):
        for i in range(8):
            ranked = sorted(((s, c) for c, s in zip(batch.candidates[b, i].tolist(), batch.bm25[b, i].tolist(), strict=True)
                             if c >= 0), reverse=True)
            want = [c for _, c in ranked[:2]]
            assert retro.model_kwargs["neighbor_ids"][b, i].tolist() == want + [-1] * (2 - len(want))
    assert prepare(batch, tiny_config(corpus["tmp"], variant="xl").model, 1.0, 0, torch.device("cpu")).model_kwargs == {}


def test_rpt_lex_trains_on_the_bm25_columns_of_sem_labels(corpus):
    """rpt-lex, like retro, reads the BM25 columns of labels of either kind: the corpus's labels are sem ones. (Every
    variant's training on labels of its own kind, its loss, log and checkpoints: tests/test_learning.py.)"""
    res = train(tiny_config(corpus["tmp"], variant="rpt-lex", steps=2, log_every=1), corpus["root"], corpus["labels"],
                progress=False)
    log = read_log(corpus["tmp"] / "run")
    assert res.step == 2 and {"ret_loss", "recall@2", "gold_top@2"} <= set(log[-1]) and all(r["ret_pairs"] > 0 for r in log)
    assert all(0 <= r["gold_top@2"] <= 1 for r in log)


def test_gate_hold_keeps_the_neighbour_gate_at_its_initial_values(corpus):
    """train.gate_hold_steps=2: the gate's parameters (and only they) stay as built for 2 updates, then learn."""
    cfg = tiny_config(corpus["tmp"], steps=3, checkpoint_every=1, gate_hold_steps=2)
    train(cfg, corpus["root"], corpus["labels"], progress=False)
    w = [weights(ck.step_path(cfg.train.out_dir, s)) for s in (1, 2, 3)]
    gate = [n for n in w[0] if n.startswith("gate.")]
    assert gate and all(torch.equal(w[0][n], w[1][n]) for n in gate)
    assert torch.equal(w[1]["gate.w"], torch.zeros_like(w[1]["gate.w"]))  # as built: w starts at 0 (gate 0.5)
    assert not all(torch.equal(w[2][n], w[1][n]) for n in gate)  # released at update 3
    assert not torch.equal(w[0]["embed.weight"], w[1]["embed.weight"])  # the rest trains throughout


def test_the_chunked_lm_loss_trains_like_the_full_logits(corpus):
    """The default chunked loss and train.loss_chunk=0 (full logits) give the same losses and weights."""
    runs = {}
    for chunk in (0, 24):
        cfg = tiny_config(corpus["tmp"] / f"chunk{chunk}", steps=2, loss_chunk=chunk)
        runs[chunk] = train(cfg, corpus["root"], corpus["labels"], progress=False)
    a, b = (read_log(corpus["tmp"] / f"chunk{c}" / "run") for c in (0, 24))
    assert [r["lm_loss"] for r in a] == pytest.approx([r["lm_loss"] for r in b], rel=1e-5)
    wa, wb = weights(runs[0].checkpoint), weights(runs[24].checkpoint)
    diff = {k: (wa[k] - wb[k]).abs().max().item() for k in wa}
    # float rounding only: Adam normalises each gradient, so an element whose gradient is ~0 can move by up to ~lr
    # on one path and not the other; the gradients themselves are compared exactly in tests/model
    assert max(diff.values()) < 1e-3, diff


@pytest.mark.slow  # seconds to tens of seconds: -m slow runs it
def test_compiled_training_matches_eager_and_writes_the_same_checkpoint_keys(corpus, monkeypatch):
    """train.compile=true: the model is compiled in place; losses and weights follow the eager run, and the checkpoint
    has the eager model's keys (it loads into an uncompiled model). Here dynamo captures the model's graphs and runs
    them as captured (backend "eager"); inductor's code generation (20 s with a warm cache, over a minute cold) runs in
    the test below, under -m slow."""
    compile_module = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: compile_module(self, **{**kw, "backend": "eager"}))
    compiled_training_matches_eager(corpus, model={"n_layers": 2, "cca_layers": [1]})  # each kind of layer once


@pytest.mark.slow
def test_inductor_compiled_training_matches_eager(corpus):
    """The same with torch.compile's default backend: losses and weights follow the eager run to float rounding
    (inductor fuses and reorders)."""
    compiled_training_matches_eager(corpus)


def compiled_training_matches_eager(corpus, model: dict | None = None):
    runs = {}
    for comp in (False, True):
        cfg = tiny_config(corpus["tmp"] / f"compile{comp}", steps=2, compile=comp, model=model)
        runs[comp] = train(cfg, corpus["root"], corpus["labels"], progress=False)
    a, b = (read_log(corpus["tmp"] / f"compile{c}" / "run") for c in (False, True))
    assert [r["lm_loss"] for r in a] == pytest.approx([r["lm_loss"] for r in b], rel=1e-4)
    wa, wb = weights(runs[False].checkpoint), weights(runs[True].checkpoint)
    assert wa.keys() == wb.keys()
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-3
    model, cfg = ck.load_model(runs[True].checkpoint)
    assert cfg.train.compile and getattr(model, "_compiled_call_impl", None) is None  # loaded eager, as saved


def test_compile_with_fsdp_is_refused(corpus):
    cfg = tiny_config(corpus["tmp"], steps=1, compile=True)
    with pytest.raises(ValueError, match="train.compile with fsdp"):
        train(cfg, corpus["root"], corpus["labels"], progress=False, fsdp=True)


@pytest.mark.parametrize("ramp, warned", [(5, True), (2, False)])
def test_a_retrieval_ramp_longer_than_the_run_is_warned_with_the_weight_it_reaches(corpus, ramp, warned):
    """alpha_ret ramps linearly over train.alpha_ramp_steps: a ramp past the last update never reaches train.alpha_ret,
    and the warning says what it does reach (0.1 x 2/5 = 0.04); a ramp within the run is not warned."""
    import warnings

    cfg = tiny_config(corpus["tmp"], variant="rpt-sem", steps=2, checkpoint_every=2, alpha_ret=0.1, alpha_ramp_steps=ramp)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        train(cfg, corpus["root"], corpus["labels"], progress=False)
    ramps = [str(w.message) for w in seen if "alpha_ramp_steps" in str(w.message)]
    assert len(ramps) == int(warned)
    if warned:
        assert "train.alpha_ramp_steps=5" in ramps[0] and "train.steps=2" in ramps[0] and "reaches only 0.04 " in ramps[0]
    assert max(r["alpha_ret"] for r in read_log(corpus["tmp"] / "run")) <= (0.04 if warned else 0.1) + 1e-9
