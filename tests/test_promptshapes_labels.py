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
    with pytest.raises(ps.SplitError, match="labels='classes'"):
        ps.PromptShapesSource("test", 2, labels="classes")
