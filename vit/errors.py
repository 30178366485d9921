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
