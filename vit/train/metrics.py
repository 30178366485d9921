"""`WORKDIR/metrics.jsonl` (one JSON object per logged step) and `WORKDIR/curves.png`."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path


class MetricsLog:
    """Appends records; on resume, drops those past the step the run resumes from, so the
    file reads as one uninterrupted run. Only an `enabled` log (process 0's) writes."""

    def __init__(self, workdir: str | Path, resume_step: int | None, enabled: bool = True):
        self.path, self.enabled = Path(workdir) / "metrics.jsonl", enabled
        if enabled and self.path.exists():
            keep = [r for r in read_metrics(self.path)
                    if resume_step is not None and r["step"] <= resume_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in keep))

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


class TrainMeter:
    """Means of the per-step training metrics since the last `flush`, and the images/s of the
    training steps alone: time spent inside `paused()` (validating, saving) does not count."""

    def __init__(self):
        self._reset()

    def _reset(self) -> None:
        self.sums: dict[str, float] = {}
        self.count, self.t0 = 0, time.time()

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

    def flush(self, batch_size: int) -> tuple[dict[str, float], float]:
        """(metric means, images/s) over the steps since the last flush; starts afresh."""
        means = {k: v / self.count for k, v in self.sums.items()}
        images_per_s = self.count * batch_size / (time.time() - self.t0)
        self._reset()
        return means, images_per_s


def read_metrics(path: str | Path) -> list[dict]:
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a crash
            continue
    return records


def plot_curves(metrics_path: str | Path, out_path: str | Path) -> None:
    """Training loss, and training / validation accuracy, against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    train = [r for r in records if r.get("split") == "train"]
    val = [r for r in records if r.get("split") == "validation"]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train")
    if val:
        ax_loss.plot([r["step"] for r in val], [r["loss"] for r in val], "o-", label="validation")
    ax_loss.set(xlabel="step", ylabel="loss", yscale="log", title="loss")
    ax_acc.plot([r["step"] for r in train], [r["accuracy"] for r in train], label="train")
    if val:
        ax_acc.plot([r["step"] for r in val], [r["accuracy"] for r in val], "o-",
                    label="validation")
    ax_acc.set(xlabel="step", ylabel="top-1 accuracy", title="accuracy", ylim=(0, 1))
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
