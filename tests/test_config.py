"""Config files and `--set` overrides."""

from pathlib import Path

import pytest

from vit.config import apply_overrides, load_config
from vit.errors import ConfigError

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
