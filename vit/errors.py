"""User-facing errors.

Anything a user can cause (a missing file, an unreadable image, a checkpoint that does not fit,
a mistyped name or config key) raises a `VitError`. The CLI prints its message on one line and
exits with code 2; a traceback is reserved for our own bugs. Messages name the bad input and
the fix.
"""


class VitError(Exception):
    """Base class: a mistake in what the user asked for, not a bug in vit."""

    exit_code = 2


class ConfigError(VitError, ValueError):
    """An unknown model name, config field or value."""


class CheckpointError(VitError):
    """A checkpoint that is missing, unreadable, or does not fit the model."""


class DataError(VitError):
    """A dataset or image that cannot be found or read."""


class OutOfSpace(VitError):
    """A write that found the disk (or the user's quota) full: the place is the user's to free
    or change. `needed` is the size the write needs in bytes, where it is known."""

    def __init__(self, path, needed: int | None = None):
        self.path, self.needed = path, needed
        size = f" (needs about {megabytes(needed)})" if needed else ""
        super().__init__(f"{path}: no space left on device{size}; free some space there or "
                         "write elsewhere")


class OutOfMemory(VitError):
    """A computation that cannot fit in the memory there is: the message says what to lower."""


# ENOSPC and EDQUOT: a full disk and a full quota, the same fix.
_NO_SPACE_ERRNOS = {28, 122}
# Libraries that report a full disk in their own error types (tensorstore through orbax as a
# ValueError, safetensors as a SafetensorError) keep the system's words in the text.
_NO_SPACE_TEXTS = ("no space left on device", "disk quota exceeded", "os error 28",
                   "os error 122", "os_error_code='28'", "os_error_code='122'")


def is_out_of_space(err: BaseException) -> bool:
    """Whether `err`, or an error it was raised from, is a full disk or quota."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OutOfSpace) or (
                isinstance(err, OSError) and err.errno in _NO_SPACE_ERRNOS):
            return True
        text = str(err).lower()
        if any(words in text for words in _NO_SPACE_TEXTS):
            return True
        err = err.__cause__ or err.__context__
    return False


def is_out_of_memory(err: BaseException) -> bool:
    """A MemoryError, or XLA's RESOURCE_EXHAUSTED for memory (not for a full disk, which
    tensorstore reports with the same code)."""
    if isinstance(err, MemoryError):
        return True
    return "RESOURCE_EXHAUSTED" in str(err) and not is_out_of_space(err)


def megabytes(size: int) -> str:
    """`size` bytes as MB for a message: one decimal below 10 MB, whole above."""
    mb = size / 1e6
    return f"{max(mb, 0.1):.1f} MB" if mb < 10 else f"{mb:,.0f} MB"
