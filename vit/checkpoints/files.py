"""Files the readers and writers share: JSON read as a one-line error, and destinations that are
checked before any work and never left half-written."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vit.errors import CheckpointError
from vit.paths import unwritable_reason


def read_json(path: Path) -> Any:
    """The parsed JSON file, or a CheckpointError naming it and where the text broke."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: not valid JSON (line {err.lineno}, column {err.colno}: "
                              f"{err.msg}); fix or replace the file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path}: cannot read ({getattr(err, 'strerror', None) or err})"
                              ) from None


def read_json_object(path: Path) -> dict:
    """`read_json` for files that must hold one JSON object (every config file)."""
    value = read_json(path)
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object ({{...}}), found "
                              f"{type(value).__name__}; fix or replace the file")
    return value


def check_destination(dst) -> Path:
    """Raises a one-line CheckpointError unless `dst` is a new path we can create.

    Called before any work: an existing file or folder is never overwritten or merged into, and
    an unwritable location fails now rather than after the weights are converted.
    """
    dst = Path(dst)
    if dst.exists() or dst.is_symlink():
        kind = "folder" if dst.is_dir() else "file"
        raise CheckpointError(f"{dst}: already exists (a {kind}); choose a new destination, or "
                              "remove it first")
    reason = unwritable_reason(dst.parent)
    if reason:
        raise CheckpointError(f"{dst}: cannot create it: {reason}; choose another destination")
    return dst


@contextlib.contextmanager
def staged(dst) -> Iterator[Path]:
    """Yields a temporary sibling of `dst` to write into (a file or a folder); renames it to
    `dst` when the block succeeds and removes it otherwise, so `dst` is whole or absent."""
    dst = check_destination(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        yield tmp
        os.replace(tmp, dst)
    except BaseException as err:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):  # a full disk, say: nothing was left behind
            raise CheckpointError(f"{dst}: cannot write ({err.strerror or err}); nothing was "
                                  "written") from None
        raise
