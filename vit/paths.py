"""Where a command or a checkpoint writer will create files, and how an output is written: one
check, made before any work, that the place can be created and written; and the one module that
writes an output safely. An output (a file or a folder) is made under a temporary sibling name
and renamed into place (`staged`, and on it `replacing` and `write_whole`), or appended to all
or nothing (`append_whole`): it is whole or as it was, and nothing temporary stays behind, a
full disk included. The caller, which knows the size, names a full disk (`vit.errors`).
Standard library only."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
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


@contextlib.contextmanager
def staged(path) -> Iterator[Path]:
    """Yields a temporary sibling of `path` for the block to make (a file or a folder, written
    by its name); renamed to `path` when the block ends well, removed when it fails (the
    rename included), so `path` is replaced whole or left as it was."""
    path = Path(path)
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        yield part
        os.replace(part, path)
    except BaseException:
        remove(part)
        raise


@contextlib.contextmanager
def replacing(path) -> Iterator[BinaryIO]:
    """Yields a binary file to write `path`'s new content into, as `staged`: `path` is replaced
    when the block ends well and the file is closed (a full disk may show only then)."""
    with staged(path) as part, open(part, "wb") as f:
        yield f


def write_whole(path, write: Callable[[BinaryIO], object]) -> None:
    """`write(file)` into a temporary sibling of `path`, renamed to `path` once complete: `path`
    is replaced whole or left as it was, and no temporary file stays behind."""
    with replacing(path) as f:
        write(f)


def append_whole(path, data: bytes) -> None:
    """Appends `data` to `path` (made if missing) all or nothing: a write the disk refuses
    half-way is cut back off to the size `path` had."""
    with open(path, "ab") as f:
        size = f.tell()
        try:
            f.write(data)
            f.flush()
        except BaseException:
            with contextlib.suppress(OSError):
                f.truncate(size)  # a truncation needs no space
            raise


def remove(path) -> None:
    """A file or a folder, whichever `path` is; a link itself, never what it points to."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


SETTLE_S = 0.5  # what a failed write began is gone once nothing has come back for this long
SETTLE_LIMIT_S = 10.0


def remove_until_settled(found: Callable[[], list[Path]]) -> None:
    """Removes what `found()` lists, again until it has listed nothing for `SETTLE_S` (at most
    `SETTLE_LIMIT_S`): when one of orbax's writes fails, tensorstore's others are still in
    flight and make their folders again (or keep `rmtree` from removing one) after a first
    removal."""
    quiet_since = time.monotonic()
    deadline = quiet_since + SETTLE_LIMIT_S
    while time.monotonic() < deadline:
        paths = found()
        for path in paths:
            remove(path)
        now = time.monotonic()
        if paths:
            quiet_since = now
        elif now - quiet_since >= SETTLE_S:
            return
        time.sleep(0.05)
