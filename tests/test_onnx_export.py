"""`vit convert --format onnx`: the classifier as an ONNX file that onnxruntime runs on the CPU,
against `vit predict` on the same images."""

import json

import numpy as np
import pytest
from PIL import Image

from vit.cli import main

# Compiles whole models or imports torch: with the slow set.
pytestmark = pytest.mark.slow

onnxruntime = pytest.importorskip("onnxruntime")
pytest.importorskip("jax2onnx")


def _images(folder, n=5):
    rng = np.random.RandomState(0)
    paths = []
    for i in range(n):  # odd sizes, so the resize matters
        path = folder / f"{i}.png"
        Image.fromarray(rng.randint(0, 255, (9 + i, 13 - i, 3), np.uint8)).save(path)
        paths.append(path)
    return paths


def test_onnx_probabilities_match_vit_predict(tmp_path, tiny_files, run_vit, capsys):
    out = tmp_path / "tiny.onnx"
    code, err = run_vit(["convert", tiny_files["hf"], out])  # the suffix says onnx
    assert code == 0, err
    assert err[-1].endswith(f"-> {out} (onnx)")
    paths = _images(tmp_path)

    assert main(["predict", *map(str, paths), "--checkpoint", str(tiny_files["hf"]), "--json",
                 "--top-k", "10"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    want = np.zeros((len(paths), 10), np.float32)
    for i, row in enumerate(rows):
        for entry in row["top_k"]:
            want[i, entry["index"]] = entry["prob"]

    runner = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    meta = runner.get_modelmeta().custom_metadata_map
    pre = json.loads(meta["vit.preprocessing"])
    assert pre["layout"] == "NCHW" and json.loads(meta["vit.labels"])[0] == "digit0"
    [inp] = runner.get_inputs()
    assert inp.name == "pixel_values" and not isinstance(inp.shape[0], int)  # dynamic batch
    assert inp.shape[1:] == [3, 8, 8]
    # The user's side: preprocessing from the metadata (no vit import needed for the maths).
    batch = []
    for path in paths:
        image = Image.open(path).convert("RGB").resize(tuple(pre["size"][::-1]), Image.BILINEAR)
        x = (np.asarray(image, np.float32) / 255 - pre["mean"]) / pre["std"]
        batch.append(x.transpose(2, 0, 1))
    assert pre["resample"] == "bilinear" and pre["crop_pct"] is None
    for size in (len(paths), 2):  # two batch sizes through the one file
        logits, probs = runner.run(["logits", "probabilities"],
                                    {"pixel_values": np.stack(batch[:size]).astype(np.float32)})
        np.testing.assert_allclose(probs, want[:size], atol=1e-4)
        e = np.exp(logits - logits.max(-1, keepdims=True))
        np.testing.assert_allclose(probs, e / e.sum(-1, keepdims=True), atol=1e-6)


def test_formats_that_cannot_be_onnx_are_refused_in_one_line(tmp_path, make_tiny, run_vit):
    from vit.checkpoints import save_checkpoint
    from vit.errors import CheckpointError
    from vit.models.config import TextConfig

    headless = make_tiny(num_classes=0, labels=None)
    with pytest.raises(CheckpointError, match="without a class head"):
        save_checkpoint(headless, tmp_path / "a.onnx", "onnx")
    text = make_tiny()
    text.config = text.config.replace(text=TextConfig(width=32, depth=1, num_heads=2,
                                                           mlp_dim=64, max_len=16))
    with pytest.raises(CheckpointError, match="ONNX classifier cannot hold text conditioning"):
        save_checkpoint(text, tmp_path / "b.onnx", "onnx")
    code, err = run_vit(["convert", tmp_path / "none", tmp_path / "c.npz", "--format", "onnx"])
    assert code == 2 and len(err) == 1 and "the name says npz" in err[0]
    assert list(tmp_path.iterdir()) == []  # nothing written by any refusal


def test_a_convolutional_stem_exports_to_onnx(tmp_path):
    """The demo's recipe has a stem (`model.stem`): its convolutions go into the ONNX graph,
    and onnxruntime gives our forward's logits."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from vit.checkpoints import LoadedCheckpoint, save_checkpoint
    from vit.models import create_model
    from vit.models.config import ViTConfig

    cfg = ViTConfig(width=32, depth=1, mlp_dim=64, num_heads=4, patch_size=4, image_size=8,
                    num_classes=5, stem=(8,), classifier="gap", class_token=False)
    model = create_model(cfg, rngs=nnx.Rngs(0))
    model.head.kernel.value = jax.random.normal(jax.random.key(1), model.head.kernel.shape)
    save_checkpoint(LoadedCheckpoint.from_model(model), tmp_path / "stem.onnx", "onnx")
    x = np.random.RandomState(0).randn(3, 8, 8, 3).astype(np.float32)
    want = np.asarray(model(jnp.asarray(x)))
    runner = onnxruntime.InferenceSession(str(tmp_path / "stem.onnx"),
                                          providers=["CPUExecutionProvider"])
    [got] = runner.run(["logits"], {"pixel_values": x.transpose(0, 3, 1, 2)})
    assert np.abs(want).max() > 1  # a head that is not zero: the logits differ per class
    np.testing.assert_allclose(got, want, atol=1e-5)
