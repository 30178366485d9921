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

Only where jax will compute on the CPU (`cpu_backend`): on a GPU or TPU the step's scratch
memory is the device's, and a process that starts twice is a cost with nothing to show for it.
That is told from the environment and the installed packages alone, before jax is imported:
starting a backend to ask it would initialise the GPU in a process about to be replaced.

Keeping freed blocks in the heap instead (mallopt: no mmap, no trimming, one arena) removes the
faults altogether but, with XLA's allocation pattern, holds much more memory at peak: not worth
it by default. benchmarks/ records both.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import pkgutil
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


def accelerator_plugins() -> tuple[str, ...]:
    """jax's accelerator plugins installed here, found as jax finds them but not imported:
    modules of the `jax_plugins` namespace package and entry points of its group (CUDA, ROCm
    and other PJRT plugins), and `libtpu`."""
    found = set()
    spec = importlib.util.find_spec("jax_plugins")
    if spec is not None and spec.submodule_search_locations:
        found |= {f"jax_plugins.{module.name}"
                  for module in pkgutil.iter_modules(spec.submodule_search_locations)}
    found |= {entry.value for entry in importlib.metadata.entry_points(group="jax_plugins")}
    if importlib.util.find_spec("libtpu") is not None:
        found.add("libtpu")
    return tuple(sorted(found))


def cpu_backend(environ=os.environ) -> bool:
    """Whether jax's default backend will be the CPU, told without starting one.

    The deprecated JAX_PLATFORM_NAME names the default outright; with JAX_PLATFORMS set, it
    is the first platform listed, the one jax prefers. Otherwise jax takes an accelerator
    whenever one of its plugins starts: the CPU for sure only where no plugin is installed or
    named (TPU_LIBRARY_PATH, PJRT_NAMES_AND_LIBRARY_PATHS). Where this cannot be sure (a
    plugin installed on a host without its device, `JAX_PLATFORMS=cuda,cpu` there) it says
    no: the cost is a CPU run without huge pages, never a GPU run started twice.
    """
    name = environ.get("JAX_PLATFORM_NAME", "").strip()
    if name:
        return name.lower() == "cpu"
    platforms = environ.get("JAX_PLATFORMS", "").strip()
    if platforms:
        return platforms.split(",")[0].strip().lower() == "cpu"
    if environ.get("TPU_LIBRARY_PATH") or environ.get("PJRT_NAMES_AND_LIBRARY_PATHS"):
        return False
    return not accelerator_plugins()


def wanted(environ=os.environ) -> bool:
    """Whether to ask for huge pages: jax will compute on the CPU, glibc can, the kernel gives
    them when asked, and neither VIT_MALLOC_TUNING=0 nor a GLIBC_TUNABLES of the user's says
    otherwise."""
    if environ.get("VIT_MALLOC_TUNING", "1") == "0" or "GLIBC_TUNABLES" in environ:
        return False
    if not cpu_backend(environ):
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
