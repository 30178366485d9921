"""Control conditions for prompt datasets: the same examples with the text or the image taken
away, to check that a benchmark cannot be solved from one modality alone.

- `shuffled_prompt`: each example gets the prompt of an example from another image (a fixed,
  seeded derangement), scored against its original answer;
- `null_prompt`: the empty prompt;
- `blank_image`: an all-black image.

On a balanced dataset (every prompt true in half its uses) every control sits at chance for
any model, so the controls check the data; the model's own accuracy is the proof it reads both.
"""

from __future__ import annotations

import numpy as np

CONTROLS = ("shuffled_prompt", "null_prompt", "blank_image")


class PromptControl:
    """A random-access view of `source` under one control; answers and labels unchanged."""

    def __init__(self, source, kind: str, seed: int = 0):
        if kind not in CONTROLS:
            raise ValueError(f"control {kind!r} is not one of {', '.join(CONTROLS)}")
        self.source, self.kind = source, kind
        self.name = f"{source.name}[{kind}]"
        self.class_names = source.class_names
        self.donor = _derangement(source, seed) if kind == "shuffled_prompt" else None

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> dict:
        element = dict(self.source[i])
        if self.kind == "shuffled_prompt":
            element["prompt"] = self.source[int(self.donor[i])]["prompt"]
        elif self.kind == "null_prompt":
            element["prompt"] = ""
        else:
            element["image"] = np.zeros_like(element["image"])
        return element


def _derangement(source, seed: int) -> np.ndarray:
    """`donor[i]`: an example whose image differs from example i's (by the source's
    `image_ids` when it has them, else by index)."""
    n = len(source)
    ids = getattr(source, "image_ids", None)
    ids = np.arange(n) if ids is None else np.asarray(ids)
    rng = np.random.default_rng(seed)
    donor = rng.permutation(n)
    for _ in range(100):  # re-draw the few that landed on their own image
        bad = np.flatnonzero(ids[donor] == ids)
        if not len(bad):
            return donor
        swap = rng.integers(0, n, len(bad))
        donor[bad], donor[swap] = donor[swap], donor[bad]
    raise ValueError(f"{source.name}: cannot give every example a prompt from another image")
