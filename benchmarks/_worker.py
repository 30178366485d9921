"""The process a side runs in (`common.run_side`):

    python -m benchmarks._worker package.module:function ARGS.json RESULT.json

imports `function`, calls it with the keyword arguments in ARGS.json, and writes the dict it
returns to RESULT.json (through a temporary name, so a crash leaves no result file)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    target, args_file, result_file = argv
    module, _, function = target.partition(":")
    fn = getattr(importlib.import_module(module), function)
    result = fn(**json.loads(Path(args_file).read_text()))
    tmp = Path(result_file).with_suffix(".tmp")
    tmp.write_text(json.dumps(result, default=float))
    tmp.replace(result_file)


if __name__ == "__main__":
    main(sys.argv[1:])
