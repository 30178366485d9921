"""Checks of command-line values that every command makes the same way, before any work starts:
counts that must be positive, and output folders that must be creatable. Standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path

from vit.errors import ConfigError
from vit.paths import unwritable_reason


def require_positive(args, *names: str) -> None:
    """`--batch-size 0`, `--limit -1`, ...: a one-line ConfigError naming the flag. Unset
    (None) values pass."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} {value}: must be at least 1")


def check_output_dir(path, flag: str) -> Path:
    """`path` as a folder we may create or write into, else a one-line ConfigError naming
    `flag` and the path. Nothing is created: the command makes the folder when it has
    something to put there, so a refused run leaves nothing behind."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path}: is an existing file, not a folder; give a new or "
                          "existing folder")
    reason = unwritable_reason(path)
    if reason:
        raise ConfigError(f"{flag} {path}: cannot be created or written: {reason}; give a "
                          "folder elsewhere")
    return path


class NewOutput:
    """What a run adds at `path`, so that a refused run can take it away again.

    Made before the run: remembers the outermost folder the run would create (None when `path`
    exists) and what `path` already holds. `undo()` removes only what is new; what the user
    had before is never touched.
    """

    def __init__(self, path):
        self.path = Path(path).absolute()
        self.created, missing = None, self.path
        while not missing.exists() and missing.parent != missing:
            self.created, missing = missing, missing.parent
        self.before = set(os.listdir(self.path)) if self.path.is_dir() else set()

    def undo(self) -> None:
        import shutil

        if self.created is not None:
            shutil.rmtree(self.created, ignore_errors=True)
            return
        if not self.path.is_dir():
            return
        for name in set(os.listdir(self.path)) - self.before:
            entry = self.path / name
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
