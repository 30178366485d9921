"""Files the readers and writers share: JSON read as a one-line error, and destinations that are
checked before any work and never left half-written (a full disk included)."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vit import paths
from vit.errors import CheckpointError, OutOfSpace, is_out_of_space
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


def field_error(file, field: str, value: Any, want: str) -> CheckpointError:
    """A config field of the wrong type or range: names the file, the field and what fits."""
    shown = json.dumps(value, default=str)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return CheckpointError(f"{file}: {field} is {shown}, not {want}; fix or replace the file")


def json_int(file, field: str, value: Any, minimum: int = 1) -> int:
    """A whole number of at least `minimum` from a JSON config (true/false and 3.0 are not)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise field_error(file, field, value, f"a whole number of at least {minimum}")
    return value


def json_number(file, field: str, value: Any, *, positive: bool = False) -> float:
    """A finite number from a JSON config (above 0 with `positive`)."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or (positive and value <= 0)):
        raise field_error(file, field, value, "a number above 0" if positive else "a number")
    return float(value)


def json_numbers(file, field: str, value: Any, *, allow_scalar: bool = False) -> list[float]:
    """A list of finite numbers (per-channel mean or std); one number stands for every channel
    where the config's library allows it."""
    one = [value] if allow_scalar and not isinstance(value, list) else value
    if not isinstance(one, list) or not one or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
            for v in one):
        want = "a list of numbers, one per channel"
        raise field_error(file, field, value, f"a number or {want}" if allow_scalar else want)
    return [float(v) for v in one]


def json_size(file, field: str, value: Any) -> tuple[int, int]:
    """An image size: one number (square), or a list ending in (height, width) (timm's
    input_size starts with the channels)."""
    pair = value[-2:] if isinstance(value, list) and len(value) in (2, 3) else [value, value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in pair):
        raise field_error(file, field, value, "a size in pixels (a whole number of at least 1, "
                          "or [height, width])")
    return pair[0], pair[1]


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
    `dst` when the block succeeds and removes it otherwise (`vit.paths.staged`), so `dst` is
    whole or absent."""
    dst = check_destination(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        with paths.staged(dst) as tmp:
            yield tmp
    except BaseException as err:
        if is_out_of_space(err):  # safetensors' own error type included
            raise OutOfSpace(dst) from None
        if isinstance(err, OSError):
            raise CheckpointError(f"{dst}: cannot write ({err.strerror or err}); nothing was "
                                  "written") from None
        raise
