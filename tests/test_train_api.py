"""`vit.train(...)` from Python (a recipe by name, own arrays, own sources), the TensorBoard
events beside metrics.jsonl (read back with TensorBoard's own reader), early stopping, and the
share of time waiting for data. Tiny models on the bundled digits or small arrays."""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from builders import tiny_recipe_sets

from vit.errors import DataError
from vit.training.metrics import read_metrics

# Each test trains for real (tens of seconds on 2 cores): with the slow set.
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
# The overrides of this file's runs: the tiny recipe over eight steps, validated and saved at
# 4 and 8, as a dict.
RUN_OVERRIDES = dict(item.split("=", 1) for item in tiny_recipe_sets(
    "model.patch_size=2", "train.batch_size=16", "train.steps=8", "train.eval_every=4",
    "train.checkpoint_every=4", "optim.warmup_steps=2"))


def tiny(**extra):
    return {**RUN_OVERRIDES, **extra}


def records(workdir, split=None):
    rows = read_metrics(Path(workdir) / "metrics.jsonl")
    return [r for r in rows if split is None or r["split"] == split]


# -- the name: a plain function ----------------------------------------------------------------

@pytest.mark.parametrize("first", ["import vit; vit.train", "import vit.training.loop",
                                   "from vit import train"])
def test_vit_train_is_the_function_whatever_is_imported_first(first):
    code = (f"{first}\nimport inspect, vit, vit.training.loop, vit.training.metrics\n"
            "from vit.training.api import train as api\n"
            "assert vit.train is api and 'train' in vit.__all__, vit.train\n"
            "assert list(inspect.signature(vit.train).parameters)[:2] == ['config', 'workdir']\n"
            "from vit import train\n"
            "assert train is api\n"
            "print('OK')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-2000:]


# -- own data ---------------------------------------------------------------------------------

def _two_classes(n, seed):
    """Bright and dark 8x8 images: a property any model learns, so the labels are the truth."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    images = np.where(labels[:, None, None, None] == 1, 200, 40).astype(np.uint8)
    images = np.clip(images + rng.integers(-30, 30, (n, 8, 8, 3)), 0, 255).astype(np.uint8)
    return images, labels


def test_train_on_own_arrays_returns_the_final_metrics(tmp_path):
    import vit

    train = _two_classes(64, 0)
    val = (_two_classes(32, 1)[0].astype(np.float32) / 255.0, _two_classes(32, 1)[1])
    result = vit.train("digits", tmp_path / "run", overrides=tiny(**{"optim.lr": 0.01}),
                       data={"train": train, "validation": val}, class_names=["dark", "bright"])
    last_train, last_val = records(tmp_path / "run", "train")[-1], \
        records(tmp_path / "run", "validation")[-1]
    assert result["step"] == 8 and result["stopped_by"] is None
    assert result["loss"] == last_train["loss"] and result["lr"] == last_train["lr"]
    assert result["val_accuracy"] == last_val["accuracy"]
    assert result["val_loss"] == last_val["loss"]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["data"]["name"] == "own-data" and config["data"]["val_split"] == "validation"
    from vit.training.checkpointing import TrainCheckpoints

    ckpts = TrainCheckpoints(tmp_path / "run")
    assert ckpts.read_meta(8)["labels"] == ["dark", "bright"]
    ckpts.close()


class SlowSource:
    """A grain-style random-access source (tuples), `delay` seconds per element."""

    class_names = ["dark", "bright"]

    def __init__(self, n, delay):
        self.images, self.labels = _two_classes(n, 2)
        self.delay = delay

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        time.sleep(self.delay)
        return self.images[i], int(self.labels[i])


def test_waiting_for_data_is_measured_and_shown(tmp_path, capsys):
    """A source that sleeps a fiftieth of a second per image, read in the main thread: each
    training record's window waited at least the sleeps it injected (the share of its time
    the record gives, times that time); the digits arrays, without sleeps, wait less than
    that."""
    import vit

    delay, batch, window = 0.02, 8, 3
    sets = tiny(**{"data.num_threads": 0, "train.steps": 6, "train.log_every": window,
                   "train.batch_size": batch, "train.checkpoint_every": 6})
    vit.train("digits", tmp_path / "slow", overrides=sets, data=SlowSource(64, delay))
    assert "waiting for data" in capsys.readouterr().out
    injected = window * batch * delay
    slow = [waited_s(r, window * batch) for r in records(tmp_path / "slow", "train")]
    assert len(slow) == 2 and all(w >= injected for w in slow), (slow, injected)
    vit.train("digits", tmp_path / "fast", overrides=sets)
    fast = [waited_s(r, window * batch) for r in records(tmp_path / "fast", "train")]
    assert all(0 <= w < injected for w in fast), (fast, injected)


def waited_s(record: dict, images: int) -> float:
    """The seconds a training record's window of `images` images waited for data: its
    `data_wait` share of the window's time, which its images/s gives."""
    return record["data_wait"] * images / record["images_per_s"]


@pytest.mark.parametrize("data,needle", [
    ((np.zeros((4, 8, 8, 3), np.uint8), np.zeros(5, int)), "one int per image"),
    ((np.zeros((4, 8, 8, 3), np.float32) + 2, np.zeros(4, int)), "must lie in [0, 1]"),
    ((np.zeros((4, 8, 8, 3), np.uint8), np.array([0, 1, 2, -1])), "is negative"),
    ({"train": [1, 2, 3]}, "no class_names"),
    ({"validation": (np.zeros((4, 8, 8, 3), np.uint8), np.zeros(4, int))}, "no 'train'"),
    (42, "is not a dataset"),
])
def test_own_data_mistakes_are_one_line(data, needle, tmp_path):
    import vit

    with pytest.raises(DataError) as err:
        vit.train("digits", tmp_path / "run", overrides=tiny(), data=data)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "run").exists()


# -- TensorBoard ------------------------------------------------------------------------------

def tensorboard_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value)]} as TensorBoard's own reader loads them."""
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def jsonl_scalars(workdir) -> dict[str, list[tuple[int, float]]]:
    """The same figures from metrics.jsonl, at TensorBoard's float32 precision."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in records(workdir):
        if r["split"] not in ("train", "validation"):
            continue
        for key, value in r.items():
            if key not in ("step", "split"):
                out.setdefault(f"{r['split']}/{key}", []).append(
                    (r["step"], float(np.float32(value))))
    return out


def test_tensorboard_events_equal_metrics_jsonl_across_a_resume(tmp_path):
    import vit

    work = tmp_path / "run"
    vit.train("digits", work, overrides=tiny(), stop_after=3)  # interrupted at 3, saved
    vit.train("digits", work, overrides=tiny())  # resumes to 8
    tb = tensorboard_scalars(work / "tb")
    assert len(list((work / "tb").glob("*tfevents*"))) == 2  # one file per run, merged
    for tag in ("train/loss", "train/accuracy", "train/lr", "train/images_per_s",
                "train/data_wait", "validation/loss", "validation/accuracy"):
        assert tag in tb, sorted(tb)
    assert tb == jsonl_scalars(work)
    assert [s for s, _ in tb["train/loss"]] == list(range(1, 9))

    # A resume from a checkpoint before the last (the step-8 one deleted): metrics.jsonl sets steps
    # 5..8 aside and the run does them again; the curves do not show them twice.
    shutil.rmtree(work / "checkpoints" / "8")
    vit.train("digits", work, overrides=tiny())
    tb = tensorboard_scalars(work / "tb")
    assert tb == jsonl_scalars(work)
    assert [s for s, _ in tb["train/loss"]] == list(range(1, 9))


def test_tensorboard_off_writes_no_events(tmp_path):
    import vit

    vit.train("digits", tmp_path / "run", overrides=tiny(**{"train.tensorboard": False,
                                                            "train.steps": 2}))
    assert not (tmp_path / "run" / "tb").exists()


# -- early stopping ---------------------------------------------------------------------------

def _expected_stop(accuracies: list[tuple[int, float]], patience: int) -> int | None:
    """The step at which `patience` validations in a row did not beat the best: plain Python."""
    best, stale = None, 0
    for step, acc in accuracies:
        if best is None or acc > best:
            best, stale = acc, 0
        else:
            stale += 1
            if stale == patience:
                return step
    return None


def test_early_stopping_stops_says_why_and_stays_stopped(tmp_path, capsys):
    import vit

    # lr 0: the weights never change, so the validation accuracy never improves after the
    # first validation; patience 2 stops at the third of them (step 6), long before step 40.
    sets = tiny(**{"optim.lr": 0.0, "train.steps": 40, "train.eval_every": 2,
                   "train.checkpoint_every": 10, "train.log_every": 5,
                   "train.early_stop_patience": 2})
    result = vit.train("digits", tmp_path / "run", overrides=sets)
    out = capsys.readouterr().out
    val = [(r["step"], r["accuracy"]) for r in records(tmp_path / "run", "validation")]
    expected = _expected_stop(val, 2)
    assert expected == 6 and result["stopped_by"] == "early_stop" and result["step"] == 6
    lines = [line for line in out.splitlines() if line.startswith("early stop")]
    assert len(lines) == 1 and "step 6" in lines[0] and "early_stop_patience=2" in lines[0]
    stop = [r for r in records(tmp_path / "run") if r["split"] != "timing"][-1]
    assert stop["split"] == "early_stop" and stop["step"] == 6 and stop["best_step"] == 2
    assert (tmp_path / "run" / "checkpoints" / "6").is_dir()  # saved where it stopped
    best = json.loads((tmp_path / "run" / "checkpoints" / "best.json").read_text())
    assert best["val_accuracy"] == val[0][1]

    # The same command again: stopped early, nothing trained, nothing written.
    before = (tmp_path / "run" / "metrics.jsonl").read_bytes()
    again = vit.train("digits", tmp_path / "run", overrides=sets)
    assert again["stopped_by"] == "early_stop"
    assert "stopped early at step 6" in capsys.readouterr().out
    assert (tmp_path / "run" / "metrics.jsonl").read_bytes() == before


def test_no_early_stop_without_patience(tmp_path):
    import vit

    sets = tiny(**{"optim.lr": 0.0, "train.steps": 6, "train.eval_every": 2,
                   "train.checkpoint_every": 6, "train.log_every": 6})
    result = vit.train("digits", tmp_path / "run", overrides=sets)
    assert result["stopped_by"] is None and result["step"] == 6
    assert len(records(tmp_path / "run", "validation")) == 3
