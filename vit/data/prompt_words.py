"""The words of prompt datasets: what a question names, the vocabulary a text model is trained
on, and prompts made only of words outside it.

A byte-level text encoder reads any string, so nothing stops a user asking "hello" of a model
trained on "is there a red triangle?". The prompt datasets therefore ask, in training, prompts
with no word of their vocabulary and answer them "no" (a rule, like the never-drawn words), and
each dataset lists its `prompt_words()`: the words a model trained on it has seen and the
templates its questions take, so a command can say when a prompt holds none of those words,
and answer "no" by rule when a word it never saw stands where a question names a thing ("is
there a belt?" of a model that never read "belt"): nothing it learnt can tell whether one is
there (`vit.inference.prompts`).

Training draws such prompts from `TRAIN_WORDS` and from random letter strings; evaluation asks
`EVAL_PROMPTS`, made of other words, so the "no" must hold for words never seen at all.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

# Everyday words that no prompt dataset's questions use. Disjoint from `EVAL_PROMPTS`' words.
TRAIN_WORDS = (
    "hello", "please", "tell", "me", "about", "weather", "cat", "dog", "car", "why", "how",
    "when", "where", "who", "what", "bad", "morning", "night", "yes", "no", "maybe", "thanks",
    "ok", "lorem", "ipsum", "foo", "bar", "table", "house", "run", "jump", "music", "price",
    "big", "small", "today", "time", "people", "water", "write", "poem", "code", "number",
    "money", "tree", "sky", "happy", "sad", "hey", "test", "sun", "moon", "city", "book",
)
# Asked by `vit eval` of every test image; none of their words is in any training prompt.
EVAL_PROMPTS = ("hi", "good evening", "xyzzy", "banana bread", "sing loudly", "umbrella",
                "quantum physics", "old friends", "Bonjour", "42")
_LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyz"))


def words(prompt: str) -> list[str]:
    """The words of a prompt, lower case, punctuation dropped: what a question names (as the
    byte encoder splits them: letters and digits, any non-ASCII character included)."""
    kept = "".join(ch if ch.isalnum() or ord(ch) >= 128 else " " for ch in prompt.lower())
    return kept.split()


def vocabulary_from(prompts) -> frozenset[str]:
    """Every word of the given prompts."""
    return frozenset(w for p in prompts for w in words(p))


def unknown_words(prompt: str, vocabulary) -> list[str]:
    """The words of `prompt` not in `vocabulary`, in order, each once."""
    out = []
    for w in words(prompt):
        if w not in vocabulary and w not in out:
            out.append(w)
    return out


def knows_none(prompt: str, vocabulary) -> bool:
    """True when the prompt has words and none of them is in `vocabulary` (the empty prompt is
    the null prompt, a control, not an unknown question)."""
    found = words(prompt)
    return bool(found) and not any(w in vocabulary for w in found)


def unknown_prompt(rng: np.random.Generator, vocabulary) -> str:
    """1-4 words, each an everyday word of `TRAIN_WORDS` or a random 2-8 letter string, none of
    them in `vocabulary`; sometimes with a "?"."""
    out = []
    while len(out) < int(rng.integers(1, 5)) or not out:
        if rng.random() < 0.5:
            word = str(TRAIN_WORDS[int(rng.integers(len(TRAIN_WORDS)))])
        else:
            word = "".join(rng.choice(_LETTERS, int(rng.integers(2, 9))))
        if word not in vocabulary:
            out.append(word)
    text = " ".join(out)
    return text + "?" if rng.random() < 0.5 else text


_FIELD = re.compile(r"\{(\w+)\}")


@dataclasses.dataclass(frozen=True)
class PromptWords:
    """What a model trained on a prompt dataset has read: `vocabulary`, every word of its
    training prompts; `templates`, the wordings its questions take (training and evaluation
    ones), with `{field}` where they name a thing; `field_lengths`, the most words a value
    of each field has ("ankle boot": 2)."""

    vocabulary: frozenset[str]
    templates: tuple[str, ...]
    field_lengths: dict[str, int]

    def unknown(self, prompt: str) -> list[str]:
        return unknown_words(prompt, self.vocabulary)

    def never_seen_named(self, prompt: str) -> list[str]:
        """The unknown words of `prompt` that stand in a field of one of the templates: "belt"
        in "is there a belt?" (from "is there a {k}?"), in order, each once; [] when every
        word is known or no template reads the prompt with an unknown word in a field."""
        unknown = self.unknown(prompt)
        if not unknown:
            return []
        text = " ".join(words(prompt))
        named = {w for pattern in self._patterns() if (found := pattern.fullmatch(text))
                 for field in found.groups() for w in field.split()}
        return [w for w in unknown if w in named]

    def _patterns(self) -> list[re.Pattern]:
        """Each template as a pattern over a prompt's words joined by spaces: its own words
        literally, each field as many words as its values have at most."""
        def pattern(template: str) -> re.Pattern:
            parts = []
            for i, piece in enumerate(_FIELD.split(template)):
                if i % 2:  # a field's name
                    most = self.field_lengths.get(piece, 1)
                    parts.append(rf"(\S+(?: \S+){{0,{most - 1}}})")
                else:
                    parts += [re.escape(w) for w in words(piece)]
            return re.compile(" ".join(parts))

        return [pattern(t) for t in self.templates]
