"""`promptshapes`: a seeded, offline benchmark for text-conditioned classification.

Each 64x64 RGB scene holds 2 to 4 coloured shapes, every one a distinct (colour, shape) pair,
on a dark, lightly noisy background, and comes with two yes/no questions. Training asks every
kind of question a user could ask, so that a model has to read the words, not memorise strings:

* pair questions ("is there a red triangle?"), true (the pair is drawn) or false in one of four
  ways, by what the scene shares with the question: `hard` (the colour on another shape and the
  shape in another colour), `colour_only`, `shape_only` and `neither`;
* single-attribute questions ("is there anything red?", "is there a triangle?"), which name
  a colour or a shape apart;
* questions about things never drawn (`NEVER_COLORS`, `NEVER_SHAPES`), always "no";
* prompts with no word of the vocabulary ("hello", random letters: `vit.data.prompt_words`),
  always "no", so a question about nothing the model knows is not a coin flip.

Wordings: `PAIR_TEMPLATES` (and `COLOUR_TEMPLATES`, `SHAPE_TEMPLATES`) in training;
`EVAL_TEMPLATES` never in training, kept for evaluation.

Splits:

* ``train`` / ``test``: pair questions about every pair except `HELDOUT_PAIRS` (different
  seeds), in the training wordings.
* ``heldout``: pair questions only about `HELDOUT_PAIRS`, in the first wording, to test
  composition. The held-out pairs are withheld from the *prompts* only, in every wording: they
  are drawn in the images of every split and marked in every image's multi-hot `labels`.

Balance, couples, wordings' "?" and case, caching: `vit.data.prompted`. For pair and
single-attribute couples scene A holds p and lacks q and scene B the other way round; a
never-drawn couple asks a pair of both scenes. `grid_questions` lists what an evaluation asks
of every image (see `vit.inference.questions`).

Only numpy and pillow.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from PIL import Image, ImageDraw

import vit.data.prompt_words as prompt_words
from vit.data.prompted import (
    HELDOUT,
    WHERE_CELL,
    PromptedDataset,
    PromptedSource,
    PromptedSplit,
)

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
# Words for things no scene ever holds: asked about only as "no" questions, so a model learns
# that what it cannot see is not there.
NEVER_COLORS = ("pink", "orange")
NEVER_SHAPES = ("hexagon", "star")
# Every (colour, shape), colour-major: index c * len(SHAPES) + s.
PAIRS = tuple((c, s) for c in COLORS for s in SHAPES)
CLASS_NAMES = [f"{c} {s}" for c, s in PAIRS]
# Never asked about in train/test; each shape once, each colour at most once (purple and white
# never), so every colour and every shape still appears in training prompts.
HELDOUT_PAIRS = (("red", "triangle"), ("green", "cross"), ("blue", "circle"),
                 ("yellow", "square"))
TRAIN_PAIRS = tuple(p for p in PAIRS if p not in HELDOUT_PAIRS)

# Wordings. The first pair template is the canonical one (`prompt_of`).
PAIR_TEMPLATES = (
    "is there a {c} {s}?",
    "is there any {c} {s}?",
    "can you find a {c} {s}?",
    "does the image contain a {c} {s}?",
    "is a {c} {s} in the picture?",
    "does this scene have a {c} {s}?",
    "is there a {s} that is {c}?",
    "any {c} {s} here?",
    "is there at least one {c} {s}?",
)
EVAL_TEMPLATES = ("do you see a {c} {s}?", "is there a {c} {s} in this image?")
COLOUR_TEMPLATES = ("is there anything {c}?", "is any shape {c}?", "is something {c}?")
SHAPE_TEMPLATES = ("is there a {s}?", "can you find a {s}?", "is there any {s}?")
# Kinds of "no" to a pair question, by what the scene shares with it.
NEGATIVE_KINDS = ("hard", "colour_only", "shape_only", "neither")
# Per couple of images: (what the two images ask, probability).
_COUPLES = (("hard", 0.15), ("colour_only", 0.15), ("shape_only", 0.15), ("neither", 0.15),
            ("attribute", 0.25), ("never", 0.15))

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


def prompt_of(pair: tuple[str, str], template: str = PAIR_TEMPLATES[0]) -> str:
    """("red", "triangle") -> "is there a red triangle?" (or in another pair template)."""
    colour, shape = pair
    return template.format(c=colour, s=shape)


PROMPTS = {prompt_of(p): p for p in PAIRS}


def pair_of(prompt: str) -> tuple[str, str]:
    """The inverse of `prompt_of` in the canonical wording."""
    try:
        return PROMPTS[prompt]
    except KeyError:
        raise ValueError(f"not a promptshapes prompt: {prompt!r}") from None


words = prompt_words.words


def split_pairs(split: str) -> tuple[tuple[str, str], ...]:
    """The pairs a split asks about."""
    DATASET.check_split(split)
    return HELDOUT_PAIRS if split == HELDOUT else TRAIN_PAIRS


def _pick(rng: np.random.Generator, items: list):
    return items[int(rng.integers(len(items)))]


def _allowed(kind: str, absent: tuple[str, str]):
    """Pairs a scene may hold when `absent` must be a "no" of this kind."""
    c, s = absent
    banned = {"hard": lambda x: False,
              "colour_only": lambda x: x[1] == s,
              "shape_only": lambda x: x[0] == c,
              "neither": lambda x: x[0] == c or x[1] == s}[kind]
    return lambda x: x != absent and not banned(x)


def _fits(kind: str, p: tuple[str, str], q: tuple[str, str]) -> bool:
    """Whether a scene holding p can make q a "no" of `kind` (and the other way round)."""
    return p != q and _allowed(kind, q)(p) and _allowed(kind, p)(q)


def _scene(rng: np.random.Generator, present: tuple[str, str], absent: tuple[str, str],
           kind: str) -> list[tuple[str, str]]:
    """2-4 distinct pairs: `present` is there; `absent` is not, and the scene shares with it
    what `kind` says (hard: its colour on another shape and its shape in another colour)."""
    ok = _allowed(kind, absent)
    scene = [present]
    c, s = absent
    if kind in ("hard", "colour_only") and present[0] != c:  # its colour on another shape
        scene.append((c, _pick(rng, [x for x in SHAPES if x != s and (c, x) not in scene])))
    if kind in ("hard", "shape_only") and present[1] != s:  # its shape in another colour
        scene.append((_pick(rng, [x for x in COLORS if x != c and (x, s) not in scene]), s))
    return _fill(rng, scene, ok)


def _fill(rng: np.random.Generator, scene: list, ok) -> list[tuple[str, str]]:
    k = int(rng.integers(max(2, len(scene)), 5))
    rest = [x for x in PAIRS if x not in scene and ok(x)]
    extra = rng.choice(len(rest), size=k - len(scene), replace=False)
    scene = scene + [rest[i] for i in extra]
    return [scene[i] for i in rng.permutation(len(scene))]


def _has(attribute: tuple[str, str], x: tuple[str, str]) -> bool:
    which, word = attribute
    return x[0 if which == "colour" else 1] == word


def _attribute_scene(rng: np.random.Generator, a: tuple[str, str],
                     b: tuple[str, str]) -> list[tuple[str, str]]:
    """2-4 pairs: something has attribute a, nothing has attribute b."""
    first = _pick(rng, [x for x in PAIRS if _has(a, x) and not _has(b, x)])
    return _fill(rng, [first], lambda x: not _has(b, x))


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


@dataclasses.dataclass
class PromptShapes(PromptedSplit):
    """One split, materialised, with what lies in each cell."""

    # [N, 16, 16] int8: the index in `PAIRS` of the shape in the cell each 4x4 block lies in,
    # -1 for an empty cell (what the per-patch readout learns, `train.patch_loss`)
    where: np.ndarray


def _render(rng: np.random.Generator, scene: list[tuple[str, str]]
            ) -> tuple[np.ndarray, np.ndarray]:
    """The image, and its `PromptShapes.where` map."""
    # light grey noise on the background; shapes are drawn over it in their exact colour
    noise = rng.integers(0, NOISE, size=(IMAGE_SIZE, IMAGE_SIZE, 1), dtype=np.uint8)
    image = Image.fromarray(np.asarray(BACKGROUND, np.uint8) + noise)
    draw = ImageDraw.Draw(image)
    cells = rng.choice(_GRID * _GRID, size=len(scene), replace=False)
    block = IMAGE_SIZE // _GRID // WHERE_CELL  # cells of the where map per grid cell side
    where = np.full((block * _GRID, block * _GRID), -1, np.int8)
    for (colour, shape), cell in zip(scene, cells, strict=True):
        size = int(rng.integers(SHAPE_SIZES[0], SHAPE_SIZES[1] + 1))
        row, col = divmod(int(cell), _GRID)
        where[row * block:(row + 1) * block, col * block:(col + 1) * block] = \
            _PAIR_INDEX[(colour, shape)]
        # 1 px margin inside the cell on each side, so shapes in neighbouring cells never touch
        x0 = int(rng.integers(_CELL_STARTS[col] + 1, _CELL_ENDS[col] - size))
        y0 = int(rng.integers(_CELL_STARTS[row] + 1, _CELL_ENDS[row] - size))
        _draw_shape(draw, shape, x0, y0, size, RGB[colour])
    return np.asarray(image), where


def grid_questions() -> list[dict]:
    """What an evaluation asks of every image: each colour x shape question in the canonical
    wording (`group` "seen" or "heldout"), each seen pair in every evaluation-only wording
    ("wording"), and questions naming never-drawn words ("never"). Each entry:
    `{"prompt", "group", "pair"}` (pair: (colour, shape), None for a never-drawn word)."""
    out = [{"prompt": prompt_of(p), "group": "heldout" if p in HELDOUT_PAIRS else "seen",
            "pair": p} for p in PAIRS]
    out += [{"prompt": prompt_of(p, t), "group": "wording", "pair": p}
            for t in EVAL_TEMPLATES for p in TRAIN_PAIRS]
    never = [(c, s) for c in NEVER_COLORS for s in SHAPES + NEVER_SHAPES]
    never += [(c, s) for c in COLORS for s in NEVER_SHAPES]
    out += [{"prompt": prompt_of(p), "group": "never", "pair": None} for p in never]
    out += [{"prompt": t.format(c=c), "group": "never", "pair": None}
            for t in COLOUR_TEMPLATES[:1] for c in NEVER_COLORS]
    out += [{"prompt": t.format(s=s), "group": "never", "pair": None}
            for t in SHAPE_TEMPLATES[:1] for s in NEVER_SHAPES]
    out += [{"prompt": p, "group": "unknown", "pair": None} for p in prompt_words.EVAL_PROMPTS]
    return out


def shares(labels_row: np.ndarray, pair: tuple[str, str]) -> str:
    """What a scene (its multi-hot `labels` row) shares with a pair question: "present", or for
    a "no", "both_apart" (the colour and the shape, on different shapes), "colour_only",
    "shape_only" or "neither"."""
    held = {PAIRS[i] for i in np.flatnonzero(labels_row)}
    if pair in held:
        return "present"
    colour = any(c == pair[0] for c, _ in held)
    shape = any(s == pair[1] for _, s in held)
    return {(True, True): "both_apart", (True, False): "colour_only",
            (False, True): "shape_only", (False, False): "neither"}[(colour, shape)]


# What a source's `label` is (the ViT stage's target, `data.labels`): "pairs", multi-hot over
# every colour x shape drawn; or "attributes", multi-hot over the colours drawn and the shapes
# drawn (`ATTRIBUTE_NAMES`), which never says which colour goes with which shape.
ATTRIBUTE_NAMES = list(COLORS) + list(SHAPES)


def attribute_labels(labels: np.ndarray) -> np.ndarray:
    """Pair multi-hots `[N, len(PAIRS)]` -> `[N, len(ATTRIBUTE_NAMES)]`: colour and shape
    multi-hots side by side."""
    grid = np.asarray(labels, np.float32).reshape(len(labels), len(COLORS), len(SHAPES))
    out = np.concatenate([grid.max(2), grid.max(1)], axis=1)
    out.setflags(write=False)
    return out


class PromptShapesDataset(PromptedDataset):
    """Scenes of coloured shapes; questions about a pair, a colour or a shape (`form` "pair",
    "colour", "shape")."""

    name = "promptshapes"
    splits = SPLITS
    default_sizes = DEFAULT_SIZES
    label_kinds = {"pairs": CLASS_NAMES, "attributes": ATTRIBUTE_NAMES}
    split_type = PromptShapes
    templates = {"pair": PAIR_TEMPLATES, "colour": COLOUR_TEMPLATES, "shape": SHAPE_TEMPLATES}
    eval_templates = {"pair": EVAL_TEMPLATES}
    field_words = {"c": COLORS + NEVER_COLORS, "s": SHAPES + NEVER_SHAPES}
    couples = _COUPLES
    heldout_couples = NEGATIVE_KINDS

    def fields(self, form: str, item) -> dict[str, str]:
        if form == "pair":
            return {"c": item[0], "s": item[1]}
        return {"c": item} if form == "colour" else {"s": item}

    def wordings(self, split: str) -> dict[str, tuple[str, ...]]:
        # heldout asks pair questions only; its couples still draw (and never use) a colour and
        # a shape wording, as its seeds always have
        if split == HELDOUT:
            return {**self.templates, "pair": PAIR_TEMPLATES[:1]}
        return self.templates

    def relabel(self, kind: str, labels: np.ndarray) -> np.ndarray:
        return attribute_labels(labels)

    def two_questions(self, rng: np.random.Generator, split: str, couple: str):
        if couple in NEGATIVE_KINDS:
            asked = split_pairs(split)
            while True:
                i, j = rng.choice(len(asked), size=2, replace=False)
                p, q = asked[i], asked[j]
                if _fits(couple, p, q):
                    break
            return (("pair", p), ("pair", q), couple,
                    [_scene(rng, p, q, couple), _scene(rng, q, p, couple)])
        attributes = [("colour", c) for c in COLORS] + [("shape", s) for s in SHAPES]
        i, j = rng.choice(len(attributes), size=2, replace=False)
        a, b = attributes[i], attributes[j]
        return a, b, "attribute", [_attribute_scene(rng, a, b), _attribute_scene(rng, b, a)]

    def never_couple(self, rng: np.random.Generator, split: str):
        asked = split_pairs(split)
        p = asked[int(rng.integers(len(asked)))]
        kind = _pick(rng, list(NEGATIVE_KINDS))
        other = _pick(rng, [x for x in PAIRS if x != p and _allowed(kind, p)(x)])
        return ("pair", p), kind, [_fill(rng, [p], lambda x: True), _scene(rng, other, p, kind)]

    def never_drawn(self, rng: np.random.Generator) -> tuple:
        form = int(rng.integers(5))
        if form == 0:
            return "pair", (_pick(rng, list(NEVER_COLORS)), _pick(rng, list(SHAPES)))
        if form == 1:
            return "pair", (_pick(rng, list(COLORS)), _pick(rng, list(NEVER_SHAPES)))
        if form == 2:
            return "pair", (_pick(rng, list(NEVER_COLORS)), _pick(rng, list(NEVER_SHAPES)))
        if form == 3:
            return "colour", _pick(rng, list(NEVER_COLORS))
        return "shape", _pick(rng, list(NEVER_SHAPES))

    def render(self, rng: np.random.Generator, scene, materials) -> dict[str, np.ndarray]:
        image, where = _render(rng, scene)
        labels = np.zeros(len(PAIRS), np.float32)
        labels[[_PAIR_INDEX[x] for x in scene]] = 1.0
        return {"images": image, "labels": labels, "where": where}

    def question_grid(self, data) -> tuple[list[dict], np.ndarray]:
        """`grid_questions()`, and what each scene shares with each question ("present" for a
        true one; "never" or "unknown" for a question that is "no" by rule)."""
        grid = grid_questions()
        found = np.asarray([[shares(row, q["pair"]) if q["pair"] else q["group"]
                             for q in grid] for row in data.labels])
        return grid, found


DATASET = PromptShapesDataset()
generate = DATASET.generate
vocabulary = DATASET.vocabulary
longest_prompt = DATASET.longest_prompt
all_templates = DATASET.all_templates


class PromptShapesSource(PromptedSource):
    """promptshapes' examples for grain (`vit.data.prompted.PromptedSource`): `label` is
    multi-hot over `CLASS_NAMES`, or over `ATTRIBUTE_NAMES` with labels="attributes"."""

    dataset = DATASET
