"""`WORKDIR/metrics.jsonl` (one JSON object per logged step) and `WORKDIR/curves.png`."""

from __future__ import annotations

import json
from pathlib import Path


class MetricsLog:
    """Appends records; on resume, drops those past the step the run resumes from, so the
    file reads as one uninterrupted run."""

    def __init__(self, workdir: str | Path, resume_step: int | None):
        self.path = Path(workdir) / "metrics.jsonl"
        if self.path.exists():
            keep = [r for r in read_metrics(self.path)
                    if resume_step is not None and r["step"] <= resume_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in keep))

    def write(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


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
