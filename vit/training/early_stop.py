"""Early stopping: end the run after `train.early_stop_patience` validations in a row without a
better validation accuracy (the metric that picks the best checkpoint, which is kept as ever).

The count lives in each checkpoint's train state, so a resumed run counts on where it stopped,
and a run that stopped early stays stopped when its command runs again (raise the patience, or
set it to 0, to train on).
"""

from __future__ import annotations

REASON = "early_stop"


class EarlyStop:
    def __init__(self, patience: int, saved: dict | None = None):
        saved = saved or {}
        self.patience = patience
        self.best: float | None = saved.get("best")
        self.best_step: int | None = saved.get("best_step")
        self.stale: int = saved.get("stale", 0)

    @property
    def due(self) -> bool:
        """Whether the patience is spent (never with patience 0)."""
        return self.patience > 0 and self.stale >= self.patience

    def update(self, step: int, accuracy: float) -> bool:
        """Counts one validation; True when the run should stop after it."""
        if self.best is None or accuracy > self.best:
            self.best, self.best_step, self.stale = accuracy, step, 0
        else:
            self.stale += 1
        return self.due

    def state(self) -> dict:
        return {"best": self.best, "best_step": self.best_step, "stale": self.stale}

    def line(self, step: int) -> str:
        """Why the run stopped, in one line."""
        return (f"early stop at step {step}: validation accuracy has not improved on "
                f"{self.best:.4f} (step {self.best_step}) in {self.stale} validations "
                f"(train.early_stop_patience={self.patience})")

    def record(self, step: int) -> dict:
        """What metrics.jsonl records of the stop."""
        return {"step": step, "split": REASON, "best_step": self.best_step,
                "best_accuracy": self.best, "validations_without_improvement": self.stale,
                "patience": self.patience}
