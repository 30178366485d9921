"""Training on real images, recorded: the shipped real-data recipes, and `vit train` side by side
with transformers + torch on the same files.

    python -m benchmarks realdata fashion --workdir runs/fashion        # fashion_mnist.json
    python -m benchmarks realdata transfer --init runs/fashion          # mnist_transfer.json
    python -m benchmarks realdata peer [--scratch-steps 300] [--tune-steps 150]
                                                                        # realdata_peer.json
    python -m benchmarks realdata dryrun [--recipes NAME ... --merge]  # dry_run.json

- `dryrun` runs `vit train --config NAME --dry-run` for every shipped recipe and keeps what
  each printed: what was checked of the full-size recipes on this host.

- `fashion` runs `vit train --config fashion_mnist` as a user would (the console script, a
  process of its own), notes the wall time of every validation and the machine's load while it
  runs, then `vit eval --split test`. `--existing WORKDIR --started UNIX_TIME --timeline FILE`
  records a run made by hand instead, timed from a poll of its metrics.jsonl (`poll_line`).
- `transfer` trains `mnist_transfer` from `--init` (the fashion_mnist workdir) and from
  scratch, the same recipe, labels and steps, and records both test accuracies.
- `peer` trains one architecture both ways: `vit train` and a transformers
  `ViTForImageClassification` script with torch's AdamW (decay on the same weights), the same
  warmup-cosine schedule, global-norm clipping, label smoothing, batch, steps and random
  shifts (`vit.data.transforms.random_affine`, applied in the DataLoader's worker processes),
  reading the same IDX/CSV files. First from scratch on Fashion-MNIST (each library's own
  initialisation); then both fine-tune on the 500 MNIST digits from identical numbers: our
  scratch run's weights written by `vit convert --format hf`, which our side reads back
  with `--init` and the peer with `from_pretrained`. The model is the HF architecture (class
  token, token head), so the same weights mean the same function. Each side is a whole
  command, timed from launch to exit; the two alternate. `--two-devices` adds `vit train` on
  two XLA:CPU devices (one per core, the batch split over the `data` axis). Test accuracy of
  each side is measured on the full test split at the end of training.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks import common

ROOT = common.ROOT
# The architecture both sides train, in float32 on both: patch 4, width 128, depth 6 (the
# model a user first tried), with the class token and token head that transformers'
# ViTForImageClassification has. Set on top of the fashion_mnist and mnist_transfer recipes, so
# their optimiser, schedule and augmentation are what both sides use.
HF_ARCH = ["model.classifier=token", "model.class_token=true", "model.width=128",
           "model.mlp_dim=256", "model.num_heads=4", "model.depth=6", "model.patch_size=4",
           "model.dtype=float32"]


def vit_command() -> list[str]:
    """The `vit` console script beside this interpreter, as a user runs it."""
    script = Path(sys.executable).parent / "vit"
    return [str(script)] if script.exists() else [sys.executable, "-m", "vit.cli"]


def poll_line(workdir: Path) -> str:
    """One line of a run's timeline: unix time, the 1/5/15-minute load averages, and the
    metrics.jsonl lines so far."""
    rows = workdir / "metrics.jsonl"
    n = len(rows.read_text().splitlines()) if rows.exists() else 0
    return f"{time.time():.1f} {' '.join(f'{x:.2f}' for x in os.getloadavg())} {n}"


def run_timed(cmd: list[str], *, env: dict | None = None, workdir: Path | None = None,
              poll_s: float = 10.0) -> dict:
    """Runs `cmd` to its end; -> {"wall_s", "lines": [[seconds, text]], "load": [[seconds,
    load1]], "returncode"}. Output lines (split at carriage returns too) are stamped as they
    come; the load average is sampled every `poll_s`."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=full_env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines, load, done = [], [], threading.Event()

    def sample():
        while not done.wait(poll_s):
            load.append([round(time.perf_counter() - start, 1), round(os.getloadavg()[0], 2)])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for chunk in proc.stdout:
        for text in re.split(r"[\r\n]", chunk):
            if text.strip():
                lines.append([round(time.perf_counter() - start, 2), text.strip()])
    proc.wait()
    done.set()
    return {"wall_s": time.perf_counter() - start, "lines": lines, "load": load,
            "returncode": proc.returncode}


def _checked(run: dict, what: str) -> dict:
    if run["returncode"]:
        tail = "\n".join(text for _, text in run["lines"][-15:])
        raise common.SideFailed(f"{what} exited with {run['returncode']}:\n{tail}")
    return run


def vit_eval(workdir: Path, split: str = "test") -> dict:
    done = subprocess.run([*vit_command(), "eval", "--workdir", str(workdir), "--split", split,
                           "--json"], cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise common.SideFailed(f"vit eval {workdir}: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def vit_train(recipe: str, workdir: Path, sets: list[str], *, init: str | None = None,
              env: dict | None = None) -> dict:
    cmd = [*vit_command(), "train", "--config", recipe, "--workdir", str(workdir)]
    for item in sets:
        cmd += ["--set", item]
    if init:
        cmd += ["--init", str(init)]
    return _checked(run_timed(cmd, env=env, workdir=workdir), f"vit train {recipe}")


def split_of_vit_run(workdir: Path, wall_s: float) -> dict:
    """Where a `vit train` command's `wall_s` went, from the timings the run wrote into its
    metrics.jsonl (`vit.training.timings`): the process's start-up and compile, each step's
    own time, the final validation, the checkpoints with the exit (the last save finished, the
    curves, the interpreter's exit after the run), and what is left (data waits, logging)."""
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


# ----------------------------------------------------------------------------- recipes


def _timeline_from_poll(text: str, workdir: Path) -> tuple[list, list, dict]:
    """(load samples, [seconds, metrics line count], {step: its checkpoint folder's mtime})
    from `poll_line` lines and `ckpt MTIME STEP` lines (a listing of checkpoints/)."""
    load, counts, saved = [], [], {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 5 and re.fullmatch(r"[\d.]+", parts[0]):
            load.append([float(parts[0]), float(parts[1])])
            counts.append([float(parts[0]), int(parts[4])])
        elif len(parts) == 3 and parts[0] == "ckpt" and parts[2].isdigit():
            saved[int(parts[2])] = min(float(parts[1]), saved.get(int(parts[2]), float("inf")))
    return load, counts, saved


def fashion(args) -> dict:
    workdir = Path(args.workdir or args.existing)
    rows_t: dict[int, float] = {}
    if args.existing:
        load, counts, saved = _timeline_from_poll(Path(args.timeline).read_text(), workdir)
        wall = args.finished - args.started if args.finished else None
        load = [[round(t - args.started, 1), x] for t, x in load]
        # A metrics line's time: the first poll that saw it (the polls are some seconds apart).
        for t, n in counts:
            rows_t.setdefault(n, round(t - args.started, 1))
        # A validation's time: its checkpoint folder's mtime (saved just after it), when seen.
        saved_t = {step: round(t - args.started, 1) for step, t in saved.items()}
        command = args.command
        source = ("a run made by hand; a validation's time is its checkpoint folder's mtime, "
                  "else the first poll of metrics.jsonl that saw it")
    else:
        sets = [f"train.steps={args.steps}"] if args.steps else []
        run = vit_train("fashion_mnist", workdir, sets)
        wall, load = run["wall_s"], run["load"]
        command = "vit train --config fashion_mnist --workdir " + str(workdir) + "".join(
            f" --set {s}" for s in sets)
        from vit.training.timings import run_timings

        source = "the run's own timings in metrics.jsonl"
        timings = run_timings(workdir / "metrics.jsonl")
        for e in timings["evaluations"]:  # seconds from the command's launch
            rows_t[e["step"]] = round(timings["process_start_s"] + e["at_s"], 1)
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    curve = []
    for i, r in enumerate(rows, start=1):
        if r["split"] == "validation":
            t = rows_t.get(r["step"]) if not args.existing else saved_t.get(r["step"], next(
                (t for n, t in sorted(rows_t.items()) if n >= i), None))
            curve.append({"step": r["step"], "validation_accuracy": round(r["accuracy"], 4),
                          "seconds": t})
    rates = [r["images_per_s"] for r in rows if r["split"] == "train"]
    test = vit_eval(workdir)
    config = json.loads((workdir / "config.json").read_text())
    within = [c for c in curve if c["seconds"] is not None and c["seconds"] <= 900]
    loads = [x for _, x in load]
    return {"recipe": "fashion_mnist", "run_command": command, "timing_source": source,
            "steps": config["train"]["steps"], "batch_size": config["train"]["batch_size"],
            "test_accuracy": round(test["accuracy"], 4), "test_images": test.get("num_examples"),
            "wall_s": round(wall, 1) if wall else None, "validation_curve": curve,
            "reached_within_15_min": within[-1] if within else None,
            "images_per_s_median": round(statistics.median(rates), 1),
            "load_average_1min": {"median": round(statistics.median(loads), 2),
                                  "max": round(max(loads), 2)} if loads else None,
            "target": "test accuracy >= 0.91 within 15 minutes of training on 2 cores"}


def transfer(args) -> dict:
    out = {"recipe": "mnist_transfer", "init": str(args.init), "seeds": args.seeds, "runs": []}
    with tempfile.TemporaryDirectory(prefix="realdata-") as tmp:
        for seed in range(args.seeds):
            for start in ("pretrained", "scratch"):
                workdir = Path(tmp) / f"{start}{seed}"
                sets = [f"seed={seed}"] + ([f"train.steps={args.steps}"] if args.steps else [])
                run = vit_train("mnist_transfer", workdir, sets,
                                init=args.init if start == "pretrained" else None)
                test = vit_eval(workdir)
                out["runs"].append({"start": start, "seed": seed,
                                    "test_accuracy": round(test["accuracy"], 4),
                                    "wall_s": round(run["wall_s"], 1)})
    by = {s: [r["test_accuracy"] for r in out["runs"] if r["start"] == s]
          for s in ("pretrained", "scratch")}
    out["test_accuracy_mean"] = {s: round(statistics.mean(v), 4) for s, v in by.items()}
    out["pretrained_gain_points"] = round(100 * (statistics.mean(by["pretrained"])
                                                 - statistics.mean(by["scratch"])), 2)
    out["labels"] = "500 (50 per digit), test 4,000 digits"
    return out


# -------------------------------------------------------------------------- the peer


def side_torch(*, dataset: str, steps: int, batch: int, lr: float, warmup: int,
               weight_decay: float, clip: float, label_smoothing: float, shift: float,
               rotate: float, config_file: str, init: str | None, out_dir: str,
               workers: int = 2) -> dict:
    """The PyTorch user's script: transformers' ViT, torch AdamW, a DataLoader with workers;
    trains, evaluates on the test split, saves. -> accuracy and where the time went."""
    t0 = time.perf_counter()
    import numpy as np
    import torch
    from transformers import ViTConfig, ViTForImageClassification, get_cosine_schedule_with_warmup

    from vit.data.real_sets import LOADERS
    from vit.data.transforms import random_affine

    torch.manual_seed(0)
    train_x, train_y, _ = LOADERS[dataset]("train")
    test_x, test_y, _ = LOADERS[dataset]("test")
    if init:
        model = ViTForImageClassification.from_pretrained(init)
    else:
        model = ViTForImageClassification(ViTConfig.from_json_file(config_file))
    decay = [p for n, p in model.named_parameters()
             if n.endswith(".weight") and "layernorm" not in n]
    rest = [p for n, p in model.named_parameters()
            if not (n.endswith(".weight") and "layernorm" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.999),
                            eps=1e-8)
    sched = get_cosine_schedule_with_warmup(opt, warmup, steps)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=label_smoothing)

    def to_model(images: np.ndarray) -> torch.Tensor:  # uint8 [b, h, w] or float -> NCHW
        x = images.astype(np.float32) / 255.0
        x = (x - 0.5) / 0.5
        return torch.from_numpy(np.repeat(x[:, None], 3, 1))

    def collate(items):
        index = np.array([i for i in items])
        rng = np.random.default_rng()
        images = train_x[index][..., None]
        if shift or rotate:
            images = random_affine(images, rng, shift=shift, rotate=rotate)
        return to_model(images[..., 0]), torch.from_numpy(train_y[index])

    class Indices(torch.utils.data.Dataset):
        def __len__(self):
            return len(train_y)

        def __getitem__(self, i):
            return i

    loader = torch.utils.data.DataLoader(
        Indices(), batch_size=batch, shuffle=True, drop_last=True, num_workers=workers,
        collate_fn=collate, persistent_workers=workers > 0)
    t1 = time.perf_counter()
    model.train()
    step, it = 0, iter(loader)
    while step < steps:
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(loader)
            continue
        loss = loss_fn(model(pixel_values=x).logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()
        step += 1
    t2 = time.perf_counter()
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(test_y), 256):
            logits = model(pixel_values=to_model(test_x[i:i + 256])).logits
            correct += int((logits.argmax(-1).numpy() == test_y[i:i + 256]).sum())
    t3 = time.perf_counter()
    model.save_pretrained(out_dir)
    t4 = time.perf_counter()
    return {"test_accuracy": round(correct / len(test_y), 4), "torch_threads":
            torch.get_num_threads(),
            "split": {"startup_s": round(t1 - t0, 1), "steps_s": round(t2 - t1, 1),
                      "step_ms": round(1000 * (t2 - t1) / steps, 1),
                      "final_eval_s": round(t3 - t2, 1), "save_s": round(t4 - t3, 1)}}


def peer(args) -> dict:
    fashion_sets = HF_ARCH + [f"train.steps={args.scratch_steps}", "data.val_split=test",
                              f"train.eval_every={args.scratch_steps}",
                              f"train.checkpoint_every={args.scratch_steps}",
                              f"train.log_every={max(args.scratch_steps // 10, 1)}",
                              f"optim.warmup_steps={args.scratch_steps // 10}",
                              "train.eval_batch_size=256"]
    tune_sets = HF_ARCH + [f"train.steps={args.tune_steps}", "data.val_split=test",
                           f"train.eval_every={args.tune_steps}",
                           f"train.checkpoint_every={args.tune_steps}",
                           f"train.log_every={max(args.tune_steps // 10, 1)}",
                           "train.eval_batch_size=256"]
    from vit.recipes.load import load_config

    scratch_cfg = load_config("fashion_mnist", fashion_sets)
    tune_cfg = load_config("mnist_transfer", tune_sets)

    def torch_kwargs(cfg, dataset, steps):
        return dict(dataset=dataset, steps=steps, batch=cfg.train.batch_size, lr=cfg.optim.lr,
                    warmup=cfg.optim.warmup_steps, weight_decay=cfg.optim.weight_decay,
                    clip=cfg.optim.clip_norm, label_smoothing=cfg.input.label_smoothing,
                    shift=cfg.input.shift, rotate=cfg.input.rotate)

    def ours(name, recipe, sets, cfg, workdir, init=None, env=None):
        run = vit_train(recipe, workdir, sets, init=init, env=env)
        rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
        val = [r for r in rows if r["split"] == "validation"][-1]
        return {"side": name, "test_accuracy": round(val["accuracy"], 4),
                "wall_s": round(run["wall_s"], 1),
                "split": split_of_vit_run(workdir, run["wall_s"])}

    def theirs(kwargs, out_dir):
        start = time.perf_counter()
        result = common.run_side("benchmarks.realdata:side_torch",
                                 {**kwargs, "out_dir": str(out_dir)})
        return {"side": "transformers+torch", **result,
                "wall_s": round(time.perf_counter() - start, 1)}

    two = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="realdata-peer-") as tmp:
        tmp = Path(tmp)
        for r in range(args.rounds):
            scratch, hf_dir = tmp / f"scratch{r}", tmp / f"hf{r}"

            def scratch_side(name, scratch=scratch, hf_dir=hf_dir, r=r):
                if name == "torch":
                    return theirs({**torch_kwargs(scratch_cfg, "fashion_mnist",
                                                  args.scratch_steps),
                                   "config_file": str(hf_dir / "config.json"), "init": None},
                                  tmp / f"torch_scratch{r}")
                if name == "vit2":
                    return ours("vit train, 2 XLA:CPU devices", "fashion_mnist", fashion_sets,
                                scratch_cfg, tmp / f"scratch2dev{r}", env=two)
                result = ours("vit train", "fashion_mnist", fashion_sets, scratch_cfg, scratch)
                # Its weights are the fine-tuning start, its HF config the peer's architecture.
                subprocess.run([*vit_command(), "convert", str(scratch), str(hf_dir),
                                "--format", "hf"], cwd=ROOT, check=True, capture_output=True)
                return result

            # Our scratch run comes first (it makes the shared weights); the others alternate.
            others = ["torch", "vit2"] if args.two_devices else ["torch"]
            order = ["vit"] + others[::(-1) ** r]
            results = {name: scratch_side(name) for name in order}
            tune = {}
            tune_order = ["torch", "vit"] if r % 2 == 0 else ["vit", "torch"]
            if args.two_devices:
                tune_order.append("vit2")
            for name in tune_order:
                if name == "torch":
                    tune[name] = theirs({**torch_kwargs(tune_cfg, "mnist_5k", args.tune_steps),
                                         "config_file": "", "init": str(hf_dir)},
                                        tmp / f"torch_tune{r}")
                else:
                    tune[name] = ours("vit train" + (", 2 XLA:CPU devices" if name == "vit2"
                                                     else ""), "mnist_transfer", tune_sets,
                                      tune_cfg, tmp / f"tune_{name}{r}", init=str(hf_dir),
                                      env=two if name == "vit2" else None)
            rounds.append({"round": r, "order": order, "scratch_fashion_mnist": results,
                           "tune_order": tune_order, "finetune_mnist_5k": tune})

    def summary(phase):
        out = {}
        for name in rounds[0][phase]:
            acc = [rd[phase][name]["test_accuracy"] for rd in rounds]
            wall = [rd[phase][name]["wall_s"] for rd in rounds]
            out[name] = {"test_accuracy": round(statistics.mean(acc), 4),
                         "wall_s_median": round(statistics.median(wall), 1)}
        for name in out:
            if name != "torch":
                out[name]["accuracy_minus_peer_points"] = round(
                    100 * (out[name]["test_accuracy"] - out["torch"]["test_accuracy"]), 2)
                out[name]["speed_vs_peer"] = round(out["torch"]["wall_s_median"]
                                                   / out[name]["wall_s_median"], 3)
        return out

    m = scratch_cfg.model
    return {"architecture": f"ViT, patch {m.patch_size}, width {m.width}, depth {m.depth}, "
                            f"{m.num_heads} heads, MLP {m.mlp_dim}, class token and token head, "
                            f"{m.dtype} on both sides, 28x28 grey as RGB",
            "scratch": {"dataset": "fashion_mnist (55,000 train; test 10,000)",
                        "steps": args.scratch_steps, "batch": scratch_cfg.train.batch_size},
            "finetune": {"dataset": "mnist_5k (500 train; test 4,000)",
                         "steps": args.tune_steps, "batch": tune_cfg.train.batch_size},
            "targets": "accuracy >= peer - 0.3 points; whole-command speed >= 1.0x the peer",
            "summary": {"scratch": summary("scratch_fashion_mnist"),
                        "finetune": summary("finetune_mnist_5k")},
            "rounds": rounds}


def dryrun(args) -> dict:
    recipes = args.recipes or sorted(p.stem for p in (ROOT / "configs").glob("*.py"))
    out = {}
    earlier = None
    if args.merge:  # the other recipes' entries stay as the record has them
        old = json.loads(common.record_path("dry_run").read_text())
        out = old["recipes"]
        earlier = old.get("earlier") or {"command": old["command"], "date_utc": old["date_utc"]}
    for name in recipes:
        run = run_timed([*vit_command(), "train", "--config", name, "--dry-run"])
        out[name] = {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "load_average_1min": round(os.getloadavg()[0], 2),
                     "returncode": run["returncode"], "wall_s": round(run["wall_s"], 1),
                     "printed": [text for _, text in run["lines"]
                                 if not text.startswith(("WARNING", "I0000", "W0000"))]}
    return {"recipes": dict(sorted(out.items())),
            **({"earlier": earlier} if earlier else {})}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks realdata")
    sub = parser.add_subparsers(dest="what", required=True)
    f = sub.add_parser("fashion", help="the fashion_mnist recipe's result and time")
    f.add_argument("--workdir")
    f.add_argument("--steps", type=int, default=None)
    f.add_argument("--existing", help="record a finished run's workdir instead of training")
    f.add_argument("--started", type=float, help="--existing: its start, unix time")
    f.add_argument("--finished", type=float, help="--existing: its end, unix time")
    f.add_argument("--timeline", help="--existing: its poll_line log")
    f.add_argument("--command", default="", help="--existing: the command that ran it")
    t = sub.add_parser("transfer", help="mnist_transfer from --init against from scratch")
    t.add_argument("--init", required=True)
    t.add_argument("--seeds", type=int, default=1)
    t.add_argument("--steps", type=int, default=None)
    p = sub.add_parser("peer", help="vit train against transformers + torch")
    p.add_argument("--scratch-steps", type=int, default=300)
    p.add_argument("--tune-steps", type=int, default=150)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--two-devices", action="store_true")
    d = sub.add_parser("dryrun", help="vit train --dry-run of every shipped recipe")
    d.add_argument("--recipes", nargs="*", default=None)
    d.add_argument("--merge", action="store_true",
                   help="run only --recipes, keeping the record's other entries")
    for each in (f, t, p, d):
        each.add_argument("--out", default=None, help="write the record here instead")
    args = parser.parse_args(argv)
    if args.what == "fashion" and not (args.workdir or args.existing):
        parser.error("fashion needs --workdir (or --existing)")
    figures = {"fashion": fashion, "transfer": transfer, "peer": peer,
               "dryrun": dryrun}[args.what](args)
    name = {"fashion": "fashion_mnist", "transfer": "mnist_transfer",
            "peer": "realdata_peer", "dryrun": "dry_run"}[args.what]
    path = common.write_record(name, figures, argv=argv, mode="realdata", out=args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


# ------------------------------------------------------------------------------ tables


def _earlier_line(record: dict) -> list[str]:
    """Which entries a merged record took from the run it was merged with."""
    if "earlier" not in record:
        return []
    new = [f"`{n}`" for n, e in record["recipes"].items() if "date_utc" in e]
    return ["", f"{', '.join(new)}: the command below; the others: "
                f"`{record['earlier']['command']}` on {record['earlier']['date_utc'][:10]}."]


def table(record: dict) -> list[str]:
    """The docs' table of a record this mode writes (`python -m benchmarks tables`)."""
    from benchmarks import tables as T

    name = record["benchmark"]
    if name == "mnist_transfer":
        rows = []
        for start in ("pretrained", "scratch"):
            runs = [r for r in record["runs"] if r["start"] == start]
            rows.append([start, " / ".join(T.pct(r["test_accuracy"]) for r in runs),
                         T.pct(record["test_accuracy_mean"][start]),
                         f"{statistics.median(r['wall_s'] for r in runs):.0f} s"])
        return [f"`vit train --config mnist_transfer`, {record['labels']}; `--init` the "
                "fashion_mnist workdir, or from scratch; the pretrained start wins by "
                f"{record['pretrained_gain_points']:.1f} points:", "",
                *T.table(["start", f"test accuracy, seeds 0-{record['seeds'] - 1}", "mean",
                          "whole command (median)"], rows)]
    if name == "dry_run":
        rows = []
        for recipe, entry in record["recipes"].items():
            got = {key: next((x.split(": ", 1)[1] for x in entry["printed"]
                              if x.startswith(key + ":")), "") for key in
                   ("model", "step", "FLOPs per step", "memory per device (XLA's plan)",
                    "one step")}
            params = re.search(r"([\d,]+) parameters", got["model"])
            memory = got["memory per device (XLA's plan)"]
            rows.append([f"`{recipe}`", "yes" if entry["returncode"] == 0 else "**failed**",
                         params.group(1) if params else "",
                         got["FLOPs per step"].split(" (")[0],
                         memory.split(" = ")[0] + (" (fits)" if memory.endswith(": fits")
                                                   else ""),
                         got["one step"].split(" (")[0]])
        example = record["recipes"].get("cifar10_finetune", {}).get("printed", [])
        return [*T.table(["recipe", "compiled", "parameters", "FLOPs per step",
                          "memory per device", "one step"], rows), "",
                "`vit train --config cifar10_finetune --dry-run` printed:", "", "```text",
                *example, "```",
                *_earlier_line(record)]
    if name == "realdata_peer":
        rows = []
        for phase, label in (("scratch", "from scratch, Fashion-MNIST"),
                             ("finetune", "fine-tuned, 500 MNIST digits")):
            for side, s in record["summary"][phase].items():
                rows.append([label, {"vit": "vit train", "vit2": "vit train, 2 devices",
                                     "torch": "transformers + torch"}[side],
                             T.pct(s["test_accuracy"]), f"{s['wall_s_median']:.0f} s",
                             f"{s['speed_vs_peer']:.2f}x" if "speed_vs_peer" in s else "",
                             f"{s['accuracy_minus_peer_points']:+.1f}"
                             if "accuracy_minus_peer_points" in s else ""])
        splits = []
        for rd in record["rounds"]:
            for phase in ("scratch_fashion_mnist", "finetune_mnist_5k"):
                for s in rd[phase].values():
                    sp = s["split"]
                    splits.append([phase.split("_")[0], s["side"],
                                   sp.get("startup_and_compile_s", sp.get("startup_s")),
                                   sp["steps_s"], sp["step_ms"], sp["final_eval_s"],
                                   sp.get("checkpoint_and_exit_s", sp.get("save_s"))])
        return [f"{record['architecture']}; from scratch {record['scratch']['steps']} steps of "
                f"{record['scratch']['batch']}, fine-tuning {record['finetune']['steps']} steps "
                f"of {record['finetune']['batch']} (targets: {record['targets']}):", "",
                *T.table(["run", "side", "test accuracy", "whole command", "speed vs peer",
                          "points vs peer"], rows), "",
                "Where each command's time went, in seconds (ours: start-up and compile, "
                "steps, final evaluation, checkpoint and exit; the peer's: start-up, steps, "
                "evaluation, save):", "",
                *T.table(["run", "side", "start-up", "steps", "ms a step", "evaluation",
                          "save and exit"], splits)]
    raise KeyError(name)
