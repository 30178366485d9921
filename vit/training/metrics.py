"""`WORKDIR/metrics.jsonl` (one JSON object per logged step) and `WORKDIR/curves.png`.

History is appended, never truncated: `metrics.jsonl` reads as one uninterrupted run, so a run
that resumes from step S (or starts again at 0, its checkpoints deleted) moves the records past S
to `metrics.dropped.jsonl`, appended there line for line, before it logs its own.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

from vit import paths
from vit.errors import OutOfSpace, is_out_of_space
from vit.paths import replacing, write_whole

DROPPED = "metrics.dropped.jsonl"


class MetricsLog:
    """Appends records. Only an `enabled` log (process 0's) writes; its first write moves the
    records past `resume_step` aside (see the module), so a run refused or crashed before it
    logs anything leaves the file as it was. A write the disk refuses takes back its part."""

    def __init__(self, workdir: str | Path, resume_step: int | None, enabled: bool = True,
                 events=None):
        self.path, self.enabled = Path(workdir) / "metrics.jsonl", enabled
        self.resume_step = resume_step or 0
        self._settled = False
        # The same records as TensorBoard events (`vit.training.tensorboard.EventLog`), or None.
        self.events = events if enabled else None

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        if not self._settled:
            dropped = self._set_aside()
            if self.events is not None and not self.events.has_events():
                self.events.backfill(self.path)  # the curves from the run's first step
            elif self.events is not None and dropped:  # the steps past the resume step go
                self.events.restart(self.resume_step + 1)
            self._settled = True
        append_whole(self.path, json.dumps(record) + "\n")
        if self.events is not None:
            self.events.write(record)

    def _set_aside(self) -> bool:
        """Moves the lines past the resume step (and lines a crash cut short) to `DROPPED`:
        the kept ones are written to a temporary file, the dropped ones appended, then the
        temporary file replaces `metrics.jsonl` (`vit.paths.replacing`); a failure on the way
        changes nothing. Whether any line moved."""
        if not self.path.exists():
            return False
        keep, drop = [], []
        for line in self.path.read_bytes().splitlines(keepends=True):
            step = _step_of(line)
            (keep if step is not None and step <= self.resume_step else drop).append(line)
        if not drop:
            return False
        keep = [line if line.endswith(b"\n") else line + b"\n" for line in keep]
        drop = [line if line.endswith(b"\n") else line + b"\n" for line in drop]
        dropped = self.path.with_name(DROPPED)
        try:
            with replacing(self.path) as f:  # replaced once the dropped lines are appended
                f.write(b"".join(keep))
                f.flush()  # a full disk shows before a line is appended
                append_whole(dropped, b"".join(drop))
        except BaseException as err:
            if is_out_of_space(err) and not isinstance(err, OutOfSpace):
                raise OutOfSpace(self.path, sum(map(len, keep))) from None
            raise
        print(f"note: {len(drop)} line(s) of {self.path} past step {self.resume_step} moved to "
              f"{dropped} (the run goes on from step {self.resume_step})", file=sys.stderr)
        return True


def _step_of(line: bytes) -> int | None:
    try:
        record = json.loads(line)
    except ValueError:  # a line cut short by a crash
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) else None


def append_whole(path: Path, data: str | bytes) -> None:
    """Appends `data` to `path` all or nothing (`vit.paths.append_whole`); a full disk is an
    `OutOfSpace` naming `path`."""
    data = data.encode() if isinstance(data, str) else data
    try:
        paths.append_whole(path, data)
    except BaseException as err:
        if is_out_of_space(err) and not isinstance(err, OutOfSpace):
            raise OutOfSpace(path, len(data)) from None
        raise


class TrainMeter:
    """Means of the per-step training metrics since the last `flush`, the images/s of the
    training steps alone (time spent inside `paused()`, validating and saving, does not count),
    and the share of that time spent waiting for the input pipeline (`waiting()`)."""

    def __init__(self):
        self._reset()

    def _reset(self) -> None:
        self.sums: dict[str, float] = {}
        self.count, self.t0, self.waited = 0, time.time(), 0.0

    @contextlib.contextmanager
    def waiting(self):
        """Counts the block's time as waiting for data."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self.waited += time.perf_counter() - t

    def add(self, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.count += 1

    @contextlib.contextmanager
    def paused(self):
        t = time.time()
        try:
            yield
        finally:
            self.t0 += time.time() - t

    def flush(self, batch_size: int) -> tuple[dict[str, float], float, float]:
        """(metric means, images/s, share of the time waiting for data) over the steps since
        the last flush; starts afresh."""
        means = {k: v / self.count for k, v in self.sums.items()}
        wall = max(time.time() - self.t0, 1e-9)
        images_per_s, data_wait = self.count * batch_size / wall, min(self.waited / wall, 1.0)
        self._reset()
        return means, images_per_s, data_wait


def read_metrics(path: str | Path) -> list[dict]:
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a crash
            continue
    return records


def plot_curves(metrics_path: str | Path, out_path: str | Path) -> None:
    """Training loss, and training / validation accuracy, against the step. `out_path` is
    replaced whole or not at all (a full disk is an `OutOfSpace` naming it). A bare `Figure`
    with fixed margins and legend corners: pyplot's state, a fitted layout and a searched
    legend place would each cost more than the drawing, at the end of every run."""
    from matplotlib.figure import Figure

    records = read_metrics(metrics_path)
    train = [r for r in records if r.get("split") == "train"]
    val = [r for r in records if r.get("split") == "validation"]
    fig = Figure(figsize=(10, 4))
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.13, top=0.92, wspace=0.22)
    ax_loss, ax_acc = fig.subplots(1, 2)
    ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train")
    if val:
        ax_loss.plot([r["step"] for r in val], [r["loss"] for r in val], "o-", label="validation")
    ax_loss.set(xlabel="step", ylabel="loss", yscale="log", title="loss")
    ax_acc.plot([r["step"] for r in train], [r["accuracy"] for r in train], label="train")
    if val:
        ax_acc.plot([r["step"] for r in val], [r["accuracy"] for r in val], "o-",
                    label="validation")
    ax_acc.set(xlabel="step", ylabel="top-1 accuracy", title="accuracy", ylim=(0, 1))
    for ax, corner in ((ax_loss, "upper right"), (ax_acc, "lower right")):
        ax.grid(alpha=0.3)
        ax.legend(loc=corner)
    out_path = Path(out_path)
    try:
        write_whole(out_path, lambda f: fig.savefig(
            f, dpi=100, format=out_path.suffix.lstrip(".") or "png"))
    except BaseException as err:
        if is_out_of_space(err) and not isinstance(err, OutOfSpace):
            raise OutOfSpace(out_path) from None
        raise
