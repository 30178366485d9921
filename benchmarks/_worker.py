"""The process a contestant runs in (`common.run_side`, `common.Side`):

    python -m benchmarks._worker package.module:function ARGS.json RESULT.json
    python -m benchmarks._worker --serve package.module:function ARGS.json FOLDER

The first calls `function(**ARGS)` and writes the dict it returns to RESULT.json. `--serve`
calls it once for a run function, writes FOLDER/ready.json, then for each JSON line on stdin
({"name", "request"}) writes FOLDER/<name>.json of `run(**request)` and prints the name. A
result goes through a temporary name, so a crash leaves none.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path


def _load(target: str):
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def _write(path: Path, result: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, default=float))
    tmp.replace(path)


def main(argv: list[str]) -> None:
    serve = argv[0] == "--serve"
    target, args_file, out = argv[1:] if serve else argv
    result = _load(target)(**json.loads(Path(args_file).read_text()))
    if not serve:
        _write(Path(out), result)
        return
    _write(Path(out) / "ready.json", {"ready": True})
    print("ready", flush=True)
    for line in sys.stdin:
        message = json.loads(line)
        _write(Path(out) / f"{message['name']}.json", result(**message["request"]))
        print(message["name"], flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
