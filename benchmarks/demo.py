"""The demo's figures: configs/digits.py trained from scratch into a fresh workdir as
./scripts/demo.sh does, `vit eval --json` on the test digits: test accuracy, each command's
time and the validation curve. The faithfulness and agreement modes use its model.

    python -m benchmarks demo [--workdir runs/record_demo] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import shutil

from benchmarks import common, tables

INLINE = True  # the README's one sentence, not a table


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks demo",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="runs/record_demo",
                        help="relative to the repository root")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", default=None, help="record path (default benchmarks/records/)")
    args = parser.parse_args(argv)
    shutil.rmtree(common.ROOT / args.workdir, ignore_errors=True)  # the time of a fresh run
    train = common.vit_train("configs/digits.py", args.workdir, args.set)
    evaluate = common.vit_eval(args.workdir, "--split", "test")
    report = evaluate["report"]
    best = json.loads((common.ROOT / args.workdir / "checkpoints" / "best.json").read_text())
    common.write_record("demo", {
        "record": "digits demo: train configs/digits.py from scratch, test accuracy",
        "run": {"train": train["command"], "eval": evaluate["command"]},
        "workdir": args.workdir,
        "train_seconds": train["wall_s"], "eval_seconds": evaluate["wall_s"],
        "best_checkpoint": best,
        "validation": [{"step": r["step"], "accuracy": r["accuracy"]}
                       for r in common.metrics(common.ROOT / args.workdir, "validation")],
        "test_accuracy": report["accuracy"], "test_top5_accuracy": report["top5_accuracy"],
        "num_test_examples": report["num_examples"],
        "eval": {k: v for k, v in report.items() if k != "confusion_png"},
    }, argv=argv, out=args.out)


def table(r: dict) -> list[str]:
    right = round(r["test_accuracy"] * r["num_test_examples"])
    return [f"Measured {r['date_utc'][:10]} (`{tables.RECORDS}/demo.json`): "
            f"**{tables.pct(r['test_accuracy'])} test accuracy** ({right} of "
            f"{r['num_test_examples']} held-out digits) after {r['train_seconds']:.0f} s of "
            f"training on a {r['machine']['cpus']}-core {r['machine']['cpu']['model_name']}."]


def targets(r: dict) -> list[tuple[str, str, bool]]:
    return [("test accuracy at least 0.970 on every kind of host",
             f"{r['test_accuracy']:.3f} on this host", r["test_accuracy"] >= 0.97)]
