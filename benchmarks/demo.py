"""The demo's figures: configs/digits.py from scratch into a fresh workdir as ./scripts/demo.sh
does, then `vit eval --json` on the test digits; faithfulness and agreement use its model."""

from __future__ import annotations

import shutil

from benchmarks import common, tables

INLINE = True  # the README's one sentence, not a table


def main(argv: list[str]) -> None:
    args = common.parser(
        "demo", __doc__, seeds=(3, "seeds 0..N-1, each a fresh run"),
        workdir=("runs/record_demo", "relative to the repository (seed k's gets _seedk)"),
        plain=(False, "also each seed with the plain patch embedding (model.stem=[])"),
    ).parse_args(argv)

    def one(seed: int, plain: bool) -> dict:
        workdir = args.workdir + (f"_seed{seed}" if seed else "") + ("_plain" if plain else "")
        shutil.rmtree(common.ROOT / workdir, ignore_errors=True)  # the time of a fresh run
        train = common.vit_train("configs/digits.py", workdir,
                                 [*(["model.stem=[]"] if plain else []), f"seed={seed}"])
        evaluate = common.vit_eval(workdir, "--split", "test")
        return {"seed": seed, "workdir": workdir, "train": train, "eval": evaluate,
                "test_accuracy": evaluate["report"]["accuracy"]}

    def figures(runs: list[dict]) -> list[dict]:
        return [{"seed": r["seed"], "test_accuracy": r["test_accuracy"],
                 "train_seconds": r["train"]["wall_s"]} for r in runs]

    runs = [one(seed, False) for seed in range(args.seeds)]
    plain = [one(seed, True) for seed in range(args.seeds if args.plain else 0)]
    first, report = runs[0], runs[0]["eval"]["report"]
    common.write_record("demo", {
        "run": {"train": first["train"]["command"], "eval": first["eval"]["command"]},
        "workdir": args.workdir,
        "train_seconds": first["train"]["wall_s"], "eval_seconds": first["eval"]["wall_s"],
        "validation": [{"step": r["step"], "accuracy": r["accuracy"]}
                       for r in common.metrics(common.ROOT / args.workdir, "validation")],
        "test_accuracy": report["accuracy"], "test_top5_accuracy": report["top5_accuracy"],
        "num_test_examples": report["num_examples"], "seeds": figures(runs),
        **({"plain_patch_embedding": figures(plain)} if plain else {}),
        "eval": {k: v for k, v in report.items() if k != "confusion_png"},
    }, argv=argv, out=args.out)


def _counts(rows: list[dict], n: int) -> str:
    counts = [str(round(r["test_accuracy"] * n)) for r in rows]
    return (", ".join(counts[:-1]) + " and " if len(counts) > 1 else "") + counts[-1]


def table(r: dict) -> list[str]:
    n, cpu = r["num_test_examples"], r["machine"]["cpu"]
    kind = "with" if cpu.get("bfloat16_arithmetic") else "no"
    seeds = r["seeds"]
    low = tables.pct(min(s["test_accuracy"] for s in seeds))
    said = (f"**{low} test accuracy** ({_counts(seeds, n)} of {n} held-out digits)"
            if len(seeds) == 1 else
            f"**{low} test accuracy or more** over seeds "
            f"{', '.join(str(s['seed']) for s in seeds)} ({_counts(seeds, n)} of {n} held-out "
            "digits)")
    record = f"{tables.RECORDS}/{r['benchmark']}.json"
    line = (f"Measured {r['date_utc'][:10]} (`{record}`): {said} after "
            f"{r['train_seconds']:.0f} s of training on a {r['machine']['cpus']}-core "
            f"{cpu['model_name']} ({kind} bfloat16 arithmetic).")
    if r.get("plain_patch_embedding"):
        line += (" Without the recipe's convolutional stem: "
                 f"{_counts(r['plain_patch_embedding'], n)} of {n}.")
    return [line]


def targets(r: dict) -> list[tuple[str, str, bool]]:
    low = min(s["test_accuracy"] for s in r["seeds"])
    return [("test accuracy at least 0.970 on every kind of host, every seed",
             f"{low:.3f} at the lowest of {len(r['seeds'])} seed(s) on this host", low >= 0.97)]
