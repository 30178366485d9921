"""Where a command or a checkpoint writer will create files, and how an output file is written:
one check, made before any work, that the place can be created and written; one writer that
replaces a file whole or not at all. Standard library only."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def unwritable_reason(path) -> str | None:
    """Why files cannot be made at `path` (a folder that exists or would be created), or None.

    The nearest existing folder on the way up (`path` itself when it exists) is where `mkdir`
    and the writes happen: it must be a folder, and writable. Permission bits are not the whole
    story (root passes `os.access` in /proc, which takes no new folders), so a folder is made
    there and removed again.
    """
    base = Path(path).absolute()
    while not base.exists() and base.parent != base:
        base = base.parent
    if not base.is_dir():
        return f"{base} is a file, not a folder"
    if not os.access(base, os.W_OK | os.X_OK):
        return f"{base} is not writable (permission denied)"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".vit-write-check-", dir=base))
    except OSError as err:
        return f"{base} takes no new folders ({err.strerror or err})"
    return None


def write_whole(path, write: Callable[[BinaryIO], object]) -> None:
    """`write(file)` into a temporary sibling of `path`, renamed to `path` once complete: `path`
    is replaced whole or left as it was, and no temporary file stays behind (a full disk
    included; the caller, which knows the size, names it)."""
    path = Path(path)
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        with open(part, "wb") as f:
            write(f)
        os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
