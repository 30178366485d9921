"""Deletion and insertion AUC of every map method (and a random ranking) on the demo's digits
model by substrate and step count, each a `vit explain-eval --json` command."""

from __future__ import annotations

from benchmarks import common, tables

METHODS = ("attention", "rollout", "grad-rollout", "relevancy")
# (metric, substrate, steps): the headline at 16 steps, every substrate, then coarser curves.
RUNS = [(metric, substrate, 16) for substrate in ("mean", "zero", "blur")
        for metric in ("deletion", "insertion")]
RUNS += [(metric, "mean", steps) for steps in (4, 8) for metric in ("deletion", "insertion")]


def main(argv: list[str]) -> None:
    args = common.parser("faithfulness", __doc__).parse_args(argv)
    made_by = common.read_record("demo")  # the model measured is the one that record names
    checkpoint = made_by["workdir"]  # relative to the repository, where `run_cli` runs
    rows = []
    for metric, substrate, steps in RUNS:
        run = common.run_cli(["vit", "explain-eval", "--checkpoint", checkpoint, "--data",
                              "digits", "--split", "test", "--method", *METHODS, "--metric",
                              metric, "--substrate", substrate, "--steps", str(steps), "--json"],
                             capture=True)
        rows.append({"metric": metric, "substrate": substrate, "steps": steps,
                     "command": run["command"], "seconds": round(run["wall_s"], 1),
                     "results": common.last_json(run["stdout"])["results"]})
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

    def pairs(steps: int, sub: str, cell) -> list[str]:
        return [cell(runs["deletion", sub, steps][m], runs["insertion", sub, steps][m])
                for m in METHODS]

    by_substrate = [[f"`{sub}`", *pairs(16, sub, lambda d, i: f"{d['vs_random']['mean']:+.3f} / "
                                        f"{i['vs_random']['mean']:+.3f}")]
                    for sub in ("mean", "zero", "blur")]
    by_steps = [[steps, *pairs(steps, "mean", lambda d, i: f"{d['auc']:.3f} / {i['auc']:.3f}")]
                for steps in sorted({s for (_, sub, s) in runs if sub == "mean"})]
    return [f"{r['images']} test digits, the digits model `{r['checkpoint']}` that the demo "
            f"record of {r['model_made_utc'][:10]} made (test accuracy "
            f"{r['model_test_accuracy']:.3f}), 16 steps, `mean` substrate; area under the curve "
            "with its 95% bootstrap interval, and the paired difference from the random ranking "
            "on the same images:", "",
            *tables.table(["method", "deletion AUC (lower is better)", "vs random",
                           "insertion AUC (higher is better)", "vs random"], rows), "",
            "Difference from random, deletion / insertion, by substrate (16 steps):", "",
            *tables.table(["substrate", *METHODS], by_substrate), "",
            "Deletion / insertion AUC by step count (`mean` substrate):", "",
            *tables.table(["steps", *METHODS], by_steps)]
