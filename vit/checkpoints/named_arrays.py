"""A checkpoint's flat `{key: array}` read by name, as every reader (npz, timm, Hugging Face)
does: a missing key is recorded rather than raised, so one error names all that are missing,
and the keys read are counted, so a reader can name the ones it does not understand."""

from __future__ import annotations

import difflib

import numpy as np

from vit.errors import CheckpointError


class NamedArrays:
    """`arrays` read under the first of `prefixes` that holds a key (as `dtype`, if given)."""

    def __init__(self, arrays: dict[str, np.ndarray], prefixes: tuple[str, ...] = ("",),
                 dtype=None):
        self.arrays, self.prefixes, self.dtype = arrays, prefixes, dtype
        self.missing: list[str] = []
        self.used: set[str] = set()

    def _key(self, key: str) -> str | None:
        return next((p + key for p in self.prefixes if p + key in self.arrays), None)

    def has(self, key: str) -> bool:
        return self._key(key) is not None

    def __call__(self, key: str) -> np.ndarray:
        """The array at `key`; an empty one, with the key recorded as missing, if absent."""
        found = self._key(key)
        if found is None:
            self.missing.append(self.prefixes[0] + key)
            return np.zeros((0,), np.float32)
        self.used.add(found)
        value = self.arrays[found]
        return value if self.dtype is None else np.asarray(value, self.dtype)

    def unused(self) -> list[str]:
        """The keys of the file that nothing has read, sorted."""
        return sorted(set(self.arrays) - self.used)

    def check(self, where: str, layout: str) -> None:
        """Raises one CheckpointError naming the missing keys (the first six), if any, and the
        file's unread keys nearest to them (a key renamed)."""
        if self.missing:
            more = f" and {len(self.missing) - 6} more" if len(self.missing) > 6 else ""
            unused = self.unused()
            near = sorted({m for key in self.missing[:6] for m in difflib.get_close_matches(
                key, unused, n=1, cutoff=0.8)})
            instead = f" (the file has {', '.join(near[:6])} instead)" if near else ""
            raise CheckpointError(f"{where}: unknown {layout} layout: expected keys missing: "
                                  f"{', '.join(self.missing[:6])}{more}{instead}")
