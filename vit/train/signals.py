"""SIGINT/SIGTERM during training: finish the step, save, stop; the same command resumes.

A preemption (SIGTERM) or a Ctrl-C should cost at most the current step, not the steps since
the last periodic checkpoint. A second Ctrl-C is the way out when saving itself hangs.
"""

from __future__ import annotations

import contextlib
import signal


class StopSignals:
    """SIGINT/SIGTERM ask the loop to save and stop; a second SIGINT interrupts at once."""

    def __init__(self):
        self.received: str | None = None  # the signal's name, once one arrived

    def _handle(self, signum, frame):
        if self.received and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name

    @contextlib.contextmanager
    def installed(self):
        """Handlers for the duration of the block; the previous ones come back after it."""
        old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
