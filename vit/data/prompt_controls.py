"""Control conditions for prompt datasets: the same examples with the text or the image taken
away, to check that a benchmark cannot be solved from one modality alone.

- `shuffled_prompt`: each example gets the prompt of an example from another image (a fixed,
  seeded derangement), scored against its original answer;
- `null_prompt`: the empty prompt;
- `blank_image`: an all-black image.

On a balanced dataset (every prompt true in half its uses) every control sits at chance for
any model, so the controls check the data; the model's own accuracy is the proof it reads both.
Questions that are "no" by rule (a never-drawn or unknown word: a source's `data.kinds` says
which) are left out of every control: they are always "no", so keeping them would tilt the
answers away from half "yes", and the controls would measure that tilt, not the model.
"""

from __future__ import annotations

import numpy as np

CONTROLS = ("shuffled_prompt", "null_prompt", "blank_image")
NO_BY_RULE = ("never", "unknown")


class PromptControl:
    """A random-access view of `source` under one control; answers and labels unchanged."""

    def __init__(self, source, kind: str, seed: int = 0):
        if kind not in CONTROLS:
            raise ValueError(f"control {kind!r} is not one of {', '.join(CONTROLS)}")
        self.source, self.kind = source, kind
        self.name = f"{source.name}[{kind}]"
        self.class_names = source.class_names
        kinds = getattr(getattr(source, "data", None), "kinds", None)
        self.index = (np.arange(len(source)) if not kinds else
                      np.flatnonzero([k not in NO_BY_RULE for k in kinds]))
        self.donor = _derangement(source, self.index, seed) if kind == "shuffled_prompt" \
            else None

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict:
        element = dict(self.source[int(self.index[i])])
        if self.kind == "shuffled_prompt":
            element["prompt"] = self.source[int(self.donor[i])]["prompt"]
        elif self.kind == "null_prompt":
            element["prompt"] = ""
        else:
            element["image"] = np.zeros_like(element["image"])
        return element


def _derangement(source, index: np.ndarray, seed: int) -> np.ndarray:
    """`donor[i]`: an example among `index` whose image differs from example `index[i]`'s (by
    the source's `image_ids` when it has them, else by index)."""
    ids = getattr(source, "image_ids", None)
    ids = np.arange(len(source)) if ids is None else np.asarray(ids)
    rng = np.random.default_rng(seed)
    donor = index[rng.permutation(len(index))]
    for _ in range(100):  # re-draw the few that landed on their own image
        bad = np.flatnonzero(ids[donor] == ids[index])
        if not len(bad):
            return donor
        swap = rng.integers(0, len(index), len(bad))
        donor[bad], donor[swap] = donor[swap], donor[bad]
    raise ValueError(f"{source.name}: cannot give every example a prompt from another image")
