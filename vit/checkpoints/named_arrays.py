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

    def account_for(self, where: str, skipped_why, what: str = "file") -> list[str]:
        """Every array read, or skipped on purpose: `skipped_why(key)` says why a classifier
        does not use `key` (None: no reason). Returns the one warning that counts what was
        skipped; raises naming the arrays nothing read and nothing explains."""
        skipped, rest = {}, []
        for key in self.unused():
            why = skipped_why(key)
            if why is None:
                rest.append(key)
            else:
                skipped[why] = skipped.get(why, 0) + 1
        if rest:
            more = f" and {len(rest) - 6} more" if len(rest) > 6 else ""
            raise CheckpointError(f"{where}: arrays this ViT has no place for: "
                                  f"{', '.join(rest[:6])}{more}; the {what} cannot be read "
                                  "exactly")
        return ["not read, as a classifier does not use them: " + "; ".join(
            f"{n} arrays of {why}" for why, n in skipped.items())] if skipped else []

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
