"""Memory figures, measured one way for every benchmark that records them.

- `peak_rss_bytes`: the process's peak resident set (host memory, whatever allocated it);
- `device_peak_bytes`: each local device's peak allocation, where the backend counts it (GPU,
  TPU; XLA:CPU does not, and its allocations are in the resident set);
- `compiled_bytes`: what XLA's buffer assignment gives a compiled program, without running it.
"""

from __future__ import annotations

import resource
import sys


def peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux counts KiB


def device_peak_bytes() -> dict[str, int] | None:
    """{device: peak bytes in use}, or None where the backend keeps no count."""
    import jax

    peaks = {}
    for device in jax.local_devices():
        stats = device.memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            peaks[str(device)] = int(stats["peak_bytes_in_use"])
    return peaks or None


def probe() -> dict:
    """Both peaks so far in this process: what a worker reports once its measurement is done."""
    return {"peak_rss_bytes": peak_rss_bytes(), "device_peak_bytes": device_peak_bytes()}


def compiled_bytes(compiled) -> dict:
    """A compiled program's buffers (`jax.jit(f).lower(...).compile()`): temporaries, outputs
    and arguments, in bytes."""
    stats = compiled.memory_analysis()
    return {"temp_bytes": int(stats.temp_size_in_bytes),
            "output_bytes": int(stats.output_size_in_bytes),
            "argument_bytes": int(stats.argument_size_in_bytes)}

