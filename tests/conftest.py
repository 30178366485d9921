import os
import shutil
import tempfile

import pytest
from builders import DIGITS_RECIPE, digests, tiny_checkpoint

# Tests run on the CPU unless a caller (the GPU check) says otherwise.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The commands turn on JAX's persistent compilation cache (vit/inference/compile_cache.py);
# tests keep it off and out of the home folder (tests/test_inference.py turns it on in a
# temporary folder).
os.environ.setdefault("JAX_ENABLE_COMPILATION_CACHE", "false")
os.environ.setdefault("VIT_CACHE_DIR", os.path.join(tempfile.gettempdir(), "vit-test-cache"))


@pytest.fixture(autouse=True, scope="session")
def _expected_backend():
    """scripts/gpu_check.sh sets VIT_TEST_BACKEND=gpu (and JAX_PLATFORMS=cuda): then every test
    errors unless jax really runs there, rather than passing on a CPU."""
    expected = os.environ.get("VIT_TEST_BACKEND")
    if expected:
        import jax

        assert jax.default_backend() == expected, (
            f"VIT_TEST_BACKEND={expected} but jax runs on {jax.default_backend()}")


# -- the command line, in-process ---------------------------------------------------------------
@pytest.fixture
def run_vit(capsys):
    """Runs `vit ARGV` in this process, as the console script would: -> (exit code, stderr
    lines). Tests that read stdout call `vit.cli.main` and `capsys` themselves."""
    from vit.cli import main

    def run(argv):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exit_:  # argparse's own usage errors
            code = exit_.code
        return code, capsys.readouterr().err.strip().splitlines()

    return run


@pytest.fixture(scope="session")
def file_tree():
    """-> tree(root): every file and folder under `root` with a digest of its bytes, to show
    that a refused run changed nothing (`builders.digests`)."""
    return digests


# -- one tiny checkpoint, in every format (built by builders.tiny_checkpoint) --------------------
@pytest.fixture(scope="session")
def make_tiny():
    """-> make(seed=0, labels=True, **model fields): a LoadedCheckpoint of the tiny ViT with
    random weights in every tensor (the head too, so images get different answers); another
    seed gives other weights. No model is built. labels=True names the classes (digit0..9, or
    class 0.. for another class count), None leaves them unnamed."""
    return tiny_checkpoint


@pytest.fixture
def tiny():
    """The tiny ViT (seed 0) as a LoadedCheckpoint, a fresh copy for each test; the files in
    `tiny_files` hold it."""
    return tiny_checkpoint()


@pytest.fixture(scope="session")
def tiny_files(tmp_path_factory):
    """`tiny` written by our writers in every format we read, as a user would convert it:
    {"orbax": export folder, "hf": folder, "timm": folder, "npz": file (no class names: an npz
    holds none), "workdir": what `vit train` leaves (config.json, checkpoints/1)}. Read-only
    (checked when the run ends): a test that damages one copies it first."""
    from vit.checkpoints import save_checkpoint
    from vit.recipes.load import load_config

    root = tmp_path_factory.mktemp("tiny_files")
    files = {}
    for fmt, name in (("orbax", "orbax"), ("hf", "hf"), ("timm", "timm"), ("npz", "tiny.npz")):
        src = tiny_checkpoint(labels=None) if fmt == "npz" else tiny_checkpoint()
        save_checkpoint(src, root / name, fmt)
        files[fmt] = root / name
    workdir = root / "workdir"
    shutil.copytree(files["orbax"], workdir / "checkpoints" / "1")
    (workdir / "config.json").write_text(load_config(DIGITS_RECIPE).to_json())
    files["workdir"] = workdir
    before = digests(root)
    yield files
    assert digests(root) == before, "a test changed the shared tiny checkpoint files"


# -- one trained model ---------------------------------------------------------------------------
# The demo recipe made quick: 300 steps, 2 blocks, no augmentation (the shifts and rotations pay
# off over 3,000 steps, not 300), and a class-token head, which a Hugging Face folder (and so
# transformers' ViT, the bfloat16 test's reference) can hold.
TRAINED_DIGITS = ["train.steps=300", "model.depth=2", "model.stem=[]", "model.classifier=token",
                  "model.class_token=True", "input.shift=0.0", "input.rotate=0.0",
                  "input.scale=0.0", "optim.warmup_steps=30", "train.eval_every=300",
                  "train.checkpoint_every=300", "train.log_every=50", "data.num_threads=1"]


@pytest.fixture(scope="session")
def once(tmp_path_factory):
    """-> once(name, build): `build(folder)` runs in one test process of the run (pytest-xdist
    starts several); the others wait for it and get the same folder, to read, not to change."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base

    def run(name, build):
        folder = root / name
        with open(root / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (root / f"{name}.done").exists():
                shutil.rmtree(folder, ignore_errors=True)  # a build that failed part way
                folder.mkdir()
                build(folder)
                (root / f"{name}.done").touch()
        return folder

    return run


@pytest.fixture(scope="session")
def trained_digits(once):
    """A small ViT trained by `vit train`'s loop on the bundled digits, once per run: -> its
    workdir. A trained model has decided margins, as a real checkpoint does; random weights are
    full of float32 near-ties."""
    def build(folder):
        from vit.recipes.load import load_config
        from vit.training.loop import train

        result = train(load_config(DIGITS_RECIPE, TRAINED_DIGITS), folder / "run")
        assert result["step"] == 300

    return once("trained_digits", build) / "run"


@pytest.fixture(scope="session")
def trained_digits_hf(trained_digits, once):
    """The trained model converted to a Hugging Face folder by `save_checkpoint`."""
    def build(folder):
        from vit.checkpoints import load_checkpoint, save_checkpoint

        save_checkpoint(load_checkpoint(trained_digits), folder / "hf", "hf")

    return once("trained_digits_hf", build) / "hf"


# -- a tiny TFDS dataset -------------------------------------------------------------------------
@pytest.fixture(scope="session")
def tiny_tfds(tmp_path_factory):
    """A real TFDS builder with tensor features (`tfds:tiny_shapes`: 20 train and 6 test
    images of 6x6, 3 classes), prepared as array_record (no TensorFlow): -> its data_dir."""
    import numpy as np
    import tensorflow_datasets as tfds

    class TinyShapes(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "image": tfds.features.Tensor(shape=(6, 6, 3), dtype=np.uint8),
                "label": tfds.features.ClassLabel(names=["a", "b", "c"])}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(20), "test": self._generate_examples(6)}

        def _generate_examples(self, n):
            for i in range(n):
                yield i, {"image": np.full((6, 6, 3), i, np.uint8), "label": i % 3}

    data_dir = tmp_path_factory.mktemp("tfds")
    TinyShapes(data_dir=data_dir, file_format="array_record").download_and_prepare()
    return data_dir


# -- CI: a comparison test that skips is a failure -------------------------------------------------
# Libraries the cross-checks compare against. CI installs them (the `compare` extra), so there a
# comparison test that skips for want of one is a failure, not a quiet pass.
PEERS = ("torch", "transformers")
_peer_skips: list[str] = []


def pytest_runtest_logreport(report):
    if report.skipped and os.environ.get("CI") == "true":
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
        if any(f"'{peer}'" in reason or f"No module named {peer}" in reason for peer in PEERS):
            _peer_skips.append(f"{report.nodeid}: {reason}")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    if _peer_skips and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter):
    if _peer_skips:
        terminalreporter.write_line(
            f"FAILED (CI=true): {len(_peer_skips)} comparison test(s) skipped because torch or "
            "transformers is missing; CI must run them (install the `compare` extra):", red=True)
        for line in _peer_skips[:10]:
            terminalreporter.write_line(f"  {line}")
