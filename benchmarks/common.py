"""What every benchmark mode shares: a side run in its own process (`run_side`), one timing
helper (`time_call`, and `interleave` for contestants that alternate), and one record writer
(`write_record`).

A mode is a module `benchmarks/NAME.py` with `main(argv: list[str]) -> int | None`, registered
by name in `benchmarks/__main__.py`'s `MODES` table (`python -m benchmarks NAME ...`). A mode:

- measures each contestant in a fresh process with `run_side("benchmarks.NAME:function",
  {...keyword arguments...})`: the function runs in `python -m benchmarks._worker`, returns a
  JSON-able dict, and that dict is what `run_side` returns (read from a result file, never
  parsed from the worker's output). A fresh process per side keeps one library's threads,
  caches and allocator out of the other's figures;
- times calls with `time_call(fn, warmup=..., repeats=...)`, which waits for JAX's
  asynchronous results, so every mode's "median" and "best" mean the same thing;
- keeps a side alive between runs with `Side` where rounds must be seconds apart (the
  train mode's `--interleave`);
- writes its figures once with `write_record("NAME", figures, argv=argv)`, which puts the
  date, the command line, the CPU, the core count and the package versions in front of them
  at `benchmarks/records/NAME.json` (one record per benchmark, the latest; git keeps the
  rest). The docs' tables are made from those records (`python -m benchmarks tables`): the
  mode's module gives its record's table as `table(record) -> list[str]` (Markdown lines), and
  the record gets one `<!-- table NAME -->` block in docs/benchmarks.md or the README.

The modes import `vit` as installed (`pip install -e .`), never a copy of it; a mode's module
imports its heavy libraries (jax, torch, ...) inside functions, so listing the modes and making
the tables stays light.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RECORDS = Path(__file__).resolve().parent / "records"
# Versions stamped on every record; a package that is not installed is recorded as None.
PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy", "torch", "transformers")


class SideFailed(RuntimeError):
    """A side's process exited with an error; the message ends with its stderr."""


# ------------------------------------------------------------------------- sides


def run_side(target: str, kwargs: dict | None = None, *, env: dict | None = None,
             cwd: str | Path | None = None, pythonpath: str | None = None,
             prefix: list[str] | None = None, timeout: float | None = None) -> dict:
    """Runs `target` ("package.module:function") in a new Python process and returns the dict
    it returned.

    `kwargs` (JSON-able) are passed as keyword arguments. `env` is added to this process's
    environment (e.g. `XLA_FLAGS`), `pythonpath` is put first on the worker's path (an export
    of an older commit, to measure against the code before a change), `prefix` goes in front
    of the interpreter (e.g. `["taskset", "-c", "0"]`). Raises `SideFailed` with the tail of
    the worker's stderr when it fails."""
    with tempfile.TemporaryDirectory(prefix="bench-side-") as folder:
        args_file, result_file = Path(folder) / "args.json", Path(folder) / "result.json"
        args_file.write_text(json.dumps(kwargs or {}))
        full_env = {**os.environ, **(env or {})}
        # The worker imports this package from the repository; `vit` comes from the
        # environment (or `pythonpath`, placed before it).
        paths = [p for p in (pythonpath, str(ROOT), full_env.get("PYTHONPATH")) if p]
        full_env["PYTHONPATH"] = os.pathsep.join(paths)
        cmd = [*(prefix or []), sys.executable, "-m", "benchmarks._worker", target,
               str(args_file), str(result_file)]
        done = subprocess.run(cmd, env=full_env, cwd=cwd or ROOT, capture_output=True,
                              text=True, timeout=timeout)
        if done.returncode or not result_file.exists():
            raise SideFailed(f"{target} exited with {done.returncode}:\n{done.stderr[-3000:]}")
        return json.loads(result_file.read_text())


class Side:
    """A side kept alive between runs (compiled and warmed up once) and asked for one run at a
    time, for benchmarks whose rounds must be seconds apart: `target` ("module:function") is
    called once with `kwargs` in `python -m benchmarks._worker --serve` and returns a function;
    each `side(**request)` calls that function in the worker and returns its dict (through a
    result file, like `run_side`; `env`, `cwd` and `pythonpath` as there). `close()` ends the
    worker."""

    def __init__(self, target: str, kwargs: dict | None = None, *, env: dict | None = None,
                 cwd: str | Path | None = None, pythonpath: str | None = None,
                 settle_s: float = 0.0):
        self.target, self.settle_s, self.count = target, settle_s, 0
        self.folder = Path(tempfile.mkdtemp(prefix="bench-side-"))
        (self.folder / "args.json").write_text(json.dumps(kwargs or {}))
        full_env = {**os.environ, **(env or {})}
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (pythonpath, str(ROOT), full_env.get("PYTHONPATH")) if p)
        # stderr to a file: a pipe nobody reads while the worker runs could fill and block it.
        self.log = self.folder / "stderr.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks._worker", "--serve", target,
                 str(self.folder / "args.json"), str(self.folder)],
                env=full_env, cwd=cwd or ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=log, text=True)
        self._result("ready")

    def _result(self, name: str) -> dict:
        line = self.proc.stdout.readline()
        path = self.folder / f"{name}.json"
        if not line or not path.exists():
            self.proc.wait()
            raise SideFailed(f"{self.target} failed:\n{self.log.read_text()[-3000:]}")
        return json.loads(path.read_text())

    def __call__(self, **request) -> dict:
        # Between runs, time for the other side's idle threads to stop spinning.
        time.sleep(self.settle_s)
        self.count += 1
        self.proc.stdin.write(json.dumps({"name": f"run{self.count}", "request": request})
                              + "\n")
        self.proc.stdin.flush()
        return self._result(f"run{self.count}")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


# ------------------------------------------------------------------------ timing


def _wait(result: Any) -> Any:
    """Blocks until JAX's asynchronous `result` is computed (anything else passes through),
    without importing JAX into a process that does not use it."""
    if "jax" in sys.modules:
        import jax

        return jax.block_until_ready(result)
    return result


def time_call(fn: Callable[[], Any], *, warmup: int = 1, repeats: int = 5,
              number: int = 1) -> dict:
    """Calls `fn()` `warmup` times untimed (the first call compiles), then takes `repeats`
    samples of `number` calls back to back, the last one waited for (`jax.block_until_ready`:
    JAX returns before the work is done). Returns seconds per call: {"median_s", "min_s",
    "times_s"}."""
    for _ in range(warmup):
        _wait(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            out = fn()
        _wait(out)
        times.append((time.perf_counter() - start) / number)
    return {"median_s": statistics.median(times), "min_s": min(times), "times_s": times}


def interleave(fns: dict[str, Callable[[], Any]], *, rounds: int, warmup: int = 1) -> dict:
    """Times several contestants in alternation, one call each per round, the order rotated
    each round, so a drift in the machine's load falls on all of them alike. Returns
    {name: time_call-style dict}."""
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            _wait(fns[name]())
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        for name in names[i % len(names):] + names[:i % len(names)]:
            start = time.perf_counter()
            _wait(fns[name]())
            times[name].append(time.perf_counter() - start)
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "times_s": t}
            for name, t in times.items()}


def median(values) -> float:
    return statistics.median(list(values))


# ----------------------------------------------------------------------- records


# The instruction sets that decide which matrix-product kernels a CPU can run.
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
# The ones that mean bfloat16 arithmetic in hardware (x86 flags; Arm's "bf16" feature).
BF16_FEATURES = ("avx512_bf16", "amx_bf16", "avx_ne_convert", "bf16")


def cpu() -> dict:
    """The CPU's model and its matrix-relevant features, from /proc/cpuinfo (Linux): the same
    code's ratio to a peer differs between hosts of one machine kind, so a record names its
    CPU. Empty where /proc/cpuinfo is not there."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    first = dict(line.split(":", 1) for line in text.split("\n\n")[0].splitlines()
                 if ":" in line)
    first = {k.strip(): v.strip() for k, v in first.items()}
    flags = set(first.get("flags", first.get("Features", "")).split())
    return {"model_name": first.get("model name"),
            "bfloat16_arithmetic": [f for f in BF16_FEATURES if f in flags],
            "avx512_bf16": "avx512_bf16" in flags, "amx": "amx_bf16" in flags,
            "family": first.get("cpu family"), "model": first.get("model"),
            "stepping": first.get("stepping"), "mhz": first.get("cpu MHz"),
            "features": [f for f in CPU_FEATURES if f in flags]}


def machine() -> dict:
    """The host: platform, CPU, core count, and JAX's backend and devices where JAX is
    importable."""
    out = {"platform": platform.platform(), "processor": platform.processor(), "cpu": cpu(),
           "cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]}
    try:
        import jax

        out.update(jax_backend=jax.default_backend(), device_kind=jax.devices()[0].device_kind,
                   devices=[str(d) for d in jax.devices()])
    except Exception:  # noqa: BLE001 - a record of a run without JAX still names its host
        pass
    return out


def versions(extra: tuple[str, ...] = ()) -> dict:
    out = {"python": platform.python_version()}
    for name in (*PACKAGES, *extra):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def command(argv: list[str] | None, mode: str | None = None) -> str:
    """The command line that makes a record: `python -m benchmarks MODE ARGS`."""
    head = ["python", "-m", "benchmarks", *([mode] if mode else [])]
    return shlex.join([*head, *(sys.argv[1:] if argv is None else argv)])


def record_path(name: str, folder: Path = RECORDS) -> Path:
    return folder / f"{name}.json"


def write_record(name: str, figures: dict, *, argv: list[str] | None, mode: str | None = None,
                 extra_packages: tuple[str, ...] = (), out: str | Path | None = None) -> Path:
    """Writes `benchmarks/records/<name>.json` (or `out`): the benchmark's name, the date (UTC,
    ISO 8601), the command line (`mode` and `argv`, the arguments after it; `argv=None` takes
    this process's), the machine (CPU model, bfloat16 features, core count) and the package
    versions, then `figures`. Atomic: a reader never sees half a record."""
    full = {"benchmark": name,
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": command(argv, mode or name), "machine": machine(),
            "versions": versions(extra_packages), **figures}
    path = Path(out) if out else record_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(full, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path
