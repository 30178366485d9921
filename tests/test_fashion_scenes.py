"""fashion_scenes: every answer checked against the scene from the question's words alone,
balance, held-out pairs and wordings kept out of training, photos from the right split."""

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from vit.data import fashion_scenes as fs
from vit.data import prompt_words as pw
from vit.data.prompted import SplitError

N = 60


def _photos(seed=0, per_class=5):
    """Synthetic 28x28 "photos", every pixel >= 20 (above the background noise, so a pasted
    photo survives exactly) and each unique."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(10), per_class)
    images = rng.integers(20, 256, size=(len(labels), 28, 28), dtype=np.uint8)
    return images, labels


def _gen(split, n=N, seed=0, photos=None):
    return fs.generate(split, n, seed=seed, photos=photos or _photos())


_PLACES = {"on the left": "left", "on the right": "right", "at the top": "top",
           "at the bottom": "bottom"}


def _read(prompt: str):
    """(kind, item) from the words alone: the class words named, a place phrase, "and"."""
    text = prompt.lower().rstrip("?")
    if not set(pw.words(text)) & fs.vocabulary():
        return "unknown", None
    named = [w for w in re.findall(r"t-shirt|[a-z]+", text)
             if w in fs.CLASSES + fs.NEVER_CLASSES]
    if set(named) & set(fs.NEVER_CLASSES):
        return "never", None
    place = [r for phrase, r in _PLACES.items() if phrase in text]
    if " and " in text:
        assert len(named) == 2 and not place, prompt
        return "both", tuple(named)
    assert len(named) == 1, prompt
    return ("region", (named[0], place[0])) if place else ("class", named[0])


def _answer(scene, kind, item) -> int:
    """The answer from the scene's cells: cell i is (row i // 2, column i % 2)."""
    present = {fs.CLASSES[c]: i for i, c in enumerate(scene) if c >= 0}
    if kind == "class":
        return int(item in present)
    if kind == "both":
        return int(item[0] in present and item[1] in present)
    if kind == "region":
        k, r = item
        if k not in present:
            return 0
        row, col = divmod(present[k], 2)
        return int({"left": col == 0, "right": col == 1, "top": row == 0,
                    "bottom": row == 1}[r])
    return 0


@pytest.mark.parametrize("split", fs.SPLITS)
def test_every_answer_is_what_the_scene_says(split):
    d = _gen(split)
    assert d.num_examples == 2 * N and d.answers.dtype == np.int32
    for n, (prompt, answer) in enumerate(zip(d.prompts, d.answers, strict=True)):
        scene = d.scenes[n // 2]
        assert 2 <= (scene >= 0).sum() <= 4
        present = [c for c in scene if c >= 0]
        assert len(set(present)) == len(present)  # distinct classes
        kind, item = _read(prompt)
        assert _answer(scene, kind, item) == answer, (prompt, scene)


def test_every_kind_of_question_and_hard_negatives_in_training():
    d = _gen("train", 600)
    asked = Counter()
    for n, prompt in enumerate(d.prompts):
        kind, item = _read(prompt)
        asked[(kind, int(d.answers[n]))] += 1
    for key in [("class", 1), ("class", 0), ("region", 1), ("region", 0), ("both", 1),
                ("both", 0), ("never", 0), ("unknown", 0)]:
        assert asked[key] >= 0.03 * d.num_examples, (key, asked)
    kinds = Counter(d.kinds)
    assert kinds["elsewhere"] >= 0.03 * d.num_examples  # the class there, in the other region
    assert kinds["one_only"] >= 0.03 * d.num_examples  # one item of the two
    assert 0.1 < np.mean([not p.endswith("?") for p in d.prompts]) < 0.5
    assert len(fs.CLASS_TEMPLATES) >= 8 and len(fs.EVAL_TEMPLATES["class"]) >= 2


def test_balance_every_answerable_string_is_true_half_the_time():
    for split in fs.SPLITS:
        d = _gen(split, 200, seed=3)
        uses, true = Counter(d.prompts), Counter(p for p, a in zip(d.prompts, d.answers,
                                                                   strict=True) if a)
        for prompt, n in uses.items():
            if _read(prompt)[0] in ("never", "unknown"):
                assert true[prompt] == 0
            else:
                assert 2 * true[prompt] == n, (split, prompt)


def _matches_any(templates, prompt) -> bool:
    for t in templates:
        pattern = re.escape(t.rstrip("?")).replace(r"\{k\}", r"[\w-]+").replace(
            r"\{k2\}", r"[\w-]+").replace(r"\{w\}", r"(on|at) the \w+")
        if re.fullmatch(pattern + r"\??", prompt.lower()):
            return True
    return False


def test_heldout_pairs_and_wordings_never_asked_outside_the_heldout_split():
    held_regions = set(fs.HELDOUT_REGIONS)
    held_both = {frozenset(p) for p in fs.HELDOUT_BOTH}
    assert {k for k, _ in fs.asked("region", "train")} == set(fs.CLASSES)
    assert {r for _, r in fs.asked("region", "train")} == set(fs.REGIONS)
    assert {k for p in fs.asked("both", "train") for k in p} == set(fs.CLASSES)
    eval_templates = sum(fs.EVAL_TEMPLATES.values(), ())
    for split in ("train", "validation", "test"):
        d = _gen(split, 400, seed=5)
        for prompt in set(d.prompts):
            kind, item = _read(prompt)
            assert not (kind == "region" and item in held_regions), prompt
            assert not (kind == "both" and frozenset(item) in held_both), prompt
            assert not _matches_any(eval_templates, prompt), prompt
    d = _gen("heldout", 200)
    for prompt in set(d.prompts):
        kind, item = _read(prompt)
        assert (kind == "region" and item in held_regions) or \
            (kind == "both" and frozenset(item) in held_both), prompt
        assert prompt in {fs.question_text(kind, x) for x in fs.asked(kind, "heldout")}


def test_photos_pasted_whole_in_their_cell_and_labels_match():
    images, labels = _photos()
    d = _gen("test", 40, photos=(images, labels))
    known = {im.tobytes(): int(c) for im, c in zip(images, labels, strict=True)}
    for n in range(d.num_images):
        covered = np.zeros((64, 64), bool)
        for i, c in enumerate(d.scenes[n]):
            if c < 0:
                continue
            y0, x0, y1, x1 = d.boxes[n, i]
            row, col = divmod(i, 2)
            assert row * 32 <= y0 and y1 <= row * 32 + 32 and col * 32 <= x0
            assert x1 <= col * 32 + 32
            crop = np.ascontiguousarray(d.images[n, y0:y1, x0:x1, 0])
            assert known.get(crop.tobytes()) == c  # a photo of that class, pixel for pixel
            covered[y0:y1, x0:x1] = True
        assert d.images[n][~covered].max() < fs.NOISE  # the rest is background noise
        assert (d.images[n, ..., 0] == d.images[n, ..., 2]).all()
        want = {fs.CLASSES[c] for c in d.scenes[n] if c >= 0}
        assert {fs.CLASS_NAMES[j] for j in np.flatnonzero(d.labels[n])} == want


def test_grid_shares_are_the_scene_answers():
    grid = fs.grid_questions()
    groups = Counter(q["group"] for q in grid)
    assert groups["heldout"] == len(fs.HELDOUT_REGIONS) + len(fs.HELDOUT_BOTH)
    assert groups["seen"] == len(fs.CLASSES) + len(fs.asked("region", "train")) + \
        len(fs.asked("both", "train"))
    assert groups["wording"] > 0 and groups["never"] >= 4 and groups["unknown"] >= 8
    source = fs.FashionScenesSource("test", 20, photos=_photos())
    _, shares = source.question_grid()
    for n, scene in enumerate(source.data.scenes):
        for j, q in enumerate(grid):
            kind, item = _read(q["prompt"])
            assert (shares[n, j] == "present") == bool(_answer(scene, kind, item)), q
            if q["group"] in ("never", "unknown"):
                assert shares[n, j] == q["group"]


def test_training_batches_carry_where_each_photo_lies():
    from vit.data import Augment, train_iterator
    from vit.preprocess import Preprocessing

    source = fs.FashionScenesSource("train", 8, photos=_photos())
    pre = Preprocessing(size=(64, 64), mean=(0.5,) * 3, std=(0.5,) * 3)
    batch = next(iter(train_iterator(source, pre, Augment(), batch_size=16, seed=0,
                                     num_classes=10, num_threads=1)))
    assert batch["where"].shape == (16, 16, 16)
    # each image's map, whichever of its two examples the batch drew
    maps = {source.data.images[i].tobytes(): source.data.where[i] for i in range(8)}
    for image, where in zip(batch["image"], batch["where"], strict=True):
        pixels = np.rint((image * 0.5 + 0.5) * 255).astype(np.uint8)
        np.testing.assert_array_equal(where, maps[pixels.tobytes()])


def test_vocabulary_and_longest_prompt():
    vocab = fs.vocabulary()
    d = _gen("train", 300, seed=9)
    for prompt, kind in zip(d.prompts, d.kinds, strict=True):
        if kind == "unknown":
            assert pw.words(prompt) and not set(pw.words(prompt)) & vocab
        else:
            assert set(pw.words(prompt)) <= vocab, prompt
    assert not {w for p in pw.EVAL_PROMPTS for w in pw.words(p)} & vocab
    from vit.recipes.load import load_config

    config = load_config(Path(__file__).parents[1] / "configs" / "fashion_scenes.py")
    assert len(fs.longest_prompt().encode()) + 1 <= config.model.text.max_len - 4


def test_bad_split_and_size():
    with pytest.raises(SplitError, match="no split"):
        fs.generate("nope", 2, photos=_photos())
    with pytest.raises(SplitError, match="even"):
        fs.generate("train", 3, photos=_photos())
    images, labels = _photos()
    with pytest.raises(fs.DataError, match="lack a class"):
        fs.generate("train", 2, photos=(images[labels != 4], labels[labels != 4]))


@pytest.mark.slow
@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").is_dir(),
                    reason="Debian's dataset-fashion-mnist is not installed")
def test_test_scenes_hold_only_test_photos():
    """Against the real files: every photo of a test or held-out scene is a Fashion-MNIST test
    photo of its class and no training photo; a training scene's photos are training photos."""
    from vit.data.real_sets import load_fashion_mnist

    pools = {}
    for split in ("train", "test"):
        images, labels, _ = load_fashion_mnist(split)
        pools[split] = (images.reshape(len(images), -1), labels)
    for split, own in (("test", "test"), ("heldout", "test"), ("train", "train")):
        d = fs.FashionScenesSource(split, 6, seed=1).data
        for n in range(d.num_images):
            for i, c in enumerate(d.scenes[n]):
                if c < 0:
                    continue
                y0, x0, y1, x1 = d.boxes[n, i]
                crop = d.images[n, y0:y1, x0:x1, 0].reshape(-1)
                for pool, (photos, labels) in pools.items():
                    hits = labels[_fits(photos, crop)]
                    if pool == own:
                        assert len(hits) and (hits == c).all(), (split, n, i)
                    else:
                        assert not len(hits), (split, n, i, pool)


def _fits(photos: np.ndarray, crop: np.ndarray) -> np.ndarray:
    """Which photos p give `crop` as max(p, noise) for some noise below NOISE: equal where the
    crop is at least NOISE, at most the crop where it is below."""
    bright = crop >= fs.NOISE
    return ((photos[:, bright] == crop[bright]).all(1)
            & (photos[:, ~bright] <= crop[~bright]).all(1))


def _find_photo(image: np.ndarray, cell: int, photo: np.ndarray):
    """Where in `cell` of `image` the `photo` lies as it is or mirrored: (y0, x0) or None."""
    row, col = divmod(cell, 2)
    for y0 in range(row * 32, row * 32 + 5):
        for x0 in range(col * 32, col * 32 + 5):
            crop = image[y0:y0 + 28, x0:x0 + 28]
            if (crop == photo).all() or (crop == photo[:, ::-1]).all():
                return y0, x0
    return None


def test_scene_jitter_moves_each_photo_inside_its_cell_and_the_where_map_follows():
    from vit.data import Augment, train_iterator
    from vit.preprocess import Preprocessing

    source = fs.FashionScenesSource("train", 8, photos=_photos())
    d = source.data
    originals = [{i: d.images[n, y0:y1, x0:x1, 0] for i, (y0, x0, y1, x1) in enumerate(d.boxes[n])
                  if d.scenes[n, i] >= 0} for n in range(d.num_images)]
    pre = Preprocessing(size=(64, 64), mean=(0.5,) * 3, std=(0.5,) * 3)
    it = train_iterator(source, pre, Augment(scene_jitter=True), batch_size=16, seed=0,
                        num_classes=10, num_threads=1)
    places, mirrored = Counter(), 0
    for _ in range(4):  # four epochs of the 16 examples
        batch = next(it)
        for image, where, label in zip(batch["image"], batch["where"], batch["label"],
                                       strict=True):
            pixels = np.rint((image[..., 0] * 0.5 + 0.5) * 255).astype(np.uint8)
            found = None
            for n, photos in enumerate(originals):
                at = {i: _find_photo(pixels, i, p) for i, p in photos.items()}
                if all(v is not None for v in at.values()):
                    found = n, at
            assert found is not None, "a photo left its cell or was cut"
            n, at = found
            np.testing.assert_array_equal(label, d.labels[n])
            covered = np.zeros((64, 64), bool)
            expected = np.full((16, 16), -1)
            for i, (y0, x0) in at.items():
                covered[y0:y0 + 28, x0:x0 + 28] = True
                mirrored += not (pixels[y0:y0 + 28, x0:x0 + 28] == originals[n][i]).all()
                for by in range(16):
                    for bx in range(16):
                        if y0 <= 4 * by + 2 < y0 + 28 and x0 <= 4 * bx + 2 < x0 + 28:
                            expected[by, bx] = d.scenes[n, i]
            assert pixels[~covered].max() < fs.NOISE  # where a photo was is noise again
            np.testing.assert_array_equal(where, expected)
            places[(n, tuple(sorted(at.items())))] += 1
    assert len(places) > 40 and mirrored > 20  # new places and mirror images every epoch


def test_scene_jitter_refused_where_the_data_does_not_say_where_things_lie():
    from vit.data import Augment, train_iterator
    from vit.data.sources import digits
    from vit.errors import ConfigError
    from vit.preprocess import Preprocessing

    with pytest.raises(ConfigError, match="input.scene_jitter"):
        train_iterator(digits("train"), Preprocessing(size=(8, 8)), Augment(scene_jitter=True),
                       batch_size=4, seed=0, num_classes=10, num_threads=1)


def _no_kind(scene, kind, item) -> str:
    """What kind of "no" a false question is, from the scene's cells alone."""
    present = {fs.CLASSES[c] for c in scene if c >= 0}
    if kind == "class":
        return "absent"
    if kind == "region":
        return "elsewhere" if item[0] in present else "absent"
    return "one_only" if (item[0] in present) != (item[1] in present) else "neither"


def test_question_pairs_skipped_are_those_no_scene_answers():
    """`_possible` against every scene there is (2-4 distinct classes in the 4 cells): a pair
    of questions is kept exactly when a scene makes the first "yes" and the second a "no" of
    the drawn kind, and another the other way round."""
    import itertools

    placed = [[c for c in s if c >= 0]
              for s in itertools.product(range(-1, len(fs.CLASSES)), repeat=4)]
    scenes = [s for s, p in zip(itertools.product(range(-1, len(fs.CLASSES)), repeat=4),
                                placed, strict=True) if len(p) >= 2 and len(set(p)) == len(p)]
    for kind in fs.KINDS:
        items = fs.asked(kind, "train") + fs.asked(kind, "heldout")
        answers = np.array([[_answer(s, kind, it) for it in items] for s in scenes], bool)
        for negative in fs._negatives(kind):
            no = np.array([[not a and _no_kind(s, kind, it) == negative
                            for a, it in zip(row, items, strict=True)]
                           for s, row in zip(scenes, answers, strict=True)], float)
            exists = answers.astype(float).T @ no > 0  # [yes item, no item]
            for i, j in itertools.permutations(range(len(items)), 2):
                assert fs._possible(kind, items[i], items[j], negative) == (
                    exists[i, j] and exists[j, i]), (kind, negative, items[i], items[j])


def test_never_placed_words_are_asked_in_every_form_in_training():
    """As evaluation asks them: alone, in a region, beside a class; always "no"."""
    d = _gen("train", 2000)
    forms = Counter()
    for n, prompt in enumerate(d.prompts):
        if d.kinds[n] == "never":
            assert d.answers[n] == 0 and _read(prompt)[0] == "never", prompt
            text = prompt.lower()
            forms["both" if " and " in text else
                  "region" if any(p in text for p in _PLACES) else "class"] += 1
    assert min(forms[f] for f in ("class", "region", "both")) >= 0.2 * sum(forms.values()), forms
