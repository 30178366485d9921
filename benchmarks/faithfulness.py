"""Deletion and insertion AUC of every map method (and a random ranking) on the demo's digits
model by substrate and step count, via `vit explain-eval --json` in-process."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time

from benchmarks import common, tables

ROOT = common.ROOT
METHODS = ("attention", "rollout", "grad-rollout", "relevancy")
# (metric, substrate, steps): the headline at 16 steps, every substrate, then coarser curves.
RUNS = [(metric, substrate, 16) for substrate in ("mean", "zero", "blur")
        for metric in ("deletion", "insertion")]
RUNS += [(metric, "mean", steps) for steps in (4, 8) for metric in ("deletion", "insertion")]


def explain_eval(argv: list[str]) -> dict:
    from vit.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    if code != 0:
        raise SystemExit(f"vit {' '.join(argv)} exited {code}")
    return json.loads(out.getvalue().strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    parser = common.parser("faithfulness", __doc__, str(common.record_path("faithfulness")))
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    args.out = os.path.abspath(args.out)
    os.chdir(ROOT)  # paths in the record and the commands are relative to the repository
    made_by = common.read_record("demo")  # the model measured is the one that record names
    checkpoint = made_by["workdir"]
    rows = []
    for metric, substrate, steps in RUNS:
        cli = ["explain-eval", "--checkpoint", checkpoint, "--data", "digits", "--split",
               "test", "--method", *METHODS, "--metric", metric, "--substrate", substrate,
               "--steps", str(steps), "--json"]
        start = time.time()
        report = explain_eval(cli)
        rows.append({"metric": metric, "substrate": substrate, "steps": steps,
                     "command": "vit " + " ".join(cli), "seconds": round(time.time() - start, 1),
                     "results": report["results"]})
    common.write_record("faithfulness", {
        "checkpoint": checkpoint, "model_record": "benchmarks/records/demo.json",
        "model_test_accuracy": made_by["test_accuracy"], "model_made_utc": made_by["date_utc"],
        "model_train": made_by["run"]["train"], "images": 360, "runs": rows},
        argv=argv, out=args.out)


def auc_cells(result: dict) -> list[str]:
    vs = result["vs_random"]
    return [f"{result['auc']:.3f} [{result['ci95'][0]:.3f}, {result['ci95'][1]:.3f}]",
            f"{vs['mean']:+.3f} [{vs['ci95'][0]:+.3f}, {vs['ci95'][1]:+.3f}]"]


def table(r: dict) -> list[str]:
    runs = {(run["metric"], run["substrate"], run["steps"]): run["results"] for run in r["runs"]}
    dele, ins = runs[("deletion", "mean", 16)], runs[("insertion", "mean", 16)]
    rows = [[m, *auc_cells(dele[m]), *auc_cells(ins[m])] for m in METHODS]
    rows.append(["random", auc_cells(dele["random"])[0], "", auc_cells(ins["random"])[0], ""])

    def pairs(metric_steps: int, sub: str, cell) -> list[str] | None:
        d, i = runs.get(("deletion", sub, metric_steps)), runs.get(("insertion", sub, metric_steps))
        return [cell(d[m], i[m]) for m in METHODS] if d and i else None

    by_substrate = [[f"`{sub}`", *cells] for sub in ("mean", "zero", "blur") if (cells := pairs(
        16, sub, lambda d, i: f"{d['vs_random']['mean']:+.3f} / {i['vs_random']['mean']:+.3f}"))]
    by_steps = [[steps, *cells] for steps in sorted({s for (_, sub, s) in runs if sub == "mean"})
                if (cells := pairs(steps, "mean", lambda d, i: f"{d['auc']:.3f} / {i['auc']:.3f}"))]
    model = (f"the digits model `{r['checkpoint']}` that the demo record of "
             f"{r['model_made_utc'][:10]} made" if r.get("model_made_utc")
             else f"the digits model `{r['checkpoint']}`")
    return [f"{r['images']} test digits, {model} (test accuracy "
            f"{r['model_test_accuracy']:.3f}), 16 steps, `mean` substrate; area under the curve "
            "with its 95% bootstrap interval, and the paired difference from the random ranking "
            "on the same images:", "",
            *tables.table(["method", "deletion AUC (lower is better)", "vs random",
                           "insertion AUC (higher is better)", "vs random"], rows), "",
            "Difference from random, deletion / insertion, by substrate (16 steps):", "",
            *tables.table(["substrate", *METHODS], by_substrate),
            *(["", "Deletion / insertion AUC by step count (`mean` substrate):", "",
               *tables.table(["steps", *METHODS], by_steps)] if len(by_steps) > 1 else [])]
