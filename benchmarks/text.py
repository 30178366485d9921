"""Records the text-conditioning benchmark: trains configs/promptshapes.py (all stages) into a
fresh workdir, evaluates it with `vit eval --json`, and writes the figures and the wall time
of each stage and of the whole run as the `promptshapes` record. The eval's `questions` hold
every colour x shape question asked of every test scene (balanced accuracy and AUC for seen
pairs, held-out pairs and held-out wordings, false-yes by what the scene shares, yes-rate on
never-drawn words).

    python -m benchmarks text [--workdir runs/bench_promptshapes] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common

ROOT = common.ROOT


def stage_results(workdir: Path) -> dict:
    """Per stage (its folder name; the last stage trains in the workdir itself): the steps
    trained and the last validation record of its metrics.jsonl."""
    out = {}
    for metrics in sorted(workdir.glob("**/metrics.jsonl")):
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        train = [r for r in rows if r.get("split") == "train"]
        val = [r for r in rows if r.get("split") == "validation"]
        name = metrics.parent.name if metrics.parent != workdir else "final"
        out[name] = {"steps": train[-1]["step"] if train else 0,
                     "last_validation": val[-1] if val else None}
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks text",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=str(ROOT / "runs" / "bench_promptshapes"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", default=None, help="record path (default benchmarks/records/)")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir)
    shutil.rmtree(workdir, ignore_errors=True)  # a fresh run: the timing covers every stage
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    vit = [sys.executable, "-m", "vit.cli"]
    train = vit + ["train", "--config", str(ROOT / "configs" / "promptshapes.py"),
                   "--workdir", str(workdir)] + [f"--set={s}" for s in args.set]
    start = time.time()
    subprocess.run(train, check=True, env=env)
    train_s = time.time() - start
    start = time.time()
    done = subprocess.run(vit + ["eval", "--workdir", str(workdir), "--json"], check=True,
                          env=env, capture_output=True, text=True)
    eval_s = time.time() - start
    report = json.loads(done.stdout.strip().splitlines()[-1])
    result = {
        "run": {"train": " ".join(train[2:]), "eval": f"vit eval --workdir {workdir} --json"},
        "train_seconds": round(train_s, 1),
        "eval_seconds": round(eval_s, 1),
        "stages": stage_results(workdir),
        "eval": report,
    }
    common.write_record("promptshapes", result, argv=argv, mode="text", out=args.out,
                        extra_packages=("grain",))
    questions = report.get("questions", {})
    print(json.dumps({"train_seconds": result["train_seconds"], **{
        k: report.get(k) for k in ("accuracy", "controls", "heldout_accuracy")},
        **{group: {k: questions[group][k] for k in ("balanced_accuracy", "auc", "false_yes")}
           for group in ("seen", "heldout", "wording") if group in questions},
        "never_yes_rate": questions.get("never", {}).get("yes_rate")}))

