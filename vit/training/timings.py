"""A run's timings, written as data: `timing` records in `WORKDIR/metrics.jsonl`, beside the
training and validation records, so a benchmark (or a user) reads where a run's time went
instead of parsing what it printed.

Each `train` call (each stage of a staged run) writes, every record with the `step` it belongs
to (start-up and compile: the first step of the call, so a run that starts again from a
step before it sets them aside with the steps after it) and `at_s`, the seconds from the call to
the moment it describes:

- `startup_s`: from the call to the program built (data opened, model, optimiser, a resumed
  state, pipeline; a new state is built in a thread from there on), with `process_start_s`,
  the process's age at the call (the interpreter, the imports and the recipe before it: a
  command's whole start-up is the two together);
- `compile_s`: the step compiled for the first batch (a new training state is built beside
  it, and what is left of that counts here);
- `step_s`: each step's own time, a list for the steps a training record covers (its last is
  the record's step): from the later of its call and the previous step's end to its own end;
- `evaluation_s`: a validation; `checkpoint_s`: what a save held the loop (the writing goes on
  in the background, and the last one is waited for at the exit);
- `exit_s`: from the last step to the call's return (the last save finished, the curves drawn).

A step's end is stamped by a thread that waits on each step's outputs in turn, so the loop never
waits on a step to time it. The records are written with the run's first training, validation
or checkpoint record, never before: a run that fails before it logs anything leaves
metrics.jsonl as it was.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from pathlib import Path

SPLIT = "timing"


def process_age_s() -> float:
    """Seconds since this process started (Linux's /proc), else 0."""
    try:
        with open("/proc/self/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, in clock ticks
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(uptime - started / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return 0.0


class RunClock:
    """The timings of one `train` call, held until `write` hands them to the metrics log."""

    def __init__(self):
        self.began = time.perf_counter()
        self.process_start_s = process_age_s()
        self.pending: list[dict] = []
        self.steps = StepTimes()

    def now(self) -> float:
        """Seconds since the call."""
        return time.perf_counter() - self.began

    def note(self, step: int, **figures) -> None:
        self.pending.append({"step": step, "split": SPLIT, **figures,
                             "at_s": round(self.now(), 4)})

    def started_up(self, step: int) -> None:
        self.note(step, startup_s=round(self.now(), 4),
                  process_start_s=round(self.process_start_s, 4))

    @contextlib.contextmanager
    def timed(self, step: int, name: str):
        """Notes the block's seconds as `name` at `step` (nothing when it raises)."""
        start = time.perf_counter()
        yield
        self.note(step, **{name: round(time.perf_counter() - start, 6)})

    def note_steps(self, step: int) -> None:
        """Notes the times of the steps run since the last call, up to `step`, once finished."""
        times = self.steps.take()
        if times:
            self.note(step, step_s=[None if t is None else round(t, 6) for t in times])

    def write(self, log) -> None:
        """Writes the noted records through `log` (`MetricsLog.write`)."""
        for record in self.pending:
            log.write(record)
        self.pending.clear()

    def close(self) -> None:
        self.steps.close()


class StepTimes:
    """Each step's own time, stamped by a thread as the step's outputs become ready."""

    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._done = threading.Condition()
        self._times: list[float | None] = []
        self._queued = self._stamped = 0
        self._last_end: float | None = None
        self._thread: threading.Thread | None = None

    def started(self, outputs, called_at: float) -> None:
        """A step was called at `called_at` (`time.perf_counter()`); `outputs` are its
        results, not waited for."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._stamp, name="vit-step-times",
                                            daemon=True)
            self._thread.start()
        self._queued += 1
        self._queue.put((outputs, called_at))

    def _stamp(self) -> None:
        import jax

        while (item := self._queue.get()) is not None:
            outputs, called_at = item
            try:
                jax.block_until_ready(outputs)
            except Exception:  # noqa: BLE001 - the loop meets the step's error itself
                seconds = None
            else:
                end = time.perf_counter()
                seconds = end - max(called_at, self._last_end or called_at)
                self._last_end = end
            with self._done:
                self._times.append(seconds)
                self._stamped += 1
                self._done.notify_all()

    def take(self) -> list[float | None]:
        """The times of the steps started since the last `take`, oldest first (None: a step
        that failed), once each is stamped: call it when the steps have finished."""
        with self._done:
            self._done.wait_for(lambda: self._stamped >= self._queued)
            times, self._times = self._times, []
        return times

    def close(self) -> None:
        """Lets the thread end once it has stamped what it holds (never waited for: a run
        that fails with steps in flight ends without them)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread = None


def run_timings(metrics_path: str | Path) -> dict:
    """The timings of the last `train` call recorded in `metrics_path`: {"process_start_s",
    "startup_s", "compile_s", "step_s": [...], "evaluations": [{"step", "seconds", "at_s"}],
    "checkpoints": [...], "exit_s", "end_at_s"}; a part not recorded is absent (or empty)."""
    from vit.training.metrics import read_metrics

    records = [r for r in read_metrics(metrics_path) if r.get("split") == SPLIT]
    starts = [i for i, r in enumerate(records) if "startup_s" in r]
    out: dict = {"step_s": [], "evaluations": [], "checkpoints": []}
    for r in records[starts[-1] if starts else 0:]:
        for key in ("process_start_s", "startup_s", "compile_s"):
            if key in r:
                out[key] = r[key]
        out["step_s"] += r.get("step_s", [])
        for key, name in (("evaluation_s", "evaluations"), ("checkpoint_s", "checkpoints")):
            if key in r:
                out[name].append({"step": r["step"], "seconds": r[key], "at_s": r["at_s"]})
        if "exit_s" in r:
            out["exit_s"], out["end_at_s"] = r["exit_s"], r["at_s"]
    return out
