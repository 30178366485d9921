"""Two real processes on loopback, 2 CPU devices each, joined by `jax.distributed` (gloo CPU
collectives): they train configs/digits.py together, agree on the loss, process 0 alone writes
metrics, both checkpoint the final step, `vit eval` of the run equals the run's own
two-process validation, a SIGTERM to both saves the same step on both and a rerun resumes,
and one process refuses to resume what two wrote.

Slow (about 4-6 minutes on 2 busy cores): run with `pytest -m slow tests/test_multiprocess.py`.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from builders import tiny_recipe_sets

from vit.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
# Each process gets half of the batch; each launch sets its own steps and intervals. With 2x2
# patches the model still improves from step 3 to step 6, so `vit eval` reads step 6 as best.
RUN_SETS = tiny_recipe_sets("model.patch_size=2", "train.batch_size=16",
                            "train.eval_batch_size=64", "optim.warmup_steps=2")
ENV = {**os.environ, "JAX_PLATFORMS": "cpu",
       "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}

# The library calls `vit train` makes, printing what each process's train() returned.
DRIVER = r"""
import json, sys
from vit.recipes.load import load_config
from vit.training.parallel import start_processes
port, pid, workdir, *sets = sys.argv[1:]
config = load_config("configs/digits.py", sets)
start_processes(f"127.0.0.1:{port}", 2, int(pid))
import jax
from vit.training.loop import train
assert jax.process_count() == 2 and jax.device_count() == 4 and jax.local_device_count() == 2
out = train(config, workdir)
print("RESULT", json.dumps({"process": jax.process_index(), "step": out["step"],
                            "loss": out["loss"]}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sets(*items):
    return [x for item in RUN_SETS + list(items) for x in ("--set", item)]


def launch(workdir, *items):
    """Both processes of `vit train` on one coordinator."""
    port = free_port()
    return [subprocess.Popen(
        [sys.executable, "-m", "vit.cli", "train", "--config", "configs/digits.py",
         "--workdir", str(workdir), *sets(*items), "--coordinator", f"127.0.0.1:{port}",
         "--num-processes", "2", "--process-id", str(i)],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)]


def finish(procs, timeout=600):
    outs = [p.communicate(timeout=timeout) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    return outs


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_two_processes_train_evaluate_preempt_and_resume_together(tmp_path):
    workdir = tmp_path / "run"
    # 1. Six steps together, through the library calls `vit train` makes.
    port = free_port()
    items = RUN_SETS + ["train.steps=6", "train.log_every=2", "train.eval_every=3",
                    "train.checkpoint_every=3"]
    procs = [subprocess.Popen([sys.executable, "-c", DRIVER, str(port), str(i), str(workdir),
                               *items], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = finish(procs)
    results = [json.loads(out.split("RESULT", 1)[1]) for out, _ in outs]
    assert [r["process"] for r in results] == [0, 1]
    assert results[0]["step"] == results[1]["step"] == 6
    assert results[0]["loss"] == results[1]["loss"]  # one global loss, read by each

    records = [r for r in read_metrics(workdir / "metrics.jsonl") if r["split"] != "timing"]
    keys = [(r["step"], r["split"]) for r in records]
    assert keys == [(2, "train"), (3, "validation"), (4, "train"), (6, "train"),
                    (6, "validation")]  # process 0 alone wrote: no record twice
    assert records[3]["loss"] == pytest.approx(results[0]["loss"], rel=1e-6)
    assert (workdir / "checkpoints" / "6").is_dir()
    data_iter = json.loads((workdir / "checkpoints" / "6" / "data_iter" / "metadata")
                           .read_text())  # each process's data position, for a resume
    assert data_iter["process_count"] == 2 and len(data_iter["per_process"]) == 2

    # 2. `vit eval` (one process) equals the two-process validation of the same step.
    ev = subprocess.run([sys.executable, "-m", "vit.cli", "eval", "--workdir", str(workdir),
                         "--split", "validation", "--json"], cwd=ROOT,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                        text=True, timeout=300)
    assert ev.returncode == 0, ev.stderr[-2000:]
    report = json.loads(ev.stdout.strip().splitlines()[-1])
    val = records[-1]
    assert report["num_examples"] == 144 and "step 6" in report["checkpoint"]
    assert report["accuracy"] == val["accuracy"]
    assert report["top5_accuracy"] == val["top5_accuracy"]
    assert report["loss"] == pytest.approx(val["loss"], rel=1e-5)

    # 3. SIGTERM to both: both save the same step, then the same command resumes from it.
    procs = launch(workdir, "train.steps=400", "train.log_every=1",
                   "train.eval_every=1000", "train.checkpoint_every=1000")
    deadline = time.time() + 300
    while not any(r["step"] > 8 for r in read_metrics(workdir / "metrics.jsonl")):
        assert time.time() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.2)
    for p in procs:
        p.send_signal(signal.SIGTERM)
    outs = finish(procs)
    saved = [re.search(r"SIGTERM: process (\d) saved step (\d+)", err) for _, err in outs]
    assert all(saved), [err[-2000:] for _, err in outs]
    assert [int(m.group(1)) for m in saved] == [0, 1]
    stop = int(saved[0].group(2))
    assert int(saved[1].group(2)) == stop and 8 < stop < 400
    assert (workdir / "checkpoints" / str(stop)).is_dir()

    procs = launch(workdir, f"train.steps={stop + 2}", "train.log_every=1",
                   "train.eval_every=1000", "train.checkpoint_every=1000")
    (out0, _), _ = finish(procs)
    assert f"resumed from step {stop}" in out0
    assert (workdir / "checkpoints" / str(stop + 2)).is_dir()
    steps = [r["step"] for r in read_metrics(workdir / "metrics.jsonl") if r["split"] == "train"]
    assert steps[-3:] == [stop, stop + 1, stop + 2] and len(steps) == len(set(steps))

    # 4. One process cannot resume what two wrote: its data shards differ.
    one = subprocess.run([sys.executable, "-m", "vit.cli", "train", "--config",
                          "configs/digits.py", "--workdir", str(workdir),
                          *sets(f"train.steps={stop + 4}")], cwd=ROOT,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                         text=True, timeout=300)
    assert one.returncode == 2
    assert "written by 2 process(es) and this run has 1" in one.stderr
    assert len(one.stderr.strip().splitlines()) == 1
