"""promptshapes' ViT-stage labels: the drawn pairs, or the drawn colours and shapes apart."""

import numpy as np
import pytest

from vit.data import promptshapes as ps


def test_attribute_labels_are_the_colours_and_shapes_drawn():
    source = ps.PromptShapesSource("test", 20, seed=2, labels="attributes")
    assert source.class_names == list(ps.COLORS) + list(ps.SHAPES) == ps.ATTRIBUTE_NAMES
    assert source.num_classes == len(ps.COLORS) + len(ps.SHAPES)
    for n in range(source.data.num_images):
        drawn = [ps.PAIRS[k] for k in np.flatnonzero(source.data.labels[n])]
        want = {c for c, _ in drawn} | {s for _, s in drawn}
        element = source[2 * n + 1]
        got = {source.class_names[k] for k in np.flatnonzero(element["label"])}
        assert got == want and element["label"].dtype == np.float32
    pairs = ps.PromptShapesSource("test", 20, seed=2)
    assert pairs.class_names == ps.CLASS_NAMES
    assert np.array_equal(pairs[3]["label"], pairs.data.labels[1])


def test_unknown_label_kind_is_refused():
    from vit.errors import ConfigError

    with pytest.raises(ConfigError, match="data.labels='classes'; promptshapes has 'pairs' or"):
        ps.PromptShapesSource("test", 2, labels="classes")


def test_the_recipe_key_picks_the_labels_and_other_datasets_refuse_it():
    """`data.labels` reaches promptshapes through `open_source` (training, the dry run and
    `vit eval --workdir` open data that way); the shipped recipe learns colours and shapes."""
    from vit.data import open_source
    from vit.errors import ConfigError
    from vit.recipes.load import load_config

    assert load_config("promptshapes").data.labels == "attributes"
    assert open_source("promptshapes", "test", labels="attributes").class_names == \
        ps.ATTRIBUTE_NAMES
    assert open_source("promptshapes", "test").class_names == ps.CLASS_NAMES  # None: pairs
    with pytest.raises(ConfigError, match="data.labels='pairs' applies to promptshapes only"):
        open_source("digits", "train", labels="pairs")


def test_labels_on_another_dataset_stop_vit_train_in_one_line(run_vit, tmp_path):
    code, err = run_vit(["train", "--config", "digits", "--workdir", str(tmp_path / "run"),
                         "--set", "data.labels=attributes", "--set", "train.steps=1"])
    assert code == 2 and len(err) == 1
    assert "data.labels='attributes' applies to promptshapes only" in err[0]
    assert not (tmp_path / "run" / "checkpoints").exists()


PAIRS_RECIPE = '''
import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.data = dict(name="promptshapes", labels="pairs", val_split="", num_threads=0)
    c.model = dict(name="Ti/16", width=16, depth=1, mlp_dim=32, num_heads=2, patch_size=16,
                   classifier="gap", class_token=False)
    c.input = dict(image_size=64, inception_crop=False, flip=False)
    c.train = dict(steps=1, batch_size=4, loss="sigmoid_xent", checkpoint_every=1)
    return c
'''


def test_a_resume_on_the_other_labels_names_data_labels(run_vit, tmp_path):
    """A run of the pairs labels resumed with the attribute labels: the same dataset with
    another class count, refused naming the key that changed it, the workdir kept."""
    recipe = tmp_path / "pairs.py"
    recipe.write_text(PAIRS_RECIPE)
    argv = ["train", "--config", str(recipe), "--workdir", str(tmp_path / "wd")]
    code, err = run_vit(argv)
    assert code == 0, err
    code, err = run_vit(argv + ["--set", "train.steps=2", "--set", "data.labels=attributes"])
    assert code == 2, err
    assert "data.labels='attributes'" in err[-1] and "set data.labels to those" in err[-1]
    assert "has 24" in err[-1] and "10 classes" in err[-1]
    assert not (tmp_path / "wd" / "checkpoints" / "2").exists()


def test_a_checkpoints_class_names_say_which_labels_it_learned():
    """`vit eval --checkpoint` opens promptshapes with the labels the checkpoint's class names
    are (the registry's `labels_named`); the default and datasets without a choice give None."""
    from vit.data import fashion_scenes as fs
    from vit.data.sources import labels_named

    assert labels_named("promptshapes", ps.ATTRIBUTE_NAMES) == "attributes"
    assert labels_named("promptshapes", ps.CLASS_NAMES) is None
    assert labels_named("promptshapes", None) is None
    assert labels_named("promptshapes", ["a", "b"]) is None
    assert labels_named("digits", ps.ATTRIBUTE_NAMES) is None
    assert labels_named("fashion_scenes", fs.CLASS_NAMES) is None
