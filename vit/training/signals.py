"""SIGINT/SIGTERM during training: finish the step, save, stop; the same command resumes.

A preemption (SIGTERM) or a Ctrl-C should cost at most the current step, not the steps since
the last periodic checkpoint. A second Ctrl-C is the way out when saving itself hangs. In the
`vit train` command (`ending_process_on_second_interrupt`) it ends the process at once, after one
line: unwinding instead would interrupt orbax's save threads mid-write, and they print their
tracebacks (or crash the interpreter at exit) after ours. Orbax writes a step under a temporary
name and renames it when complete, so the last finished checkpoint is intact, the unfinished
one is invisible (the next run clears it), and the kernel releases the workdir's lock. Called
from Python, `train` raises KeyboardInterrupt instead, leaving the caller's process alive.

With several processes every one must save the same step, or the collective save waits
forever. There SIGTERM is left to JAX's preemption service (`jax.distributed` listens for it
and agrees on a step with every process); `StopSignals.check(step)` asks it, a local call
that never waits on the devices. A Ctrl-C in a multi-process run interrupts at once, without
saving: one process alone cannot save.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable

import jax
from jax.experimental import multihost_utils

_END_PROCESS = {"on": False}


@contextlib.contextmanager
def ending_process_on_second_interrupt():
    """For `vit train`: inside the block a second Ctrl-C (a first one with several processes)
    ends the process at once with exit code 130 (see the module)."""
    _END_PROCESS["on"] = True
    try:
        yield
    finally:
        _END_PROCESS["on"] = False


class StopSignals:
    """SIGINT/SIGTERM ask the loop to save and stop; a second SIGINT interrupts at once.
    `kept()` says which checkpoint survives an interruption, for its line."""

    def __init__(self, kept: Callable[[], str] | None = None):
        self.received: str | None = None  # the signal's name, once one arrived
        self.synced = jax.process_count() > 1
        self.kept = kept

    def _handle(self, signum, frame):
        if (self.received or self.synced) and signum == signal.SIGINT:
            if _END_PROCESS["on"]:
                self._end_process()
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name

    def _end_process(self) -> None:
        kept = ""
        with contextlib.suppress(Exception):  # a line without it beats no line
            kept = f"; {self.kept()}" if self.kept else ""
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        lead = "\n" if sys.stderr.isatty() else ""  # past a progress bar's line
        os.write(2, f"{lead}vit train: interrupted, stopped without saving{kept}\n".encode())
        os._exit(128 + signal.SIGINT)

    def check(self, step: int) -> str | None:
        """The signal to stop on after `step`, the same on every process; None to go on."""
        if self.synced and not self.received and \
                multihost_utils.reached_preemption_sync_point(step):
            self.received = "SIGTERM"
        return self.received

    @contextlib.contextmanager
    def installed(self):
        """Handlers for the duration of the block; the previous ones come back after it."""
        if threading.current_thread() is not threading.main_thread():
            yield self  # signals reach only the main thread (vit.train from a worker thread)
            return
        signals = (signal.SIGINT,) if self.synced else (signal.SIGINT, signal.SIGTERM)
        old = {s: signal.signal(s, self._handle) for s in signals}
        try:
            yield self
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
