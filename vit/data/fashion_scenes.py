"""`fashion_scenes`: questions about real photos. Each 64x64 scene holds 2 to 4 Fashion-MNIST
photos (28x28, grey, of distinct classes) in distinct cells of a 2x2 grid of 32 px cells, each
shifted by up to 4 px inside its cell, on a dark, lightly noisy background. Questions:

* class: "is there a sneaker?" (`CLASS_TEMPLATES`);
* class in a region: "is there a bag on the left?" (`REGION_TEMPLATES`; the regions are the
  grid's columns, left and right, and rows, top and bottom). A "no" is `elsewhere` (the class is
  there, only not in that region) or `absent`;
* two classes: "is there a coat and a sandal?" (`BOTH_TEMPLATES`). A "no" is `one_only` (one of
  the two is there) or `neither`;
* class words of things no scene holds (`NEVER_CLASSES`: no Fashion-MNIST photo shows them) and
  prompts with no word of the vocabulary (`vit.data.prompt_words`): always "no".

Photos: the `train` split's scenes use Fashion-MNIST's own training photos, `validation` its
validation slice, `test` and `heldout` only its test photos, so a "yes" in evaluation needs a
new photo of the class recognised.

Held out: the (class, region) pairs `HELDOUT_REGIONS` and the class pairs `HELDOUT_BOTH` are
never asked in `train`, `validation` or `test` (in any wording), only in `heldout` (in the first
wording); they are in the scenes of every split. `EVAL_TEMPLATES` (two class wordings, one of
each other kind) are never asked in training: `grid_questions` asks them of the test scenes.

Balance, couples, wordings and caching: `vit.data.prompted`, as for `promptshapes`.

Labels (for the ViT stage): multi-hot over the classes present, `CLASS_NAMES`, and `where`,
the class on each 4x4 block (`where_map`), for a per-patch readout (`train.patch_loss`): the
patch features learn what lies on each patch, and the text stage binds region words to the
patch positions (`text.head="placed"` or "things").
Photos come from `vit.data.real_sets.load_fashion_mnist` (Debian's `dataset-fashion-mnist`), or
from `photos` given to `generate` (tests).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

import vit.data.prompt_words as prompt_words
from vit.data.prompted import WHERE_CELL, PromptedDataset, PromptedSource, PromptedSplit
from vit.errors import DataError

# Fashion-MNIST's classes in its label order, as one word each ("T-shirt/top" is read as its
# own word pair "t shirt", apart from "shirt").
CLASSES = ("t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker",
           "bag", "boot")
NEVER_CLASSES = ("hat", "scarf", "glove", "sock")
REGIONS = ("left", "right", "top", "bottom")
PLACE = {"left": "on the left", "right": "on the right", "top": "at the top",
         "bottom": "at the bottom"}
CLASS_NAMES = list(CLASSES)
# Every class and every region is still asked about in training in some other pair.
HELDOUT_REGIONS = (("sneaker", "left"), ("coat", "right"), ("bag", "top"), ("dress", "bottom"),
                   ("trouser", "right"))
HELDOUT_BOTH = (("coat", "sandal"), ("bag", "sneaker"), ("shirt", "trouser"),
                ("dress", "boot"), ("pullover", "bag"))
CLASS_TEMPLATES = (
    "is there a {k}?",
    "is there any {k}?",
    "can you find a {k}?",
    "does the image contain a {k}?",
    "is a {k} in the picture?",
    "does this scene have a {k}?",
    "any {k} here?",
    "is there at least one {k}?",
)
REGION_TEMPLATES = ("is there a {k} {w}?", "is a {k} {w}?", "can you find a {k} {w}?")
BOTH_TEMPLATES = ("is there a {k} and a {k2}?", "are there both a {k} and a {k2}?",
                  "can you find a {k} and a {k2}?")
EVAL_TEMPLATES = {"class": ("do you see a {k}?", "is there a {k} in this image?"),
                  "region": ("do you see a {k} {w}?",),
                  "both": ("do you see a {k} and a {k2}?",)}
KINDS = ("class", "region", "both")
# Per couple of scenes: (kind of question, probability)
_COUPLES = (("class", 0.3), ("region", 0.3), ("both", 0.25), ("never", 0.15))

SPLITS = ("train", "validation", "test", "heldout")
PHOTO_SPLIT = {"train": "train", "validation": "validation", "test": "test", "heldout": "test"}
# 30,000 training scenes place each of the 55,000 training photos more than once on average:
# with a few thousand, the ViT stage memorises its scenes' photos and stops recognising new ones.
DEFAULT_SIZES = {"train": 30000, "validation": 500, "test": 500, "heldout": 500}
IMAGE_SIZE, CELL, PHOTO = 64, 32, 28
NOISE = 12
# cell index -> (row, col); cell regions
_CELLS = ((0, 0), (0, 1), (1, 0), (1, 1))
_CELL_REGIONS = tuple(({0: "left", 1: "right"}[c], {0: "top", 1: "bottom"}[r])
                      for r, c in _CELLS)
ALL_BOTH = tuple(itertools.combinations(CLASSES, 2))


def _held(kind: str, item: tuple) -> bool:
    if kind == "region":
        return item in HELDOUT_REGIONS
    if kind == "both":
        return item in HELDOUT_BOTH or item[::-1] in HELDOUT_BOTH
    return False


def asked(kind: str, split: str) -> tuple:
    """What a split asks about for a kind: classes, (class, region) or (class, class) pairs."""
    DATASET.check_split(split)
    items = {"class": tuple(CLASSES),
             "region": tuple((k, r) for k in CLASSES for r in REGIONS),
             "both": ALL_BOTH}[kind]
    if split == "heldout":
        return tuple(x for x in items if _held(kind, x))
    return tuple(x for x in items if not _held(kind, x))


# A scene: tuple of 4 class indices or -1 per cell.
def truth(scene, kind: str, item) -> bool:
    present = {CLASSES[c] for c in scene if c >= 0}
    if kind == "class":
        return item in present
    if kind == "region":
        k, r = item
        return any(c >= 0 and CLASSES[c] == k and r in _CELL_REGIONS[i]
                   for i, c in enumerate(scene))
    if kind == "both":
        return item[0] in present and item[1] in present
    return False  # never, unknown


def share(scene, kind: str, item) -> str:
    """"present" for a true question, else what kind of "no" it is for this scene."""
    if kind in ("never", "unknown"):
        return kind
    if truth(scene, kind, item):
        return "present"
    present = {CLASSES[c] for c in scene if c >= 0}
    if kind == "class":
        return "absent"
    if kind == "region":
        return "elsewhere" if item[0] in present else "absent"
    return "one_only" if (item[0] in present) != (item[1] in present) else "neither"


def _negatives(kind: str) -> tuple[str, ...]:
    return {"class": ("absent",), "region": ("elsewhere", "absent"),
            "both": ("one_only", "neither")}[kind]


def _random_scene(rng: np.random.Generator, must: dict[int, int]) -> tuple:
    """2-4 items of distinct classes in distinct cells, `must` (cell -> class) among them."""
    n = int(rng.integers(max(2, len(must)), 5))
    cells = [i for i in rng.permutation(4) if i not in must][:n - len(must)]
    scene = [-1] * 4
    for i, c in must.items():
        scene[i] = c
    used = set(must.values())
    for i in cells:
        free = [x for x in range(len(CLASSES)) if x not in used]
        c = free[int(rng.integers(len(free)))]  # rng.choice(free)'s draw, without its overhead
        scene[i] = c
        used.add(c)
    return tuple(scene)


def _must(rng: np.random.Generator, kind: str, item, negative: str | None) -> dict[int, int]:
    """Placements that make `item` true (negative None) or a "no" of kind `negative` likely."""
    cells = list(rng.permutation(4))
    if kind == "class" and negative is None:
        return {cells[0]: CLASSES.index(item)}
    if kind == "region":
        k, r = item
        inside = [i for i in cells if r in _CELL_REGIONS[i]]
        outside = [i for i in cells if r not in _CELL_REGIONS[i]]
        if negative is None:
            return {inside[0]: CLASSES.index(k)}
        if negative == "elsewhere":
            return {outside[0]: CLASSES.index(k)}
        return {}
    if kind == "both":
        if negative is None:
            return {cells[0]: CLASSES.index(item[0]), cells[1]: CLASSES.index(item[1])}
        if negative == "one_only":
            return {cells[0]: CLASSES.index(item[int(rng.integers(2))])}
    return {}


def _classes(kind: str, item) -> set[str]:
    return {item} if kind == "class" else {item[0]} if kind == "region" else set(item)


def _possible(kind: str, p, q, negative: str) -> bool:
    """Whether some scene answers both `p` and `q` "yes" in turn, the other "no" of kind
    `negative`: a "no" that needs its classes absent ("absent", "neither") cannot share a
    class with the "yes" (a bag on the left, no bag on the right)."""
    if negative in ("absent", "neither"):
        return not _classes(kind, p) & _classes(kind, q)
    return True


def _scene_for(rng, kind, yes_item, no_item, negative) -> tuple:
    """A scene where `yes_item` is true and `no_item` is a "no" of kind `negative`."""
    for _ in range(200):
        must = _must(rng, kind, yes_item, None)
        extra = _must(rng, kind, no_item, negative)
        if any(i in must and must[i] != c for i, c in extra.items()) or \
                len(set(must.values()) | set(extra.values())) < len({**must, **extra}):
            continue
        scene = _random_scene(rng, {**must, **extra})
        if truth(scene, kind, yes_item) and share(scene, kind, no_item) == negative:
            return scene
    return None


@dataclasses.dataclass
class FashionScenes(PromptedSplit):
    """One split, materialised, with where each photo lies."""

    scenes: np.ndarray  # [N, 4] int32: the class in each grid cell, -1 for none
    boxes: np.ndarray  # [N, 4, 4] int32: (y0, x0, y1, x1) of the photo in each cell
    # [N, 16, 16] int8: the class whose photo covers the centre of each 4x4 block, -1 for none
    # (what the per-patch readout learns, `train.patch_loss`)
    where: np.ndarray


def photos_of(split: str, data_dir=None) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST's photos for a scene split: (images uint8 [n, 28, 28], labels [n])."""
    from vit.data.real_sets import load_fashion_mnist

    images, labels, _ = load_fashion_mnist(PHOTO_SPLIT[split], data_dir)
    return images, labels


def where_map(cells: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """`[16, 16]` int8: the class of the photo (`cells`, `boxes` as `render` gives them) that
    covers each 4x4 block's centre pixel, -1 where none does."""
    side = IMAGE_SIZE // WHERE_CELL
    out = np.full((side, side), -1, np.int8)
    for c, box in zip(cells.tolist(), boxes.tolist(), strict=True):
        if c >= 0:  # the blocks whose centre (WHERE_CELL * i + WHERE_CELL // 2) is inside
            r0, c0, r1, c1 = (max(0, (v + WHERE_CELL // 2 - 1) // WHERE_CELL) for v in box)
            out[r0:r1, c0:c1] = c
    return out


def move_photos(image: np.ndarray, cells: np.ndarray, boxes: np.ndarray,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A rendered scene with each photo (and the noise under it) moved to a fresh place inside
    its own cell and mirrored left-right half the time, the place it left filled with fresh
    noise: the training augmentation `input.scene_jitter`. Every question keeps its answer
    (a photo never leaves its cell) and a photo is seen anew every epoch, so the ViT stage
    cannot memorise its scenes. -> (image [64, 64, 3] uint8, where map)."""
    canvas = image[..., 0].copy()
    pairs = zip(cells.tolist(), boxes.tolist(), strict=True)
    present = [(i, box) for i, (c, box) in enumerate(pairs) if c >= 0]
    photos = [canvas[y0:y1, x0:x1].copy() for _, (y0, x0, y1, x1) in present]
    for _, (y0, x0, y1, x1) in present:  # every draw of noise before every draw of place
        canvas[y0:y1, x0:x1] = rng.integers(0, NOISE, size=(y1 - y0, x1 - x0), dtype=np.uint8)
    moved = boxes.copy()
    for (i, _), photo in zip(present, photos, strict=True):
        row, col = _CELLS[i]
        y0 = row * CELL + int(rng.integers(0, CELL - PHOTO + 1))
        x0 = col * CELL + int(rng.integers(0, CELL - PHOTO + 1))
        canvas[y0:y0 + PHOTO, x0:x0 + PHOTO] = photo[:, ::-1] if rng.random() < 0.5 else photo
        moved[i] = (y0, x0, y0 + PHOTO, x0 + PHOTO)
    return np.repeat(canvas[..., None], 3, -1), where_map(cells, moved)


def grid_questions() -> list[dict]:
    """What `vit eval` asks of every test scene: every class, every (class, region) and every
    class pair in the first wording (`group` "seen" or "heldout"), every seen question in each
    evaluation-only wording ("wording"), never-placed class words ("never") and prompts of
    unknown words ("unknown"). Each entry: `{"prompt", "group", "kind", "item"}`."""
    out = []
    for kind in KINDS:
        items = asked(kind, "train") + asked(kind, "heldout")
        out += [{"prompt": question_text(kind, x), "group": "heldout" if _held(kind, x)
                 else "seen", "kind": kind, "item": x} for x in items]
    for kind in KINDS:
        out += [{"prompt": question_text(kind, x, t), "group": "wording", "kind": kind,
                 "item": x} for t in EVAL_TEMPLATES[kind] for x in asked(kind, "train")]
    out += [{"prompt": question_text("class", k), "group": "never", "kind": "never",
             "item": k} for k in NEVER_CLASSES]
    out += [{"prompt": question_text("region", (k, r)), "group": "never", "kind": "never",
             "item": (k, r)} for k in NEVER_CLASSES[:2] for r in REGIONS[:2]]
    out += [{"prompt": question_text("both", (k, CLASSES[i])), "group": "never",
             "kind": "never", "item": (k, CLASSES[i])} for i, k in enumerate(NEVER_CLASSES)]
    out += [{"prompt": p, "group": "unknown", "kind": "unknown", "item": p}
            for p in prompt_words.EVAL_PROMPTS]
    return out


class FashionScenesDataset(PromptedDataset):
    """Fashion-MNIST photos in a 2x2 grid; questions about a class, a class in a region, or two
    classes (`form` "class", "region", "both": the `KINDS`)."""

    name = "fashion_scenes"
    splits = SPLITS
    default_sizes = DEFAULT_SIZES
    label_kinds = {"classes": CLASS_NAMES}
    templates = {"class": CLASS_TEMPLATES, "region": REGION_TEMPLATES, "both": BOTH_TEMPLATES}
    eval_templates = EVAL_TEMPLATES
    field_words = {"k": CLASSES + NEVER_CLASSES, "k2": CLASSES + NEVER_CLASSES,
                   "w": tuple(PLACE.values())}
    couples = _COUPLES
    heldout_couples = ("region", "both")
    split_type = FashionScenes
    seed_salt = (7,)
    cache_size = 8

    def fields(self, form: str, item) -> dict[str, str]:
        if form == "class":
            return {"k": item}
        if form == "region":
            return {"k": item[0], "w": PLACE[item[1]]}
        return {"k": item[0], "k2": item[1]}

    def two_questions(self, rng: np.random.Generator, split: str, couple: str):
        items = asked(couple, split)
        while True:
            i, j = rng.choice(len(items), size=2, replace=False)
            p, q = items[i], items[j]
            negative = _negatives(couple)[int(rng.integers(len(_negatives(couple))))]
            if not _possible(couple, p, q, negative):
                continue  # no scene can answer it: drawn again, as the search would end
            a = _scene_for(rng, couple, p, q, negative)
            b = _scene_for(rng, couple, q, p, negative)
            if a is not None and b is not None:
                return (couple, p), (couple, q), negative, [a, b]

    def never_couple(self, rng: np.random.Generator, split: str):
        kind = KINDS[int(rng.integers(3))]
        items = asked(kind, split)
        p = items[int(rng.integers(len(items)))]
        negative = _negatives(kind)[int(rng.integers(len(_negatives(kind))))]
        a = _random_scene(rng, _must(rng, kind, p, None))
        b = None
        while b is None:
            b = _random_scene(rng, _must(rng, kind, p, negative))
            b = b if share(b, kind, p) == negative else None
        return (kind, p), negative, [a, b]

    def never_drawn(self, rng: np.random.Generator) -> tuple:
        """A never-placed class word in any form of question: alone, in a region, or beside a
        class, as evaluation asks it. One draw whatever the form (20 places a form: every
        region and every class equally often), so no other draw of the split depends on the
        form."""
        i = int(rng.integers(3 * len(NEVER_CLASSES) * 20))
        word, extra = NEVER_CLASSES[i // 3 % len(NEVER_CLASSES)], i // (3 * len(NEVER_CLASSES))
        return (("class", word), ("region", (word, REGIONS[extra % len(REGIONS)])),
                ("both", (word, CLASSES[extra % len(CLASSES)])))[i % 3]

    def load_materials(self, split: str, data_dir: str | None):
        return photos_of(split, data_dir)

    def prepare(self, materials):
        """(photos, labels) -> (photos, the photos of each class)."""
        photo_images, photo_labels = materials
        by_class = [np.flatnonzero(np.asarray(photo_labels) == c) for c in range(len(CLASSES))]
        if any(len(b) == 0 for b in by_class):
            raise DataError("fashion_scenes: the photos lack a class; every class 0-9 is needed")
        return photo_images, by_class

    def render(self, rng: np.random.Generator, scene, materials) -> dict[str, np.ndarray]:
        photo_images, by_class = materials
        canvas = rng.integers(0, NOISE, size=(IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)
        labels = np.zeros(len(CLASS_NAMES), np.float32)
        cells = np.full(4, -1, np.int32)
        boxes = np.zeros((4, 4), np.int32)
        for i, c in enumerate(scene):
            if c < 0:
                continue
            row, col = _CELLS[i]
            y0 = row * CELL + int(rng.integers(0, CELL - PHOTO + 1))
            x0 = col * CELL + int(rng.integers(0, CELL - PHOTO + 1))
            photo = photo_images[by_class[c][int(rng.integers(len(by_class[c])))]]
            region = canvas[y0:y0 + PHOTO, x0:x0 + PHOTO]
            np.maximum(region, photo, out=region)
            boxes[i] = (y0, x0, y0 + PHOTO, x0 + PHOTO)
            cells[i] = c
            labels[c] = 1.0
        return {"images": np.repeat(canvas[..., None], 3, -1), "labels": labels,
                "scenes": cells, "boxes": boxes, "where": where_map(cells, boxes)}

    def question_grid(self, data) -> tuple[list[dict], np.ndarray]:
        grid = grid_questions()
        found = np.asarray([[share(tuple(scene), q["kind"], q["item"]) for q in grid]
                            for scene in data.scenes.tolist()])
        return grid, found


DATASET = FashionScenesDataset()
question_text = DATASET.text
vocabulary = DATASET.vocabulary
longest_prompt = DATASET.longest_prompt


def generate(split: str, num_images: int | None = None, seed: int = 0, *,
             photos: tuple[np.ndarray, np.ndarray] | None = None,
             data_dir: str | None = None) -> FashionScenes:
    """Materialise a split (`vit.data.prompted.PromptedDataset.generate`). `photos` (images
    [n, 28, 28] uint8, labels [n] in 0-9) replace Fashion-MNIST's."""
    return DATASET.generate(split, num_images, seed, materials=photos, data_dir=data_dir)


class FashionScenesSource(PromptedSource):
    """fashion_scenes' examples for grain (`vit.data.prompted.PromptedSource`)."""

    dataset = DATASET

    def __init__(self, split: str, num_images: int | None = None, seed: int = 0,
                 data_dir: str | None = None, photos=None, labels: str | None = None):
        super().__init__(split, num_images, seed, labels=labels, data_dir=data_dir,
                         materials=photos)

    def jitter(self, element: dict, rng: np.random.Generator) -> dict:
        """`element` (one of this source's) with its photos moved (`move_photos`)."""
        i = int(element["image_id"])
        image, where = move_photos(element["image"], self.data.scenes[i], self.data.boxes[i],
                                   rng)
        return {**element, "image": image, "where": where}
