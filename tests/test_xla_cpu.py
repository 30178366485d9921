"""The XLA:CPU compile options (vit/cpu/xla_options.py): XLA's own dots in the compiled
forward of a Predictor on CPU; XLA's dots and YNNPACK's reductions in the float32 training step,
and the memory-optimised schedule in every training step; jax's defaults when opted out,
elsewhere, or where an option is unknown."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from builders import tiny_program

from vit.cpu import xla_options
from vit.inference.predictor import Predictor

pytestmark = pytest.mark.timeout(300)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the options are XLA:CPU's")
def test_the_predictor_compiles_with_xla_dots_unless_opted_out(monkeypatch, make_tiny):
    # The arrays below are 32x32.
    loaded = make_tiny(image_size=32, patch_size=8, depth=1, num_classes=5)

    def predictor():
        return Predictor(loaded.build_model(), loaded.preprocessing, batch_size=2)

    monkeypatch.delenv(xla_options.OPT_OUT, raising=False)
    fast = predictor()
    fast.compile()
    assert "__ynn_fusion" not in fast._compiled.as_text()  # XLA's own dots
    monkeypatch.setenv(xla_options.OPT_OUT, "0")
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
    monkeypatch.delenv(xla_options.OPT_OUT, raising=False)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    lowered = Lowered()
    assert xla_options.compile_for_inference(lowered) == "compiled" and lowered.calls == [None]
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    lowered = Lowered(refuse=xla_options.INFERENCE)  # a jaxlib without the option
    assert xla_options.compile_for_inference(lowered) == "compiled"
    assert lowered.calls == [xla_options.INFERENCE, None]
    # And a real compile with an option XLA does not know still runs, on its defaults.
    monkeypatch.setattr(xla_options, "INFERENCE", {"xla_cpu_no_such_option": True})
    f = jax.jit(lambda a: jnp.tanh(a @ a))
    a = jnp.ones((8, 8))
    np.testing.assert_allclose(xla_options.compile_for_inference(f.lower(a))(a), f(a))


def ynn_fusions(hlo: str) -> dict:
    """{"dot": n, "other": m}: the YNNPACK fusions of a compiled module, with a dot or without."""
    bodies = dict(re.findall(r"\n%?([\w.\-]+) [^\n]*\{\n(.*?)\n\}", hlo, re.S))
    called = re.findall(r"kind=kCustom, calls=%?([\w.\-]+)[^\n]*__ynn_fusion", hlo)
    dots = sum(" dot(" in bodies.get(name, "") for name in called)
    return {"dot": dots, "other": len(called) - dots}


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the options are XLA:CPU's")
def test_the_training_step_takes_xla_dots_ynnpack_reductions_and_less_memory(monkeypatch):
    def compiled(dtype="float32"):
        # `vit train`'s program of a model wider than the tiny recipe's (a class token and
        # its head, batch 4): big enough for XLA to hand reductions to YNNPACK (it keeps tiny
        # ones).
        program, batch = tiny_program("input.image_size=32", "model.patch_size=8",
                                      "model.width=64", "model.num_heads=2",
                                      "model.mlp_dim=128", "model.class_token=true",
                                      "model.classifier=token", "train.batch_size=4",
                                      f"model.dtype={dtype}", num_classes=4)
        return program.compile(batch)

    monkeypatch.delenv(xla_options.OPT_OUT, raising=False)
    ours = {dtype: compiled(dtype) for dtype in ("float32", "bfloat16")}
    fast = ynn_fusions(ours["float32"].as_text())
    assert fast["dot"] == 0 and fast["other"] > 0  # XLA's dots, YNNPACK's reductions
    assert ynn_fusions(ours["bfloat16"].as_text())["dot"] > 0  # jax's fusions
    monkeypatch.setenv(xla_options.OPT_OUT, "0")
    defaults = compiled()  # opted out, the dtype changes nothing: jax's defaults
    assert ynn_fusions(defaults.as_text())["dot"] > 0
    # The memory-optimised schedule keeps fewer buffers alive at once, in either dtype.
    for dtype, ours_compiled in ours.items():
        temp = ours_compiled.memory_analysis().temp_size_in_bytes
        assert temp < defaults.memory_analysis().temp_size_in_bytes, dtype


def test_jit_options_are_none_where_this_jaxlib_refuses_them(monkeypatch):
    monkeypatch.delenv(xla_options.OPT_OUT, raising=False)
    if jax.default_backend() == "cpu":
        assert xla_options.jit_options() == {"compiler_options": xla_options.INFERENCE}
        training = xla_options.TRAINING
        assert xla_options.jit_options(training) == {"compiler_options": training}
    assert xla_options.jit_options({"xla_cpu_no_such_option": True}) == {}
    # A float32 step takes XLA's dots and YNNPACK's reductions, a narrow one jax's fusions; both
    # the memory-optimised schedule.
    assert xla_options.training_options("float32") == xla_options.TRAINING
    assert xla_options.training_options("bfloat16") == xla_options.SCHEDULE


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the options are XLA:CPU's")
@pytest.mark.parametrize("features, ynn_dots", [((), False), (("amx_bf16", "avx512_bf16"), True)])
def test_a_bfloat16_predictor_keeps_ynnpack_dots_where_the_cpu_has_bfloat16_arithmetic(
        monkeypatch, make_tiny, features, ynn_dots):
    from vit.cpu import features as cpu_features

    monkeypatch.delenv(xla_options.OPT_OUT, raising=False)
    monkeypatch.setattr(cpu_features, "cpu_bfloat16_features", lambda: features)
    loaded = make_tiny(image_size=32, patch_size=8, depth=1, num_classes=5, dtype="bfloat16")
    narrow = Predictor(loaded.build_model(), loaded.preprocessing, batch_size=2)
    narrow.compile()
    assert narrow.dtype == "bfloat16"
    assert (ynn_fusions(narrow._compiled.as_text())["dot"] > 0) == ynn_dots
    # float32 keeps XLA's own dots whatever the CPU.
    wide = make_tiny(image_size=32, patch_size=8, depth=1, num_classes=5)
    wide = Predictor(wide.build_model(), wide.preprocessing, batch_size=2)
    wide.compile()
    assert "__ynn_fusion" not in wide._compiled.as_text()
    x = np.random.RandomState(1).randn(2, 32, 32, 3).astype(np.float32)
    p_narrow, p_wide = narrow.predict_arrays(x)[0], wide.predict_arrays(x)[0]  # top-k probs
    assert np.ptp(p_wide) > 0.01  # not a constant model
    np.testing.assert_allclose(p_narrow, p_wide, atol=0.02)  # bfloat16's error, no more
    assert xla_options.inference_options("float32") == xla_options.INFERENCE
    assert (xla_options.inference_options("bfloat16") == {}) == ynn_dots
