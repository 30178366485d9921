"""Overlays, raw maps, safe names and the HTML gallery."""

import html.parser
import urllib.parse

import numpy as np
import pytest
from PIL import Image

from vit.explanations import render
from vit.preprocess import Preprocessing

pytestmark = pytest.mark.timeout(60)


def test_overlay_png_has_the_input_size_and_puts_heat_where_the_map_is(tmp_path):
    image = Image.new("RGB", (200, 150), (128, 128, 128))
    grid = np.zeros((3, 4), np.float32)
    grid[0, 3] = 1.0  # top-right patch
    paths = render.write_explanation(tmp_path, "x", image, grid, cmap="gray", alpha=1.0)
    out = Image.open(tmp_path / paths["overlay"])
    assert out.size == (200, 150)
    a = np.asarray(out, np.float32)
    assert a[10, 190].mean() > 200 and a[140, 10].mean() < 30  # white hot spot, black elsewhere
    np.testing.assert_array_equal(np.load(tmp_path / paths["map"], allow_pickle=False), grid)


def test_alpha_zero_leaves_the_image_and_tiny_images_are_enlarged():
    digit = Image.fromarray((np.arange(64).reshape(8, 8) * 4).astype(np.uint8), "L")
    out = render.overlay(digit, np.random.default_rng(0).random((2, 2)), alpha=0.0)
    assert out.size == (128, 128)
    want = np.asarray(digit.convert("RGB").resize((128, 128), Image.NEAREST))
    np.testing.assert_array_equal(np.asarray(out), want)


def test_bilinear_upsampling_is_smooth():
    image = Image.new("RGB", (160, 160))
    grid = np.array([[0.0, 1.0]], np.float32).repeat(2, 0)
    row = np.asarray(render.overlay(image, grid, cmap="gray", alpha=1.0), np.float32)[80, :, 0]
    assert np.all(np.diff(row) >= -1) and 0 < row[80] < 255  # ramps, no step at the middle


def test_centre_crop_region_maps_back_to_the_original():
    pre = Preprocessing(size=(100, 100), crop_pct=0.5)
    left, top, right, bottom = render.seen_region(pre, (400, 200))
    assert (right - left, bottom - top) == pytest.approx((100, 100), abs=1)
    assert (left + right) / 2 == pytest.approx(200, abs=1)
    assert render.seen_region(Preprocessing(size=(8, 8)), (30, 20)) == (0, 0, 30, 20)


def test_safe_names_strip_directories_and_resolve_collisions():
    names = render.SafeNames()
    got = [names.claim(n) for n in ["../../etc/passwd", "a/cat.png", "b/cat.jpg", "CAT.png",
                                    "..", "we ird?.png", "C:\\x\\dog.png", "digits:test:3"]]
    assert got == ["passwd", "cat", "cat-1", "CAT-2", "image", "we_ird", "dog", "digits_test_3"]
    assert all("/" not in g and "\\" not in g and not g.startswith(".") for g in got)


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []

    def handle_starttag(self, tag, attrs):
        self.links += [v for k, v in attrs if k in ("src", "href")]


def test_gallery_links_all_resolve(tmp_path):
    names, entries = render.SafeNames(), []
    for i, name in enumerate(["a b.png", "x/a b.png", "<evil>&.png"]):
        stem = names.claim(name)
        img = Image.new("RGB", (8, 8), (i * 80, 0, 0))
        paths = render.write_explanation(tmp_path, stem, img, np.eye(2))
        entries.append({**paths, "caption": f"{name} pred 3 (97.0%)"})
    page = render.write_gallery(tmp_path, entries)
    parser = _Links()
    parser.feed(page.read_text())
    assert len(parser.links) == 4 * len(entries)
    for link in parser.links:
        assert not urllib.parse.urlparse(link).scheme and not link.startswith("/")
        assert (tmp_path / urllib.parse.unquote(link)).is_file(), link
    assert "<evil>" not in page.read_text()
