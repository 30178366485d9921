"""What every benchmark mode shares: contestant processes, timed `vit` commands, one timer and
one record writer (docs/benchmarks.md describes modes and records)."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import json
import os
import platform
import re
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
RECORDS = ROOT / "benchmarks" / "records"
PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy", "grain", "orbax-checkpoint", "torch",
            "transformers", "triton", "jax-cuda12-plugin", "jax-cuda13-plugin")
VIT = [sys.executable, "-m", "vit.cli"]


class SideFailed(RuntimeError):
    """A contestant's process exited with an error; the message ends with its output."""


def _side_env(env: dict | None, pythonpath: str | None) -> dict:
    """This environment with `env` on top and `pythonpath` (an older copy of vit) first."""
    full = {**os.environ, **(env or {})}
    full["PYTHONPATH"] = os.pathsep.join(
        p for p in (pythonpath, str(ROOT), full.get("PYTHONPATH")) if p)
    return full


def run_side(target: str, kwargs: dict | None = None, *, env: dict | None = None,
             cwd: str | Path | None = None, pythonpath: str | None = None) -> dict:
    """`target` ("module:function") called with `kwargs` in a new process: the dict it returned."""
    with tempfile.TemporaryDirectory(prefix="bench-side-") as folder:
        args, result = Path(folder) / "args.json", Path(folder) / "result.json"
        args.write_text(json.dumps(kwargs or {}))
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.common", target, str(args), str(result)],
            env=_side_env(env, pythonpath), cwd=cwd or ROOT, capture_output=True, text=True)
        if done.returncode or not result.exists():
            raise SideFailed(f"{target} exited with {done.returncode}:\n{done.stderr[-3000:]}")
        return json.loads(result.read_text())


class Side:
    """A contestant kept alive: `target(**kwargs)` returns a function that each `side(**request)`
    calls in that process; `settle_s` pauses before each run (the other's threads settle)."""

    def __init__(self, target: str, kwargs: dict | None = None, *, env: dict | None = None,
                 pythonpath: str | None = None, settle_s: float = 0.0):
        self.target, self.settle_s = target, settle_s
        self.folder = Path(tempfile.mkdtemp(prefix="bench-side-"))
        (self.folder / "args.json").write_text(json.dumps(kwargs or {}))
        self.log = self.folder / "stderr.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.common", "--serve", target,
                 str(self.folder / "args.json"), str(self.folder)],
                env=_side_env(env, pythonpath), cwd=ROOT, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, text=True)
        self._result()

    def _result(self) -> dict:
        """What the process wrote for the line it answered with (none: it failed)."""
        line = self.proc.stdout.readline().strip()
        if not line or not (path := self.folder / f"{line}.json").exists():
            self.proc.wait()
            raise SideFailed(f"{self.target} failed:\n{self.log.read_text()[-3000:]}")
        return json.loads(path.read_text())

    def __call__(self, **request) -> dict:
        time.sleep(self.settle_s)
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._result()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def run_cli(command: list[str], *, env: dict | None = None, capture: bool = False,
            check: bool = True) -> dict:
    """`command` run from the repository root and timed to its exit (`vit` is this interpreter's,
    on the CPU unless the environment says otherwise); `check`: a failure raises `SideFailed`."""
    vit = command[0] == "vit"
    full = {**({"JAX_PLATFORMS": "cpu"} if vit else {}), **os.environ, **(env or {})}
    start = time.perf_counter()
    done = subprocess.run([*VIT, *command[1:]] if vit else command, cwd=ROOT, env=full,
                          text=True, capture_output=capture)
    wall = time.perf_counter() - start
    if check and done.returncode:
        tail = f":\n{(done.stdout or '')[-2000:]}{(done.stderr or '')[-2000:]}" if capture else ""
        raise SideFailed(f"{shlex.join(command)} exited with {done.returncode}{tail}")
    return {"command": relative(shlex.join(command), strict=False), "wall_s": round(wall, 3),
            "returncode": done.returncode,
            **({"stdout": done.stdout, "stderr": done.stderr} if capture else {})}


def parser(mode: str, doc: str, out: str | None = None, add_help: bool = True,
           **options) -> argparse.ArgumentParser:
    """A mode's parser, described by `doc`'s first line, with `--out` (default `out`: a record
    in benchmarks/records/ is named for its file) and `options` (`add_options`)."""
    p = argparse.ArgumentParser(prog=f"python -m benchmarks {mode}",
                                description=doc.splitlines()[0], add_help=add_help)
    p.add_argument("--out", default=out, help="where the record goes")
    return add_options(p, options)


def add_options(p: argparse.ArgumentParser, options: dict) -> argparse.ArgumentParser:
    """`--name` for each `name` in `options`: add_argument's keywords, or its default (False: a
    switch; []: repeatable; a list: one or more of its items' type; None: a string; else the
    default's type), or (default, help)."""
    for name, spec in options.items():
        default, what = spec if isinstance(spec, tuple) else (spec, None)
        kw = (default if isinstance(default, dict) else
              {"action": "store_true"} if default is False else
              {"action": "append", "default": []} if default == [] else
              {"nargs": "+", "default": default, "type": type(default[0])}
              if isinstance(default, list) else
              {"default": default, "type": str if default is None else type(default)})
        p.add_argument(f"--{name.replace('_', '-')}", help=what, **kw)
    return p


def vit_train(config: str | Path, workdir: str | Path, sets=(), *, init: str | None = None,
              env: dict | None = None) -> dict:
    """`vit train --config CONFIG --workdir WORKDIR [--init INIT] --set=...` by `run_cli`."""
    return run_cli(["vit", "train", "--config", str(config), "--workdir", str(workdir),
                    *(["--init", str(init)] if init else []), *(f"--set={s}" for s in sets)],
                   env=env)


def vit_eval(workdir: str | Path, *args: str) -> dict:
    """`vit eval --workdir WORKDIR ARGS --json` run by `run_cli`, what it printed as "report"."""
    run = run_cli(["vit", "eval", "--workdir", str(workdir), *args, "--json"], capture=True)
    del run["stderr"]
    return {**run, "report": last_json(run.pop("stdout"))}


def last_json(text: str) -> dict:
    """The JSON object a command printed on its last line (`vit eval --json`)."""
    return json.loads(text.strip().splitlines()[-1])


def metrics(workdir: str | Path, split: str | None = None) -> list[dict]:
    """The records of a `vit train` workdir's metrics.jsonl (those of `split`, if given)."""
    from vit.training.metrics import read_metrics

    return [r for r in read_metrics(Path(workdir) / "metrics.jsonl")
            if split is None or r.get("split") == split]


def our_forward(checkpoint: str | Path, dtype: str, example) -> Callable:
    """f(images): the softmax of `checkpoint`'s model compiled as `vit predict` compiles it (an
    older copy of vit, `inference --baseline`, without what it lacks)."""
    import jax
    from flax import nnx

    from vit.checkpoints import load_checkpoint

    try:
        from vit.cpu.xla_options import compile_for_inference
        from vit.inference.weights import narrow_kernels
    except ImportError:
        compile_for_inference = lambda lowered, dtype: lowered.compile()  # noqa: E731
        narrow_kernels = lambda model: model  # noqa: E731
    graphdef, state = nnx.split(narrow_kernels(load_checkpoint(checkpoint, dtype=dtype)
                                               .build_model()))
    forward = jax.jit(lambda s, x: jax.nn.softmax(nnx.merge(graphdef, s)(x), -1))
    compiled = compile_for_inference(forward.lower(state, example), dtype)
    return lambda images: compiled(state, images)


def _wait(result: Any) -> Any:
    """`result` waited for, if JAX is loaded."""
    return sys.modules["jax"].block_until_ready(result) if "jax" in sys.modules else result


def interleave(fns: dict[str, Callable[[], Any]], *, rounds: int, warmup: int = 1,
               number: int = 1) -> dict:
    """Contestants timed `number` calls each per round, the order rotated: {name: seconds per
    call, as "median_s", "min_s" and every round's "times_s"}."""
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            _wait(fns[name]())
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        for name in names[i % len(names):] + names[:i % len(names)]:
            start = time.perf_counter()
            for _ in range(number):
                out = fns[name]()
            _wait(out)
            times[name].append((time.perf_counter() - start) / number)
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "times_s": t}
            for name, t in times.items()}


def time_call(fn: Callable[[], Any], *, warmup: int = 1, repeats: int = 5,
              number: int = 1) -> dict:
    """`warmup` untimed calls, then `repeats` samples of `number` calls: seconds per call."""
    return interleave({"": fn}, rounds=repeats, warmup=warmup, number=number)[""]


# --------------------------------------------------------------------------------- records

def cpu() -> dict:
    """The CPU's model and matrix features from /proc/cpuinfo (empty elsewhere)."""
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return {}
    info = dict(map(str.strip, line.split(":", 1)) for line in first.splitlines() if ":" in line)
    flags = set(info.get("flags", info.get("Features", "")).split())
    return {"model_name": info.get("model name"),
            "bfloat16_arithmetic": [f for f in ("avx512_bf16", "amx_bf16", "avx_ne_convert", "bf16")
                                    if f in flags]}


def machine() -> dict:
    out = {"platform": platform.platform(), "processor": platform.processor(), "cpu": cpu(),
           "cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]}
    try:
        import jax

        devices = jax.devices()
        return {**out, "jax_backend": jax.default_backend(),
                "device_kind": devices[0].device_kind, "devices": [str(d) for d in devices]}
    except Exception:  # noqa: BLE001 - a record of a run without JAX still names its host
        return out


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


# An absolute path; not a rate, a pattern, a fraction or "/path/to/" placeholder.
ABSOLUTE = re.compile(r"(?<![\w.)\]*~/:])/(?!path/to/)[A-Za-z_.][\w.@+-]*(?:/[\w.@+-]*)+")


class PathOutside(ValueError):
    """A record would name a path outside the repository."""


def relative(value: Any, strict: bool = True) -> Any:
    """`value` with the repository's paths relative and home `~`; `strict`: any other absolute
    path raises `PathOutside`."""
    if isinstance(value, dict):
        return {k: relative(v, strict) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [relative(v, strict) for v in value]
    if not isinstance(value, str):
        return value
    text = value.replace(f"{ROOT}/", "")
    text = re.sub(rf"{re.escape(str(ROOT))}(?![\w.-])", ".", text)
    home = str(Path.home())
    if home != "/":
        text = re.sub(rf"{re.escape(home)}(?=/)", "~", text)
    outside = ABSOLUTE.findall(text)
    if outside and strict:
        raise PathOutside(f"{', '.join(outside)} is outside the repository: a record names "
                          "paths inside it only (runs/ is a place git ignores)")
    return text


def out_of(argv: list[str]) -> str | None:
    """The `--out` of a mode's arguments, if given."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--out")
    return p.parse_known_args(argv)[0].out


def command(argv: list[str] | None, mode: str) -> str:
    """`python -m benchmarks MODE ARGS`, without an `--out` outside benchmarks/records/."""
    args = list(sys.argv[1:] if argv is None else argv)
    out = out_of(args)
    if out is not None and not is_record(out):
        args = [a for a in args if a not in ("--out", out, f"--out={out}")]
    return shlex.join(["python", "-m", "benchmarks", mode, *args])


def is_record(path: str | Path | None) -> bool:
    """Whether `path` (None: the default) is in benchmarks/records/ (held to `relative`)."""
    return path is None or Path(path).resolve().is_relative_to(RECORDS)


def read_record(name: str, root: Path = ROOT) -> dict:
    """benchmarks/records/NAME.json (below `root`) as written."""
    return json.loads((root / "benchmarks" / "records" / f"{name}.json").read_text())


def write_record(name: str, figures: dict, *, argv: list[str] | None, mode: str | None = None,
                 out: str | Path | None = None) -> Path:
    """`benchmarks/records/NAME.json` (or `out`, named for its file there) written atomically:
    name, date, command (`mode` and `argv`), machine, versions, then `figures`."""
    mode = mode or name
    if out is not None and is_record(out):
        name = Path(out).stem
    full = relative({"benchmark": name,
                     "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "command": command(argv, mode), "machine": machine(),
                     "versions": versions(),
                     **json.loads(json.dumps(figures, default=str))}, strict=is_record(out))
    path = Path(out) if out else RECORDS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    _write(path, json.dumps(full, indent=2) + "\n")
    print(f"wrote {path}", flush=True)
    return path


def _write(path: Path, text: str) -> None:
    """`text` into `path` atomically (a reader sees the old file or the whole new one)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _contestant(argv: list[str]) -> None:
    """A contestant's process (`run_side`): `TARGET ARGS.json RESULT.json` writes `TARGET(**ARGS)`;
    (`Side`) `--serve TARGET ARGS.json FOLDER` writes and prints FOLDER/ready, then per stdin line
    FOLDER/result of `run(**request)`, `run` being what `TARGET(**ARGS)` returned (`.json`)."""
    serve = argv[0] == "--serve"
    target, args_file, out = argv[1:] if serve else argv
    module, _, function = target.partition(":")
    result = getattr(importlib.import_module(module), function)(
        **json.loads(Path(args_file).read_text()))
    if not serve:
        _write(Path(out), json.dumps(result, default=float))
        return
    _write(Path(out) / "ready.json", json.dumps({"ready": True}))
    print("ready", flush=True)
    for line in sys.stdin:
        _write(Path(out) / "result.json", json.dumps(result(**json.loads(line)), default=float))
        print("result", flush=True)


if __name__ == "__main__":
    _contestant(sys.argv[1:])
