"""promptshapes: the generator's images, labels and questions, checked against the pixels."""

from collections import Counter

import numpy as np
import pytest
from scipy import ndimage

from vit.data import promptshapes as ps

SMALL = 60  # images per split in most tests: fast, and enough to hit every case


def _pairs_of(labels_row) -> set:
    return {ps.PAIRS[i] for i in np.flatnonzero(labels_row)}


def _uses_and_true(d) -> tuple[Counter, Counter]:
    """How often each prompt is asked, and how often it is true."""
    true = Counter(p for p, a in zip(d.prompts, d.answers, strict=True) if a)
    return Counter(d.prompts), true


def _classify(mask: np.ndarray) -> str:
    """Shape of one component from its pixels alone (an independent check of the renderer)."""
    if mask.all():
        return "square"
    top = mask[0, 0] or mask[0, -1]
    bottom = mask[-1, 0] and mask[-1, -1]
    if bottom and not top:
        return "triangle"
    h, w = mask.shape
    return "circle" if mask[round(0.2 * (h - 1)), round(0.2 * (w - 1))] else "cross"


def _pixel_pairs(image: np.ndarray) -> list:
    """(colour, shape) of every connected blob of non-background pixels."""
    found = []
    components, n = ndimage.label(image.max(-1) > 60, structure=np.ones((3, 3)))
    for k, box in enumerate(ndimage.find_objects(components), start=1):
        mask = components[box] == k
        colours = {tuple(int(v) for v in px) for px in image[box][mask]}
        assert len(colours) == 1, f"a blob of several colours: {colours}"
        colour = colours.pop()
        name = [c for c, rgb in ps.RGB.items() if rgb == colour]
        assert len(name) == 1
        h, w = mask.shape
        assert h == w and ps.SHAPE_SIZES[0] <= h <= ps.SHAPE_SIZES[1], (h, w)
        found.append((name[0], _classify(mask)))
    return found


def test_vocabulary():
    assert len(ps.COLORS) >= 5 and len(ps.SHAPES) >= 4
    assert len(set(ps.COLORS)) == len(ps.COLORS) and len(set(ps.SHAPES)) == len(ps.SHAPES)
    assert list(ps.PAIRS) == [(c, s) for c in ps.COLORS for s in ps.SHAPES]
    assert [f"{c} {s}" for c, s in ps.PAIRS] == ps.CLASS_NAMES
    rgb = np.array([ps.RGB[c] for c in ps.COLORS], np.int64)
    distance = np.abs(rgb[:, None] - rgb[None]).sum(-1) + 1000 * np.eye(len(rgb), dtype=int)
    assert distance.min() > 100  # clearly distinct colours
    assert all(max(v) > 100 for v in ps.RGB.values())  # and far from the dark background
    assert ps.prompt_of(("red", "triangle")) == "is there a red triangle?"
    assert all(ps.pair_of(ps.prompt_of(p)) == p for p in ps.PAIRS)
    # a few held-out pairs; every colour and every shape is still asked about in training
    held = ps.HELDOUT_PAIRS
    assert 3 <= len(held) <= 6 and set(held) <= set(ps.PAIRS) and len(set(held)) == len(held)
    assert max(Counter(c for c, _ in held).values()) <= 2
    assert max(Counter(s for _, s in held).values()) <= 2
    train = ps.split_pairs("train")
    assert set(train) == set(ps.PAIRS) - set(held)
    assert {c for c, _ in train} == set(ps.COLORS) and {s for _, s in train} == set(ps.SHAPES)


def test_deterministic_and_seeded():
    fresh = ps._generate.__wrapped__  # bypass the cache: really generate twice
    a, b = fresh("train", SMALL, 0), fresh("train", SMALL, 0)
    np.testing.assert_array_equal(a.images, b.images)
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_array_equal(a.answers, b.answers)
    assert a.prompts == b.prompts
    c = fresh("train", SMALL, 1)
    assert not np.array_equal(a.images, c.images) and a.prompts != c.prompts
    # splits draw from independent streams: same seed and size, different data
    t = fresh("test", SMALL, 0)
    assert not np.array_equal(a.images, t.images) and a.prompts != t.prompts
    # the cache hands back the same object; None means the default size
    assert ps.generate("test", None, 0) is ps.generate("test", 500, 0)
    assert not ps.generate("test").images.flags.writeable


@pytest.mark.parametrize("split", ps.SPLITS)
def test_images_and_labels_match_pixels(split):
    d = ps.generate(split, SMALL, seed=3)
    assert d.images.shape == (SMALL, 64, 64, 3) and d.images.dtype == np.uint8
    assert d.labels.shape == (SMALL, len(ps.PAIRS)) and d.labels.dtype == np.float32
    assert set(np.unique(d.labels)) <= {0.0, 1.0}
    counts = d.labels.sum(1)
    assert counts.min() >= 2 and counts.max() <= 4
    assert len(set(counts.tolist())) > 1  # not always the same number of shapes
    for image, row in zip(d.images, d.labels, strict=True):
        labelled = _pairs_of(row)
        found = _pixel_pairs(image)
        assert len(found) == len(set(found)), "a (colour, shape) pair drawn twice"
        assert set(found) == labelled  # every labelled shape drawn, nothing else
        for colour, rgb in ps.RGB.items():  # colour presence straight from the pixels
            has = (image == np.array(rgb, np.uint8)).all(-1).any()
            assert has == any(c == colour for c, _ in labelled), colour
        background = image.max(-1) <= 60
        assert background.mean() > 0.5 and image[background].max() < 40  # dark, plain


@pytest.mark.parametrize("split", ps.SPLITS)
def test_one_true_and_one_hard_false_question_per_image(split):
    d = ps.generate(split, SMALL, seed=4)
    assert d.num_examples == 2 * SMALL == len(d.answers) and d.answers.dtype == np.int32
    first_true = 0
    for i, row in enumerate(d.labels):
        present = _pairs_of(row)
        (false_prompt, true_prompt) = sorted(
            [(d.answers[2 * i], d.prompts[2 * i]), (d.answers[2 * i + 1], d.prompts[2 * i + 1])])
        assert (false_prompt[0], true_prompt[0]) == (0, 1)
        assert ps.pair_of(true_prompt[1]) in present
        colour, shape = ps.pair_of(false_prompt[1])
        assert (colour, shape) not in present
        assert any(c == colour and s != shape for c, s in present)  # hard: colour elsewhere
        assert any(s == shape and c != colour for c, s in present)  # and shape elsewhere
        first_true += int(d.answers[2 * i])
    assert 0.2 < first_true / SMALL < 0.8  # the true question is not always first


def test_default_sizes_and_balance():
    for split, size in ps.DEFAULT_SIZES.items():
        d = ps.generate(split)
        assert d.num_images == size and size % 2 == 0 and d.num_examples == 2 * size
        uses, true = _uses_and_true(d)
        for prompt, n in uses.items():
            assert 2 * true[prompt] == n, (split, prompt, true[prompt], n)
        # every prompt of the split is asked, and nothing else
        assert set(uses) == {ps.prompt_of(p) for p in ps.split_pairs(split)}
    for n in (2, 6, 38):  # balanced at any size, not only on average
        d = ps.generate("train", n, seed=7)
        uses, true = _uses_and_true(d)
        assert all(2 * true[p] == k for p, k in uses.items())


def test_heldout_pairs_only_in_heldout_prompts_but_in_every_split_images():
    held = {ps.prompt_of(p) for p in ps.HELDOUT_PAIRS}
    for split in ("train", "test"):
        d = ps.generate(split)
        assert not held & set(d.prompts), split
        columns = [ps.PAIRS.index(p) for p in ps.HELDOUT_PAIRS]
        assert (d.labels[:, columns].sum(0) > 0).all(), split  # drawn, just never asked
    d = ps.generate("heldout")
    assert set(d.prompts) == held


def test_source_format():
    n = 20
    src = ps.PromptShapesSource("train", n, seed=5)
    d = ps.generate("train", n, seed=5)
    assert len(src) == 2 * n
    assert src.name == "promptshapes" and src.multi_label is True
    assert src.class_names == ps.CLASS_NAMES and src.num_classes == len(ps.PAIRS) == 24
    assert sorted(src.prompts) == sorted({ps.prompt_of(p) for p in ps.split_pairs("train")})
    assert ps.PromptShapesSource("heldout", n).prompts == [ps.prompt_of(p)
                                                           for p in ps.HELDOUT_PAIRS]
    for i in (0, 1, 7, 2 * n - 1):
        x = src[i]
        assert set(x) == {"image", "label", "prompt", "answer", "image_id"}
        assert x["image_id"] == i // 2
        assert x["image"].shape == (64, 64, 3) and x["image"].dtype == np.uint8
        assert x["label"].shape == (24,) and x["label"].dtype == np.float32
        assert isinstance(x["prompt"], str) and x["prompt"] in src.prompts
        assert x["answer"].dtype == np.int32 and int(x["answer"]) in (0, 1)
        np.testing.assert_array_equal(x["image"], d.images[i // 2])
        np.testing.assert_array_equal(x["label"], d.labels[i // 2])
        assert x["prompt"] == d.prompts[i] and x["answer"] == d.answers[i]
        # the answer is what the label says about the prompt's pair
        assert int(x["answer"]) == int(x["label"][ps.PAIRS.index(ps.pair_of(x["prompt"]))])
    assert src[-1]["prompt"] == src[2 * n - 1]["prompt"]
    assert src[np.int64(3)]["prompt"] == d.prompts[3]
    with pytest.raises(IndexError):
        src[2 * n]


def test_bad_split_and_size():
    for bad in (lambda: ps.generate("validation"), lambda: ps.PromptShapesSource("val")):
        with pytest.raises(ValueError, match="train, test, heldout"):
            bad()
    for size in (0, 3, -2):
        with pytest.raises(ValueError, match="even"):
            ps.generate("train", size)
