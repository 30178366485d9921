"""`vit predict` and `vit.inference.predictor`: JSON lines, bad files, error exits, one compile."""

import json
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from vit.checkpoints import save_checkpoint
from vit.cli import main
from vit.images import open_image

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def checkpoint(tiny_files):
    """The tiny model as a Hugging Face folder (tests/conftest.py), classes digit0..digit9."""
    return tiny_files["hf"]


def png_bomb(path, side=40_000):
    """A PNG whose header claims side x side pixels (over the decompression-bomb limit)."""
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
                     + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("images")
    rng = np.random.RandomState(1)
    Image.fromarray(rng.randint(0, 255, (40, 50, 3), np.uint8)).save(d / "a_rgb.png")
    Image.fromarray(rng.randint(0, 255, (30, 30), np.uint8), "L").save(d / "b_gray.jpg")
    Image.fromarray(rng.randint(0, 255, (20, 35, 4), np.uint8), "RGBA").save(d / "c_rgba.png")
    Image.fromarray(rng.randint(0, 255, (33, 33, 3), np.uint8)).convert("P").save(d / "d_pal.gif")
    Image.fromarray(rng.randint(0, 65535, (25, 25)).astype(np.uint16)).save(d / "e_16bit.png")
    good = (d / "a_rgb.png").read_bytes()
    (d / "f_truncated.png").write_bytes(good[: len(good) // 2])
    (d / "g_text.jpg").write_text("not an image")
    png_bomb(d / "h_bomb.png")
    (d / "notes.txt").write_text("skipped: not an image suffix")
    sub = d / "sub"
    sub.mkdir()
    Image.fromarray(rng.randint(0, 255, (32, 32, 3), np.uint8)).save(sub / "i_nested.png")
    return d


GOOD = ["a_rgb.png", "b_gray.jpg", "c_rgba.png", "d_pal.gif", "e_16bit.png", "i_nested.png"]
BAD = ["f_truncated.png", "g_text.jpg", "h_bomb.png"]


@pytest.mark.slow
def test_predict_json_lines_with_bad_files(checkpoint, image_dir, capsys):
    code = main(["predict", str(image_dir), "--checkpoint", str(checkpoint), "--json",
                 "--top-k", "3", "--batch-size", "4"])
    out, err = capsys.readouterr()
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    by_name = {r["image"].rsplit("/", 1)[-1]: r for r in rows}
    assert sorted(by_name) == sorted(GOOD + BAD)
    for name in BAD:
        assert set(by_name[name]) == {"image", "error"} and by_name[name]["error"]
    assert "pixels" in by_name["h_bomb.png"]["error"]

    # Batching: each row equals the model applied to that image alone (a batch of 4 with
    # padding must not change anything). The independent reference is the next test.
    from vit.checkpoints import load_checkpoint

    loaded = load_checkpoint(checkpoint)
    model = loaded.build_model()
    for name in GOOD:
        row = by_name[name]
        assert set(row) == {"image", "top_k"} and len(row["top_k"]) == 3
        assert all(set(t) == {"index", "label", "prob"} for t in row["top_k"])
        x = loaded.preprocessing(open_image(row["image"]))[None]
        logits = np.asarray(model(x))[0]
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        expect = np.argsort(-probs)[:3]
        assert [t["index"] for t in row["top_k"]] == expect.tolist()
        assert [t["label"] for t in row["top_k"]] == [f"digit{i}" for i in expect]
        np.testing.assert_allclose([t["prob"] for t in row["top_k"]], probs[expect], atol=1e-5)
    assert "images/s" in err and "6 images classified, 3 failed" in err


# RGBA and 16-bit files are left out: transformers' `load_image` drops alpha and clips 16-bit
# values, where we composite on white and rescale; these four decode the same in both.
SAME_DECODING = ["a_rgb.png", "b_gray.jpg", "d_pal.gif", "i_nested.png"]


def test_predict_matches_the_transformers_pipeline_on_the_same_folder(checkpoint, image_dir,
                                                                      capsys):
    """The reference is another library end to end: transformers reads the same Hugging Face
    folder (config, weights, preprocessor_config.json) and classifies the same files."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    paths = [str(next(image_dir.rglob(name))) for name in SAME_DECODING]
    assert main(["predict", *paths, "--checkpoint", str(checkpoint), "--json", "--top-k", "10",
                 "--batch-size", "4"]) == 0
    ours = {r["image"]: r["top_k"] for r in map(json.loads, capsys.readouterr().out.splitlines())}
    classify = transformers.pipeline("image-classification", model=str(checkpoint),
                                     device="cpu")
    tops = set()
    for path in paths:
        theirs = {t["label"]: t["score"] for t in classify(path, top_k=10)}
        mine = {t["label"]: t["prob"] for t in ours[path]}
        assert sorted(mine) == sorted(theirs) == [f"digit{i}" for i in range(10)]
        np.testing.assert_allclose([mine[k] for k in sorted(mine)],
                                   [theirs[k] for k in sorted(mine)], atol=2e-5)
        assert ours[path][0]["label"] == max(theirs, key=theirs.get)
        tops.add(tuple(sorted(mine, key=mine.get)))
    assert len(tops) > 1  # the images give different rankings: the preprocessing matters


def test_predictor_compiles_once_and_labels_file(checkpoint, image_dir, tmp_path):
    from vit.images import list_images
    from vit.inference.predictor import Predictor, load_pretrained

    names = tmp_path / "names.txt"
    names.write_text("\n".join(f"n{i}" for i in range(10)) + "\n")
    model, preprocess, labels = load_pretrained(checkpoint, labels=names)
    assert labels == [f"n{i}" for i in range(10)] and preprocess.size == (8, 8)
    predictor = Predictor(model, preprocess, labels, top_k=2, batch_size=4)
    paths = list_images([image_dir / "a_rgb.png", image_dir / "sub", image_dir / "missing.png"])
    rows = list(predictor.predict_files(paths))
    assert [("error" in r) for r in rows] == [False, False, True]
    assert "no such file" in rows[2]["error"]
    list(predictor.predict_files(list_images([image_dir])))  # full and padded batches
    # One ahead-of-time compile at the fixed batch serves full and padded batches alike.
    assert predictor._compiled is not None and predictor._forward._cache_size() == 0


def run_cli(argv, capsys):
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def test_errors_are_one_line_exit_2(checkpoint, image_dir, tmp_path, capsys):
    img = str(image_dir / "a_rgb.png")
    code, err = run_cli(["predict", img, "--checkpoint", str(tmp_path / "absent")], capsys)
    assert code == 2 and len(err) == 1 and "no such file" in err[0]

    np.savez(tmp_path / "odd.npz", weights=np.zeros(3, np.float32))
    code, err = run_cli(["predict", img, "--checkpoint", str(tmp_path / "odd.npz")], capsys)
    assert code == 2 and len(err) == 1 and "embedding/kernel" in err[0]

    code, err = run_cli(["predict", img, "--checkpoint", str(checkpoint), "--set", "width=64"],
                        capsys)
    assert code == 2 and len(err) == 1 and "do not fit" in err[0]


def test_zero_head_refuses_to_predict(tmp_path, image_dir, make_tiny, capsys):
    zero = make_tiny(labels=None)  # an npz holds no class names
    zero.params["head"] = {k: np.zeros_like(v) for k, v in zero.params["head"].items()}
    save_checkpoint(zero, tmp_path / "z.npz", "npz")
    code, err = run_cli(["predict", str(image_dir / "a_rgb.png"), "--checkpoint",
                         str(tmp_path / "z.npz")], capsys)
    assert code == 2 and "all zeros" in err[-1] and "fine-tune" in err[-1]


def test_convert_cli_and_unrepresentable_exit_2(checkpoint, tmp_path, make_tiny, capsys):
    code, err = run_cli(["convert", str(checkpoint), str(tmp_path / "m.safetensors")], capsys)
    assert code == 2 and "bare .safetensors" in err[-1] and "--format timm" in err[-1]
    assert not (tmp_path / "m.safetensors").exists()
    code, _ = run_cli(["convert", str(checkpoint), str(tmp_path / "m"), "--format", "timm"],
                      capsys)
    assert code == 0 and (tmp_path / "m" / "model.safetensors").exists()
    save_checkpoint(make_tiny(classifier="gap", class_token=False, num_registers=2),
                    tmp_path / "t", "timm")
    code, err = run_cli(["convert", str(tmp_path / "t"), str(tmp_path / "hf"), "--format", "hf"],
                        capsys)
    assert code == 2 and len(err) == 1
    # the nearest type is SigLIP's (a mean over every token), which holds no registers
    assert "2 register tokens" in err[0] and "model_type siglip" in err[0]
