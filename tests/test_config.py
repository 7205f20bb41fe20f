import json

import pytest
import yaml

from rpt.checkpoint import checkpoint_config
from rpt.config import PRESETS, SIZES, ConfigError, RPTConfig, config_differences, flat_config, load_config


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_parses_and_round_trips(name, tmp_path):
    cfg = RPTConfig.from_preset(name)
    path = tmp_path / "c.yaml"
    cfg.to_yaml(path)
    assert RPTConfig.from_yaml(path) == cfg


def test_preset_overrides():
    cfg = RPTConfig.from_preset("tiny", variant="xl", vocab_size=300)
    assert cfg.model.variant == "xl" and cfg.model.vocab_size == 300


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match="model.d_modle"):
        RPTConfig.from_yaml("model:\n  d_modle: 3\n")


def test_wrong_type_is_named():
    with pytest.raises(ConfigError, match="train.lr"):
        RPTConfig.from_yaml("train:\n  lr: fast\n")
    with pytest.raises(ConfigError, match="model.n_layers"):
        RPTConfig.from_yaml("model:\n  n_layers: 2.5\n")
    with pytest.raises(ConfigError, match="model.variant"):
        RPTConfig.from_yaml("model:\n  variant: gpt\n")


def test_preset_key_in_yaml_and_bad_values():
    cfg = RPTConfig.from_yaml("preset: tiny\nmodel:\n  variant: retro\n")
    assert cfg.model.d_model == 64 and cfg.model.variant == "retro"
    with pytest.raises(ConfigError, match="cca_layers"):
        RPTConfig.from_yaml("preset: tiny\nmodel:\n  cca_layers: [0]\n")
    with pytest.raises(ConfigError, match="unknown preset"):
        RPTConfig.from_preset("huge")


def test_yaml_unknown_preset_and_missing_file_are_named(tmp_path):
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        RPTConfig.from_yaml("preset: huge\nmodel:\n  d_model: 8\n")
    with pytest.raises(ConfigError, match="nope.yaml not found"):
        RPTConfig.from_yaml(tmp_path / "nope.yaml")


def test_variants_without_cca_do_not_check_cca_layers():
    """The paper's Griffin row (xl + 5 recurrent layers) and xl + 2 layers build from flags: cca_layers is read only
    by the variants with chunked cross-attention."""
    from rpt.config import ConfigError, RPTConfig

    cfg = RPTConfig.from_preset("250m", variant="griffin", n_layers=17, **{"griffin.pattern": "A" * 12 + "R" * 5})
    assert cfg.model.n_layers == 17
    with pytest.raises(ConfigError, match="cca_layers"):
        RPTConfig.from_preset("250m", variant="rpt-sem", n_layers=17)


def old_layout(config: dict) -> dict:
    """A current config dict as an earlier version of rpt wrote it: flat model keys (cca_rel_bias, gate, gate_eta,
    memory_topk, ...) and data.chunk_size."""
    from rpt.config import MOVED

    d = {k: dict(v) for k, v in config.items()}
    for old, new in MOVED.items():
        (section, name), (new_section, *path) = old.split("."), new.split(".")
        if len(path) == 2:
            d[section][name] = d[new_section][path[0]].pop(path[1])
        else:
            d[section][name] = d[new_section][path[0]]
    d["model"]["cca"].pop("query")  # added after the flat layout was given up: such a config never had it
    for sub in ("cca", "memorizing", "block_recurrent", "griffin"):
        assert not d["model"].pop(sub)
    d["model"]["gate"] = d["model"]["gate"]["kind"]
    return d


def test_a_recorded_config_missing_a_field_whose_default_changed_gets_the_former_default(tmp_path):
    """The library reads a config as written, today's defaults for what it lacks (a missing init field changes no
    trained weight); the lab, reading results recorded before the copy prior's fields existed (lab.compat), gives them
    the random init they ran with. A field the recorded config does have is kept."""
    from lab.compat import with_former_defaults

    cfg = RPTConfig.from_preset("tiny", variant="retro")
    d = old_layout(cfg.to_dict())
    for key in ("cca_qk_init", "cca_ov_init", "cca_qk_match_std"):
        del d["model"][key]
    old = yaml.safe_dump(d)
    got = RPTConfig.from_yaml(old, recorded=True).model
    assert (got.cca.qk_init, got.cca.ov_init) == ("match", "identity")
    rec = RPTConfig.from_yaml(yaml.safe_dump(with_former_defaults(d))).model
    assert (rec.cca.qk_init, rec.cca.ov_init, rec.cca.qk_match_std) == ("random", "random", 0.1)
    d["model"]["cca_qk_init"] = "match"  # written after cca_qk_init existed, before cca_ov_init did
    rec = RPTConfig.from_yaml(yaml.safe_dump(with_former_defaults(d))).model
    assert (rec.cca.qk_init, rec.cca.ov_init) == ("match", "random")
    (tmp_path / "config.yaml").write_text(old)
    assert checkpoint_config(tmp_path).model.cca.qk_init == "match"
    with pytest.raises(ConfigError, match="cca.qk_match_std"):
        RPTConfig.from_preset("tiny", variant="retro", **{"cca.qk_match_std": -1.0})


def test_named_settings_select_the_paper_or_the_default_whole():
    """model.cca: paper and model.gate: paper are the paper's model as printed (what the -paper presets set); default
    is this code's; a field set after a setting changes it, a setting set after a field replaces it."""
    paper = {"qk_init": "random", "ov_init": "random", "rel_bias": False, "shift_values": False, "context_norm": False}
    for size in SIZES:
        plain = RPTConfig.from_preset(size)
        cfg = RPTConfig.from_yaml(f"preset: {size}\nmodel: {{cca: paper, gate: paper}}\n")
        assert {k: getattr(cfg.model.cca, k) for k in paper} == paper and cfg.model.gate.on == "states"
        assert cfg.model.cca.positions is True and cfg.model.gate.kind == "paper" and cfg.model.gate.eta == 0.1
        rest = {k: v for k, v in cfg.to_dict()["model"].items() if k not in ("cca", "gate")}
        assert rest == {k: v for k, v in plain.to_dict()["model"].items() if k not in ("cca", "gate")}
        assert RPTConfig.from_preset(size, cca="paper", gate="paper").model == cfg.model
    assert RPTConfig.from_preset("tiny", cca="default", gate="default").model == RPTConfig.from_preset("tiny").model
    on = RPTConfig.from_yaml("preset: tiny\nmodel: {cca: paper, cca.rel_bias: true}\n").model.cca
    assert on.rel_bias is True and on.shift_values is False
    again = RPTConfig.from_yaml("preset: tiny\nmodel: {cca: {rel_bias: false, shift_values: true}}\n").model
    assert again.cca.rel_bias is False and again.cca.shift_values is True and again.cca.context_norm is True
    assert load_config("paper-250m-code").model.cca == RPTConfig.from_preset("250m", cca="paper").model.cca
    with pytest.raises(ConfigError,
                       match=r"model.cca='printed' is not a named setting of model.cca \(choose from paper, default"):
        RPTConfig.from_yaml("model: {cca: printed}\n")
    with pytest.raises(ConfigError, match=r"model.gate.kind=clamp"):
        RPTConfig.from_yaml("model: {gate: clamp}\n")


def test_nested_keys_in_set_yaml_and_api(tmp_path):
    """--set model.cca.rel_bias=false, model.cca=paper, the YAML forms and rpt's dotted keyword arguments reach the
    nested field; flat_config and config_differences name it model.cca.rel_bias."""
    from rpt.api import build_train_config
    from rpt.commands.options import parse_sets

    def config_with(config, values):
        return build_train_config(config, values, placeholder_vocab=True)

    sets = parse_sets(["model.cca=paper", "model.cca.rel_bias=true", "model.memorizing.topk=4", "model.gate.kind=clamp"])
    assert sets == {"model.cca": "paper", "model.cca.rel_bias": True, "model.memorizing.topk": 4, "model.gate.kind": "clamp"}
    cfg = config_with("tiny", sets)
    assert cfg.model.cca.rel_bias is True and cfg.model.cca.shift_values is False
    assert cfg.model.memorizing.topk == 4 and cfg.model.gate.kind == "clamp" and cfg.model.gate.on == "values"
    flat, base = flat_config(cfg.to_dict()), flat_config(RPTConfig.from_preset("tiny").to_dict())
    assert flat["model.cca.rel_bias"] is True and "model.cca_rel_bias" not in flat
    diff = config_differences(base, flat)
    assert "model.memorizing.topk 32 -> 4" in diff and "model.cca.shift_values True -> False" in diff
    assert config_with("tiny", {"model.cca.rel_bias": True, "model.cca": "paper"}).model.cca.rel_bias is False


@pytest.mark.parametrize("key, new", [("model.cca_rel_bias", "model.cca.rel_bias"), ("model.gate_eta", "model.gate.eta"),
                                      ("model.memory_topk", "model.memorizing.topk"),
                                      ("model.recurrent_state", "model.block_recurrent.state"),
                                      ("model.griffin_pattern", "model.griffin.pattern"),
                                      ("data.chunk_size", "model.chunk_size")])
def test_an_old_flat_key_is_refused_naming_the_new_one(key, new):
    from rpt.api import build_train_config

    def config_with(config, values):
        return build_train_config(config, values, placeholder_vocab=True)

    section, name = key.split(".")
    value = {"model.griffin_pattern": "RA", "model.gate_eta": 0.2}.get(key, 8 if "chunk" in key or "state" in key
                                                                       or "topk" in key else False)
    for make in (lambda: RPTConfig.from_yaml(f"preset: tiny\n{section}: {{{name}: {json.dumps(value)}}}\n"),
                 lambda: config_with("tiny", {key: value})):
        with pytest.raises(ConfigError) as e:
            make()
        assert "\n" not in str(e.value) and key in str(e.value) and new in str(e.value)


def test_a_run_folder_with_the_old_flat_keys_loads(tmp_path):
    """A run folder written before the nested sections (its config.yaml with model.cca_rel_bias, model.gate: clamp,
    model.memory_topk, data.chunk_size, ...) still loads: checkpoint_config, load_config of the folder and rpt.load."""
    import rpt
    from rpt.checkpoint import file_records, rng_state, save
    from rpt.model.registry import build_model

    cfg = RPTConfig.from_preset("tiny", variant="retro", vocab_size=64, **{"cca.rel_bias": False, "gate.kind": "clamp",
                                                                         "memorizing.topk": 7})
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(old_layout(cfg.to_dict())))
    assert "cca_rel_bias" in (run / "config.yaml").read_text()
    for got in (checkpoint_config(run), load_config(run)):
        assert got == cfg
    with pytest.raises(ConfigError, match="model.gate.kind|model.cca.rel_bias"):
        RPTConfig.from_yaml(run / "config.yaml")  # a config file someone writes gets no such leniency
    step = save(run, 1, build_model(cfg.model, seed=0).state_dict(), {}, cfg, [rng_state()], {})
    (step / "config.yaml").write_text(yaml.safe_dump(old_layout(cfg.to_dict())))  # as an earlier rpt saved it
    state = json.loads((step / "state.json").read_text())
    (step / "state.json").write_text(json.dumps({**state, "files": file_records(step)}))
    loaded = rpt.load(run, device="cpu")
    assert loaded.config.model == cfg.model


def test_resume_compares_only_the_model_fields_a_variant_reads():
    """An xl or baseline run resumes whatever CCA's init says (it has no CCA); a retro run with another init, or any
    run with another width, is refused by name. The automatic q/k std equals the explicit value it resolves to."""
    from rpt.training.loop import _model_difference

    def cfg(variant, **model):
        return RPTConfig.from_preset("tiny", variant=variant, **model)

    random_init = {"cca.qk_init": "random", "cca.ov_init": "random"}
    assert _model_difference(cfg("xl", **random_init), cfg("xl")) == ""
    assert _model_difference(cfg("griffin", **{"gate.kind": "none"}, **{"memorizing.topk": 4}), cfg("griffin")) == ""
    assert _model_difference(cfg("retro", **{"cca.qk_match_std": 0.1}), cfg("retro")) == ""
    assert _model_difference(cfg("retro", **random_init, **{"cca.ov_scale": 0.3}), cfg("retro", **random_init)) == ""
    diff = _model_difference(cfg("retro", **random_init), cfg("retro"))
    assert "model.cca.qk_init 'random' -> 'match'" in diff and "model.cca.ov_init" in diff
    assert "model.griffin.conv 4 -> 3" in _model_difference(cfg("griffin"), cfg("griffin", **{"griffin.conv": 3}))
    assert "model.d_model" in _model_difference(cfg("xl"), cfg("xl", d_model=32, n_heads=2, mlp_hidden=64))


