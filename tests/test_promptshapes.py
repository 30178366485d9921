"""promptshapes: the generator's images, labels and questions, checked against the pixels and
against answers read from the questions' words."""

from collections import Counter
from pathlib import Path

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
    assert ps.prompt_of(("red", "cross"), "do you see a {c} {s}?") == "do you see a red cross?"
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
    fresh = ps.DATASET.build  # bypass the cache: really generate twice
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


def test_where_names_the_pair_drawn_in_each_cell():
    d = ps.generate("train", SMALL, seed=3)
    assert d.where.shape == (SMALL, 16, 16) and d.where.dtype == np.int8
    for image, where in zip(d.images, d.where, strict=True):
        for row in range(4):
            for col in range(4):
                cell = image[16 * row:16 * row + 16, 16 * col:16 * col + 16]
                marks = np.unique(where[4 * row:4 * row + 4, 4 * col:4 * col + 4])
                assert len(marks) == 1  # one value for the whole cell
                drawn = _pixel_pairs(cell)
                assert drawn == ([ps.PAIRS[marks[0]]] if marks[0] >= 0 else []), drawn


def _named(prompt: str) -> tuple[str | None, str | None]:
    """(colour word, shape word) a question names, read from its words alone."""
    found = prompt.lower().replace("?", " ").split()
    colours = [w for w in found if w in ps.COLORS + ps.NEVER_COLORS]
    shapes = [w for w in found if w in ps.SHAPES + ps.NEVER_SHAPES]
    assert len(colours) <= 1 and len(shapes) <= 1 and (colours or shapes), prompt
    return (colours or [None])[0], (shapes or [None])[0]


# every word a training wording can hold: a prompt with none of them is an unknown prompt
_WORDS_ASKED = {w for t in ps.PAIR_TEMPLATES + ps.COLOUR_TEMPLATES + ps.SHAPE_TEMPLATES
                for w in t.replace("{c}", " ").replace("{s}", " ").replace("?", " ").split()}
_WORDS_ASKED |= set(ps.COLORS + ps.NEVER_COLORS + ps.SHAPES + ps.NEVER_SHAPES)


def _truth_and_kind(prompt: str, present: set) -> tuple[int, str]:
    """The answer from the scene's pairs, and the kind of question, computed apart from the
    generator: pair questions by what the scene shares with them."""
    if not set(ps.words(prompt)) & set(_WORDS_ASKED):
        return 0, "unknown"
    colour, shape = _named(prompt)
    if colour in ps.NEVER_COLORS or shape in ps.NEVER_SHAPES:
        return 0, "never"
    if colour is None:
        return int(any(s == shape for _, s in present)), "shape"
    if shape is None:
        return int(any(c == colour for c, _ in present)), "colour"
    if (colour, shape) in present:
        return 1, "pair"
    has_colour = any(c == colour for c, _ in present)
    has_shape = any(s == shape for _, s in present)
    return 0, {(True, True): "hard", (True, False): "colour_only", (False, True): "shape_only",
               (False, False): "neither"}[(has_colour, has_shape)]


@pytest.mark.parametrize("split", ps.SPLITS)
def test_every_answer_is_what_the_scene_says(split):
    d = ps.generate(split, SMALL, seed=4)
    assert d.num_examples == 2 * SMALL == len(d.answers) == len(d.kinds)
    assert d.answers.dtype == np.int32
    for n, (prompt, answer, kind) in enumerate(zip(d.prompts, d.answers, d.kinds, strict=True)):
        truth, what = _truth_and_kind(prompt, _pairs_of(d.labels[n // 2]))
        assert truth == answer, (prompt, _pairs_of(d.labels[n // 2]))
        # the generator's own kind agrees with what the scene shares with the question
        assert kind == ("yes" if truth else "attribute" if what in ("colour", "shape")
                        else what), (prompt, kind, what)


def test_every_kind_of_question_is_asked_in_training():
    d = ps.generate("train")
    kinds = Counter()
    for n, prompt in enumerate(d.prompts):
        truth, what = _truth_and_kind(prompt, _pairs_of(d.labels[n // 2]))
        kinds[(what, truth)] += 1
    for key in [("pair", 1), ("hard", 0), ("colour_only", 0), ("shape_only", 0),
                ("neither", 0), ("colour", 1), ("colour", 0), ("shape", 1), ("shape", 0),
                ("never", 0)]:
        assert kinds[key] >= 0.03 * d.num_examples, (key, kinds)
    # some questions drop their "?" or change case: neither may carry the answer
    assert 0.1 < np.mean([not p.endswith("?") for p in d.prompts]) < 0.5
    assert 0.05 < np.mean([p != p.lower() for p in d.prompts]) < 0.4
    # at least 8 wordings of pair questions in training, none of the evaluation-only ones
    assert len(ps.PAIR_TEMPLATES) >= 8 and len(ps.EVAL_TEMPLATES) >= 2
    assert not set(ps.EVAL_TEMPLATES) & set(ps.PAIR_TEMPLATES)
    used = {t for t in ps.PAIR_TEMPLATES for p in d.prompts
            if _matches(t, p)}
    assert used == set(ps.PAIR_TEMPLATES)


def _matches(template: str, prompt: str) -> bool:
    """Whether `prompt` is `template` with some words in, whatever its case and "?"."""
    import re
    pattern = re.escape(template.rstrip("?")).replace(r"\{c\}", r"\w+").replace(r"\{s\}", r"\w+")
    return re.fullmatch(pattern + r"\??", prompt.lower()) is not None


def test_balance_every_answerable_string_is_true_half_the_time():
    never = set(ps.NEVER_COLORS + ps.NEVER_SHAPES)
    for split, size in ps.DEFAULT_SIZES.items():
        d = ps.generate(split)
        assert d.num_images == size and size % 2 == 0 and d.num_examples == 2 * size
        uses, true = _uses_and_true(d)
        for prompt, n in uses.items():
            # never-drawn words, or no word of the vocabulary: always "no"
            if never & set(ps.words(prompt)) or not _WORDS_ASKED & set(ps.words(prompt)):
                assert true[prompt] == 0, prompt
            else:
                assert 2 * true[prompt] == n, (split, prompt, true[prompt], n)
    for n in (2, 6, 38):  # balanced at any size, not only on average
        d = ps.generate("train", n, seed=7)
        uses, true = _uses_and_true(d)
        assert all(2 * true[p] == k for p, k in uses.items()
                   if not never & set(ps.words(p)) and _WORDS_ASKED & set(ps.words(p)))


def test_never_drawn_words_are_asked_only_as_no_and_never_drawn():
    assert len(ps.NEVER_COLORS) >= 2 and len(ps.NEVER_SHAPES) >= 2
    assert not set(ps.NEVER_COLORS) & set(ps.COLORS) and not set(ps.NEVER_SHAPES) & set(ps.SHAPES)
    d = ps.generate("train")
    asked = Counter()
    for prompt, answer in zip(d.prompts, d.answers, strict=True):
        for w in set(ps.words(prompt)) & set(ps.NEVER_COLORS + ps.NEVER_SHAPES):
            asked[w] += 1
            assert answer == 0, prompt
    assert set(asked) == set(ps.NEVER_COLORS + ps.NEVER_SHAPES)


def test_heldout_pairs_and_wordings_never_in_training_but_pairs_in_every_split_images():
    for split in ("train", "test"):
        d = ps.generate(split)
        for prompt in set(d.prompts):
            if not _WORDS_ASKED & set(ps.words(prompt)):
                continue  # a prompt of unknown words names no pair
            assert _named(prompt) not in ps.HELDOUT_PAIRS, (split, prompt)  # in any wording
            assert not any(_matches(t, prompt) for t in ps.EVAL_TEMPLATES), (split, prompt)
        columns = [ps.PAIRS.index(p) for p in ps.HELDOUT_PAIRS]
        assert (d.labels[:, columns].sum(0) > 0).all(), split  # drawn, just never asked
    d = ps.generate("heldout")
    assert set(d.prompts) == {ps.prompt_of(p) for p in ps.HELDOUT_PAIRS}


def test_the_longest_question_fits_the_recipe_with_room():
    import warnings

    from vit.models.text import detokenize, tokenize
    from vit.recipes.load import load_config

    colours = ps.COLORS + ps.NEVER_COLORS
    shapes = ps.SHAPES + ps.NEVER_SHAPES
    longest = max((t.format(c=c, s=s) for t in ps.all_templates() for c in colours
                   for s in shapes), key=lambda p: len(p.encode()))
    assert len(longest) == len(ps.longest_prompt())
    root = Path(__file__).resolve().parents[1]
    max_len = load_config(root / "configs" / "promptshapes.py").model.text.max_len
    assert len(longest.encode()) + 1 <= max_len - 4  # the end token, and room to spare
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a cut prompt warns
        tokens, _ = tokenize([longest, ps.longest_prompt()], max_len)
    assert detokenize(tokens) == [longest, ps.longest_prompt()]


def test_grid_asks_every_pair_every_held_out_wording_and_never_drawn_words():
    grid = ps.grid_questions()
    groups = Counter(q["group"] for q in grid)
    assert {q["pair"] for q in grid if q["group"] in ("seen", "heldout")} == set(ps.PAIRS)
    assert {q["pair"] for q in grid if q["group"] == "heldout"} == set(ps.HELDOUT_PAIRS)
    assert groups["wording"] == len(ps.EVAL_TEMPLATES) * len(ps.TRAIN_PAIRS)
    assert all(_named(q["prompt"])[0] in ps.NEVER_COLORS
               or _named(q["prompt"])[1] in ps.NEVER_SHAPES for q in grid if q["group"] == "never")
    assert groups["never"] >= 8
    d = ps.generate("test", SMALL, seed=2)
    for row in d.labels:
        present = _pairs_of(row)
        for q in grid:
            if q["pair"] is not None:
                truth, what = _truth_and_kind(ps.prompt_of(q["pair"]), present)
                want = "present" if truth else {"hard": "both_apart"}.get(what, what)
                assert ps.shares(row, q["pair"]) == want


def test_source_format():
    n = 20
    src = ps.PromptShapesSource("train", n, seed=5)
    d = ps.generate("train", n, seed=5)
    assert len(src) == 2 * n
    assert src.name == "promptshapes" and src.multi_label is True
    assert src.class_names == ps.CLASS_NAMES and src.num_classes == len(ps.PAIRS) == 24
    assert src.prompts == sorted(set(d.prompts))
    assert ps.PromptShapesSource("heldout", n).prompts == sorted(ps.prompt_of(p)
                                                                 for p in ps.HELDOUT_PAIRS)
    for i in (0, 1, 7, 2 * n - 1):
        x = src[i]
        assert set(x) == {"image", "label", "prompt", "answer", "image_id", "where"}
        np.testing.assert_array_equal(x["where"], d.where[i // 2])
        assert x["image_id"] == i // 2
        assert x["image"].shape == (64, 64, 3) and x["image"].dtype == np.uint8
        assert x["label"].shape == (24,) and x["label"].dtype == np.float32
        assert isinstance(x["prompt"], str) and x["prompt"] in src.prompts
        assert x["answer"].dtype == np.int32 and int(x["answer"]) in (0, 1)
        np.testing.assert_array_equal(x["image"], d.images[i // 2])
        np.testing.assert_array_equal(x["label"], d.labels[i // 2])
        assert x["prompt"] == d.prompts[i] and x["answer"] == d.answers[i]
        # the answer is what the label says about the prompt
        assert int(x["answer"]) == _truth_and_kind(x["prompt"], _pairs_of(x["label"]))[0]
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
