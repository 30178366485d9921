"""One design for the prompt datasets (`vit.data.promptshapes`, `vit.data.fashion_scenes`):
a dataset says what its scenes are and how its questions are worded and answered; the splits,
the wordings, the questions that are "no" by rule, the balance of every answer, the
materialised split and the grain source are written here once.

A question is `(form, item)`: the form picks a template (`templates[form]`, the first one the
canonical wording), the item fills it (`fields`); the form "unknown" is a prompt as it stands.

Balance: images come in twos (a couple) that ask the same strings. For a couple of two
questions p and q, scene A holds p and lacks q, scene B the other way round, and A asks
(p: yes, q: no), B (q: yes, p: no). A "never" couple asks one question p of both scenes (yes
in A, a "no" in B), each beside a question that is "no" by rule: a word no scene ever holds
(the dataset's `never_drawn`), or, `UNKNOWN` of the time, a prompt with no word of the
vocabulary (`vit.data.prompt_words`). So every answerable prompt string is true in exactly half
of its uses within a split, at any size. Images are then shuffled and the two questions of an
image put in random order. The empty prompt is never asked: it stays the null-prompt control.

Wordings: each couple draws a template per form; in training a few couples also lose their
"?" or change case, so neither is a cue. The ``heldout`` split asks in the canonical wording.

Deterministic for (split, num_images, seed); cached in-process; the arrays are read-only.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import ClassVar

import numpy as np

import vit.data.prompt_words as prompt_words
from vit.errors import ConfigError, DataError

HELDOUT = "heldout"  # the split that asks only what the others never ask
DROP_MARK, RECASE = 0.3, 0.2  # per couple, in training: questions without "?", in another case
CASES = ("upper", "capitalize", "title")
UNKNOWN = 0.5  # per question that is "no" by rule: a prompt of unknown words instead
# A split's `where` map (what lies on each part of its images, for a per-patch readout) has one
# cell per this many pixels a side.
WHERE_CELL = 4


class SplitError(DataError, ValueError):
    """An unknown split of a prompt dataset, or a bad size."""


@dataclasses.dataclass
class PromptedSplit:
    """One split, materialised. Examples 2i and 2i+1 ask about image i."""

    images: np.ndarray  # [N, H, W, 3] uint8
    labels: np.ndarray  # [N, classes] float32 multi-hot (the dataset's first kind of labels)
    prompts: list[str]  # [2N]
    answers: np.ndarray  # [2N] int32, 1 = the prompt is true of the image
    # [2N]: "yes", the dataset's kind of "no", "never" (a never-drawn word) or "unknown" (no
    # word of the vocabulary)
    kinds: list[str]

    @property
    def num_images(self) -> int:
        return len(self.images)

    @property
    def num_examples(self) -> int:
        return len(self.prompts)


class Wording:
    """One couple's wording: a template per form, and whether its questions keep their "?" and
    their case."""

    def __init__(self, rng: np.random.Generator, templates: dict[str, tuple[str, ...]],
                 vary: bool, text):
        self.templates = {form: ts[int(rng.integers(len(ts)))] for form, ts in templates.items()}
        self.drop_mark = vary and rng.random() < DROP_MARK
        self.case = CASES[int(rng.integers(len(CASES)))] if vary and rng.random() < RECASE \
            else None
        self.text = text  # (form, item, template) -> the question

    def __call__(self, question: tuple) -> str:
        form, item = question
        text = item if form == "unknown" else self.text(form, item, self.templates[form])
        if self.drop_mark:
            text = text.rstrip("?")
        return getattr(text, self.case)() if self.case else text


class PromptedDataset:
    """A prompt dataset. A subclass says its scenes and its question grammar:

    - `name`, `splits` (``heldout`` among them), `default_sizes` (images per split, even);
    - `label_kinds`: {`data.labels` value: class names}, the first the default and the one a
      split's `labels` hold (`relabel` gives the others);
    - `templates` / `eval_templates`: {form: wordings} asked in training / kept for evaluation;
      `fields(form, item)`: what fills a template; `field_words`: {field: every word that may fill
      it, the never-drawn ones included};
    - `couples`: ((couple, probability), ...) in training, "never" among them;
      `heldout_couples`, drawn evenly in ``heldout``; `two_questions` and `never_couple` make a
      couple's scenes, `never_drawn` a question about something no scene holds;
    - `render(rng, scene, materials)`: one image and what the split records of it;
      `load_materials` / `prepare`: what the renderer draws from (photos), if anything;
    - `question_grid(data)`: what an evaluation asks of every image.
    """

    name: ClassVar[str]
    splits: ClassVar[tuple[str, ...]]
    default_sizes: ClassVar[dict[str, int]]
    label_kinds: ClassVar[dict[str, list[str]]]
    templates: ClassVar[dict[str, tuple[str, ...]]]
    eval_templates: ClassVar[dict[str, tuple[str, ...]]]
    field_words: ClassVar[dict[str, tuple[str, ...]]]
    couples: ClassVar[tuple[tuple[str, float], ...]]
    heldout_couples: ClassVar[tuple[str, ...]]
    split_type: ClassVar[type] = PromptedSplit
    seed_salt: ClassVar[tuple[int, ...]] = ()  # mixed into every split's seed
    cache_size: ClassVar[int] = 16

    def __init__(self):
        self._cached = functools.lru_cache(maxsize=self.cache_size)(self.build)
        self._vocabulary: frozenset[str] | None = None

    # --- what a dataset says -------------------------------------------------------------
    def fields(self, form: str, item) -> dict[str, str]:
        raise NotImplementedError

    def two_questions(self, rng: np.random.Generator, split: str, couple: str):
        """(p, q, kind of "no", [scene A, scene B]): p true in A and a "no" in B, q the other
        way round."""
        raise NotImplementedError

    def never_couple(self, rng: np.random.Generator, split: str):
        """(p, kind of "no", [scene A, scene B]): p true in A, a "no" in B."""
        raise NotImplementedError

    def never_drawn(self, rng: np.random.Generator) -> tuple:
        """A question naming something no scene ever holds."""
        raise NotImplementedError

    def render(self, rng: np.random.Generator, scene, materials) -> dict[str, np.ndarray]:
        """{"images": the image, "labels": its multi-hot, and any field of `split_type`}."""
        raise NotImplementedError

    def question_grid(self, data) -> tuple[list[dict], np.ndarray]:
        """The questions an evaluation asks of every image, and `[images, questions]` what each
        scene makes of each ("present" for a true one, else the kind of "no")."""
        raise NotImplementedError

    def load_materials(self, split: str, data_dir: str | None):
        """What the renderer draws from for a split, read from `data_dir`; nothing by default."""
        return None

    def prepare(self, materials):
        """`materials` made ready for `render` (and checked)."""
        return materials

    def wordings(self, split: str) -> dict[str, tuple[str, ...]]:
        """The templates a split's couples draw from: in ``heldout``, the canonical ones."""
        if split == HELDOUT:
            return {form: ts[:1] for form, ts in self.templates.items()}
        return self.templates

    def relabel(self, kind: str, labels: np.ndarray) -> np.ndarray:
        """A split's `labels` as labels of another of `label_kinds`."""
        raise NotImplementedError

    # --- written once --------------------------------------------------------------------
    def text(self, form: str, item, template: str | None = None) -> str:
        """A question in `template` (default: the form's canonical wording)."""
        return (template or self.templates[form][0]).format(**self.fields(form, item))

    def all_templates(self) -> tuple[str, ...]:
        return sum(self.templates.values(), ()) + sum(self.eval_templates.values(), ())

    def vocabulary(self) -> frozenset[str]:
        """Every word of every training prompt: each training template filled with every word,
        never-drawn ones included (the evaluation-only wordings' own words are not in it)."""
        if self._vocabulary is None:
            names = list(self.field_words)
            self._vocabulary = prompt_words.vocabulary_from(
                t.format(**dict(zip(names, chosen, strict=True)))
                for ts in self.templates.values() for t in ts
                for chosen in itertools.product(*self.field_words.values()))
        return self._vocabulary

    def prompt_words(self) -> prompt_words.PromptWords:
        """What a model trained on this dataset has read: its vocabulary and question
        templates (`vit.data.prompt_words.PromptWords`)."""
        return prompt_words.PromptWords(
            self.vocabulary(), self.all_templates(),
            {field: max(len(prompt_words.words(v)) for v in values)
             for field, values in self.field_words.items()})

    def longest_prompt(self) -> str:
        """The longest question any template makes with any words, in upper case."""
        longest = {field: max(ws, key=len) for field, ws in self.field_words.items()}
        return max((t.format(**longest).upper() for t in self.all_templates()), key=len)

    def check_split(self, split: str) -> None:
        if split not in self.splits:
            raise SplitError(f"{self.name} has no split {split!r}; use one of "
                             f"{', '.join(self.splits)}")

    def generate(self, split: str, num_images: int | None = None, seed: int = 0, *,
                 materials=None, data_dir: str | None = None) -> PromptedSplit:
        """Materialise a split: `num_images` images (default: `default_sizes[split]`, always
        even), 2 examples each. Cached per (split, num_images, seed, data_dir) unless
        `materials` (what the renderer draws from) are given."""
        self.check_split(split)
        num_images = self.default_sizes[split] if num_images is None else int(num_images)
        if num_images < 2 or num_images % 2:
            raise SplitError(f"{self.name}: num_images must be an even number >= 2, "
                             f"not {num_images}")
        if materials is not None:
            return self.build(split, num_images, int(seed), materials)
        return self._cached(split, num_images, int(seed), None, data_dir)

    def build(self, split: str, num_images: int, seed: int, materials=None,
              data_dir: str | None = None) -> PromptedSplit:
        """`generate` without its checks or its cache."""
        if materials is None:
            materials = self.load_materials(split, data_dir)
        materials = self.prepare(materials)
        # independent streams per split: the split's index is part of the seed
        rng = np.random.default_rng(np.random.SeedSequence(
            [seed, self.splits.index(split), *self.seed_salt]))
        heldout = split == HELDOUT
        names = [name for name, _ in self.couples]
        chances = np.asarray([p for _, p in self.couples])
        templates = self.wordings(split)
        scenes, questions = [], []  # questions: [(text, answer, kind)] x 2 per image
        for _ in range(num_images // 2):
            if heldout:
                couple = self.heldout_couples[int(rng.integers(len(self.heldout_couples)))]
            else:
                couple = names[int(rng.choice(len(names), p=chances / chances.sum()))]
            two_scenes, asks = self.couple(rng, split, couple)
            wording = Wording(rng, templates, not heldout, self.text)
            scenes += two_scenes
            questions += [[(wording(q), a, k) for q, a, k in ask] for ask in asks]
        order = rng.permutation(num_images)
        arrays: dict[str, np.ndarray] = {}
        prompts, answers, kinds = [], [], []
        for n, k in enumerate(order):
            for field, value in self.render(rng, scenes[k], materials).items():
                if field not in arrays:
                    arrays[field] = np.zeros((num_images, *np.shape(value)),
                                             np.asarray(value).dtype)
                arrays[field][n] = value
            two = questions[k] if rng.integers(2) else questions[k][::-1]
            for text, answer, kind in two:
                prompts.append(text)
                answers.append(answer)
                kinds.append(kind)
        arrays["answers"] = np.asarray(answers, np.int32)
        for a in arrays.values():
            a.setflags(write=False)
        return self.split_type(prompts=prompts, kinds=kinds, **arrays)

    def couple(self, rng: np.random.Generator, split: str, couple: str):
        """Two scenes and, per scene, its two (question, answer, kind)."""
        if couple == "never":
            p, negative, scenes = self.never_couple(rng, split)
            return scenes, [[(p, 1, "yes"), self.never(rng)], [(p, 0, negative), self.never(rng)]]
        p, q, negative, scenes = self.two_questions(rng, split, couple)
        return scenes, [[(p, 1, "yes"), (q, 0, negative)], [(q, 1, "yes"), (p, 0, negative)]]

    def never(self, rng: np.random.Generator) -> tuple:
        """(question, 0, "never" or "unknown"): a never-drawn word, or (`UNKNOWN` of the time)
        a prompt with no word of the vocabulary."""
        if rng.random() < UNKNOWN:
            return ("unknown", prompt_words.unknown_prompt(rng, self.vocabulary())), 0, "unknown"
        return self.never_drawn(rng), 0, "never"


class PromptedSource:
    """Random access over a split's (image, prompt) examples, as grain expects.

    `source[i]` is `{"image": uint8 [H, W, 3], "label": float32 multi-hot over `class_names`,
    "prompt": str, "answer": int32, "image_id": int32}`, and `"where"` when the split says
    where things lie (`FashionScenes.where`); examples 2i and 2i+1 share image i.
    `prompts` lists the distinct prompt strings the split asks, sorted. `labels` (the recipe's
    `data.labels`) picks one of the dataset's `label_kinds`.
    """

    dataset: ClassVar[PromptedDataset]  # each dataset's subclass names its own
    multi_label = True

    def __init__(self, split: str, num_images: int | None = None, seed: int = 0, *,
                 labels: str | None = None, data_dir: str | None = None, materials=None):
        kinds = self.dataset.label_kinds
        labels = labels or next(iter(kinds))
        if labels not in kinds:  # a recipe's value, so a config error (no fallback data)
            raise ConfigError(f"data.labels={labels!r}; {self.name} has "
                              f"{' or '.join(map(repr, kinds))}")
        self.split = split
        self.data = self.dataset.generate(split, num_images, seed, materials=materials,
                                          data_dir=data_dir)
        self.class_names = list(kinds[labels])
        self.num_classes = len(self.class_names)
        self.labels = self.data.labels if labels == next(iter(kinds)) else \
            self.dataset.relabel(labels, self.data.labels)
        self.prompts = sorted(set(self.data.prompts))

    @property
    def name(self) -> str:
        return self.dataset.name

    def __len__(self) -> int:
        return self.data.num_examples

    @property
    def image_ids(self) -> np.ndarray:
        """The image of each example (examples 2i and 2i+1 share image i)."""
        return np.arange(len(self)) // 2

    def question_grid(self) -> tuple[list[dict], np.ndarray]:
        """What `vit eval` asks of every image (`PromptedDataset.question_grid`)."""
        return self.dataset.question_grid(self.data)

    def __getitem__(self, i: int) -> dict:
        n = len(self)
        i = int(i)
        if not -n <= i < n:
            raise IndexError(f"{self.name}:{self.split} has {n} examples, no index {i}")
        i %= n
        out = {"image": self.data.images[i // 2], "label": self.labels[i // 2],
               "prompt": self.data.prompts[i], "answer": self.data.answers[i],
               "image_id": np.int32(i // 2)}
        if hasattr(self.data, "where"):  # what lies where, for a per-patch readout
            out["where"] = self.data.where[i // 2]
        return out
