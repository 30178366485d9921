"""A contestant's process: `_worker TARGET ARGS.json RESULT.json` writes `TARGET(**ARGS)`;
`--serve` writes FOLDER/ready.json, then FOLDER/NAME.json of `run(**request)` per stdin line."""

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
