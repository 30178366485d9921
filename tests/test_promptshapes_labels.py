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
    with pytest.raises(ps.SplitError, match="data.labels=.classes."):
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
