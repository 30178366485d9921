"""SIGINT/SIGTERM during training: finish the step, save, stop; the same command resumes.

A preemption (SIGTERM) or a Ctrl-C should cost at most the current step, not the steps since
the last periodic checkpoint. A second Ctrl-C is the way out when saving itself hangs.

With several processes every one must save the same step, or the collective save waits
forever. There SIGTERM is left to JAX's preemption service (`jax.distributed` listens for it
and agrees on a step with every process); `StopSignals.check(step)` asks it, a local call
that never waits on the devices. A Ctrl-C in a multi-process run interrupts at once, without
saving: one process alone cannot save.
"""

from __future__ import annotations

import contextlib
import signal

import jax
from jax.experimental import multihost_utils


class StopSignals:
    """SIGINT/SIGTERM ask the loop to save and stop; a second SIGINT interrupts at once."""

    def __init__(self):
        self.received: str | None = None  # the signal's name, once one arrived
        self.synced = jax.process_count() > 1

    def _handle(self, signum, frame):
        if (self.received or self.synced) and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name

    def check(self, step: int) -> str | None:
        """The signal to stop on after `step`, the same on every process; None to go on."""
        if self.synced and not self.received and \
                multihost_utils.reached_preemption_sync_point(step):
            self.received = "SIGTERM"
        return self.received

    @contextlib.contextmanager
    def installed(self):
        """Handlers for the duration of the block; the previous ones come back after it."""
        signals = (signal.SIGINT,) if self.synced else (signal.SIGINT, signal.SIGTERM)
        old = {s: signal.signal(s, self._handle) for s in signals}
        try:
            yield self
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
