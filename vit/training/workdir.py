"""A training workdir is ours or refused, and locked while a run writes into it.

Ours: a new or empty folder, one holding our marker (`.vit-workdir`, written when a run starts
there), or a run of release 0.1.0, which wrote no marker and is recognised by what it holds (a
`checkpoints/<step>/` with our `meta` item, or a `metrics.jsonl` of our records) and adopted
when the run first writes. Anything else with files in it, a model folder above all (its
`config.json` is not ours to replace), is refused, naming what is there.

The lock is `fcntl.flock` on `.vit-workdir.lock`, held for the whole run: the kernel releases it
when the process ends, however it ends, so a killed run leaves no stale lock, and a second writer
is refused at once, naming the holder (pid, host, start time: what the holder wrote into the
file). The file is removed on release while still locked, so a process that opened it before the
removal finds, once it holds the lock, that the path names another file or none, and tries again:
two runs never both hold "the" lock. Over NFS, Linux emulates `flock` with byte-range locks the
server arbitrates, so hosts sharing the workdir exclude each other too.

Several processes: process 0 alone writes the workdir's own files, so it alone claims the
workdir; the others follow its verdict (`claim(..., agree=...)`), so a refused multi-process run
stops on every process together rather than leaving the rest waiting for process 0.

Readers (`vit eval`, `predict`, `rollout`, `--init`) never take the lock: a run's step folders
appear by an atomic rename, so a reader sees only finished steps.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from vit.errors import OutOfSpace, VitError, is_out_of_space
from vit.paths import write_whole
from vit.step_folders import finished_steps

MARKER = ".vit-workdir"
LOCK = ".vit-workdir.lock"
FORMAT = "vit-workdir-1"
# What a 0.1.0 workdir holds: finished checkpoints/<step>/, metrics.jsonl records, staged runs.
CHECKPOINTS, METRICS, STAGES = "checkpoints", "metrics.jsonl", "stages"
METRIC_SPLITS = ("train", "validation", "timing")  # timing: vit.training.timings
SHOWN = 4  # names listed in a refusal


class WorkdirError(VitError):
    """A workdir `vit train` may not write into: another program's folder."""


class WorkdirBusy(WorkdirError):
    """Another run holds the workdir's lock."""


# -- ours or not -----------------------------------------------------------------------------

def foreign_entries(path) -> list[str]:
    """What makes `path` a folder `vit train` must not write into: its entries (folders with a
    trailing `/`), or [] when it is ours (missing, empty, marked, or a 0.1.0 run)."""
    path = Path(path)
    if not path.is_dir():
        return []
    names = sorted(set(os.listdir(path)) - {LOCK})
    if not names or MARKER in names or is_run(path):
        return []
    return [f"{n}/" if (path / n).is_dir() else n for n in names]


def is_run(path: Path) -> bool:
    """Whether `path` holds a run by its structure (what release 0.1.0 left, without marker)."""
    return has_finished_step(path) or _has_records(path / METRICS) or any(
        is_run(stage) for stage in _children(path / STAGES))


def has_finished_step(workdir) -> bool:
    """Whether `workdir` or one of its stages holds a finished step (`vit.step_folders`)."""
    workdir = Path(workdir)
    return bool(finished_steps(workdir / CHECKPOINTS)) or any(
        has_finished_step(stage) for stage in _children(workdir / STAGES))


def latest_step(workdir) -> int | None:
    """`workdir`'s latest finished step, None when it has none."""
    return max(finished_steps(Path(workdir) / CHECKPOINTS), default=None)


def _children(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir()]
    except OSError:
        return []


def _has_records(metrics: Path) -> bool:
    """Whether the first line of `metrics` is one of our records ({"step": N, "split": ...})."""
    try:
        with metrics.open("rb") as f:
            first = f.readline(1 << 16)
        record = json.loads(first)
    except (OSError, ValueError):
        return False
    return (isinstance(record, dict) and isinstance(record.get("step"), int)
            and record.get("split") in METRIC_SPLITS)


def refuse_foreign(path) -> None:
    """A one-line `WorkdirError` when `path` is not a folder `vit train` may write into."""
    names = foreign_entries(path)
    if not names:
        return
    shown = ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more"
                                        if len(names) > SHOWN else "")
    model = any(n.endswith((".safetensors", ".npz", ".bin", ".pth", ".msgpack", ".h5"))
                for n in names)
    hint = (f"; to fine-tune the model it holds, give it as --init {path} with a new --workdir"
            if model else "")
    raise WorkdirError(f"--workdir {path} holds files that `vit train` did not make ({shown}); "
                       "a run writes only into a new or empty folder or its own workdir, so "
                       f"nothing there is overwritten: give another --workdir{hint}")


def mark(path) -> None:
    """Writes the marker that makes `path` ours (nothing when it is there already)."""
    marker = Path(path) / MARKER
    if marker.exists():
        return
    record = {"format": FORMAT, "created": _now()}
    replace_file(marker, json.dumps(record) + "\n")


# -- the lock --------------------------------------------------------------------------------

class WorkdirLock:
    """The exclusive lock of a workdir, taken by `acquire()` or refused with `WorkdirBusy`."""

    def __init__(self, path):
        self.path = Path(path)
        self.file = self.path / LOCK
        self.fd: int | None = None

    def acquire(self) -> None:
        while True:
            self.path.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self.file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:  # the folder went between mkdir and open: again
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                holder = _read_holder(fd)
                os.close(fd)
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                raise WorkdirBusy(f"--workdir {self.path} is being trained by another run "
                                  f"({holder}); wait for it to finish or stop it, or give "
                                  "another --workdir") from None
            if _same_file(fd, self.file):
                break
            os.close(fd)  # released and removed by its holder after we opened it: again
        self.fd = fd
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": _now()}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        except OSError:  # a full disk: the lock holds all the same, only unnamed
            pass

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):  # gone with its folder when a failed run undid it
            if _same_file(self.fd, self.file):
                self.file.unlink()
        os.close(self.fd)  # the lock goes with the last descriptor
        self.fd = None


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _read_holder(fd: int) -> str:
    """Who holds the lock, as its holder wrote it; a holder that has just taken the lock writes
    that a moment later, so an empty file is read again for up to a second."""
    for _ in range(20):
        try:
            holder = json.loads(os.pread(fd, 4096, 0))
            return (f"pid {holder['pid']} on host {holder['host']}, started "
                    f"{holder['started']}")
        except (OSError, ValueError, TypeError, KeyError):
            time.sleep(0.05)
    return "it has just started"


# -- a claim: checked, locked, and undone when the run fails before its first checkpoint -----

class Claim:
    """Process 0's hold on a workdir for one run: refused when foreign or busy; remembers what
    the folder held when locked, so `undo()` removes only what the run added."""

    def __init__(self, path):
        self.path = Path(path).absolute()
        self.lock = WorkdirLock(self.path)
        self.made: Path | None = None  # the outermost folder this claim created
        self.before: set[str] = set()
        self.undone = False

    def __enter__(self) -> Claim:
        refuse_foreign(self.path)  # before anything is made, not even the lock file
        missing = self.path
        while not missing.exists() and missing.parent != missing:
            self.made, missing = missing, missing.parent
        self.lock.acquire()
        try:
            refuse_foreign(self.path)  # another program may have written since the check
            self.before = set(os.listdir(self.path)) - {LOCK}
            if not self.before:  # new or empty: ours from now on
                mark(self.path)
        except BaseException:
            self.release()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def adopt(self) -> None:
        """Marks a 0.1.0 run as ours: called when the run first writes into it."""
        mark(self.path)

    def undo(self) -> None:
        """Removes what the run added; with a folder it made, that folder too (and the parents
        it made, when nothing else is in them)."""
        if not self.path.is_dir():
            return
        for name in set(os.listdir(self.path)) - self.before - {LOCK}:
            entry = self.path / name
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        self.undone = True

    def release(self) -> None:
        self.lock.release()
        if not self.undone or self.made is None:
            return
        folder = self.path
        while True:  # empty folders only: what another run put there meanwhile stays
            try:
                folder.rmdir()
            except OSError:
                return
            if folder == self.made:
                return
            folder = folder.parent


@contextlib.contextmanager
def claim(path, *, primary: bool = True,
          agree: Callable[[str | None], list] | None = None) -> Iterator[Claim | None]:
    """`Claim(path)` on process 0 (`primary`), None elsewhere, held for the block. With several
    processes, `agree` (called by every process with its refusal or None; it returns every
    process's, process 0's first) stops them all when process 0 is refused."""
    held, error = None, None
    if primary:
        try:
            held = Claim(path).__enter__()
        except Exception as err:  # noqa: BLE001  (the others must hear of any failure)
            error = err
    if agree is not None:
        said = agree(None if error is None else str(error))[0]
        if error is None and said is not None:
            error = WorkdirError(said)
    if error is not None:
        raise error
    try:
        yield held
    finally:
        if held is not None:
            held.release()


# -- small files ------------------------------------------------------------------------------

def write_config(workdir: Path, config, name: str = "config.json") -> None:
    """`WORKDIR/config.json`, the resolved recipe (`vit eval --workdir` reads it), replaced
    atomically."""
    replace_file(Path(workdir) / name, config.to_json(indent=2))


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def replace_file(path: Path, text: str) -> None:
    """`path` replaced atomically by `text` (`vit.paths.write_whole`). A failed write leaves the
    old `path` as it was and no temporary file; a full disk is an `OutOfSpace` naming `path`
    and the bytes it needs."""
    data = text.encode()
    try:
        write_whole(path, lambda f: f.write(data))
    except BaseException as err:
        if is_out_of_space(err) and not isinstance(err, OutOfSpace):
            raise OutOfSpace(path, len(data)) from None
        raise
