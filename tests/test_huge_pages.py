"""Huge pages for XLA:CPU's scratch memory (vit/cpu/huge_pages.py): where jax will compute on
the CPU, and only there, the `vit` command starts itself again with glibc's tunable set, keeps
its process id and arguments, leaves a user's choice alone, and the tunable does cut the page
faults of a large block malloc maps afresh."""

import os
import subprocess
import sys

import pytest

from vit.cpu import huge_pages

pytestmark = pytest.mark.timeout(120)
ON_CPU = {"JAX_PLATFORMS": "cpu"}
needs_huge_pages = pytest.mark.skipif(
    not huge_pages.wanted(ON_CPU),
    reason="needs Linux's glibc >= 2.35 and huge pages on request (madvise)")

# Run as the console script runs `vit`: main() without arguments, so sys.argv is read.
SHOW = """
import os, sys
from vit import cli
print(os.getpid(), os.environ.get("GLIBC_TUNABLES"), sys.argv[1:], flush=True)
sys.argv = ["vit", "--version"]
cli.main()
"""


def run(code: str, *args: str, **env: str) -> list[str]:
    """`code` in a fresh interpreter, on the CPU unless `env` says otherwise."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("GLIBC_TUNABLES", "VIT_MALLOC_TUNING", "JAX_PLATFORM_NAME")}
    proc = subprocess.run([sys.executable, "-c", code, *args], env={**clean, **ON_CPU, **env},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


@needs_huge_pages
def test_the_vit_command_starts_again_with_the_tunable_in_the_same_process():
    first, second, version = run(SHOW, "a b", "c")
    pid, tunables, argv = first.split(" ", 2)
    assert tunables == "None" and argv == "['a b', 'c']"
    assert second == f"{pid} {huge_pages.TUNABLE} ['a b', 'c']"  # same id, same arguments
    assert version.startswith("vit ")


@needs_huge_pages
def test_an_opt_out_or_a_users_tunables_are_left_alone():
    first, version = run(SHOW, VIT_MALLOC_TUNING="0")
    assert first.split(" ")[1] == "None" and version.startswith("vit ")
    first, version = run(SHOW, GLIBC_TUNABLES="glibc.malloc.mmap_max=7")
    assert first.split(" ")[1] == "glibc.malloc.mmap_max=7" and version.startswith("vit ")


# 256 MiB taken from malloc, written and freed, three times: in 4 KiB pages each round faults
# 65,536 times; in huge pages a few hundred.
FAULTS = """
import ctypes, resource
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
size = 256 << 20
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@needs_huge_pages
def test_the_tunable_cuts_the_page_faults_of_a_large_block():
    plain = int(run(FAULTS)[0])
    huge = int(run(FAULTS, GLIBC_TUNABLES=huge_pages.TUNABLE)[0])
    assert plain >= 3 * 65536 * 0.9  # every page of every round faulted in: the cost it cuts
    assert huge < plain / 8, (huge, plain)


@needs_huge_pages
def test_the_vit_command_starts_once_where_jax_will_compute_elsewhere(tmp_path):
    # A GPU asked for by name, and a CUDA plugin installed with JAX_PLATFORMS unset: no second
    # start, and the plugin (which fails if imported) is found without being imported.
    first, version = run(SHOW, JAX_PLATFORMS="cuda")
    assert first.split(" ")[1] == "None" and version.startswith("vit ")
    plugin = tmp_path / "jax_plugins" / "xla_cuda_fake.py"
    plugin.parent.mkdir()
    plugin.write_text("raise ImportError('imported')\n")
    first, version = run(SHOW, JAX_PLATFORMS="", PYTHONPATH=str(tmp_path))
    assert first.split(" ")[1] == "None" and version.startswith("vit ")


@pytest.mark.parametrize("environ, cpu", [
    ({"JAX_PLATFORMS": "cpu"}, True),
    ({"JAX_PLATFORMS": "cpu,cuda"}, True),
    ({"JAX_PLATFORMS": "cuda"}, False),
    ({"JAX_PLATFORMS": "cuda,cpu"}, False),
    ({"JAX_PLATFORMS": "tpu"}, False),
    ({"JAX_PLATFORM_NAME": "gpu", "JAX_PLATFORMS": "cpu,cuda"}, False),
    ({}, True),  # no plugin installed (patched below)
    ({"TPU_LIBRARY_PATH": "/opt/libtpu.so"}, False),
    ({"PJRT_NAMES_AND_LIBRARY_PATHS": "cuda:/opt/pjrt_c_api_gpu_plugin.so"}, False),
])
def test_the_backend_is_told_from_the_environment_without_starting_jax(monkeypatch, environ, cpu):
    monkeypatch.setattr(huge_pages, "accelerator_plugins", lambda: ())
    assert huge_pages.cpu_backend(environ) is cpu


def test_an_installed_accelerator_plugin_means_no_huge_pages(monkeypatch):
    monkeypatch.setattr(huge_pages, "accelerator_plugins", lambda: ("jax_plugins.xla_cuda12",))
    assert not huge_pages.cpu_backend({}) and not huge_pages.wanted({})
    assert "GLIBC_TUNABLES" not in huge_pages.environment({})
    assert huge_pages.cpu_backend(ON_CPU)  # asked for by name, the CPU it is
