"""JAX's persistent compilation cache for the `vit` commands: a second run with the same model
and batch shape loads the compiled forward from disk instead of compiling it again.

The cache root is `$VIT_CACHE_DIR` when set, else `$XDG_CACHE_HOME/vit` (`~/.cache/vit`); JAX's
compiles go in its `jax/` folder and `vit predict`'s prepared classifiers
(`vit.inference.prepared`) in `prepared/`. JAX keys each entry on the program, the devices and
the jax/XLA versions, so a stale entry is never used; deleting the folder is always safe.
Standard library and jax only.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "VIT_CACHE_DIR"
# JAX stores only compiles slower than this; its default (1 s) skips small models and the short
# compiles of a fast machine. `vit predict` compiles one program (the forward), so store it all.
MIN_COMPILE_SECONDS = 0.0


def root() -> Path:
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vit"


def default_dir() -> Path:
    """JAX's compilation cache folder."""
    return root() / "jax"


def enable(path: str | os.PathLike | None = None, *,
           min_compile_seconds: float = MIN_COMPILE_SECONDS) -> Path | None:
    """Turns the cache on at `path` (default: `default_dir()`); returns the folder, or None when
    it cannot be created (the run goes on uncached). Call it before the first compile: JAX
    opens the cache once per process."""
    import jax

    folder = Path(path).expanduser() if path is not None else default_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_seconds)
    return folder


def disable() -> None:
    """`--no-cache`: neither read nor write the persistent cache in this process."""
    import jax

    jax.config.update("jax_enable_compilation_cache", False)


def configure(no_cache: bool) -> Path | None:
    """What the commands call first: the cache on (returns the cache root), or off for
    `--no-cache` (None)."""
    if no_cache:
        disable()
        return None
    return root() if enable() is not None else None
