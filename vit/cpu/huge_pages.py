"""Huge pages for XLA:CPU's per-run scratch memory, asked of glibc's malloc.

XLA:CPU takes each run's temporary buffer from malloc and frees it when the run ends; for a
training step that buffer is gigabytes. glibc serves a block that large with a fresh mmap and
unmaps it on free, so every step faults every page of it in again, in 4 KiB pages: a sizeable
share of a CPU step's time goes to the kernel. Where the kernel gives transparent huge pages on
request (`madvise`, the usual default), glibc's tunable `glibc.malloc.hugetlb=1` requests them
for its mappings: 2 MiB pages, 512 times fewer faults, and no more memory held than before.

Tunables are read when a process starts, so the `vit` command starts itself again with the
tunable set (`reexec`), before it has done anything. A Python program that calls the library
sets it in the environment of its own process (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`).
`VIT_MALLOC_TUNING=0` turns this off; a GLIBC_TUNABLES the user set is left as it is.

Keeping freed blocks in the heap instead (mallopt: no mmap, no trimming, one arena) removes the
faults altogether but, with XLA's allocation pattern, holds much more memory at peak: not worth
it by default. benchmarks/ records both.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb=1"
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MIN_GLIBC = (2, 35)  # glibc.malloc.hugetlb needs this release or a later one


def glibc_version() -> tuple[int, ...] | None:
    """The running glibc's version, or None off Linux's glibc."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        version = ctypes.CDLL(None).gnu_get_libc_version
    except (OSError, AttributeError):  # musl and others have no such function
        return None
    version.restype = ctypes.c_char_p
    try:
        return tuple(int(p) for p in version().decode().split(".")[:2])
    except ValueError:
        return None


def huge_pages_on_request() -> bool:
    """Whether the kernel gives transparent huge pages to mappings that ask (`madvise`); with
    `always` they come unasked, with `never` not at all."""
    try:
        return "[madvise]" in THP_MODE.read_text()
    except OSError:
        return False


def wanted(environ=os.environ) -> bool:
    """Whether to ask for huge pages: glibc can, the kernel gives them when asked, and neither
    VIT_MALLOC_TUNING=0 nor a GLIBC_TUNABLES of the user's says otherwise."""
    if environ.get("VIT_MALLOC_TUNING", "1") == "0" or "GLIBC_TUNABLES" in environ:
        return False
    version = glibc_version()
    return version is not None and version >= MIN_GLIBC and huge_pages_on_request()


def environment(environ=os.environ) -> dict[str, str]:
    """`environ` with the tunable added where `wanted`: for a process started from this one."""
    return {**environ, "GLIBC_TUNABLES": TUNABLE} if wanted(environ) else dict(environ)


def reexec() -> None:
    """Start this program again with the tunable set, where `wanted`; returns otherwise.

    For a command's entry point only, before it has opened, started or written anything: the
    process keeps its id and open files, and its arguments as the interpreter got them.
    """
    if not wanted() or not sys.orig_argv or not sys.executable:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, environment())
