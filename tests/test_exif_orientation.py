"""Photos the right way up: a file whose pixels are stored turned, with an EXIF orientation tag
saying so (as a phone writes a portrait photo), reads, predicts and explains as the upright
file does, in every reader of image files."""

import io
import json

import numpy as np
import pytest
from PIL import Image

from vit.cli import main
from vit.data import open_source
from vit.images import ORIENTATION, open_image

pytestmark = pytest.mark.timeout(300)

# The stored pixels for each tag, from the upright ones (EXIF 2.3: the transform that displays
# the stored image upright is the inverse of these).
STORED = {
    2: lambda a: a[:, ::-1],              # mirrored left-right
    3: lambda a: np.rot90(a, 2),          # upside down
    4: lambda a: a[::-1],                 # mirrored top-bottom
    5: lambda a: np.transpose(a, (1, 0, 2)),  # transposed
    6: lambda a: np.rot90(a, 1),          # turned 90 degrees anticlockwise: shown turned back
    7: lambda a: np.rot90(a, 2).transpose(1, 0, 2),  # transverse
    8: lambda a: np.rot90(a, -1),         # turned 90 degrees clockwise
}


def upright_pixels(h=24, w=40) -> np.ndarray:
    """A smooth, asymmetric picture (a ramp, and a bright block in the top-left corner): JPEG
    keeps it almost exactly, and every turn or mirror of it is a different picture."""
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([x * 255 // (w - 1), y * 255 // (h - 1), (x + y) * 255 // (h + w - 2)], -1)
    a[: h // 3, : w // 4] = (250, 250, 40)
    return a.astype(np.uint8)


def save(path, pixels, orientation=None, **kw):
    exif = Image.Exif()
    if orientation is not None:
        exif[ORIENTATION] = orientation
    Image.fromarray(np.ascontiguousarray(pixels)).save(path, exif=exif.tobytes(), **kw)


JPEG = dict(quality=100, subsampling=0)


@pytest.mark.parametrize("orientation", sorted(STORED))
@pytest.mark.parametrize("fmt", ["png", "jpg"])
def test_open_image_turns_a_tagged_file_upright(tmp_path, orientation, fmt):
    up = upright_pixels()
    kw = JPEG if fmt == "jpg" else {}
    save(tmp_path / f"up.{fmt}", up, **kw)
    save(tmp_path / f"tagged.{fmt}", STORED[orientation](up), orientation, **kw)
    stored = np.asarray(Image.open(tmp_path / f"tagged.{fmt}"))
    assert stored.shape != up.shape or not np.array_equal(stored, up)  # the file really is turned
    got = np.asarray(open_image(tmp_path / f"tagged.{fmt}"), np.int16)
    want = np.asarray(open_image(tmp_path / f"up.{fmt}"), np.int16)
    assert got.shape == want.shape == up.shape
    assert np.abs(got - want).max() <= (0 if fmt == "png" else 3)
    if fmt == "png":
        np.testing.assert_array_equal(got, up)


def test_open_image_leaves_untagged_and_badly_tagged_files_as_stored(tmp_path):
    up = upright_pixels()
    save(tmp_path / "one.png", up, 1)  # orientation 1: as stored
    np.testing.assert_array_equal(open_image(tmp_path / "one.png"), up)
    save(tmp_path / "odd.png", up, 99)  # not an orientation: the pixels as stored
    np.testing.assert_array_equal(open_image(tmp_path / "odd.png"), up)
    buf = io.BytesIO()  # a file object (encoded TFDS records come this way) is turned too
    save(buf, STORED[6](up), 6, format="PNG")
    buf.seek(0)
    np.testing.assert_array_equal(open_image(buf), up)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """`up.png` and the same picture stored turned with a tag, as PNG and as JPEG (quality 100,
    no chroma subsampling; its upright twin is a JPEG too, so both carry the same losses)."""
    d = tmp_path_factory.mktemp("photos")
    up = upright_pixels()
    save(d / "up.png", up)
    save(d / "turned6.png", STORED[6](up), 6)
    save(d / "turned8.png", STORED[8](up), 8)
    save(d / "up.jpg", up, **JPEG)
    save(d / "turned6.jpg", STORED[6](up), 6, **JPEG)
    save(d / "ignored.png", STORED[6](up))  # the turned pixels with no tag: a different picture
    return d


def predict(files, checkpoint, capsys):
    assert main(["predict", *map(str, files), "--checkpoint", str(checkpoint), "--json",
                 "--top-k", "10"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return {r["image"].rsplit("/", 1)[-1]: {t["index"]: t["prob"] for t in r["top_k"]}
            for r in rows}


def test_predict_gives_a_tagged_photo_the_upright_photos_answer(tiny_files, photos, capsys):
    names = ["up.png", "turned6.png", "turned8.png", "up.jpg", "turned6.jpg", "ignored.png"]
    probs = predict([photos / n for n in names], tiny_files["hf"], capsys)

    def vec(name):
        return np.array([probs[name][i] for i in range(10)])

    np.testing.assert_allclose(vec("turned6.png"), vec("up.png"), atol=1e-6)
    np.testing.assert_allclose(vec("turned8.png"), vec("up.png"), atol=1e-6)
    np.testing.assert_allclose(vec("turned6.jpg"), vec("up.jpg"), atol=2e-3)
    # The test can fail: the same pixels read as stored give another answer.
    assert np.abs(vec("ignored.png") - vec("up.png")).max() > 1e-3


def test_rollout_maps_a_tagged_photo_as_the_upright_photo(tiny_files, photos, tmp_path):
    out = tmp_path / "out"
    files = [photos / n for n in ("up.png", "turned6.png", "turned8.png", "ignored.png")]
    assert main(["rollout", *map(str, files), "--checkpoint", str(tiny_files["orbax"]),
                 "--out", str(out)]) == 0
    rows = {r["image"].rsplit("/", 1)[-1]: r for r in map(
        json.loads, (out / "manifest.jsonl").read_text().splitlines())}
    maps = {name: np.load(out / row["map"], allow_pickle=False) for name, row in rows.items()}
    for name in ("turned6.png", "turned8.png"):
        np.testing.assert_allclose(maps[name], maps["up.png"], atol=1e-6)
        assert rows[name]["pred"] == rows["up.png"]["pred"]
        # The overlay is drawn on the upright picture: its shape is the upright one's.
        assert Image.open(out / rows[name]["overlay"]).size == Image.open(
            out / rows["up.png"]["overlay"]).size
    assert not np.allclose(maps["ignored.png"], maps["up.png"], atol=1e-4)


def test_an_image_folder_dataset_reads_tagged_photos_upright(tmp_path):
    up = upright_pixels()
    (tmp_path / "a").mkdir()
    save(tmp_path / "a" / "0_up.png", up)
    save(tmp_path / "a" / "1_turned.jpg", STORED[8](up), 8, **JPEG)
    source = open_source(str(tmp_path), "train", val_fraction=0.0, strict=True)
    assert [p.name for p in source.files] == ["0_up.png", "1_turned.jpg"]
    first, second = (source[i]["image"].astype(np.int16) for i in range(2))
    assert second.shape == first.shape == up.shape
    assert np.abs(second - first).max() <= 3
