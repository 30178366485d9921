"""Checks of command-line values that every command makes the same way, before any work starts:
counts that must be positive, and output folders that must be creatable; and writing a command's
output files whole or not at all. Standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path

from vit.errors import ConfigError, OutOfSpace, is_out_of_space
from vit.paths import unwritable_reason, write_whole


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
    exists) and what `path` already holds: its entries, or with `deep` every file and folder
    under it (for a run that writes into subfolders a previous run made). `undo()` removes
    only what is new; what the user had before is never touched.
    """

    def __init__(self, path, *, deep: bool = False):
        self.path, self.deep = Path(path).absolute(), deep
        self.created, missing = None, self.path
        while not missing.exists() and missing.parent != missing:
            self.created, missing = missing, missing.parent
        self.before = self._entries()

    def _entries(self) -> set[str]:
        if not self.path.is_dir():
            return set()
        if not self.deep:
            return set(os.listdir(self.path))
        return {os.path.relpath(os.path.join(root, name), self.path)
                for root, dirs, files in os.walk(self.path) for name in (*dirs, *files)}

    def added(self) -> list[Path]:
        """What is new at `path` since this was made."""
        return [self.path / name for name in self._entries() - self.before]

    def undo(self) -> None:
        import shutil

        if self.created is not None:
            shutil.rmtree(self.created, ignore_errors=True)
            return
        for entry in self.added():  # a new folder holds only new files
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def write_outputs(folder, files: dict[str, bytes]) -> None:
    """Writes each `name: data` into `folder` (made if missing), each by `write_whole`, so an
    existing file of that name is replaced whole or kept. When a write fails (a full disk),
    what this call made is removed and a full disk is one `OutOfSpace` naming the file and the
    size all of them need."""
    folder = Path(folder)
    new_output = NewOutput(folder)
    name = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            write_whole(folder / name, lambda f, data=data: f.write(data))
    except BaseException as err:
        new_output.undo()
        if is_out_of_space(err):
            raise OutOfSpace(folder / name if name is not None else folder,
                             sum(len(d) for d in files.values())) from None
        raise
