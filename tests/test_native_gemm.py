"""scripts/native_gemm.py, the experiment that hands the float32 step's layer products to MKL:
its reading of a layer's einsum as one 2-D product (with the transposes the layouts ask for)
must give `jnp.einsum`'s values and gradients. The layout part runs everywhere (the 2-D product
a plain `@`); the MKL call itself only where `pip install mkl` and a C++ compiler are present."""

import importlib.util
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
# The specs the model's layers issue (vit/models/blocks.py), both attention layouts.
SPECS = [("aby,yz->abz", (2, 5, 8), (8, 6)),
         ("bnc,chd->bhnd", (2, 5, 8), (8, 3, 4)),
         ("bnc,chd->bnhd", (2, 5, 8), (8, 3, 4)),
         ("bhnd,hdc->bnc", (2, 3, 5, 4), (3, 4, 8)),
         ("bnhd,hdc->bnc", (2, 5, 3, 4), (3, 4, 8))]


@pytest.fixture(scope="module")
def native():
    path = ROOT / "scripts" / "native_gemm.py"
    spec = importlib.util.spec_from_file_location("native_gemm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check(native, product, spec, xs, ks):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal(xs), jnp.float32)
    k = jnp.asarray(rng.standard_normal(ks), jnp.float32)

    out_shape = jnp.einsum(spec, x, k).shape
    # A weighted sum: a plain one would not see the output's layout.
    weights = jnp.asarray(rng.standard_normal(out_shape), jnp.float32)

    def ours(x, k):
        return jnp.sum(jnp.sin(native.einsum(spec, x, k, product)) * weights)

    def reference(x, k):
        return jnp.sum(jnp.sin(jnp.einsum(spec, x, k, precision="highest")) * weights)

    got = jax.jit(jax.value_and_grad(ours, (0, 1)))(x, k)
    want = jax.value_and_grad(reference, (0, 1))(x, k)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert float(jnp.abs(w).max()) > 0.1  # the comparison compares something
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("spec", "xs", "ks"), SPECS)
def test_a_layers_product_as_one_2d_product(native, spec, xs, ks):
    _check(native, lambda a, b: jnp.matmul(a, b, precision="highest"), spec, xs, ks)


def test_not_a_layers_product_is_refused(native):
    with pytest.raises(ValueError, match="not a layer's product"):
        native.einsum("bij,bjk->bik", jnp.ones((2, 3, 4)), jnp.ones((2, 4, 5)), jnp.matmul)


def _mkl_present(native) -> bool:
    try:
        native.mkl_runtime()
    except SystemExit:
        return False
    return shutil.which("g++") is not None


@pytest.mark.parametrize(("spec", "xs", "ks"), SPECS)
def test_the_mkl_product_and_its_gradients(native, spec, xs, ks):
    if not _mkl_present(native):
        pytest.skip("MKL's runtime (pip install mkl) or g++ not here")
    native._register()
    _check(native, native._product(), spec, xs, ks)
