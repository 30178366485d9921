"""Records the demo's figures: trains configs/digits.py from scratch (what ./scripts/demo.sh
trains), evaluates the best checkpoint on the 360 held-out test digits with `vit eval --json`,
and records the test accuracy, the wall time of training and evaluation and the validation
curve (the README's demo result).

    python -m benchmarks demo [--workdir runs/record_demo] [--set KEY=VALUE ...]

The workdir is deleted first, so the time covers a whole fresh run. The faithfulness and
bfloat16-agreement benchmarks read the model it leaves there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from benchmarks import common

ROOT = common.ROOT


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks demo",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="runs/record_demo",
                        help="relative to the repository root")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", default=None, help="record path (default benchmarks/records/)")
    args = parser.parse_args(argv)
    workdir = ROOT / args.workdir
    shutil.rmtree(workdir, ignore_errors=True)
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    vit = [sys.executable, "-m", "vit.cli"]
    train = ["train", "--config", "configs/digits.py", "--workdir", args.workdir,
             *[f"--set={s}" for s in args.set]]
    evaluate = ["eval", "--workdir", args.workdir, "--split", "test", "--json"]
    start = time.time()
    subprocess.run(vit + train, check=True, env=env, cwd=ROOT)
    train_s = time.time() - start
    start = time.time()
    done = subprocess.run(vit + evaluate, check=True, env=env, cwd=ROOT, capture_output=True,
                          text=True)
    eval_s = time.time() - start
    report = json.loads(done.stdout.strip().splitlines()[-1])
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()
            if line.strip()]
    validation = [{"step": r["step"], "accuracy": r["accuracy"]} for r in rows
                  if r.get("split") == "validation"]
    best = json.loads((workdir / "checkpoints" / "best.json").read_text())
    common.write_record("demo", {
        "record": "digits demo: train configs/digits.py from scratch, test accuracy",
        "run": {"train": "vit " + " ".join(train), "eval": "vit " + " ".join(evaluate)},
        "workdir": os.path.relpath(workdir, ROOT),
        "train_seconds": round(train_s, 1),
        "eval_seconds": round(eval_s, 1),
        "best_checkpoint": best,
        "validation": validation,
        "test_accuracy": report["accuracy"],
        "test_top5_accuracy": report["top5_accuracy"],
        "num_test_examples": report["num_examples"],
        "eval": {k: v for k, v in report.items() if k != "confusion_png"},
    }, argv=argv, out=args.out, extra_packages=("grain", "orbax-checkpoint"))
    print(json.dumps({"test_accuracy": report["accuracy"], "train_seconds": round(train_s, 1)}))

