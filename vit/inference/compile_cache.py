"""JAX's persistent compilation cache for the `vit` commands: a second run with the same model
and batch shape loads the compiled forward from disk instead of compiling it again.

The cache root is `$VIT_CACHE_DIR` when set, else `$XDG_CACHE_HOME/vit` (`~/.cache/vit`); JAX's
compiles go in its `jax/` folder and `vit predict`'s prepared classifiers
(`vit.inference.prepared`) in `prepared/`. JAX keys each entry on the program, the devices and
the jax/XLA versions, so a stale entry is never used; deleting the folder is always safe.

A nearly full disk turns the caches off for the run (with a note), and a compile whose entry
could not be written all the same (the disk filled meanwhile) leaves no cut entry behind: JAX
writes entries in place and never replaces one, so a cut entry would be read, warned about and
recompiled on every later run. Standard library and jax only.
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from vit.errors import megabytes

ENV_VAR = "VIT_CACHE_DIR"
# JAX stores only compiles slower than this; its default (a second) skips small models and the
# short compiles of a fast machine. `vit predict` compiles one program (the forward), so store
# it all.
MIN_COMPILE_SECONDS = 0.0
# Below this much free space on the cache's disk, nothing is cached: entries are megabytes.
MIN_FREE_BYTES = 64 << 20


def root() -> Path:
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vit"


def default_dir() -> Path:
    """JAX's compilation cache folder."""
    return root() / "jax"


def enable(path: str | os.PathLike | None = None, *,
           min_compile_seconds: float = MIN_COMPILE_SECONDS,
           note: Callable[[str], None] | None = None) -> Path | None:
    """Turns the cache on at `path` (default: `default_dir()`); returns the folder, or None when
    it cannot be created or its disk is nearly full (the run goes on uncached; `note` is told
    why). Call it before the first compile: JAX opens the cache once per process."""
    import jax

    folder = Path(path).expanduser() if path is not None else default_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    if free < MIN_FREE_BYTES:
        if note is not None:
            note(f"{folder}: only {megabytes(free)} free, so nothing is cached this run; free "
                 f"some space or set {ENV_VAR} to another folder")
        return None
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_seconds)
    _remove_cut_entries(folder, note)
    return folder


def disable() -> None:
    """`--no-cache`: neither read nor write the persistent cache in this process."""
    import jax

    jax.config.update("jax_enable_compilation_cache", False)


def configure(no_cache: bool, note: Callable[[str], None] | None = None) -> Path | None:
    """What the commands call first: the cache on (returns the cache root), or off for
    `--no-cache` or a nearly full disk (None)."""
    if no_cache:
        disable()
        return None
    return root() if enable(note=note) is not None else None


# JAX's warning when it could not store an entry; the entry file may be left cut short.
_WRITE_FAILED = "Error writing persistent compilation cache entry"


_watching: dict = {}  # the folder JAX writes to, since when, and whom to tell


def _remove_cut_entries(folder: Path, note: Callable[[str], None] | None) -> None:
    """From now on, JAX's warning that an entry could not be written removes the entries
    written in `folder` since (a valid one only costs a compile) and is one `note` instead."""
    if not _watching:  # once per process: the hook reads the folder of the latest call
        previous = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if str(message).startswith(_WRITE_FAILED):
                _cut_entry_written(str(message))
            else:
                previous(message, category, filename, lineno, file, line)

        warnings.showwarning = show
    _watching.update(folder=folder, since=time.time() - 1, note=note)


def _cut_entry_written(message: str) -> None:
    folder, since, note = _watching["folder"], _watching["since"], _watching["note"]
    for entry in folder.glob("*-cache"):
        try:
            if entry.stat().st_mtime >= since:
                entry.unlink()
        except OSError:
            pass
    if note is not None:
        note(f"{folder}: a compile could not be cached ({message.rsplit(': ', 1)[-1]})")
