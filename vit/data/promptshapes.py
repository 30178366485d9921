"""`promptshapes`: a seeded, offline benchmark for text-conditioned classification.

Each 64x64 RGB scene holds 2 to 4 coloured shapes, every one a distinct (colour, shape) pair,
on a dark, lightly noisy background. Each image comes with two yes/no questions of the form
"is there a red triangle?": one true (a pair in the scene, answer 1) and one *hard* false
(answer 0): a pair whose colour is in the scene on another shape and whose shape is in the
scene in another colour, so neither the colour nor the shape alone answers it.

Splits:

* ``train`` / ``test``: prompts from every pair except `HELDOUT_PAIRS` (different seeds).
* ``heldout``: prompts only from `HELDOUT_PAIRS`, to test compositional generalisation.

The held-out pairs are withheld from the *prompts* only: they are drawn in the images of every
split and marked in every image's multi-hot `labels`.

Balance: every prompt string is true in exactly half of its uses within a split. Images come in
twos built from an ordered pair of distinct prompt pairs (p, q): scene A holds p and is a hard
negative for q, scene B holds q and is a hard negative for p; A asks (p: yes, q: no) and B asks
(q: yes, p: no). Images are then shuffled and the two questions of an image put in random order.

Only numpy and pillow; deterministic for (split, num_images, seed), cached in-process.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
from PIL import Image, ImageDraw

from vit.errors import DataError

COLORS = ("red", "green", "blue", "yellow", "purple", "white")
SHAPES = ("square", "circle", "triangle", "cross")
RGB = {
    "red": (230, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 90, 240),
    "yellow": (240, 220, 40),
    "purple": (170, 60, 210),
    "white": (245, 245, 245),
}
# Every (colour, shape), colour-major: index c * len(SHAPES) + s.
PAIRS = tuple((c, s) for c in COLORS for s in SHAPES)
CLASS_NAMES = [f"{c} {s}" for c, s in PAIRS]
# Never asked about in train/test; each shape once, each colour at most once (purple and white
# never), so every colour and every shape still appears in training prompts.
HELDOUT_PAIRS = (("red", "triangle"), ("green", "cross"), ("blue", "circle"),
                 ("yellow", "square"))
TRAIN_PAIRS = tuple(p for p in PAIRS if p not in HELDOUT_PAIRS)

SPLITS = ("train", "test", "heldout")
DEFAULT_SIZES = {"train": 4000, "test": 500, "heldout": 500}  # images (each gives 2 examples)
IMAGE_SIZE = 64
BACKGROUND = (16, 16, 22)  # plus the same uniform noise in [0, NOISE) on each channel
NOISE = 12
SHAPE_SIZES = (11, 14)  # bounding-box side in pixels, inclusive
# Shapes sit in distinct cells of a 4x4 grid of 16 px cells, 1 px inside the cell, so they never
# touch, and each lies within one 16x16 patch: the benchmark tests reading the text, and a
# small ViT trained from scratch on a CPU learns the scenes in minutes.
_GRID = 4
_CELL_STARTS = (0, 16, 32, 48)
_CELL_ENDS = (16, 32, 48, 64)
_PAIR_INDEX = {p: i for i, p in enumerate(PAIRS)}


class SplitError(DataError, ValueError):
    """An unknown promptshapes split, or a bad size."""


def prompt_of(pair: tuple[str, str]) -> str:
    """("red", "triangle") -> "is there a red triangle?"."""
    colour, shape = pair
    return f"is there a {colour} {shape}?"


PROMPTS = {prompt_of(p): p for p in PAIRS}


def pair_of(prompt: str) -> tuple[str, str]:
    """The inverse of `prompt_of`."""
    try:
        return PROMPTS[prompt]
    except KeyError:
        raise ValueError(f"not a promptshapes prompt: {prompt!r}") from None


def split_pairs(split: str) -> tuple[tuple[str, str], ...]:
    """The pairs a split asks about."""
    _check_split(split)
    return HELDOUT_PAIRS if split == "heldout" else TRAIN_PAIRS


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise SplitError(f"promptshapes has no split {split!r}; use one of {', '.join(SPLITS)}")


@dataclasses.dataclass
class PromptShapes:
    """One split, materialised. Examples 2i and 2i+1 ask about image i."""

    images: np.ndarray  # [N, 64, 64, 3] uint8
    labels: np.ndarray  # [N, len(PAIRS)] float32 multi-hot over PAIRS
    prompts: list[str]  # [2N]
    answers: np.ndarray  # [2N] int32, 1 = the prompt's pair is in the image

    @property
    def num_images(self) -> int:
        return len(self.images)

    @property
    def num_examples(self) -> int:
        return len(self.prompts)


def _hard_negative_scene(rng: np.random.Generator, p: tuple[str, str],
                         q: tuple[str, str]) -> list[tuple[str, str]]:
    """2-4 distinct pairs: p is present; q is absent but its colour (on another shape) and its
    shape (in another colour) are present."""
    scene = [p]
    if p[0] != q[0]:  # q's colour on another shape
        shapes = [s for s in SHAPES if s != q[1] and (q[0], s) not in scene]
        scene.append((q[0], shapes[rng.integers(len(shapes))]))
    if p[1] != q[1]:  # q's shape in another colour
        colours = [c for c in COLORS if c != q[0] and (c, q[1]) not in scene]
        scene.append((colours[rng.integers(len(colours))], q[1]))
    k = int(rng.integers(max(2, len(scene)), 5))
    rest = [x for x in PAIRS if x != q and x not in scene]
    extra = rng.choice(len(rest), size=k - len(scene), replace=False)
    scene += [rest[i] for i in extra]
    return [scene[i] for i in rng.permutation(len(scene))]


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, x0: int, y0: int, size: int,
                fill: tuple[int, int, int]) -> None:
    x1, y1 = x0 + size - 1, y0 + size - 1
    if shape == "square":
        draw.rectangle([x0, y0, x1, y1], fill=fill)
    elif shape == "circle":
        draw.ellipse([x0, y0, x1, y1], fill=fill)
    elif shape == "triangle":  # apex up, base on the bottom row
        draw.polygon([(x0 + (size - 1) / 2, y0), (x1, y1), (x0, y1)], fill=fill)
    elif shape == "cross":  # a plus sign, arms 0.4 of the side thick
        t = round(0.4 * size)
        a = (size - t) // 2
        draw.rectangle([x0 + a, y0, x0 + a + t - 1, y1], fill=fill)
        draw.rectangle([x0, y0 + a, x1, y0 + a + t - 1], fill=fill)
    else:
        raise AssertionError(shape)


def _render(rng: np.random.Generator, scene: list[tuple[str, str]]) -> np.ndarray:
    # light grey noise on the background; shapes are drawn over it in their exact colour
    noise = rng.integers(0, NOISE, size=(IMAGE_SIZE, IMAGE_SIZE, 1), dtype=np.uint8)
    image = Image.fromarray(np.asarray(BACKGROUND, np.uint8) + noise)
    draw = ImageDraw.Draw(image)
    cells = rng.choice(_GRID * _GRID, size=len(scene), replace=False)
    for (colour, shape), cell in zip(scene, cells, strict=True):
        size = int(rng.integers(SHAPE_SIZES[0], SHAPE_SIZES[1] + 1))
        row, col = divmod(int(cell), _GRID)
        # 1 px margin inside the cell on each side, so shapes in neighbouring cells never touch
        x0 = int(rng.integers(_CELL_STARTS[col] + 1, _CELL_ENDS[col] - size))
        y0 = int(rng.integers(_CELL_STARTS[row] + 1, _CELL_ENDS[row] - size))
        _draw_shape(draw, shape, x0, y0, size, RGB[colour])
    return np.asarray(image)


def generate(split: str, num_images: int | None = None, seed: int = 0) -> PromptShapes:
    """Materialise a split: `num_images` images (default: `DEFAULT_SIZES[split]`, always even),
    2 examples each. Cached per (split, num_images, seed); the arrays are read-only."""
    _check_split(split)
    num_images = DEFAULT_SIZES[split] if num_images is None else int(num_images)
    if num_images < 2 or num_images % 2:
        raise SplitError(f"promptshapes: num_images must be an even number >= 2, "
                         f"not {num_images}")
    return _generate(split, num_images, int(seed))


@functools.lru_cache(maxsize=16)
def _generate(split: str, num_images: int, seed: int) -> PromptShapes:
    # independent streams per split: the split's index is part of the seed
    rng = np.random.default_rng(np.random.SeedSequence([seed, SPLITS.index(split)]))
    asked = split_pairs(split)
    scenes, questions = [], []  # questions: (pair, answer) x 2 per image
    for _ in range(num_images // 2):
        i, j = rng.choice(len(asked), size=2, replace=False)
        p, q = asked[i], asked[j]
        scenes += [_hard_negative_scene(rng, p, q), _hard_negative_scene(rng, q, p)]
        questions += [[(p, 1), (q, 0)], [(q, 1), (p, 0)]]
    order = rng.permutation(num_images)
    images = np.empty((num_images, IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8)
    labels = np.zeros((num_images, len(PAIRS)), np.float32)
    prompts, answers = [], []
    for n, k in enumerate(order):
        images[n] = _render(rng, scenes[k])
        labels[n, [_PAIR_INDEX[x] for x in scenes[k]]] = 1.0
        two = questions[k] if rng.integers(2) else questions[k][::-1]
        prompts += [prompt_of(pair) for pair, _ in two]
        answers += [answer for _, answer in two]
    answers = np.asarray(answers, np.int32)
    for a in (images, labels, answers):
        a.setflags(write=False)
    return PromptShapes(images, labels, prompts, answers)


class PromptShapesSource:
    """Random access over a split's (image, prompt) examples, as grain expects.

    `source[i]` is `{"image": uint8 [64, 64, 3], "label": float32 multi-hot over PAIRS,
    "prompt": str, "answer": int32}`; examples 2i and 2i+1 share image i. `prompts` lists the
    distinct prompt strings the split asks.
    """

    name = "promptshapes"
    multi_label = True

    def __init__(self, split: str, num_images: int | None = None, seed: int = 0):
        self.split = split
        self.data = generate(split, num_images, seed)
        self.class_names = list(CLASS_NAMES)
        self.num_classes = len(CLASS_NAMES)
        self.pairs = split_pairs(split)
        self.prompts = [prompt_of(p) for p in self.pairs]

    def __len__(self) -> int:
        return self.data.num_examples

    @property
    def image_ids(self) -> np.ndarray:
        """The image of each example (examples 2i and 2i+1 share image i)."""
        return np.arange(len(self)) // 2

    def __getitem__(self, i: int) -> dict:
        n = len(self)
        i = int(i)
        if not -n <= i < n:
            raise IndexError(f"promptshapes:{self.split} has {n} examples, no index {i}")
        i %= n
        return {"image": self.data.images[i // 2], "label": self.data.labels[i // 2],
                "prompt": self.data.prompts[i], "answer": self.data.answers[i],
                "image_id": np.int32(i // 2)}
