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

Balance: as in `promptshapes`, scenes come in couples asking the same two strings (scene A holds
p and not q, scene B the other way round), so every answerable prompt string is true in exactly
half of its uses within a split.

Labels (for the ViT stage): multi-hot over the classes present, `CLASS_NAMES`. Where an item
is comes only from the patch it lies on (its position embedding), never from a label, so a
region word has to be bound to positions by the text stage.
Deterministic for (split, num_images, seed); cached in-process. Photos come from
`vit.data.real_sets.load_fashion_mnist` (Debian's `dataset-fashion-mnist`), or from `photos`
given to `generate` (tests).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import numpy as np

import vit.data.prompt_words as prompt_words
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
DROP_MARK, RECASE, UNKNOWN = 0.3, 0.2, 0.5

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


class SplitError(DataError, ValueError):
    """An unknown fashion_scenes split, or a bad size."""


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise SplitError(f"fashion_scenes has no split {split!r}; use one of {', '.join(SPLITS)}")


def _held(kind: str, item: tuple) -> bool:
    if kind == "region":
        return item in HELDOUT_REGIONS
    if kind == "both":
        return item in HELDOUT_BOTH or item[::-1] in HELDOUT_BOTH
    return False


def asked(kind: str, split: str) -> tuple:
    """What a split asks about for a kind: classes, (class, region) or (class, class) pairs."""
    _check_split(split)
    items = {"class": tuple(CLASSES),
             "region": tuple((k, r) for k in CLASSES for r in REGIONS),
             "both": ALL_BOTH}[kind]
    if split == "heldout":
        return tuple(x for x in items if _held(kind, x))
    return tuple(x for x in items if not _held(kind, x))


def question_text(kind: str, item, template: str | None = None) -> str:
    """("region", ("bag", "left")) -> "is there a bag on the left?" (or in `template`)."""
    if kind == "class":
        return (template or CLASS_TEMPLATES[0]).format(k=item)
    if kind == "region":
        return (template or REGION_TEMPLATES[0]).format(k=item[0], w=PLACE[item[1]])
    return (template or BOTH_TEMPLATES[0]).format(k=item[0], k2=item[1])


@functools.cache
def vocabulary() -> frozenset[str]:
    """Every word of every training prompt (never-placed class words included)."""
    everything = CLASSES + NEVER_CLASSES
    prompts = [t.format(k=k, k2=k, w=PLACE[r]) for k in everything for r in REGIONS
               for t in CLASS_TEMPLATES + REGION_TEMPLATES + BOTH_TEMPLATES]
    return prompt_words.vocabulary_from(prompts)


def longest_prompt() -> str:
    k = max(CLASSES + NEVER_CLASSES, key=len)
    w = max(PLACE.values(), key=len)
    templates = (CLASS_TEMPLATES + REGION_TEMPLATES + BOTH_TEMPLATES
                 + sum(EVAL_TEMPLATES.values(), ()))
    return max((t.format(k=k, k2=k, w=w).upper() for t in templates), key=len)


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
        c = int(rng.choice([x for x in range(len(CLASSES)) if x not in used]))
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


class _Wording:
    def __init__(self, rng, heldout: bool):
        pick = (lambda ts: ts[0]) if heldout else (lambda ts: ts[int(rng.integers(len(ts)))])
        self.templates = {"class": pick(CLASS_TEMPLATES), "region": pick(REGION_TEMPLATES),
                          "both": pick(BOTH_TEMPLATES)}
        self.drop_mark = not heldout and rng.random() < DROP_MARK
        self.case = (["upper", "capitalize", "title"][int(rng.integers(3))]
                     if not heldout and rng.random() < RECASE else None)

    def __call__(self, kind: str, item) -> str:
        text = item if kind == "unknown" else question_text(
            "class" if kind == "never" else kind, item,
            self.templates["class" if kind == "never" else kind])
        if self.drop_mark:
            text = text.rstrip("?")
        return getattr(text, self.case)() if self.case else text


def _never_question(rng) -> tuple[str, object]:
    """("unknown", prompt) or ("never", a never-placed class word) asked as a class question."""
    if rng.random() < UNKNOWN:
        return "unknown", prompt_words.unknown_prompt(rng, vocabulary())
    return "never", NEVER_CLASSES[int(rng.integers(len(NEVER_CLASSES)))]


def _couple(rng, split: str, couple: str):
    """Two scenes and, per scene, two (kind, item, answer, what-kind-of-answer)."""
    if couple == "never":
        kind = KINDS[int(rng.integers(3))]
        items = asked(kind, split)
        p = items[int(rng.integers(len(items)))]
        negative = _negatives(kind)[int(rng.integers(len(_negatives(kind))))]
        a = _random_scene(rng, _must(rng, kind, p, None))
        b = None
        while b is None:
            b = _random_scene(rng, _must(rng, kind, p, negative))
            b = b if share(b, kind, p) == negative else None
        n1, n2 = _never_question(rng), _never_question(rng)
        return [a, b], [[(kind, p, 1, "yes"), (*n1, 0, n1[0])],
                        [(kind, p, 0, negative), (*n2, 0, n2[0])]]
    kind = couple
    items = asked(kind, split)
    while True:
        i, j = rng.choice(len(items), size=2, replace=False)
        p, q = items[i], items[j]
        negative = _negatives(kind)[int(rng.integers(len(_negatives(kind))))]
        a = _scene_for(rng, kind, p, q, negative)
        b = _scene_for(rng, kind, q, p, negative)
        if a is not None and b is not None:
            return [a, b], [[(kind, p, 1, "yes"), (kind, q, 0, negative)],
                            [(kind, q, 1, "yes"), (kind, p, 0, negative)]]


@dataclasses.dataclass
class FashionScenes:
    """One split, materialised. Examples 2i and 2i+1 ask about image i."""

    images: np.ndarray  # [N, 64, 64, 3] uint8
    labels: np.ndarray  # [N, len(CLASS_NAMES)] float32 multi-hot over the classes present
    scenes: np.ndarray  # [N, 4] int32: the class in each grid cell, -1 for none
    boxes: np.ndarray  # [N, 4, 4] int32: (y0, x0, y1, x1) of the photo in each cell
    prompts: list[str]
    answers: np.ndarray  # [2N] int32
    kinds: list[str]  # [2N]: "yes", a kind of "no", "never" or "unknown"

    @property
    def num_images(self) -> int:
        return len(self.images)

    @property
    def num_examples(self) -> int:
        return len(self.prompts)


def photos_of(split: str, data_dir=None) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST's photos for a scene split: (images uint8 [n, 28, 28], labels [n])."""
    from vit.data.real_sets import load_fashion_mnist

    images, labels, _ = load_fashion_mnist(PHOTO_SPLIT[split], data_dir)
    return images, labels


def generate(split: str, num_images: int | None = None, seed: int = 0, *,
             photos: tuple[np.ndarray, np.ndarray] | None = None,
             data_dir: str | None = None) -> FashionScenes:
    """Materialise a split (`num_images` even; default `DEFAULT_SIZES[split]`). `photos`
    (images [n, 28, 28] uint8, labels [n] in 0-9) replace Fashion-MNIST's."""
    _check_split(split)
    num_images = DEFAULT_SIZES[split] if num_images is None else int(num_images)
    if num_images < 2 or num_images % 2:
        raise SplitError(f"fashion_scenes: num_images must be an even number >= 2, "
                         f"not {num_images}")
    if photos is None:
        return _cached(split, num_images, int(seed), data_dir)
    return _generate(split, num_images, int(seed), *photos)


@functools.lru_cache(maxsize=8)
def _cached(split, num_images, seed, data_dir):
    return _generate(split, num_images, seed, *photos_of(split, data_dir))


def _generate(split: str, num_images: int, seed: int, photo_images: np.ndarray,
              photo_labels: np.ndarray) -> FashionScenes:
    rng = np.random.default_rng(np.random.SeedSequence([seed, SPLITS.index(split), 7]))
    by_class = [np.flatnonzero(np.asarray(photo_labels) == c) for c in range(len(CLASSES))]
    if any(len(b) == 0 for b in by_class):
        raise DataError("fashion_scenes: the photos lack a class; every class 0-9 is needed")
    heldout = split == "heldout"
    names = [n for n, _ in _COUPLES]
    chances = np.asarray([p for _, p in _COUPLES])
    scenes, questions = [], []
    for _ in range(num_images // 2):
        if heldout:
            couple = ("region", "both")[int(rng.integers(2))]
        else:
            couple = names[int(rng.choice(len(names), p=chances / chances.sum()))]
        two, asks = _couple(rng, split, couple)
        wording = _Wording(rng, heldout)
        scenes += two
        questions += [[(wording(k, item), a, what) for k, item, a, what in ask]
                      for ask in asks]
    order = rng.permutation(num_images)
    images = np.empty((num_images, IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8)
    labels = np.zeros((num_images, len(CLASS_NAMES)), np.float32)
    scene_arr = np.full((num_images, 4), -1, np.int32)
    boxes = np.zeros((num_images, 4, 4), np.int32)
    prompts, answers, kinds = [], [], []
    for n, k in enumerate(order):
        scene = scenes[k]
        canvas = rng.integers(0, NOISE, size=(IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)
        for i, c in enumerate(scene):
            if c < 0:
                continue
            row, col = _CELLS[i]
            y0 = row * CELL + int(rng.integers(0, CELL - PHOTO + 1))
            x0 = col * CELL + int(rng.integers(0, CELL - PHOTO + 1))
            photo = photo_images[by_class[c][int(rng.integers(len(by_class[c])))]]
            region = canvas[y0:y0 + PHOTO, x0:x0 + PHOTO]
            np.maximum(region, photo, out=region)
            boxes[n, i] = (y0, x0, y0 + PHOTO, x0 + PHOTO)
            scene_arr[n, i] = c
            labels[n, c] = 1.0
        images[n] = canvas[..., None]
        two = questions[k] if rng.integers(2) else questions[k][::-1]
        for text, answer, what in two:
            prompts.append(text)
            answers.append(answer)
            kinds.append(what)
    answers = np.asarray(answers, np.int32)
    for a in (images, labels, scene_arr, boxes, answers):
        a.setflags(write=False)
    return FashionScenes(images, labels, scene_arr, boxes, prompts, answers, kinds)


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


class FashionScenesSource:
    """Random access over a split's (image, prompt) examples, as grain expects:
    `{"image", "label", "prompt", "answer", "image_id"}`; examples 2i and 2i+1 share image i."""

    name = "fashion_scenes"
    multi_label = True

    def __init__(self, split: str, num_images: int | None = None, seed: int = 0,
                 data_dir: str | None = None, photos=None):
        self.split = split
        self.data = generate(split, num_images, seed, photos=photos, data_dir=data_dir)
        self.class_names = list(CLASS_NAMES)
        self.num_classes = len(CLASS_NAMES)
        self.prompts = sorted(set(self.data.prompts))

    def __len__(self) -> int:
        return self.data.num_examples

    @property
    def image_ids(self) -> np.ndarray:
        return np.arange(len(self)) // 2

    def question_grid(self) -> tuple[list[dict], np.ndarray]:
        """`grid_questions()` and `[images, questions]` what each scene makes of each
        ("present" for a true one, else the kind of "no")."""
        grid = grid_questions()
        kind_of = [q["kind"] for q in grid]
        shares = np.asarray([[share(tuple(scene), k, q["item"]) for k, q in zip(kind_of, grid,
                                                                                strict=True)]
                             for scene in self.data.scenes.tolist()])
        return grid, shares

    def __getitem__(self, i: int) -> dict:
        n = len(self)
        i = int(i)
        if not -n <= i < n:
            raise IndexError(f"fashion_scenes:{self.split} has {n} examples, no index {i}")
        i %= n
        return {"image": self.data.images[i // 2], "label": self.data.labels[i // 2],
                "prompt": self.data.prompts[i], "answer": self.data.answers[i],
                "image_id": np.int32(i // 2)}
