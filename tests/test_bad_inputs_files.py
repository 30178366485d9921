"""Damaged or ill-typed checkpoint files and inputs: one line naming the file and the fix, exit 2,
no traceback, nothing left behind (as tests/test_bad_inputs.py, for what lies inside the files).

Covers an orbax checkpoint that was copied in part (its params emptied, _METADATA or the OCDBT
manifest gone, chunk files cut short), a labels file that is not UTF-8, empty or broken .npz
files, Hugging Face and timm JSON configs whose fields have the wrong type, and images above the
pixel limit.
"""

import json
import shutil
import struct
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vit.cli import main
from vit.errors import CheckpointError, ConfigError, DataError
from vit.preprocess import Preprocessing

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).parent.parent
RECIPE = str(ROOT / "configs" / "digits.py")


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_files):
    """The tiny checkpoint as an orbax export ("ckpt") and its Hugging Face and timm copies,
    and an 8x8 image."""
    root = tmp_path_factory.mktemp("files")
    for name, fmt in (("ckpt", "orbax"), ("hf", "hf"), ("timm", "timm")):
        shutil.copytree(tiny_files[fmt], root / name)
    Image.new("RGB", (8, 8), (10, 200, 30)).save(root / "img.png")
    return root


@pytest.fixture
def check_refused(run_vit, file_tree):
    """-> refused(argv, where, *names): runs `vit argv` in-process; the last stderr line must
    be the command's one error line naming each of `names`, and `where` must be left as it
    was. Returns that line."""
    def refused(argv: list[str], where: Path, *names: str) -> str:
        before = file_tree(where)
        code, err = run_vit(argv)
        assert code == 2, err
        assert not any("Traceback" in line for line in err), err
        assert err and err[-1].startswith(f"vit {argv[0]}: error:"), err
        for name in names:
            assert name in err[-1], err[-1]
        assert file_tree(where) == before, "partial output left behind, or an input changed"
        return err[-1]

    return refused


# -- an orbax checkpoint copied in part ------------------------------------------------------------
def _empty_params(step: Path) -> None:
    for child in (step / "params").iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()


def _no_metadata(step: Path) -> None:
    (step / "params" / "_METADATA").unlink()


def _no_manifest(step: Path) -> None:
    for manifest in (step / "params").rglob("manifest.ocdbt"):
        manifest.unlink()


def _chunks(step: Path) -> list[Path]:
    chunks = [f for f in (step / "params").rglob("*") if f.is_file() and f.parent.name == "d"]
    assert chunks
    return sorted(chunks, key=lambda f: f.stat().st_size)


def _cut_in_half(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _truncated_chunks(step: Path) -> None:  # the tree metadata is damaged too
    for chunk in _chunks(step):
        _cut_in_half(chunk)


def _truncated_array_chunk(step: Path) -> None:  # the tree reads, an array read fails
    _cut_in_half(_chunks(step)[-1])


DAMAGE = {"params-emptied": _empty_params, "metadata-removed": _no_metadata,
          "manifest-removed": _no_manifest, "chunks-truncated": _truncated_chunks,
          "array-chunk-truncated": _truncated_array_chunk}


def _damaged(files: Path, tmp_path: Path, damage: str) -> Path:
    step = tmp_path / "inputs" / f"ckpt_{damage}"
    shutil.copytree(files / "ckpt", step)
    DAMAGE[damage](step)
    return step


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_orbax_checkpoint_is_one_line(damage, files, tmp_path, monkeypatch, check_refused):
    step = _damaged(files, tmp_path, damage)
    monkeypatch.chdir(tmp_path)
    line = check_refused(["predict", str(files / "img.png"), "--checkpoint", str(step),
                          "--no-cache"], tmp_path, str(step))
    assert "incomplete or damaged" in line and "copy it again" in line, line


def test_failed_orbax_read_leaves_no_thread_errors(files, tmp_path, monkeypatch, capfd):
    """When one chunk read fails, the reads still in flight end without "Event loop is closed"
    errors from tensorstore's threads (printed after the one-line error before), and the next
    read of a good copy works."""
    from vit.checkpoints import load_checkpoint

    errors = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: errors.append(repr(u.exc_value)))
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, tb: errors.append(repr(value)))
    steps = [_damaged(files, tmp_path, d) for d in ("chunks-truncated", "array-chunk-truncated")]
    for _ in range(3):  # each failure may leave such errors behind
        for step in steps:
            with pytest.raises(CheckpointError, match="incomplete or damaged"):
                load_checkpoint(step)
        assert load_checkpoint(files / "ckpt").config.num_classes == 10
    err = capfd.readouterr().err
    assert not errors and "Event loop is closed" not in err, (errors, err)


@pytest.mark.parametrize("command", ["eval", "rollout", "convert", "train"])
def test_every_command_refuses_a_damaged_orbax_checkpoint(command, files, tmp_path,
                                                          monkeypatch, check_refused):
    step = _damaged(files, tmp_path, "params-emptied")
    out = tmp_path / "out"
    argv = {"eval": f"eval --checkpoint {step} --data digits --out {out}",
            "rollout": f"rollout {files / 'img.png'} --checkpoint {step} --out {out}",
            "convert": f"convert {step} {out} --format timm",
            "train": f"train --config {RECIPE} --workdir {out} --init {step}"}[command]
    monkeypatch.chdir(tmp_path)
    check_refused(argv.split(), tmp_path, str(step), "copy it again")


def test_damaged_step_in_a_workdir_is_named(files, tmp_path, monkeypatch, check_refused):
    workdir = tmp_path / "run"
    shutil.copytree(files / "ckpt", workdir / "checkpoints" / "4")
    _empty_params(workdir / "checkpoints" / "4")
    monkeypatch.chdir(tmp_path)
    check_refused(["predict", str(files / "img.png"), "--checkpoint", str(workdir),
                   "--no-cache"], tmp_path, str(workdir / "checkpoints" / "4"))


# -- a labels file that is not UTF-8 ---------------------------------------------------------------
def test_labels_file_not_utf8_is_one_line(files, tmp_path, monkeypatch, check_refused):
    labels = tmp_path / "labels.txt"
    labels.write_bytes(b"\xff\xfe\x00bad\n" * 10)
    monkeypatch.chdir(tmp_path)
    line = check_refused(["predict", str(files / "img.png"), "--checkpoint",
                          str(files / "ckpt"), "--labels", str(labels), "--no-cache"],
                         tmp_path, "--labels", str(labels))
    assert "UTF-8" in line, line


# -- .npz files that are empty, cut short or not archives ------------------------------------------
def _npz_variants(tmp_path: Path) -> dict[str, Path]:
    """Files named .npz that are not whole archives of arrays."""
    tmp_path.mkdir(exist_ok=True)
    good = tmp_path / "good.npz"
    np.savez(good, tokens=np.zeros((2, 3, 4), np.float32), mask=np.ones((2, 3), bool))
    compressed = tmp_path / "compressed.npz"
    np.savez_compressed(compressed, tokens=np.random.default_rng(0).normal(size=(2, 3, 4)),
                        mask=np.ones((2, 3), bool))
    data = bytearray(compressed.read_bytes())
    with zipfile.ZipFile(compressed) as archive:
        info = archive.getinfo("tokens.npy")
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26:
                                                    info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len
    data[start:start + 16] = b"\xff" * 16  # the deflate stream of tokens.npy, damaged
    variants = {"empty": b"", "garbage": b"not a zip at all" * 8,
                "truncated": good.read_bytes()[:-40], "bad-deflate": bytes(data)}
    out = {}
    for name, content in variants.items():
        out[name] = tmp_path / f"{name}.npz"
        out[name].write_bytes(content)
    out["npy"] = tmp_path / "npy.npz"
    with open(out["npy"], "wb") as f:  # a bare array: np.load returns an ndarray
        np.save(f, np.zeros(3))
    return out


def test_broken_npz_checkpoints_are_one_line(files, tmp_path, monkeypatch, check_refused):
    monkeypatch.chdir(tmp_path)
    for path in _npz_variants(tmp_path / "inputs").values():
        check_refused(["predict", str(files / "img.png"), "--checkpoint", str(path),
                       "--no-cache"], tmp_path, str(path))


def test_broken_text_embeddings_are_a_data_error(tmp_path):
    from vit.inference.prompts import load_text_embeddings

    config = types.SimpleNamespace(text=types.SimpleNamespace(
        source="embeddings", embed_dim=4, similarity_dim=0))
    variants = _npz_variants(tmp_path)
    for path in variants.values():
        with pytest.raises(DataError, match=f"--text-embeddings {path}: not a readable .npz"):
            load_text_embeddings(config, path)
    with pytest.raises(DataError, match="no such file"):
        load_text_embeddings(config, tmp_path / "missing.npz")
    # The same reader still takes a good file.
    prompts = load_text_embeddings(config, tmp_path / "good.npz")
    assert prompts.text.shape == (2, 3, 4) and prompts.mask.all()


# -- JSON configs whose fields have the wrong type -------------------------------------------------
def _edit_json(file: Path, **fields) -> None:
    value = json.loads(file.read_text()) if file.exists() else {}
    for key, field in fields.items():
        if "." in key:
            outer, inner = key.split(".")
            value[outer][inner] = field
        else:
            value[key] = field
    file.write_text(json.dumps(value))


HF_PREPROCESSOR = [  # (fields of preprocessor_config.json, the field the error must name)
    ({"image_mean": "x"}, "image_mean"),
    ({"image_std": [0.5, "a", 0.5]}, "image_std"),
    ({"size": -3}, "size"),
    ({"size": "8"}, "size"),
    ({"size": {"height": "x", "width": 8}}, "size.height"),
    ({"size": {"height": 8}}, "size"),
    ({"do_center_crop": True, "crop_size": {"shortest_edge": 8}}, "crop_size"),
    ({"rescale_factor": "x"}, "rescale_factor"),
    ({"resample": [2]}, "resample"),
    ({"image_std": [0.0, 0.0, 0.0]}, "std"),
]
HF_CONFIG = [
    ({"layer_norm_eps": "x"}, "layer_norm_eps"),
    ({"num_hidden_layers": "1"}, "num_hidden_layers"),
    ({"num_attention_heads": None}, "num_attention_heads"),
    ({"image_size": [8, "x"]}, "image_size"),
    ({"qkv_bias": "yes"}, "qkv_bias"),
    ({"hidden_act": ["gelu"]}, "hidden_act"),
    ({"num_attention_heads": 3}, "num_heads 3"),  # fits no width of 32
]
TIMM_CONFIG = [
    ({"pretrained_cfg.mean": 0.5}, "pretrained_cfg.mean"),
    ({"pretrained_cfg.input_size": [3, "x", 8]}, "pretrained_cfg.input_size"),
    ({"pretrained_cfg.crop_mode": "center", "pretrained_cfg.crop_pct": "x"},
     "pretrained_cfg.crop_pct"),
    ({"pretrained_cfg.interpolation": ["bicubic"]}, "pretrained_cfg.interpolation"),
    ({"pretrained_cfg.std": [0.5, 0.0, 0.5]}, "std"),
    ({"model_args.num_heads": "4"}, "model_args.num_heads"),
    ({"model_args.img_size": [8, None]}, "model_args.img_size"),
]


@pytest.mark.parametrize(("family", "file", "fields", "names"), [
    *[("hf", "preprocessor_config.json", f, n) for f, n in HF_PREPROCESSOR],
    *[("hf", "config.json", f, n) for f, n in HF_CONFIG],
    *[("timm", "config.json", f, n) for f, n in TIMM_CONFIG],
], ids=lambda v: json.dumps(v) if isinstance(v, dict) else str(v))
def test_wrong_typed_config_field_names_file_and_field(family, file, fields, names, files,
                                                       tmp_path):
    from vit.checkpoints import load_checkpoint

    folder = tmp_path / family
    shutil.copytree(files / family, folder)
    _edit_json(folder / file, **fields)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(folder)
    message = str(err.value)
    assert str(folder / file) in message and names in message, message
    assert "\n" not in message


def test_wrong_typed_preprocessor_field_is_one_line_from_the_cli(files, tmp_path, monkeypatch,
                                                                 check_refused):
    folder = tmp_path / "inputs" / "hf"
    shutil.copytree(files / "hf", folder)
    _edit_json(folder / "preprocessor_config.json", image_mean="x")
    monkeypatch.chdir(tmp_path)
    check_refused(["predict", str(files / "img.png"), "--checkpoint", str(folder),
                   "--no-cache"], tmp_path, "preprocessor_config.json", "image_mean")


def test_preprocessor_fields_as_transformers_reads_them(files, tmp_path):
    """ViTImageProcessor takes one number for image_mean/image_std (every channel) and a null
    field as its class default (224x224, bilinear, whatever the model's size: transformers
    prepares it so); a white pixel then normalises to (1 - mean) / std."""
    from vit.checkpoints import load_checkpoint

    folder = tmp_path / "hf"
    shutil.copytree(files / "hf", folder)
    (folder / "preprocessor_config.json").write_text(json.dumps(
        {"image_mean": 0.25, "image_std": 0.5, "size": None, "resample": None}))
    pre = load_checkpoint(folder).preprocessing
    assert pre.size == (224, 224) and pre.resample == "bilinear"
    white = pre(Image.new("RGB", (8, 8), (255, 255, 255)))
    np.testing.assert_allclose(white, np.full((224, 224, 3), (1 - 0.25) / 0.5), rtol=1e-6)


@pytest.mark.parametrize(("fields", "names"), [
    ({"mean": 0.5}, "mean=0.5"), ({"mean": "0.5"}, "mean='0.5'"),
    ({"size": ("8", "8")}, "image size"), ({"size": "88"}, "image size"),
    ({"size": (8.5, 8)}, "image size"), ({"crop_pct": "x"}, "crop_pct"),
    ({"std": (0.5, float("nan"), 0.5)}, "std"), ({"mean": (float("inf"),) * 3}, "mean"),
])
def test_preprocessing_refuses_wrong_types(fields, names):
    with pytest.raises(ConfigError) as err:
        Preprocessing(**fields)
    assert names in str(err.value), err.value


def test_preprocessing_refuses_a_resample_that_is_not_a_name():
    with pytest.raises(DataError, match="unknown resample"):
        Preprocessing(resample=["bilinear"])


# -- the pixel limit -------------------------------------------------------------------------------
def test_pixel_limit_is_the_documented_one():
    """Pillow refuses above twice its MAX_IMAGE_PIXELS: that must be our MAX_PIXELS, or images
    between the two are decoded (with a raw warning) despite the limit."""
    from vit import images

    assert 2 * Image.MAX_IMAGE_PIXELS == images.MAX_PIXELS == 16_384 * 16_384


def test_images_above_the_limit_are_refused_without_a_warning(tmp_path):
    """In a fresh process (warnings shown as a user sees them), with the limit made tiny: an
    image at the limit opens with nothing printed, one above it is a DataError naming it."""
    Image.new("1", (10, 10)).save(tmp_path / "at.png")  # 100 pixels
    Image.new("1", (11, 10)).save(tmp_path / "above.png")  # 110 pixels
    script = (
        "import sys\n"
        "from PIL import Image\n"
        "from vit import images\n"
        "from vit.errors import DataError\n"
        "Image.MAX_IMAGE_PIXELS = 50\n"  # a limit of 100 pixels
        f"print(images.open_image({str(tmp_path / 'at.png')!r}).size)\n"
        "try:\n"
        f"    images.open_image({str(tmp_path / 'above.png')!r})\n"
        "except DataError as err:\n"
        "    print(err)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "(10, 10)"
    assert str(tmp_path / "above.png") in lines[1] and "larger than 100 pixels" in lines[1]


# The tiny limit makes Pillow warn about the good 8x8 images; vit's filter for that warning goes
# with the import, which pytest's collection undoes.
@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_an_image_above_the_limit_in_a_folder_is_skipped(files, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "images"
    folder.mkdir()
    shutil.copy(files / "img.png", folder / "a_good.png")  # 64 pixels
    shutil.copy(files / "img.png", folder / "c_good.png")
    Image.new("RGB", (12, 12), (200, 0, 0)).save(folder / "b_big.png")  # 144 pixels
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 50)  # a limit of 100 pixels
    monkeypatch.chdir(tmp_path)
    code = main(["predict", str(folder), "--checkpoint", str(files / "ckpt"), "--json",
                         "--no-cache"])
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0
    assert [Path(r["image"]).name for r in results] == ["a_good.png", "b_big.png", "c_good.png"]
    assert "larger than 100 pixels" in results[1]["error"]
    assert results[0]["top_k"] and results[2]["top_k"]


@pytest.mark.parametrize("command", ["predict", "rollout"])
def test_a_link_that_loops_or_dangles_in_a_folder_is_one_failed_image(files, tmp_path, command,
                                                                       monkeypatch, capsys):
    import os

    folder = tmp_path / "images"
    folder.mkdir()
    shutil.copy(files / "img.png", folder / "a_good.png")
    os.symlink("b_loop.png", folder / "b_loop.png")  # a link to itself
    os.symlink("nowhere.png", folder / "c_gone.png")
    shutil.copy(files / "img.png", folder / "d_good.png")
    os.symlink("e_loop", folder / "e_loop")  # not named like an image: not listed
    monkeypatch.chdir(tmp_path)
    extra = ["--json", "--no-cache"] if command == "predict" else ["--out", "maps"]
    code = main([command, str(folder), "--checkpoint", str(files / "ckpt"), *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Traceback" not in err
    if command == "predict":
        results = {Path(r["image"]).name: r for r in map(json.loads, out.splitlines())}
        assert sorted(results) == ["a_good.png", "b_loop.png", "c_gone.png", "d_good.png"]
        assert results["a_good.png"]["top_k"] and results["d_good.png"]["top_k"]
        assert "a symbolic link that loops" in results["b_loop.png"]["error"]
        assert "a dangling symbolic link" in results["c_gone.png"]["error"]
        assert "2 images classified, 2 failed" in err
    else:
        assert "b_loop.png: a symbolic link that loops" in err
        assert "c_gone.png: a dangling symbolic link" in err
        manifest = (tmp_path / "maps" / "manifest.jsonl").read_text().splitlines()
        assert len(manifest) == 2


def test_a_folder_dataset_with_a_link_that_loops_lists_it_and_skips_it_when_read(files,
                                                                                  tmp_path):
    import os

    from vit.data import open_source

    for c in ("c0", "c1"):
        (tmp_path / "root" / c).mkdir(parents=True)
        for i in range(2):
            shutil.copy(files / "img.png", tmp_path / "root" / c / f"{i}.png")
    os.symlink("x.png", tmp_path / "root" / "c0" / "x.png")
    os.symlink("loop", tmp_path / "root" / "loop")  # beside the class folders: not a class
    source = open_source(str(tmp_path / "root"), "train", val_fraction=0.0)
    assert len(source) == 5
    assert [source[i]["image"].shape for i in range(len(source))]  # the bad entry: skipped
    with pytest.raises(DataError, match="x.png: a symbolic link that loops"):
        open_source(str(tmp_path / "root"), "train", val_fraction=0.0, strict=True)  # listing
