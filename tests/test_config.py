import pytest

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
