"""`vit predict`'s prepared classifiers (vit/inference/prepared.py): stored by a cold run, used by a
warm one without reading the checkpoint or building the model, and never stale or fatal.

The reference for every output is `vit predict --no-cache` (the plain jitted model, no export,
no cache) on the same files. Nothing here is timed: bench_predict.py measures the start-up.
"""

import json
import os

import numpy as np
import pytest
from PIL import Image

import vit.checkpoints
from vit.checkpoints import save_checkpoint
from vit.cli import main
from vit.inference import prepared as predict_cache
from vit.inference.predictor import Predictor

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def setup(tmp_path, monkeypatch, make_tiny):
    monkeypatch.setenv("VIT_CACHE_DIR", str(tmp_path / "cache"))
    save_checkpoint(make_tiny(), tmp_path / "ckpt", "hf")
    rng = np.random.RandomState(1)
    for i in range(5):
        h, w = rng.randint(20, 60, size=2)
        Image.fromarray(rng.randint(0, 255, (h, w, 3), np.uint8)).save(tmp_path / f"{i}.png")
    return tmp_path


def predict(capsys, folder, *extra):
    code = main(["predict", *[str(folder / f"{i}.png") for i in range(5)], "--checkpoint",
                 str(folder / "ckpt"), "--json", "--top-k", "3", *extra])
    out = capsys.readouterr()
    assert code == 0, out.err
    return [json.loads(line) for line in out.out.splitlines()], out.err


def entries(folder):
    prepared = folder / "cache" / "prepared"
    return sorted(p for p in prepared.iterdir() if not p.name.startswith(".")) \
        if prepared.exists() else []


def same(got, want):
    for g, w in zip(got, want, strict=True):
        assert [t["index"] for t in g["top_k"]] == [t["index"] for t in w["top_k"]]
        assert [t["label"] for t in g["top_k"]] == [t["label"] for t in w["top_k"]]
        np.testing.assert_allclose([t["prob"] for t in g["top_k"]],
                                   [t["prob"] for t in w["top_k"]], rtol=1e-5, atol=1e-7)


def test_a_warm_run_reads_neither_the_checkpoint_nor_the_model(setup, capsys, monkeypatch):
    want, _ = predict(capsys, setup, "--no-cache")
    assert not entries(setup)  # --no-cache writes nothing
    assert len({r["top_k"][0]["index"] for r in want}) > 1  # not a constant model

    cold, err = predict(capsys, setup)
    assert "prepared:" not in err
    [entry] = entries(setup)
    files = {p.name for p in entry.iterdir()}
    assert {"meta.json", "weights.bin"} <= files and any(f.endswith(".jaxexport") for f in files)
    same(cold, want)

    def refuse(*args, **kwargs):
        raise AssertionError("the warm run must not need this")

    monkeypatch.setattr(vit.checkpoints, "load_checkpoint", refuse)
    monkeypatch.setattr(Predictor, "__init__", refuse)
    warm, err = predict(capsys, setup)
    assert f"prepared: {entry}" in err
    same(warm, want)


@pytest.mark.slow
def test_a_changed_checkpoint_or_batch_is_a_miss_and_a_new_batch_reuses_the_weights(
        setup, capsys, make_tiny):
    predict(capsys, setup)
    [entry] = entries(setup)
    weights = (entry / "weights.bin").stat()
    # Another batch size: a second forward in the same entry; the weights are not written again.
    predict(capsys, setup, "--batch-size", "2")
    assert len(list(entry.glob("forward-*.jaxexport"))) == 2
    assert (entry / "weights.bin").stat().st_mtime_ns == weights.st_mtime_ns
    # New weights under the same path: a new entry, and the answers are the new model's.
    save_checkpoint(make_tiny(seed=7), setup / "new", "hf")
    os.replace(setup / "new" / "model.safetensors", setup / "ckpt" / "model.safetensors")
    got, err = predict(capsys, setup)
    assert "prepared:" not in err and len(entries(setup)) == 2
    want, _ = predict(capsys, setup, "--no-cache")
    same(got, want)
    # An override changes the model: its own entry too.
    _, err = predict(capsys, setup, "--image-size", "48")
    assert "prepared:" not in err and len(entries(setup)) == 3


@pytest.mark.slow
def test_a_damaged_entry_is_dropped_and_the_run_goes_on(setup, capsys):
    want, _ = predict(capsys, setup, "--no-cache")
    predict(capsys, setup)
    [entry] = entries(setup)
    with open(entry / "weights.bin", "r+b") as f:
        f.truncate(100)  # a copy cut short
    got, err = predict(capsys, setup)
    assert "prepared:" not in err  # not trusted ...
    same(got, want)  # ... the checkpoint was read instead
    [entry] = entries(setup)  # and stored again, whole
    got, err = predict(capsys, setup)
    assert "prepared:" in err
    same(got, want)


def test_labels_a_refused_head_and_only_the_newest_entries_stay(setup, capsys, monkeypatch,
                                                                 make_tiny):
    labels = setup / "labels.txt"
    labels.write_text("\n".join(f"name {i}" for i in range(10)))
    predict(capsys, setup)
    got, err = predict(capsys, setup, "--labels", str(labels))  # --labels applies warm too
    assert "prepared:" in err and got[0]["top_k"][0]["label"].startswith("name ")
    # An all-zero head is refused, and so never stored: refused again on the next run.
    zero = make_tiny()
    zero.params["head"] = {k: np.zeros_like(v) for k, v in zero.params["head"].items()}
    save_checkpoint(zero, setup / "zero", "hf")
    for _ in range(2):
        code = main(["predict", str(setup / "0.png"), "--checkpoint", str(setup / "zero")])
        err = capsys.readouterr().err
        assert code == 2 and "head is all zeros" in err.strip().splitlines()[-1]
    assert len(entries(setup)) == 1
    # A second checkpoint with KEEP=1: storing it drops the older entry.
    monkeypatch.setattr(predict_cache, "KEEP", 1)
    save_checkpoint(make_tiny(seed=3), setup / "other", "hf")
    [old] = entries(setup)
    assert main(["predict", str(setup / "0.png"), "--checkpoint", str(setup / "other")]) == 0
    [new] = entries(setup)
    assert new != old


@pytest.mark.slow
def test_a_prepared_forward_runs_split_over_several_devices(setup):
    """Two forced host devices in fresh processes: the exported forward keeps its split over
    them (jax refuses to call it on another device count), cold and warm answer as --no-cache."""
    import subprocess
    import sys

    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "JAX_PLATFORMS": "cpu", "VIT_CACHE_DIR": str(setup / "cache")}
    env.pop("JAX_ENABLE_COMPILATION_CACHE", None)

    def run(*extra):
        out = subprocess.run(
            [sys.executable, "-m", "vit.cli", "predict", *[str(setup / f"{i}.png") for i in
                                                           range(5)],
             "--checkpoint", str(setup / "ckpt"), "--json", "--batch-size", "3", *extra],
            capture_output=True, text=True, env=env, timeout=240)
        assert out.returncode == 0, out.stderr[-2000:]
        return [json.loads(line) for line in out.stdout.splitlines()], out.stderr

    want, _ = run("--no-cache")
    cold, err = run()
    assert "batch 4" in err  # rounded up to the two devices
    warm, err = run()
    assert "prepared:" in err
    same(cold, want)
    same(warm, want)


@pytest.mark.slow
def test_a_hub_id_is_prepared_by_its_snapshot_and_a_new_revision_is_a_miss(setup, capsys,
                                                                            monkeypatch,
                                                                            make_tiny):
    """A hub id in a local Hugging Face cache (made here; nothing downloads): the warm run
    finds the snapshot it resolved to; a new revision under refs/main is read cold."""
    hub = setup / "hub"
    repo = hub / "models--someorg--tiny-vit"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    save_checkpoint(make_tiny(), repo / "snapshots" / "rev1", "hf")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("rev1")

    def run(*extra):
        code = main(["predict", *[str(setup / f"{i}.png") for i in range(5)], "--checkpoint",
                     "someorg/tiny-vit", "--json", "--top-k", "3", *extra])
        out = capsys.readouterr()
        assert code == 0, out.err
        return [json.loads(line) for line in out.out.splitlines()], out.err

    want, _ = run("--no-cache")
    run()
    got, err = run()
    assert f"prepared: {entries(setup)[0]}" in err
    same(got, want)
    # A new revision becomes main: the old snapshot must not answer for the name any more.
    save_checkpoint(make_tiny(seed=5), repo / "snapshots" / "rev2", "hf")
    (repo / "refs" / "main").write_text("rev2")
    new_want, _ = run("--no-cache")
    assert [r["top_k"][0]["prob"] for r in new_want] != [r["top_k"][0]["prob"] for r in want]
    got, err = run()
    assert "prepared:" not in err
    same(got, new_want)
    got, err = run()
    assert "prepared:" in err
    same(got, new_want)


def test_a_bfloat16_classifier_is_stored_with_its_bfloat16_kernels_and_read_back(setup, capsys):
    """A narrow model's kernels are stored narrow (vit/inference/weights.py); numpy names
    bfloat16 "<V2", raw bytes, so the entry must name it for the warm run to read it back."""
    want, _ = predict(capsys, setup, "--no-cache", "--dtype", "bfloat16")
    cold, _ = predict(capsys, setup, "--dtype", "bfloat16")
    [entry] = entries(setup)
    stored = {d for _, d, _ in json.loads((entry / "meta.json").read_text())["leaves"]}
    assert "bfloat16" in stored and "<f4" in stored  # kernels narrow, norms and biases not
    warm, err = predict(capsys, setup, "--dtype", "bfloat16")
    assert f"prepared: {entry}" in err
    same(cold, want)
    same(warm, want)
