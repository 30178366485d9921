"""What both kinds of `vit eval` share: the scorer over every local device, the batch size
and the report written whole."""

from __future__ import annotations

import json
from pathlib import Path

from vit.commands.checks import write_outputs


def scorer(loaded, batch: int, task: str, tokenize=None):
    """`score(source) -> figures` (`vit.inference.evaluate.evaluate_task`'s) for the loaded
    checkpoint's model, run on every local device with batches padded to fit them."""
    from flax import nnx

    from vit import device_mesh
    from vit.data import eval_batches
    from vit.inference.evaluate import evaluate_task, make_logits_fn
    from vit.inference.memory import check_fits
    from vit.inference.weights import narrow_kernels

    check_fits(loaded.config, batch, lower=("--batch-size",))  # before the model is built
    graphdef, params = nnx.split(narrow_kernels(loaded.build_model()), nnx.Param)
    mesh = device_mesh.local_mesh()
    logits_fn = make_logits_fn(graphdef, mesh, dtype=loaded.config.dtype)
    host_batch = device_mesh.eval_host_batch_size(batch, mesh)
    num_classes = loaded.config.num_classes

    def score(source) -> dict:
        batches = eval_batches(source, loaded.preprocessing, batch_size=host_batch,
                               tokenize=tokenize)
        return evaluate_task(task, logits_fn, params, batches, num_classes, mesh)

    return score


def batch_size(args, source) -> int:
    """`--batch-size`, no larger than the examples there are: a batch is padded to its size,
    so `--batch-size 100000000` would otherwise allocate that many images."""
    return max(1, min(args.batch_size, len(source)))


def save_report(args, out: Path, report: dict, files: dict | None = None, **more) -> bool:
    """Writes `OUT/eval.json` (the report and `more`) and `files`, whole or not at all; with
    `--json` prints the report too and returns True: the command has nothing more to print."""
    text = json.dumps({**report, **more}, indent=2)
    write_outputs(out, {**(files or {}), "eval.json": text.encode()})
    if args.json:
        print(json.dumps(report))
    return args.json
