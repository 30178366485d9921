"""Training progress: a tqdm bar on a terminal, one plain line per log step otherwise.

Each shows the latest figures, the images/s and the share of the time the steps waited for the
input pipeline (`data_wait`: high means the data, not the model, sets the pace).

Logs redirected to a file (batch jobs, `nohup`) get readable lines instead of carriage-return
bar redraws; a terminal gets the bar with the latest figures beside it.
"""

from __future__ import annotations

import sys

# Record fields that are not per-step training metrics.
_NOT_METRICS = ("step", "split", "lr", "images_per_s", "data_wait")


def progress(start: int, total: int, enabled: bool = True):
    """A display for steps `start..total`: `update(n)`, `report(record)`, `close()`.
    Disabled (processes other than 0 of a multi-process run), it shows nothing."""
    if not enabled:
        return _Silent()
    return _Bar(start, total) if sys.stderr.isatty() else _Lines(total)


class _Silent:
    def update(self, n: int) -> None:
        pass

    def report(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


def _metrics(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in _NOT_METRICS}


class _Bar:
    def __init__(self, start: int, total: int):
        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)

    def update(self, n: int) -> None:
        self.bar.update(n)

    def report(self, record: dict) -> None:
        figures = {("acc" if k == "accuracy" else k): f"{v:.3f}"
                   for k, v in _metrics(record).items()}
        if "data_wait" in record:
            figures["data"] = f"{record['data_wait']:.0%}"
        self.bar.set_postfix(figures)

    def close(self) -> None:
        self.bar.close()


class _Lines:
    def __init__(self, total: int):
        self.total = total

    def update(self, n: int) -> None:
        pass

    def report(self, record: dict) -> None:
        figures = " ".join(f"{k} {v:.4f}" if k == "loss" else f"{k} {v:.3f}"
                           for k, v in _metrics(record).items())
        waiting = (f", {record['data_wait']:.0%} waiting for data" if "data_wait" in record
                   else "")
        print(f"step {record['step']}/{self.total}: {figures} lr {record['lr']:.2e} "
              f"{record['images_per_s']:.0f} img/s{waiting}", flush=True)

    def close(self) -> None:
        pass
