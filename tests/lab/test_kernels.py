"""The attention-kernel check (lab.kernels, `python -m lab bench --kernels`): it reads the kernel each SDPA call took from the
profiler, names the call site, and catches the unfused math path."""

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lab.cli import main
from lab.kernels import FUSED, probe_kernels, probe_sdpa


class TwoCalls(nn.Module):
    """One call a fused CPU kernel takes (no mask) and one it cannot (an additive mask that requires grad)."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(1, 1, 8, 8))

    def plain(self, q: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, q, q)

    def learned_bias(self, q: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, q, q, attn_mask=self.bias)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return self.plain(q) + self.learned_bias(q) + self.plain(q)


def test_probe_names_sites_and_catches_the_math_path():
    model = TwoCalls()
    q = torch.randn(2, 2, 8, 16)
    real = F.scaled_dot_product_attention
    rows = {r["site"].split(":")[1].split(" ")[0]: r for r in probe_sdpa(lambda: model(q), model)}
    assert set(rows) == {"TwoCalls.plain", "TwoCalls.learned_bias"}
    assert rows["TwoCalls.plain"]["calls"] == 2 and rows["TwoCalls.learned_bias"]["calls"] == 1
    assert rows["TwoCalls.learned_bias"]["kernels"] == {"math": 1} and not rows["TwoCalls.learned_bias"]["fused"]
    assert "grad" in rows["TwoCalls.learned_bias"]["mask"]
    assert set(rows["TwoCalls.plain"]["kernels"]) <= FUSED and rows["TwoCalls.plain"]["fused"]
    model.bias.requires_grad_(False)  # the same bias, not learned: the fused kernel takes it
    rows = {r["site"].split(":")[1].split(" ")[0]: r for r in probe_sdpa(lambda: model(q), model)}
    assert rows["TwoCalls.learned_bias"]["fused"]
    assert F.scaled_dot_product_attention is real  # put back afterwards


def test_rpt_sem_kernels_on_cpu():
    """Invariants of the report for rpt-sem that hold whatever kernels a torch build offers: every attention call site
    of the model is reported once per phase with its call count, each row's `fused` agrees with the kernels it names,
    and the overall verdict with its rows. Which fused kernel a build takes (flash-cpu today) is not pinned. One choice
    is our code's, not the build's: CCA's training forward on a CPU attends directly (its learned relative bias is a
    mask that requires grad), so it is reported as the unfused "direct" path."""
    r = probe_kernels("rpt-sem", "tiny", seq_len=512, batch_size=1, eval_tokens=256)
    known = FUSED | {"math", "unknown", "direct"}
    for phase in ("train", "eval"):
        rows = r[phase]
        sites = [row["site"] for row in rows]
        assert len(sites) == len(set(sites)), sites  # one row per call site
        for row in rows:
            assert set(row["kernels"]) <= known and sum(row["kernels"].values()) == row["calls"], row
            assert row["fused"] == (set(row["kernels"]) <= FUSED), row
        # tiny: 4 layers, CCA in 2; training is one forward, evaluation two segment steps (256 tokens)
        steps = 1 if phase == "train" else 2
        window = "SelfAttention.forward" if phase == "train" else "attend_after_cache < SelfAttention.step"
        calls = {s.split(":", 1)[1]: row["calls"] for s, row in zip(sites, rows, strict=True)}
        assert calls == {f"{window} [layers.*.attn]": 4 * steps, "Attention.forward [encoder.attn]": steps,
                         "Attention.forward [query_aug.self_attn]": steps, "Attention.forward [query_aug.cross_attn]": steps,
                         "Attention.forward [gate.attn]": steps, "ChunkedCrossAttention.forward [layers.*.cca]": 2 * steps}
    cca = next(row for row in r["train"] if "ChunkedCrossAttention" in row["site"])
    assert cca["kernels"] == {"direct": 2} and not cca["fused"]
    assert r["fused"] == all(row["fused"] for phase in ("train", "eval") for row in r[phase])
    assert not r["fused"]  # the direct CCA rows are unfused


def test_cca_through_sdpa_takes_the_math_path_in_cpu_training(monkeypatch):
    from rpt.model.cca import ChunkedCrossAttention

    monkeypatch.setattr(ChunkedCrossAttention, "direct_attention", False)
    r = probe_kernels("retro", "tiny", seq_len=512, batch_size=1, eval_tokens=0)
    cca = [row for row in r["train"] if "ChunkedCrossAttention" in row["site"]]
    assert cca and {k for row in cca for k in row["kernels"]} == {"math"} and "grad" in cca[0]["mask"]


def test_bench_kernels_cli(tmp_path, capsys):
    out = tmp_path / "k.json"
    assert main(["bench", "--kernels", "--variants", "xl,retro", "--seq-len", "256", "--batch-size", "1",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "unfused (math path or direct): retro: cca.py:ChunkedCrossAttention.forward [layers.*.cca] (train)" in text
    data = json.loads(out.read_text())
    assert [r["variant"] for r in data["kernels"]] == ["xl", "retro"] and data["kernels"][0]["fused"]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["xl", "rpt-sem", "memorizing", "block-recurrent", "griffin"])
def test_gpu_attention_is_fused_in_bf16(variant):
    """On a GPU in bf16: every attention call, the sliding window and CCA included, takes flash, efficient or cuDNN."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    r = probe_kernels(variant, "small", seq_len=4096, batch_size=1, device="cuda", precision="bf16", eval_tokens=1024)
    unfused = [(phase, row["site"], row["kernels"]) for phase in ("train", "eval") for row in r[phase] if not row["fused"]]
    assert not unfused, unfused


def test_attention_dropout_is_recorded_and_takes_the_math_path_on_cpu():
    """This CPU build has no fused kernel with attention dropout: every preset but tiny trains with dropout 0.05."""
    q = torch.randn(1, 2, 8, 16)
    rows = probe_sdpa(lambda: (F.scaled_dot_product_attention(q, q, q, dropout_p=0.1),
                               F.scaled_dot_product_attention(q, q, q)))
    assert [(r["dropout"], r["fused"]) for r in rows] == [(0.1, False), (0.0, True)]
    assert rows[0]["kernels"] == {"math": 1}


@pytest.mark.parametrize("variant", ["rpt-sem", "memorizing", "block-recurrent", "griffin"])
def test_attn_dropout_sets_the_dropout_of_every_attention_call(variant):
    """model.attn_dropout: -1 (default) keeps the one dropout rate on the attention probabilities too; 0 turns it off
    in every attention call of every variant (so a CPU takes its fused kernels) and leaves the residual dropout."""
    from rpt.config import RPTConfig
    from rpt.model.registry import build_model

    seen, residual = {}, {}
    for attn in (-1.0, 0.0):
        cfg = RPTConfig.from_preset("tiny", variant=variant)
        cfg.model.dropout, cfg.model.attn_dropout = 0.05, attn
        model = build_model(cfg.model, seed=0).train()
        ids = torch.randint(0, cfg.model.vocab_size, (1, 256))
        rows = probe_sdpa(lambda m=model, x=ids: m(x), model)
        seen[attn] = {r["dropout"] for r in rows if "StateCell" not in r["site"]}  # the state's own attention: none
        residual[attn] = [m.p for m in model.modules() if isinstance(m, nn.Dropout)]
    assert seen == {-1.0: {0.05}, 0.0: {0.0}}
    assert residual[0.0] == residual[-1.0] and 0.05 in residual[0.0]  # the other dropouts are left as they were


def test_attn_dropout_out_of_range_is_refused():
    from rpt.config import ConfigError, RPTConfig

    cfg = RPTConfig.from_preset("tiny")
    cfg.model.attn_dropout = 1.5
    with pytest.raises(ConfigError, match="model.attn_dropout=1.5"):
        cfg.validate()


def test_attn_dropout_benchmark_runs(tmp_path, benchmark_script):
    """benchmarks/attn_dropout.py (the §2c measurement) at a toy size: three settings per variant, ratios per round."""
    mod = benchmark_script("attn_dropout")
    out = tmp_path / "a.json"
    mod.main(["preset=tiny", "seq=256", "variants=xl", "rounds=2", "steps=1", f"out={out}"])
    rows = json.loads(out.read_text())["variants"]["xl"]
    assert set(rows) == set(mod.SETTINGS) and all(len(r["seconds_per_update"]) == 2 for r in rows.values())
    ref = rows["attn_dropout=0"]["seconds_per_update"]
    for name, r in rows.items():  # each round's time against the reference setting's time in the same round
        want = [a / b for a, b in zip(r["seconds_per_update"], ref, strict=True)]
        assert r["ratio_to_attn_dropout_0"] == pytest.approx(want), name
    assert any(r != 1.0 for name, row in rows.items() if name != "attn_dropout=0" for r in row["ratio_to_attn_dropout_0"])


@pytest.mark.parametrize("flags, needle", [(["--variants", "xl,gpt"], "--variants"), (["--preset", "huge"], "--preset")]
                         + ([(["--device", "cuda"], "--device cuda")] if not torch.cuda.is_available() else []))
def test_bench_kernels_bad_flags_are_one_line(flags, needle, capsys):
    assert main(["bench", "--kernels", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
