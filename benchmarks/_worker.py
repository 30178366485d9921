"""The process a side runs in (`common.run_side`, `common.Side`):

    python -m benchmarks._worker package.module:function ARGS.json RESULT.json
    python -m benchmarks._worker --serve package.module:function ARGS.json FOLDER

The first imports `function`, calls it with the keyword arguments in ARGS.json and writes the
dict it returns to RESULT.json. `--serve` calls it once to get a run function, writes
FOLDER/ready.json, then for each JSON line on stdin ({"name", "request"}) calls the run function
with the request and writes FOLDER/<name>.json, printing the name when it is there. Results go
through a temporary name, so a crash leaves no result file.
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
    if argv[0] == "--serve":
        target, args_file, folder = argv[1:]
        run = _load(target)(**json.loads(Path(args_file).read_text()))
        _write(Path(folder) / "ready.json", {"ready": True})
        print("ready", flush=True)
        for line in sys.stdin:
            message = json.loads(line)
            _write(Path(folder) / f"{message['name']}.json", run(**message["request"]))
            print(message["name"], flush=True)
        return
    target, args_file, result_file = argv
    _write(Path(result_file), _load(target)(**json.loads(Path(args_file).read_text())))


if __name__ == "__main__":
    main(sys.argv[1:])
