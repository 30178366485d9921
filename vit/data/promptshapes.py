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
  always "no", so a question about nothing the model knows is not a coin flip. The empty
  prompt is never asked: it stays the null-prompt control.

Wordings: `PAIR_TEMPLATES` (and `COLOUR_TEMPLATES`, `SHAPE_TEMPLATES`) in training;
`EVAL_TEMPLATES` never in training, kept for evaluation. A few questions lose their "?" or
change case, so neither is a cue.

Splits:

* ``train`` / ``test``: pair questions about every pair except `HELDOUT_PAIRS` (different
  seeds), in the training wordings.
* ``heldout``: pair questions only about `HELDOUT_PAIRS`, in the first wording, to test
  composition. The held-out pairs are withheld from the *prompts* only, in every wording: they
  are drawn in the images of every split and marked in every image's multi-hot `labels`.

Balance: every answerable prompt string is true in exactly half of its uses within a split.
Images come in twos (a couple) that ask the same strings: for pair and single-attribute
questions, scene A holds p and lacks q, scene B holds q and lacks p, and A asks (p: yes, q: no),
B (q: yes, p: no); a never-drawn couple asks p of both (yes in A, no in B) with a never-drawn
question beside it. Images are then shuffled and the two questions of an image put in random
order. `grid_questions` lists what an evaluation asks of every image (see
`vit.inference.questions`).

Only numpy and pillow; deterministic for (split, num_images, seed), cached in-process.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
from PIL import Image, ImageDraw

import vit.data.prompt_words as prompt_words
from vit.errors import ConfigError, DataError

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
DROP_MARK, RECASE = 0.3, 0.2  # per couple: questions without "?", in another case
UNKNOWN = 0.5  # per never-drawn question: asked as a prompt of unknown words instead

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


def all_templates() -> tuple[str, ...]:
    return PAIR_TEMPLATES + EVAL_TEMPLATES + COLOUR_TEMPLATES + SHAPE_TEMPLATES


@functools.cache
def vocabulary() -> frozenset[str]:
    """Every word of every training prompt: the training wordings with every colour and shape
    word, never-drawn ones included (the evaluation-only wordings' own words are not in it)."""
    colours, shapes = COLORS + NEVER_COLORS, SHAPES + NEVER_SHAPES
    prompts = [t.format(c=c, s=s) for t in PAIR_TEMPLATES + COLOUR_TEMPLATES + SHAPE_TEMPLATES
               for c in colours for s in shapes]
    return prompt_words.vocabulary_from(prompts)


def longest_prompt() -> str:
    """The longest question any template makes with any colour and shape word."""
    colours, shapes = COLORS + NEVER_COLORS, SHAPES + NEVER_SHAPES
    c = max(colours, key=len)
    s = max(shapes, key=len)
    return max((t.format(c=c, s=s).upper() for t in all_templates()), key=len)


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
    answers: np.ndarray  # [2N] int32, 1 = the prompt is true of the image
    # [2N]: "yes", a `NEGATIVE_KINDS` entry, "attribute" (a false single-attribute question),
    # "never" (a never-drawn word) or "unknown" (no word of the vocabulary)
    kinds: list[str] = dataclasses.field(default_factory=list)

    @property
    def num_images(self) -> int:
        return len(self.images)

    @property
    def num_examples(self) -> int:
        return len(self.prompts)


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


class _Wording:
    """One couple's wording: a template per question type, and its "?" and case."""

    def __init__(self, rng: np.random.Generator, pair_templates: tuple[str, ...],
                 vary: bool):
        self.pair = _pick(rng, list(pair_templates))
        self.colour = _pick(rng, list(COLOUR_TEMPLATES))
        self.shape = _pick(rng, list(SHAPE_TEMPLATES))
        self.drop_mark = vary and rng.random() < DROP_MARK
        self.case = _pick(rng, ["upper", "capitalize", "title"]) \
            if vary and rng.random() < RECASE else None

    def __call__(self, question: tuple) -> str:
        which = question[0]
        if which == "unknown":
            text = question[1]
        elif which == "pair":
            text = self.pair.format(c=question[1], s=question[2])
        elif which == "colour":
            text = self.colour.format(c=question[1])
        else:
            text = self.shape.format(s=question[1])
        if self.drop_mark:
            text = text.rstrip("?")
        return getattr(text, self.case)() if self.case else text


def _never_question(rng: np.random.Generator) -> tuple:
    """A question naming at least one never-drawn word, or (`UNKNOWN` of the time) a prompt
    with no word of the vocabulary."""
    if rng.random() < UNKNOWN:
        return ("unknown", prompt_words.unknown_prompt(rng, vocabulary()))
    form = int(rng.integers(5))
    if form == 0:
        return ("pair", _pick(rng, list(NEVER_COLORS)), _pick(rng, list(SHAPES)))
    if form == 1:
        return ("pair", _pick(rng, list(COLORS)), _pick(rng, list(NEVER_SHAPES)))
    if form == 2:
        return ("pair", _pick(rng, list(NEVER_COLORS)), _pick(rng, list(NEVER_SHAPES)))
    if form == 3:
        return ("colour", _pick(rng, list(NEVER_COLORS)))
    return ("shape", _pick(rng, list(NEVER_SHAPES)))


def _couple(rng: np.random.Generator, asked: tuple, couple: str):
    """Two scenes and their questions: [(question, answer, kind)] x 2 per scene."""
    if couple in NEGATIVE_KINDS:
        while True:
            i, j = rng.choice(len(asked), size=2, replace=False)
            p, q = asked[i], asked[j]
            if _fits(couple, p, q):
                break
        qp, qq = ("pair", *p), ("pair", *q)
        return ([_scene(rng, p, q, couple), _scene(rng, q, p, couple)],
                [[(qp, 1, "yes"), (qq, 0, couple)], [(qq, 1, "yes"), (qp, 0, couple)]])
    if couple == "attribute":
        attributes = [("colour", c) for c in COLORS] + [("shape", s) for s in SHAPES]
        i, j = rng.choice(len(attributes), size=2, replace=False)
        a, b = attributes[i], attributes[j]
        return ([_attribute_scene(rng, a, b), _attribute_scene(rng, b, a)],
                [[(a, 1, "yes"), (b, 0, "attribute")], [(b, 1, "yes"), (a, 0, "attribute")]])
    # never: p is asked of both scenes (yes, then a "no" of some kind), beside a never question
    p = asked[int(rng.integers(len(asked)))]
    kind = _pick(rng, list(NEGATIVE_KINDS))
    other = _pick(rng, [x for x in PAIRS if x != p and _allowed(kind, p)(x)])
    qp = ("pair", *p)
    return ([_fill(rng, [p], lambda x: True), _scene(rng, other, p, kind)],
            [[(qp, 1, "yes"), _never(rng)], [(qp, 0, kind), _never(rng)]])


def _never(rng: np.random.Generator) -> tuple:
    """(question, 0, "never" or "unknown")."""
    question = _never_question(rng)
    return question, 0, "unknown" if question[0] == "unknown" else "never"


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
    heldout = split == "heldout"
    names = [name for name, _ in _COUPLES]
    chances = np.asarray([p for _, p in _COUPLES])
    scenes, questions = [], []  # questions: [(text, answer, kind)] x 2 per image
    for _ in range(num_images // 2):
        # the held-out split asks only pair questions in the canonical wording
        couple = names[int(rng.integers(len(NEGATIVE_KINDS)))] if heldout \
            else names[int(rng.choice(len(names), p=chances / chances.sum()))]
        two_scenes, asks = _couple(rng, asked, couple)
        wording = _Wording(rng, PAIR_TEMPLATES[:1] if heldout else PAIR_TEMPLATES,
                           vary=not heldout)
        scenes += two_scenes
        questions += [[(wording(q), a, k) for q, a, k in ask] for ask in asks]
    order = rng.permutation(num_images)
    images = np.empty((num_images, IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8)
    labels = np.zeros((num_images, len(PAIRS)), np.float32)
    prompts, answers, kinds = [], [], []
    for n, k in enumerate(order):
        images[n] = _render(rng, scenes[k])
        labels[n, [_PAIR_INDEX[x] for x in scenes[k]]] = 1.0
        two = questions[k] if rng.integers(2) else questions[k][::-1]
        for text, answer, kind in two:
            prompts.append(text)
            answers.append(answer)
            kinds.append(kind)
    answers = np.asarray(answers, np.int32)
    for a in (images, labels, answers):
        a.setflags(write=False)
    return PromptShapes(images, labels, prompts, answers, kinds)


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


# What a source's `label` is (the ViT stage's target): "pairs", multi-hot over every colour x
# shape drawn; or "attributes", multi-hot over the colours drawn and the shapes drawn
# (`ATTRIBUTE_NAMES`), which never says which colour goes with which shape.
LABEL_KINDS = ("pairs", "attributes")
ATTRIBUTE_NAMES = list(COLORS) + list(SHAPES)


def attribute_labels(labels: np.ndarray) -> np.ndarray:
    """Pair multi-hots `[N, len(PAIRS)]` -> `[N, len(ATTRIBUTE_NAMES)]`: colour and shape
    multi-hots side by side."""
    grid = np.asarray(labels, np.float32).reshape(len(labels), len(COLORS), len(SHAPES))
    out = np.concatenate([grid.max(2), grid.max(1)], axis=1)
    out.setflags(write=False)
    return out


class PromptShapesSource:
    """Random access over a split's (image, prompt) examples, as grain expects.

    `source[i]` is `{"image": uint8 [64, 64, 3], "label": float32 multi-hot over PAIRS (over
    ATTRIBUTE_NAMES with labels="attributes"), "prompt": str, "answer": int32}`; examples 2i
    and 2i+1 share image i. `prompts` lists the distinct prompt strings the split asks, sorted.
    """

    name = "promptshapes"
    multi_label = True

    def __init__(self, split: str, num_images: int | None = None, seed: int = 0,
                 labels: str = "pairs"):
        if labels not in LABEL_KINDS:  # a recipe's value, so a config error (no fallback data)
            raise ConfigError(f"data.labels={labels!r}; promptshapes has "
                              f"{' or '.join(map(repr, LABEL_KINDS))}")
        self.split = split
        self.data = generate(split, num_images, seed)
        self.class_names = list(CLASS_NAMES) if labels == "pairs" else list(ATTRIBUTE_NAMES)
        self.num_classes = len(self.class_names)
        self.labels = self.data.labels if labels == "pairs" else attribute_labels(self.data.labels)
        self.pairs = split_pairs(split)
        self.prompts = sorted(set(self.data.prompts))

    def __len__(self) -> int:
        return self.data.num_examples

    @property
    def image_ids(self) -> np.ndarray:
        """The image of each example (examples 2i and 2i+1 share image i)."""
        return np.arange(len(self)) // 2

    def question_grid(self) -> tuple[list[dict], np.ndarray]:
        """What `vit eval` asks of every image: `grid_questions()`, and `[images, questions]`
        what each scene shares with each question ("present" for a true one; "never" or
        "unknown" for a question that is "no" by rule)."""
        grid = grid_questions()
        shares_ = np.asarray([[shares(row, q["pair"]) if q["pair"] else q["group"]
                               for q in grid] for row in self.data.labels])
        return grid, shares_

    def __getitem__(self, i: int) -> dict:
        n = len(self)
        i = int(i)
        if not -n <= i < n:
            raise IndexError(f"promptshapes:{self.split} has {n} examples, no index {i}")
        i %= n
        return {"image": self.data.images[i // 2], "label": self.labels[i // 2],
                "prompt": self.data.prompts[i], "answer": self.data.answers[i],
                "image_id": np.int32(i // 2)}
