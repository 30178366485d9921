"""Config files and `--set` overrides."""

from pathlib import Path

import pytest

from vit.errors import ConfigError
from vit.recipes.load import apply_overrides, load_config

pytestmark = pytest.mark.timeout(60)

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.py"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_config_loads_with_the_fields_tools_rely_on(path):
    config = load_config(path)
    for key in ("steps", "checkpoint_every", "batch_size"):
        assert isinstance(config.train[key], int)
    assert config.data.name


def test_overrides_are_typed_by_the_current_value():
    config = load_config(CONFIGS[0], ["train.steps=7", "optim.lr=0.5", "input.flip=true",
                                      "input.mean=0.1,0.2,0.3", "data.data_dir=/tmp/x",
                                      "optim.lr=3"])
    assert config.train.steps == 7 and isinstance(config.train.steps, int)
    assert config.optim.lr == 3.0 and isinstance(config.optim.lr, float)
    assert config.input.flip is True
    assert list(config.input.mean) == [0.1, 0.2, 0.3]
    assert config.data.data_dir == "/tmp/x"


@pytest.mark.parametrize("item, message", [
    ("train.steps=1.5", "expected int"),
    ("train.steps=ten", "expected int"),
    ("input.flip=maybe", "expected true or false"),
    ("train.stpes=10", "did you mean train.steps"),
    ("optim.learning_rate=1", "no such config key"),
    ("train.steps", "write KEY=VALUE"),
])
def test_bad_overrides_are_one_line_errors(item, message):
    config = load_config(CONFIGS[0])
    with pytest.raises(ConfigError, match=message) as err:
        apply_overrides(config, [item])
    assert "\n" not in str(err.value)


def test_missing_config_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "nope.py")
    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(ConfigError, match="get_config"):
        load_config(tmp_path / "empty.py")


# One set of typing rules for `--set`: a recipe key typed by its current value and a model field
# typed by ViTConfig's annotation read the same text as the same value.
def _model_recipe():
    """A recipe whose `model` block holds ViTConfig's defaults (None where the default is)."""
    import ml_collections

    from vit.models.config import ViTConfig

    return ml_collections.ConfigDict({"model": ViTConfig().to_dict()})


@pytest.mark.parametrize("item, value", [
    ("dropout=0.1", 0.1),
    ("dropout=1", 1.0),
    ("depth=6", 6),
    ("class_token=false", False),
    ("class_token=True", True),
    ("qk_norm=1", True),
    ("patch_size=(14,14)", (14, 14)),
    ("patch_size=[14,14]", (14, 14)),
    ("patch_size=14,14", (14, 14)),
    ("image_size=384x512", (384, 512)),
    ("representation_size=None", None),
    ("representation_size=null", None),
    ("representation_size=768", 768),
    ("layer_scale=1e-5", 1e-5),
    ("classifier=gap", "gap"),
])
def test_model_and_recipe_overrides_type_the_same_text_alike(item, value):
    from vit.recipes.model_fields import parse_model_overrides

    key = item.split("=", 1)[0]
    by_model = parse_model_overrides([item])[key]
    config = _model_recipe()
    apply_overrides(config, [f"model.{item}"])
    by_recipe = config.model[key]
    assert by_model == by_recipe == value
    assert type(by_model) is type(by_recipe) is type(value)


def test_an_int_image_size_stays_an_int_on_both_paths():
    from vit.recipes.model_fields import parse_model_overrides

    config = load_config(CONFIGS[0], ["input.image_size=384"])
    assert config.input.image_size == 384 == parse_model_overrides(["image_size=384"])[
        "image_size"]


@pytest.mark.parametrize("item, message", [
    ("depth=deep", "expected int, e.g. --set {key}=12"),
    ("depth=1.5", "expected int, e.g. --set {key}=12"),
    ("dropout=true", "expected float, e.g. --set {key}=0.0"),
    ("class_token=maybe", "expected true or false, e.g. --set {key}=true"),
    ("qk_norm=2", "expected true or false, e.g. --set {key}=false"),
])
def test_model_and_recipe_overrides_reject_a_mistyped_value_alike(item, message):
    from vit.recipes.model_fields import parse_model_overrides

    key, text = item.split("=", 1)
    with pytest.raises(ConfigError) as by_model:
        parse_model_overrides([item])
    with pytest.raises(ConfigError) as by_recipe:
        apply_overrides(_model_recipe(), [f"model.{item}"])
    assert str(by_model.value).startswith(f"--set {key}={text}: {message.format(key=key)}")
    # Word for word the same error; only the key is spelt as each path spells it.
    assert str(by_recipe.value) == str(by_model.value).replace(f"--set {key}=",
                                                                f"--set model.{key}=")


def test_the_shared_parser_is_light():
    """`vit info --set` must not pay for ml_collections (recipes) or jax through the parser."""
    import subprocess
    import sys

    code = ("import sys, vit.recipes.overrides; "
            "print(sorted(m for m in ('ml_collections', 'jax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_configs_saved_before_act_layer_keep_their_activation():
    """Checkpoints and workdirs written when the field was `gelu: exact | tanh` still load,
    with the activation they were trained with."""
    from vit.models.config import ViTConfig

    old = {**ViTConfig(width=32, depth=1, mlp_dim=64, num_heads=2).to_dict()}
    del old["act_layer"]
    for saved, meant in (("exact", "gelu"), ("tanh", "gelu_tanh")):
        assert ViTConfig.from_dict({**old, "gelu": saved}).act_layer == meant
    assert ViTConfig.from_dict({**old, "gelu": "tanh", "unknown_later_field": 1}).depth == 1
