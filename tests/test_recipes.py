"""Recipes over defaults: every key has one default (vit/recipes/defaults.py), a shipped recipe
sets only what differs and loads the very values it held when it spelt every key out, `--set`
types a key the recipe leaves out by its default, and a workdir trained before the recipes were
trimmed resumes under the trimmed ones."""

import json
from pathlib import Path

import ml_collections
import pytest
from builders import tiny_recipe_sets

from vit.errors import ConfigError
from vit.recipes.defaults import DEFAULTS, default_tree, type_of
from vit.recipes.load import load_config, with_defaults

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).parent.parent
TEXT_PARTS = "(text_path|prompt_head)/.*"  # promptshapes keeps its cross-attention shut

# Each shipped recipe as it loaded when it set every key (the files before the defaults
# existed), written out by hand: the trimmed files must load to these values.
SPELT_OUT = {
    "cifar10_finetune": dict(
        seed=0, init="",
        data=dict(name="tfds:cifar10", data_dir=None, train_split="train[:98%]",
                  val_split="train[98%:]", test_split="test", strict=False, num_threads=8),
        model=dict(name="B/16", dropout=0.0, drop_path=0.0, attention_impl="auto",
                   dtype="auto", remat=False),  # since spelt out: bfloat16 where it pays
        input=dict(image_size=384, resample="bilinear", crop_pct=None, mean=None, std=None,
                   inception_crop=True, crop_area=[0.05, 1.0], flip=True, shift=0.0, rotate=0.0,
                   scale=0.0, mixup=0.0, cutmix=0.0, label_smoothing=0.0),
        optim=dict(name="sgd", lr=0.03, warmup_steps=500, schedule="cosine", weight_decay=0.0,
                   b1=0.9, b2=0.999, momentum=0.9, clip_norm=1.0, layer_decay=1.0, trainable=".*"),
        train=dict(steps=10000, batch_size=512, accum_steps=8, eval_every=1000,
                   checkpoint_every=1000, keep_checkpoints=2, log_every=50, ema_decay=0.0,
                   eval_batch_size=256),
        parallel=dict(data=-1, fsdp=1, rules=[[".*", "auto"]]),
    ),
    "digits": dict(
        seed=0, init="",
        data=dict(name="digits", data_dir=None, train_split="train", val_split="validation",
                  test_split="test", strict=False, num_threads=1),
        model=dict(name="Ti/16", width=64, depth=4, mlp_dim=128, num_heads=4, patch_size=2,
                   stem=[32], classifier="gap", class_token=False, dropout=0.0, drop_path=0.0,
                   attention_impl="xla"),
        input=dict(image_size=8, resample="bilinear", crop_pct=None, mean=[0.5, 0.5, 0.5],
                   std=[0.5, 0.5, 0.5], inception_crop=False, flip=False, shift=1.0, rotate=8.0,
                   scale=0.08, mixup=0.0, cutmix=0.0, label_smoothing=0.1),
        optim=dict(name="adamw", lr=0.003, warmup_steps=100, schedule="cosine",
                   weight_decay=0.05, b1=0.9, b2=0.999, momentum=0.9, clip_norm=1.0,
                   layer_decay=1.0, trainable=".*"),
        train=dict(steps=3000, batch_size=64, accum_steps=1, eval_every=500,
                   checkpoint_every=500, keep_checkpoints=2, log_every=50, ema_decay=0.0,
                   eval_batch_size=128),
        parallel=dict(data=-1, fsdp=1, rules=[[".*", "auto"]]),
    ),
    "imagefolder": dict(
        seed=0, init="",
        data=dict(name="/path/to/images", data_dir=None, train_split="train",
                  val_split="validation", test_split="test", strict=False, num_threads=4),
        model=dict(name="B/16", dropout=0.0, drop_path=0.0, attention_impl="auto",
                   dtype="auto", remat=False),  # since spelt out: bfloat16 where it pays
        input=dict(image_size=224, resample="bilinear", crop_pct=None, mean=None, std=None,
                   inception_crop=True, crop_area=[0.25, 1.0], flip=True, shift=0.0, rotate=0.0,
                   scale=0.0, mixup=0.0, cutmix=0.0, label_smoothing=0.1),
        optim=dict(name="sgd", lr=0.01, warmup_steps=100, schedule="cosine", weight_decay=0.0,
                   b1=0.9, b2=0.999, momentum=0.9, clip_norm=1.0, layer_decay=1.0, trainable=".*"),
        train=dict(steps=2000, batch_size=64, accum_steps=1, eval_every=200,
                   checkpoint_every=200, keep_checkpoints=2, log_every=20, ema_decay=0.0,
                   eval_batch_size=64),
        parallel=dict(data=-1, fsdp=1, rules=[[".*", "auto"]]),
    ),
    "pets_finetune": dict(
        seed=0, init="",
        data=dict(name="tfds:oxford_iiit_pet", data_dir=None, train_split="train[:90%]",
                  val_split="train[90%:]", test_split="test", strict=False, num_threads=8),
        model=dict(name="B/16", dropout=0.0, drop_path=0.0, attention_impl="auto",
                   dtype="auto", remat=False),  # since spelt out: bfloat16 where it pays
        input=dict(image_size=224, resample="bilinear", crop_pct=None, mean=None, std=None,
                   inception_crop=True, crop_area=[0.05, 1.0], flip=True, shift=0.0, rotate=0.0,
                   scale=0.0, mixup=0.0, cutmix=0.0, label_smoothing=0.0),
        optim=dict(name="sgd", lr=0.01, warmup_steps=100, schedule="cosine", weight_decay=0.0,
                   b1=0.9, b2=0.999, momentum=0.9, clip_norm=1.0, layer_decay=1.0, trainable=".*"),
        train=dict(steps=500, batch_size=512, accum_steps=4, eval_every=100,
                   checkpoint_every=100, keep_checkpoints=2, log_every=10, ema_decay=0.0,
                   eval_batch_size=256),
        parallel=dict(data=-1, fsdp=1, rules=[[".*", "auto"]]),
    ),
    # Since spelt out: longer prompts (max_len 48), the things head, 900 text and 100 gentler
    # tune steps, colour and shape labels, the cross-attention closed; the values below are the
    # recipe's today.
    "promptshapes": dict(
        seed=0, init="",
        data=dict(name="promptshapes", data_dir=None, labels="attributes", train_split="train",
                  val_split="test", test_split="test", heldout_split="heldout", strict=False,
                  num_threads=1),
        model=dict(name="Ti/16", width=128, depth=4, mlp_dim=256, num_heads=4, patch_size=16,
                   classifier="gap", class_token=False, attention_impl="xla", patch_classes=25,
                   text=dict(source="bytes", max_len=48, width=64, depth=1, num_heads=2,
                             mlp_dim=128, xattn_start=2, xattn_every=1, head="things")),
        input=dict(image_size=64, resample="bilinear", crop_pct=None, mean=[0.5, 0.5, 0.5],
                   std=[0.5, 0.5, 0.5], inception_crop=False, flip=False, shift=0.0, rotate=0.0,
                   scale=0.0, mixup=0.0, cutmix=0.0, label_smoothing=0.0),
        optim=dict(name="adamw", lr=0.003, warmup_steps=100, schedule="cosine",
                   weight_decay=0.05, b1=0.9, b2=0.999, momentum=0.9, clip_norm=1.0,
                   layer_decay=1.0, trainable=".*", lr_mults=[], no_decay=""),
        train=dict(steps=600, batch_size=64, accum_steps=1, eval_every=300,
                   checkpoint_every=300, keep_checkpoints=1, log_every=50, ema_decay=0.0,
                   eval_batch_size=250, loss="sigmoid_xent"),
        parallel=dict(data=-1, fsdp=1, rules=[[".*", "auto"]]),
        stages=dict(
            vit=dict(order=0, text=False, skip_with_init=True,
                     train=dict(steps=800, loss="sigmoid_xent", patch_loss=1.0)),
            text=dict(order=1, train=dict(steps=900, loss="prompt_xent"),
                      optim=dict(lr=0.002, warmup_steps=50, trainable=TEXT_PARTS)),
            tune=dict(order=2, train=dict(steps=100, loss="prompt_xent"),
                      optim=dict(lr=0.0003, warmup_steps=20,
                                 trainable=f"{TEXT_PARTS}|blocks/[23]/.*|norm/.*")),
        ),
    ),
}


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _as_json(config) -> dict:
    """What a workdir's config.json holds: tuples as lists."""
    return json.loads(config.to_json()) if hasattr(config, "to_json") else json.loads(
        json.dumps(config))


def _model_field_types():
    from vit.commands.train import model_field_types

    return model_field_types()


def _fallbacks() -> dict:
    """What training used for a key a spelt-out recipe left out, taken from the code that read
    it (a `.get` default or the augmentation dataclass), not from the recipe defaults."""
    from vit.data import Augment
    from vit.training.losses import DEFAULT

    return {"train.loss": DEFAULT, "optim.lr_mults": [], "optim.no_decay": "",
            "data.heldout_split": None, "data.labels": None,
            "input.crop_area": list(Augment().crop_area),
            # Features newer than the spelt-out recipes: off where they change the training,
            # and TensorBoard files beside metrics.jsonl, which change nothing trained.
            "input.randaugment": "", "input.random_erasing": 0.0, "input.scene_jitter": False,
            "train.early_stop_patience": 0, "train.tensorboard": True, "train.patch_loss": 0.0,
            # The CPU step's split, a constant of the step before it was a key.
            "train.micro_tokens": 1536}


@pytest.mark.parametrize("name", sorted(SPELT_OUT))
def test_a_trimmed_recipe_loads_the_values_it_spelt_out(name):
    loaded = _flat(_as_json(load_config(ROOT / "configs" / f"{name}.py",
                                        model_field_types=_model_field_types)))
    before = _flat(_as_json(SPELT_OUT[name]))
    for key, value in before.items():
        assert loaded.get(key, "(absent)") == value, key
    # Keys the spelt-out recipe left out now hold what training used in their absence:
    # falsy `.get` fallbacks (`optim.get("lr_mults")`) stay falsy, the others equal.
    fallbacks = _fallbacks()
    added = {key: loaded[key] for key in set(loaded) - set(before)}
    assert set(added) <= set(fallbacks), sorted(set(added) - set(fallbacks))
    for key, value in added.items():
        assert value == fallbacks[key], key


@pytest.mark.parametrize("name", sorted(SPELT_OUT))
def test_a_recipe_sets_only_what_differs_from_the_defaults(name):
    from vit.recipes.load import _run_recipe

    recipe = _run_recipe(ROOT / "configs" / f"{name}.py").get_config().to_dict()
    defaults = _flat(_as_json(default_tree()))
    model = recipe.pop("model")
    recipe.pop("stages", None)
    repeated = [key for key, value in _flat(_as_json(recipe)).items()
                if key in defaults and defaults[key] == value]
    assert not repeated, f"configs/{name}.py repeats defaults: {repeated}"
    assert model["name"]  # the model section keeps its keys: see test_an_old_workdir_resumes


def test_every_key_has_a_one_line_meaning_and_a_default_of_its_type():
    from vit.recipes.overrides import convert

    for key, entry in DEFAULTS.items():
        assert entry.meaning and "\n" not in entry.meaning and len(entry.meaning) < 120, key
        assert convert(entry.default, type_of(key)) == entry.default, key
    # The defaults are fresh copies: changing one loaded recipe leaves the next one alone.
    default_tree()["optim"]["lr_mults"].append(["x", 2.0])
    assert default_tree()["optim"]["lr_mults"] == []


def _recipe(tmp_path, body: str, name: str = "recipe.py") -> Path:
    path = tmp_path / name
    path.write_text("import ml_collections\n\n\ndef get_config():\n"
                    "    c = ml_collections.ConfigDict()\n"
                    + "".join(f"    {line}\n" for line in body.strip().splitlines())
                    + "    return c\n")
    return path


def test_a_recipe_of_one_line_gets_every_default(tmp_path):
    config = load_config(_recipe(tmp_path, 'c.data = dict(name="digits")'))
    got = _flat(_as_json(config))
    want = {**_flat(_as_json(default_tree())), "data.name": "digits"}
    assert got == want
    # Written out by hand: the fine-tuning defaults the module's docstring promises.
    assert (config.optim.name, config.optim.lr, config.optim.momentum) == ("sgd", 0.01, 0.9)
    assert (config.input.image_size, config.input.inception_crop, config.input.flip) == (
        224, True, True)
    assert (config.parallel.data, config.parallel.fsdp) == (-1, 1)


@pytest.mark.parametrize("key", sorted(DEFAULTS))
def test_every_default_key_can_be_written_in_a_recipe_and_set(tmp_path, key):
    section, _, leaf = key.rpartition(".")
    value = "digits" if key == "data.name" else DEFAULTS[key].default
    if section:
        fields = {"name": "digits"} if section == "data" else {}
        body = f"c.{section} = {fields | {leaf: value}!r}"
    else:
        body = f"c.{leaf} = {value!r}"
    config = load_config(_recipe(tmp_path, f'c.data = dict(name="digits")\n{body}'))
    assert _flat(_as_json(config))[key] == _as_json({"v": value})["v"]
    config = load_config(_recipe(tmp_path, 'c.data = dict(name="digits")'),
                         [f"{key}={json.dumps(value)}"])
    assert _flat(_as_json(config))[key] == _as_json({"v": value})["v"]


@pytest.mark.parametrize("item, attr, value", [
    ("optim.b1=0", ("optim", "b1"), 0.0),  # cifar10 leaves b1 out: typed float by its default
    ("data.data_dir=none", ("data", "data_dir"), None),
    ("data.data_dir=/data/tfds", ("data", "data_dir"), "/data/tfds"),
    ("input.crop_pct=0.875", ("input", "crop_pct"), 0.875),
    ("input.mean=0.5,0.5,0.5", ("input", "mean"), [0.5, 0.5, 0.5]),
    ("data.val_split=none", ("data", "val_split"), None),
    ("train.loss=sigmoid_xent", ("train", "loss"), "sigmoid_xent"),
])
def test_a_key_the_recipe_leaves_out_is_typed_by_its_default(item, attr, value):
    config = load_config(ROOT / "configs" / "cifar10_finetune.py", [item])
    got = config[attr[0]][attr[1]]
    assert got == value and type(got) is type(value)


def test_a_stage_key_the_stage_leaves_out_is_typed_by_its_base_key():
    config = load_config(ROOT / "configs" / "promptshapes.py",
                         ["stages.text.optim.b1=0", "stages.vit.train.batch_size=32"])
    assert config.stages.text.optim.b1 == 0.0 and type(config.stages.text.optim.b1) is float
    assert config.stages.vit.train.batch_size == 32
    for item, message in [("stages.text.optim.b1=high", "expected float"),
                          ("stages.text.optim.bee1=1", "no such config key")]:
        with pytest.raises(ConfigError, match=message):
            load_config(ROOT / "configs" / "promptshapes.py", [item])


@pytest.mark.parametrize("body, names", [
    ('c.data = dict(name="digits")\nc.trian = dict(steps=5)', ["unknown key trian",
                                                              "did you mean train"]),
    ('c.data = dict(name="digits")\nc.train = dict(stpes=5)', ["unknown key train.stpes",
                                                              "train.steps"]),
    ('c.data = dict(name="digits")\nc.train = dict(num_devices=1)',
     ["unknown key train.num_devices"]),
    ('c.data = dict(name="digits")\nc.train = dict(steps=1e4)',
     ["train.steps=10000.0", "expected int"]),
    ('c.data = dict(name="digits")\nc.optim = "adamw"', ["optim='adamw'", "must be a section"]),
    ('c.data = dict(name="digits")\nc.stages = dict(a=dict(optim=dict(lr="fast")))',
     ["stages.a.optim.lr='fast'", "expected float"]),
    ('c.train = dict(steps=5)', ["data.name is not set", "--set data.name="]),
])
def test_a_recipe_mistake_is_one_line_naming_the_file(tmp_path, body, names):
    path = _recipe(tmp_path, body)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert str(path) in message and "\n" not in message, message
    for name in names:
        assert name in message, message


def test_a_recipe_value_is_typed_as_its_default_types_it(tmp_path):
    """An int learning rate becomes a float, so a later `--set optim.lr=0.5` fits the field."""
    path = _recipe(tmp_path, 'c.data = dict(name="digits")\nc.optim = dict(lr=1)')
    config = load_config(path, ["optim.lr=0.5"])
    assert config.optim.lr == 0.5 and type(config.optim.lr) is float
    assert type(load_config(path).optim.lr) is float


def test_the_variant_config_is_one_function():
    import vit
    import vit.models

    assert vit.models.variant_config is vit.variant_config
    cfg = vit.variant_config("B/16")  # ViT-B/16 as the paper's table gives it
    assert (cfg.width, cfg.depth, cfg.mlp_dim, cfg.num_heads, cfg.patch_size) == (
        768, 12, 3072, 12, (16, 16))


# A tiny digits run, spelt out as the recipe was before the defaults (its model section as
# `--set` below makes it): what a workdir trained then holds in config.json and checkpoint meta.
RUN_SETS = tiny_recipe_sets("train.checkpoint_every=2")


def _old_tiny_digits(steps: int) -> dict:
    import copy

    old = copy.deepcopy(SPELT_OUT["digits"])
    for item in RUN_SETS:
        key, value = item.split("=")
        if key == "train.steps":
            continue
        section, leaf = key.split(".")
        old[section][leaf] = json.loads(value)
    old["train"]["steps"] = steps
    return old


@pytest.mark.slow
def test_an_old_workdir_resumes_under_the_trimmed_recipe(tmp_path, capsys):
    from vit.cli import main
    from vit.training.loop import train

    workdir = tmp_path / "wd"
    old = _old_tiny_digits(steps=2)
    train(ml_collections.ConfigDict(old), workdir)
    saved = json.loads((workdir / "config.json").read_text())
    assert saved == _as_json(old)  # every key of the spelt-out recipe, and nothing else
    assert "loss" not in saved["train"] and "crop_area" not in saved["input"]
    # Its config.json, read back as a recipe, loads too.
    assert _flat(_as_json(with_defaults(ml_collections.ConfigDict(saved))))["optim.b1"] == 0.9
    capsys.readouterr()

    argv = ["train", "--config", str(ROOT / "configs" / "digits.py"), "--workdir", str(workdir)]
    for item in [*RUN_SETS, "train.steps=4"]:
        argv += ["--set", item]
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "resumed from step 2" in out, out
    assert (workdir / "checkpoints" / "4").is_dir()
    resumed = _flat(json.loads((workdir / "config.json").read_text()))
    for key, value in _flat(_as_json(_old_tiny_digits(steps=4))).items():
        assert resumed[key] == value, key
