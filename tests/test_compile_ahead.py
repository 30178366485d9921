"""`CompiledAhead`: a training run's validation forward compiles in a thread while the steps
compile and run; its first call must run that executable (no second compile) and give what
the jitted function gives, and any other call must still work."""

import uuid

import jax
import numpy as np
from jax._src import dispatch

from vit.inference.evaluate import CompiledAhead

COMPILES = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, seconds, **_: COMPILES.append(event)
    if event == dispatch.BACKEND_COMPILE_EVENT else None)


def _fresh_function():
    """A jitted affine map with a constant no other program has: never in the compile cache."""
    k = 1.0 + (uuid.uuid4().int % 10_000) / 8.0
    return k, jax.jit(lambda x: x * k + 1.0)


def test_the_first_call_runs_the_executable_compiled_ahead():
    k, jitted = _fresh_function()
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    before = len(COMPILES)
    ahead = CompiledAhead(jitted, lambda: (jax.ShapeDtypeStruct(x.shape, x.dtype),))
    ahead.wait()
    assert len(COMPILES) == before + 1  # compiled in the thread
    np.testing.assert_allclose(np.asarray(ahead(x)), x * np.float32(k) + 1, rtol=1e-6)
    assert len(COMPILES) == before + 1  # ... and not again at the call
    y = np.ones((5, 3), np.float32)  # another shape: compiled as the jitted function would
    np.testing.assert_allclose(np.asarray(ahead(y)), y * np.float32(k) + 1, rtol=1e-6)
    assert len(COMPILES) == before + 2


def test_a_compile_ahead_that_fails_leaves_the_call_to_the_jitted_function():
    k, jitted = _fresh_function()

    def no_batch():
        raise StopIteration("an empty validation source")

    ahead = CompiledAhead(jitted, no_batch)
    x = np.full((2, 2), 3.0, np.float32)
    np.testing.assert_allclose(np.asarray(ahead(x)), x * np.float32(k) + 1, rtol=1e-6)
