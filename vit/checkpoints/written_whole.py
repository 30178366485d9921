"""Around any checkpoint writer: what a failed write began is removed, a full disk is one
line naming the destination and the size it needs, and orbax's writer threads stay quiet."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from vit.checkpoints.orbax_io import quiet_event_loops
from vit.errors import OutOfSpace, is_out_of_space
from vit.paths import remove_until_settled


@contextlib.contextmanager
def written_whole(dst, needed: int | None = None) -> Iterator[Path]:
    """Around any writer that makes `dst` (a file or a folder, and its missing parents): when
    the block fails, what it began is removed (`dst`, temporary siblings named `dst.*` or
    `.dst.*` such as orbax's `dst.orbax-checkpoint-tmp`, the parents it made), and a full disk
    is one `OutOfSpace` naming `dst` and the `needed` bytes. Orbax's writer threads print
    nothing meanwhile: the block's own error is the report."""
    shown, dst = dst, Path(dst).absolute()
    made, parent = None, dst.parent
    while not parent.exists() and parent.parent != parent:
        made, parent = parent, parent.parent
    existing = set(os.listdir(dst.parent)) if made is None else set()
    try:
        with _quiet_orbax_threads():
            yield dst
    except BaseException as err:
        _remove_begun(dst, made, existing)
        if is_out_of_space(err):
            raise OutOfSpace(shown, needed) from None
        raise


def _remove_begun(dst: Path, made: Path | None, existing: set[str]) -> None:
    """Removes what a failed write began: the parents it made, or what is new beside `dst`
    under its name (writes still in flight may make it again: `remove_until_settled`)."""
    def begun() -> list[Path]:
        if made is not None:
            return [made] if made.exists() else []
        if not dst.parent.is_dir():
            return []
        return [dst.parent / name for name in set(os.listdir(dst.parent)) - existing
                if name == dst.name or name.startswith((f"{dst.name}.", f".{dst.name}."))]

    remove_until_settled(begun)


@contextlib.contextmanager
def _quiet_orbax_threads() -> Iterator[None]:
    """Orbax writes every array at once in its own threads; when one write fails (a full disk)
    absl logs each thread's traceback, and tensorstore's late callbacks print "Event loop is
    closed" tracebacks. The loops orbax reads with (`orbax_io`) serve its writes as well, and
    absl stays quiet until the block is over. A failed block may end while threads it started
    are still failing one by one: absl stays quiet until they have ended too."""
    absl = logging.getLogger("absl")
    level = absl.level
    before = set(threading.enumerate())
    absl.setLevel(logging.CRITICAL)
    try:
        with quiet_event_loops():
            try:
                yield
            except BaseException:
                # Orbax's writer threads end soon after a failure, each logging it; the wait
                # is bounded all the same. Thread.join: orbax's own join waits on its signals.
                deadline = time.monotonic() + 15
                for thread in set(threading.enumerate()) - before:
                    if type(thread).__name__ == "_SignalingThread":
                        threading.Thread.join(thread, max(0.0, deadline - time.monotonic()))
                raise
    finally:
        absl.setLevel(level)
