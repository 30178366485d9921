"""`import vit` switches XLA:CPU to its own dot emitter (vit/xla_cpu.py): where, and only where,
it was measured, never over a user's flag, and really in the compiled program."""

import importlib.metadata
import os
import subprocess
import sys

import pytest

from vit import xla_cpu

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def env(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.delenv(xla_cpu.OPT_OUT, raising=False)
    return monkeypatch


def test_the_flag_is_added_only_where_it_was_measured_and_never_over_yours(env):
    measured = importlib.metadata.version("jaxlib").startswith(xla_cpu.MEASURED_JAXLIB)
    assert xla_cpu.use_xla_dots() is measured
    assert (os.environ.get("XLA_FLAGS") == xla_cpu.FLAG) is measured
    assert xla_cpu.use_xla_dots() is False  # already there: not added twice
    env.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT")
    assert xla_cpu.use_xla_dots() is False  # the user's own setting stands
    env.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    env.setenv(xla_cpu.OPT_OUT, "0")
    assert xla_cpu.use_xla_dots() is False
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"
    env.delenv(xla_cpu.OPT_OUT)
    env.setattr(importlib.metadata, "version", lambda name: "0.99.0")  # an unmeasured jaxlib
    assert xla_cpu.use_xla_dots() is False


PROGRAM = """
import vit, jax, jax.numpy as jnp
x = jnp.ones((64, 64))
text = jax.jit(lambda a: jnp.tanh(a @ a)).lower(x).compile().as_text()
print("__ynn_fusion" in text)
"""


@pytest.mark.skipif(not importlib.metadata.version("jaxlib").startswith(
    xla_cpu.MEASURED_JAXLIB), reason="the flag is only set on the jaxlib it was measured on")
def test_a_fresh_process_compiles_without_ynnpack_fusions_unless_told_otherwise():
    def ynn_in_program(**extra):
        env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", xla_cpu.OPT_OUT)}
        out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                             env={**env, "JAX_PLATFORMS": "cpu", **extra}, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.strip().splitlines()[-1] == "True"

    assert not ynn_in_program()  # vit's default: XLA's own dots
    assert ynn_in_program(**{xla_cpu.OPT_OUT: "0"})  # jax's default, as the opt-out promises
