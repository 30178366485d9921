import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Tests run on the CPU unless a caller (the GPU check) says otherwise.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The commands turn on JAX's persistent compilation cache (vit/inference/compile_cache.py);
# tests keep it off and out of the home folder (tests/test_inference.py turns it on in a
# temporary folder).
os.environ.setdefault("JAX_ENABLE_COMPILATION_CACHE", "false")
os.environ.setdefault("VIT_CACHE_DIR", os.path.join(tempfile.gettempdir(), "vit-test-cache"))

ROOT = Path(__file__).resolve().parents[1]
DIGITS_RECIPE = ROOT / "configs" / "digits.py"


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


def _tree(root: Path) -> dict:
    out = {}
    for path in sorted(Path(root).rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = hashlib.sha1(path.read_bytes()).hexdigest() if path.is_file() else "dir"
    return out


@pytest.fixture(scope="session")
def file_tree():
    """-> tree(root): every file and folder under `root` with a digest of its bytes, to show
    that a refused run changed nothing."""
    return _tree


# -- the shared tiny builders: one recipe, one model, one text model, one training step ---------
# Every test that trains, builds a model or runs a step starts from these; a test states only
# what it needs different (`tiny_recipe_sets("train.steps=8")`, `tiny_model(depth=3)`).

# `vit train` on the bundled digits made as small and quick as a run can be: one block of
# width 16 over four 4x4 patches, two steps, a checkpoint at every step, no validation before
# step 100 (a test that wants one sets train.eval_every), one data thread.
TINY_RECIPE = ["model.width=16", "model.mlp_dim=32", "model.depth=1", "model.num_heads=2",
               "model.patch_size=4", "train.batch_size=8", "train.steps=2",
               "train.eval_every=100", "train.checkpoint_every=1", "train.log_every=1",
               "train.eval_batch_size=144", "data.num_threads=1", "optim.warmup_steps=1"]


def tiny_recipe_sets(*extra: str) -> list[str]:
    """`TINY_RECIPE` with `extra` `--set` items over it: a key given again takes the new
    value, in the base key's place."""
    items = {item.split("=", 1)[0]: item for item in TINY_RECIPE}
    for item in extra:
        items[item.split("=", 1)[0]] = item
    return list(items.values())


def tiny_recipe(*extra: str):
    """configs/digits.py loaded with `tiny_recipe_sets(*extra)`: a full, checked recipe."""
    from vit.recipes.load import load_config
    from vit.recipes.model_fields import model_field_types

    return load_config(DIGITS_RECIPE, tiny_recipe_sets(*extra),
                       model_field_types=model_field_types)


# The tiny ViT built in memory: 16x16 inputs in 4x4 patches, two blocks, five classes, the
# XLA attention (exact on every backend).
TINY_MODEL = dict(width=32, depth=2, mlp_dim=64, num_heads=4, patch_size=4, image_size=16,
                  num_classes=5, attention_impl="xla")


def tiny_model(head_scale: float | None = None, seed: int = 0, **fields):
    """A `VisionTransformer` of `TINY_MODEL` with `fields` over it. Its head is zero at
    initialisation, as vit_jax's; `head_scale` gives it random weights of that scale (so
    gradients and maps see a signal), None keeps it zero."""
    import jax
    from flax import nnx

    from vit.models.vit import create_model

    model = create_model("Ti/16", rngs=nnx.Rngs(seed), **{**TINY_MODEL, **fields})
    if head_scale is not None and model.head is not None:
        k = model.head.kernel
        k[...] = jax.random.normal(jax.random.key(seed + 1), k.shape) * head_scale
    return model


# Its text path: a two-block byte encoder, cross-attention from block 0, every second block.
TINY_TEXT = dict(max_len=24, width=16, depth=2, num_heads=2, mlp_dim=32, xattn_start=0,
                 xattn_every=2)


def tiny_text_model(gates: float | None = None, text: dict | None = None, **fields):
    """`tiny_model` (three blocks) with a text path (`TINY_TEXT`, `text` over it). The prompt
    head gets unit-scale weights (a clear signal for the rules); `gates` sets every
    cross-attention gate to that value (MLP gates 0.5), None keeps them at 0, where the text
    changes nothing."""
    import jax
    import jax.numpy as jnp

    from vit.models.config import TextConfig

    model = tiny_model(**{"depth": 3, **fields}, text=TextConfig(**{**TINY_TEXT, **(text or {})}))
    out = model.prompt_head.out.kernel
    out[...] = jax.random.normal(jax.random.key(3), out.shape)
    if gates is not None:
        for block in model.xattn:
            block.attn_gate[...] = jnp.float32(gates)
            block.mlp_gate[...] = jnp.float32(0.5)
    return model


class TinyStep:
    """A compiled-on-first-use training step of a small model on one device, with its
    parameters and one fixed batch of random images (seeded labels, one-hot targets)."""

    def __init__(self, model_config, tx, batch_size: int, seed: int, **step_options):
        import numpy as np

        from vit import device_mesh
        from vit.training.model import fresh_params
        from vit.training.placement import Placement
        from vit.training.step import make_train_step

        self.config, self.tx = model_config, tx
        self.graphdef, self.params = fresh_params(model_config, seed)
        self.mesh = device_mesh.make_mesh(1)
        rng = np.random.default_rng(seed)
        size, classes = model_config.image_size, model_config.num_classes
        labels = rng.integers(0, classes, batch_size).astype(np.int32)
        self.host_batch = {
            "image": rng.normal(size=(batch_size, *size, 3)).astype(np.float32),
            "label": labels, "target": np.eye(classes, dtype=np.float32)[labels]}
        self.batch = device_mesh.to_global(self.host_batch, self.mesh)
        self.step = make_train_step(self.graphdef, tx, Placement.of(self.mesh, self.params, tx),
                                    **{"accum_steps": 1, "ema_decay": 0.0, **step_options})

    def args(self, params=None, ema=None, seed: int = 0, step: int = 0) -> tuple:
        """The step's arguments from fresh copies of `params` (default: the initial ones)."""
        import jax
        import jax.numpy as jnp

        p = jax.tree.map(jnp.array, self.params if params is None else params)
        return p, self.tx.init(p), ema, self.batch, seed, step

    def __call__(self, params=None, ema=None, seed: int = 0, step: int = 0):
        """One step from `params`: (params, opt_state, ema, metrics)."""
        return self.step(*self.args(params, ema, seed, step))


def tiny_train_step(model_config=None, *, tx=None, batch_size: int = 8, seed: int = 0,
                    **step_options) -> TinyStep:
    """`TinyStep` of `model_config` (default: the tiny recipe's model on 8x8 digits, ten
    classes) under `tx` (default: SGD, learning rate 0.1); `step_options` go to
    `make_train_step` (`accum_steps`, `ema_decay`, `compute_dtype`, `loss_fn`, ...)."""
    import optax

    if model_config is None:
        from vit.models.config import variant_config

        model_config = variant_config("Ti/16", num_classes=10, image_size=8, width=16,
                                      depth=1, mlp_dim=32, num_heads=2, patch_size=4)
    return TinyStep(model_config, optax.sgd(0.1) if tx is None else tx, batch_size, seed,
                    **step_options)


# -- one tiny checkpoint, in every format ------------------------------------------------------
# The tiny model (`TINY_MODEL`) with 8x8 inputs and 10 classes, so the bundled digits fit it
# (eval, rollout --data, train --init). tanh GELU and LayerNorm eps 1e-6: the numerics every
# format can hold (a vit_jax npz always reads back as tanh GELU), so each file is the same
# function.
TINY = dict(TINY_MODEL, image_size=8, num_classes=10, act_layer="gelu_tanh")
TINY_LABELS = [f"digit{i}" for i in range(10)]


def _tiny(seed=0, labels=True, **fields):
    import numpy as np

    from vit.checkpoints import LoadedCheckpoint, expected_shapes, nest
    from vit.models.config import variant_config
    from vit.preprocess import INCEPTION

    cfg = variant_config("Ti/16", **{**TINY, **fields})
    rng = np.random.RandomState(seed)
    params = nest({path: rng.randn(*shape).astype(np.float32) * 0.5
                   for path, shape in expected_shapes(cfg).items()})
    if labels is True:
        labels = TINY_LABELS if cfg.num_classes == 10 else [
            f"class {i}" for i in range(cfg.num_classes)]
    return LoadedCheckpoint(cfg, params, INCEPTION.with_size(cfg.image_size), labels or None)


@pytest.fixture(scope="session")
def make_tiny():
    """-> make(seed=0, labels=True, **model fields): a LoadedCheckpoint of the tiny ViT with
    random weights in every tensor (the head too, so images get different answers); another
    seed gives other weights. No model is built. labels=True names the classes (digit0..9, or
    class 0.. for another class count), None leaves them unnamed."""
    return _tiny


@pytest.fixture
def tiny():
    """The tiny ViT (seed 0) as a LoadedCheckpoint, a fresh copy for each test; the files in
    `tiny_files` hold it."""
    return _tiny()


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
        src = _tiny(labels=None) if fmt == "npz" else _tiny()
        save_checkpoint(src, root / name, fmt)
        files[fmt] = root / name
    workdir = root / "workdir"
    shutil.copytree(files["orbax"], workdir / "checkpoints" / "1")
    (workdir / "config.json").write_text(load_config(DIGITS_RECIPE).to_json())
    files["workdir"] = workdir
    before = _tree(root)
    yield files
    assert _tree(root) == before, "a test changed the shared tiny checkpoint files"


# -- one trained model ---------------------------------------------------------------------------
# The demo recipe made quick: 300 steps, 2 blocks, no augmentation (the shifts and rotations pay
# off over 3,000 steps, not 300), and a class-token head, which a Hugging Face folder (and so
# transformers' ViT, the bfloat16 test's reference) can hold.
TRAINED_DIGITS = ["train.steps=300", "model.depth=2", "model.classifier=token",
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
