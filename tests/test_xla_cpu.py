"""The inference compile options (vit/inference/xla_cpu.py): XLA's own dots in the compiled
forward of a Predictor on CPU, jax's defaults when opted out, elsewhere, or where an option is
unknown."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit.inference import xla_cpu
from vit.inference.predictor import Predictor

pytestmark = pytest.mark.timeout(300)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the options are XLA:CPU's")
def test_the_predictor_compiles_with_xla_dots_unless_opted_out(monkeypatch, make_tiny):
    # The arrays below are 32x32.
    loaded = make_tiny(image_size=32, patch_size=8, depth=1, num_classes=5)

    def predictor():
        return Predictor(loaded.build_model(), loaded.preprocessing, batch_size=2)

    monkeypatch.delenv(xla_cpu.OPT_OUT, raising=False)
    fast = predictor()
    fast.compile()
    assert "__ynn_fusion" not in fast._compiled.as_text()  # XLA's own dots
    monkeypatch.setenv(xla_cpu.OPT_OUT, "0")
    default = predictor()
    default.compile()
    assert "__ynn_fusion" in default._compiled.as_text()  # jax's default, as promised
    x = np.random.RandomState(1).randn(2, 32, 32, 3).astype(np.float32)
    for got, want in zip(fast.predict_arrays(x), default.predict_arrays(x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class Lowered:
    """Records the options each compile was asked for; refuses the ones in `refuse`."""

    def __init__(self, refuse=()):
        self.calls, self.refuse = [], refuse

    def compile(self, options=None):
        self.calls.append(options)
        if options and set(options) & set(self.refuse):
            raise ValueError("INVALID_ARGUMENT: no such option")
        return "compiled"


def test_no_options_on_other_backends_and_defaults_where_an_option_is_unknown(monkeypatch):
    monkeypatch.delenv(xla_cpu.OPT_OUT, raising=False)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    lowered = Lowered()
    assert xla_cpu.compile_for_inference(lowered) == "compiled" and lowered.calls == [None]
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    lowered = Lowered(refuse=xla_cpu.OPTIONS)  # a jaxlib without the option
    assert xla_cpu.compile_for_inference(lowered) == "compiled"
    assert lowered.calls == [xla_cpu.OPTIONS, None]
    # And a real compile with an option XLA does not know still runs, on its defaults.
    monkeypatch.setattr(xla_cpu, "OPTIONS", {"xla_cpu_no_such_option": True})
    f = jax.jit(lambda a: jnp.tanh(a @ a))
    a = jnp.ones((8, 8))
    np.testing.assert_allclose(xla_cpu.compile_for_inference(f.lower(a))(a), f(a))
