"""The one writer of benchmark records: each carries the command that made it, the date, the
machine (its CPU and devices), the package versions, then its figures.

A record lives at `benchmarks/<name>.json` (`default_out`), the latest run of each benchmark;
earlier runs are in git's history. Imported by the scripts in this folder (`python
scripts/NAME.py` puts this folder on the path).
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy", "scipy")


def default_out(name: str) -> str:
    """Where the record of benchmark `name` is written unless `--out` says otherwise."""
    return str(BENCHMARKS / f"{name}.json")


def command(argv: list[str] | None = None, script: str | None = None) -> str:
    """The command line, the script relative to the repository root. `argv` and `script`
    default to the running process's (a script whose `main(argv)` is called in-process passes
    its own)."""
    script = os.path.relpath(os.path.abspath(script or sys.argv[0]), ROOT)
    return shlex.join(["python", script, *(sys.argv[1:] if argv is None else argv)])


# The instruction sets that decide which matrix-product kernels a CPU can run.
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
# The ones that mean bfloat16 arithmetic in hardware (x86 flags; Arm's "bf16" feature).
BF16_FEATURES = ("avx512_bf16", "amx_bf16", "avx_ne_convert", "bf16")


def cpu() -> dict:
    """The CPU's model and its matrix-relevant features, from /proc/cpuinfo (Linux): the same
    code's ratio to transformers differs between hosts of one machine kind, so a record names
    the host's CPU. Empty where /proc/cpuinfo is not there."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    first = dict(line.split(":", 1) for line in text.split("\n\n")[0].splitlines()
                 if ":" in line)
    first = {k.strip(): v.strip() for k, v in first.items()}
    flags = set(first.get("flags", first.get("Features", "")).split())
    return {"bfloat16_arithmetic": [f for f in BF16_FEATURES if f in flags],
            "model_name": first.get("model name"), "family": first.get("cpu family"),
            "model": first.get("model"), "stepping": first.get("stepping"),
            "mhz": first.get("cpu MHz"), "features": [f for f in CPU_FEATURES if f in flags]}


def machine() -> dict:
    import jax

    return {"platform": platform.platform(), "processor": platform.processor(), "cpu": cpu(),
            "cpus": os.cpu_count(), "jax_backend": jax.default_backend(),
            "device_kind": jax.devices()[0].device_kind,
            "devices": [str(d) for d in jax.devices()],
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def versions(extra: tuple[str, ...] = ()) -> dict:
    out = {"python": platform.python_version()}
    for name in (*PACKAGES, *extra):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def write(path: str | Path, record: dict, extra_packages: tuple[str, ...] = (), *,
          argv: list[str] | None = None, script: str | None = None) -> Path:
    """Writes `record` with the command, date, machine and versions in front of it, atomically
    (a reader never sees half a record; a script may rewrite it as sections finish)."""
    full = {"command": command(argv, script),
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": machine(), "versions": versions(extra_packages), **record}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(full, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path
