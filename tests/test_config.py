import pytest
import yaml

from rpt.checkpoint import checkpoint_config
from rpt.config import PRESETS, ConfigError, RPTConfig


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

    cfg = RPTConfig.from_preset("250m", variant="griffin", n_layers=17, griffin_pattern="A" * 12 + "R" * 5)
    assert cfg.model.n_layers == 17
    with pytest.raises(ConfigError, match="cca_layers"):
        RPTConfig.from_preset("250m", variant="rpt-sem", n_layers=17)


def test_a_recorded_config_missing_a_field_whose_default_changed_gets_the_former_default(tmp_path):
    """The library reads a config as written, today's defaults for what it lacks (a missing init field changes no
    trained weight); the lab, reading results recorded before the copy prior's fields existed (lab.compat), gives them
    the random init they ran with. A field the recorded config does have is kept."""
    from lab.compat import with_former_defaults

    cfg = RPTConfig.from_preset("tiny", variant="retro")
    d = cfg.to_dict()
    for key in ("cca_qk_init", "cca_ov_init", "cca_qk_match_std"):
        del d["model"][key]
    old = yaml.safe_dump(d)
    assert (RPTConfig.from_yaml(old).model.cca_qk_init, RPTConfig.from_yaml(old).model.cca_ov_init) == ("match", "identity")
    rec = RPTConfig.from_yaml(yaml.safe_dump(with_former_defaults(d))).model
    assert (rec.cca_qk_init, rec.cca_ov_init, rec.cca_qk_match_std) == ("random", "random", 0.1)
    d["model"]["cca_qk_init"] = "match"  # written after cca_qk_init existed, before cca_ov_init did
    rec = RPTConfig.from_yaml(yaml.safe_dump(with_former_defaults(d))).model
    assert (rec.cca_qk_init, rec.cca_ov_init) == ("match", "random")
    (tmp_path / "config.yaml").write_text(old)
    assert checkpoint_config(tmp_path).model.cca_qk_init == "match"
    with pytest.raises(ConfigError, match="cca_qk_match_std"):
        RPTConfig.from_preset("tiny", variant="retro", cca_qk_match_std=-1.0)


def test_resume_compares_only_the_model_fields_a_variant_reads():
    """An xl or baseline run resumes whatever CCA's init says (it has no CCA); a retro run with another init, or any
    run with another width, is refused by name. The automatic q/k std equals the explicit value it resolves to."""
    from rpt.training.loop import _model_difference

    def cfg(variant, **model):
        return RPTConfig.from_preset("tiny", variant=variant, **model)

    random_init = {"cca_qk_init": "random", "cca_ov_init": "random"}
    assert _model_difference(cfg("xl", **random_init), cfg("xl")) == ""
    assert _model_difference(cfg("griffin", gate="none", memory_topk=4), cfg("griffin")) == ""
    assert _model_difference(cfg("retro", cca_qk_match_std=0.1), cfg("retro")) == ""
    assert _model_difference(cfg("retro", **random_init, cca_ov_scale=0.3), cfg("retro", **random_init)) == ""
    diff = _model_difference(cfg("retro", **random_init), cfg("retro"))
    assert "model.cca_qk_init 'random' -> 'match'" in diff and "model.cca_ov_init" in diff
    assert "model.griffin_conv 4 -> 3" in _model_difference(cfg("griffin"), cfg("griffin", griffin_conv=3))
    assert "model.d_model" in _model_difference(cfg("xl"), cfg("xl", d_model=32, n_heads=2, mlp_hidden=64))


def test_paper_presets_turn_off_every_addition_and_keep_the_size():
    from rpt.config import PAPER_MODEL, SIZES

    for size in SIZES:
        plain, paper = RPTConfig.from_preset(size), RPTConfig.from_preset(f"{size}-paper")
        for key, value in PAPER_MODEL.items():
            assert getattr(paper.model, key) == value
            assert getattr(plain.model, key) != value  # each is an addition of the default model
        rest = {k: v for k, v in paper.to_dict()["model"].items() if k not in PAPER_MODEL}
        assert rest == {k: v for k, v in plain.to_dict()["model"].items() if k not in PAPER_MODEL}
        assert paper.train == plain.train and paper.data == plain.data
    assert RPTConfig.from_yaml("preset: tiny-paper\nmodel: {cca_rel_bias: true}\n").model.cca_rel_bias is True
