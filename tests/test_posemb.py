"""Position-embedding resize: each checkpoint family's convention against its own reference."""

import numpy as np
import pytest
import scipy.ndimage

from vit.models import posemb

pytestmark = pytest.mark.timeout(120)


def grid(h, w, d=5, seed=0):
    return np.random.default_rng(seed).normal(size=(h, w, d)).astype(np.float32)


@pytest.mark.parametrize("method", posemb.METHODS)
def test_same_size_is_identity(method):
    g = grid(7, 7)
    np.testing.assert_array_equal(posemb.resize_grid(g, (7, 7), method), g)
    pe = np.random.default_rng(1).normal(size=(1, 1 + 49, 5)).astype(np.float32)
    assert posemb.resize_posemb(pe, (7, 7), (7, 7), 1, method) is pe


@pytest.mark.parametrize("old,new", [((14, 14), (24, 24)), ((7, 7), (3, 5)), ((4, 6), (9, 8))])
def test_linear_matches_scipy_zoom_order1(old, new):
    g = grid(*old)
    zoom = (new[0] / old[0], new[1] / old[1], 1)
    expected = scipy.ndimage.zoom(g, zoom, order=1)
    assert expected.shape[:2] == new
    np.testing.assert_allclose(posemb.resize_grid(g, new, "linear"), expected, atol=1e-5)


@pytest.mark.parametrize("old,new", [((14, 14), (24, 24)), ((7, 7), (3, 5)), ((4, 6), (9, 8))])
def test_bicubic_matches_torch_interpolate(old, new):
    torch = pytest.importorskip("torch")
    g = grid(*old)
    t = torch.from_numpy(g).permute(2, 0, 1)[None]
    expected = torch.nn.functional.interpolate(t, size=new, mode="bicubic", align_corners=False)
    expected = expected[0].permute(1, 2, 0).numpy()
    np.testing.assert_allclose(posemb.resize_grid(g, new, "bicubic"), expected, atol=1e-5)


def reference_resize(grid_emb, new, method):
    """The source libraries' own resize, for the expectations below."""
    if method == "linear":
        zoom = (new[0] / grid_emb.shape[0], new[1] / grid_emb.shape[1], 1)
        return scipy.ndimage.zoom(grid_emb, zoom, order=1)
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(np.ascontiguousarray(grid_emb)).permute(2, 0, 1)[None]
    out = torch.nn.functional.interpolate(t, size=new, mode="bicubic", align_corners=False,
                                          antialias=method == "bicubic_antialias")
    return out[0].permute(1, 2, 0).numpy()


@pytest.mark.parametrize("method", posemb.METHODS)
def test_prefix_rows_kept_apart(method):
    pe = np.random.default_rng(2).normal(size=(1, 2 + 16, 3)).astype(np.float32)
    out = posemb.resize_posemb(pe, (4, 4), (6, 2), num_prefix=2, method=method)
    assert out.shape == (1, 2 + 12, 3)
    np.testing.assert_array_equal(out[:, :2], pe[:, :2])
    expected = reference_resize(pe[0, 2:].reshape(4, 4, 3), (6, 2), method).reshape(1, 12, 3)
    np.testing.assert_allclose(out[:, 2:], expected, atol=1e-5)


def test_sincos_matches_formula():
    pe = np.asarray(posemb.sincos_2d((3, 4), 8))
    assert pe.shape == (1, 12, 8)
    # Token (y=2, x=1) is row 9; omega = [1, 1/10000].
    omega = np.array([1.0, 1e-4])
    expected = np.concatenate([np.sin(1 * omega), np.cos(1 * omega),
                               np.sin(2 * omega), np.cos(2 * omega)])
    np.testing.assert_allclose(pe[0, 9], expected, rtol=1e-6)
