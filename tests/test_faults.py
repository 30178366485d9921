"""Faults outside training, met as an unlucky operator meets them: a disk that is full, memory
that runs out, and inputs that could end in a traceback (text that is not UTF-8, a link
that loops, a recipe value out of its range, a class folder named in another encoding, a FIFO
among the images).

One table. Each row runs a `vit` command line in a scratch folder that holds copies of tiny
fixtures (and, for the full-disk rows, a 1 MiB tmpfs filled to its last few KiB) and asserts:
the exit code; the one line (`vit CMD: error: ...` last on stderr for a refusal, or the note
or warning a run that goes on prints); no traceback anywhere; every file that was there before
has the same bytes after; and nothing new is left but what the row allows. Rows that are about
threads' tracebacks, a hang or a memory cap run `vit` in a subprocess (with a timeout, and
`RLIMIT_AS` for the memory rows); the others in-process. The full-disk rows skip only where a
tmpfs cannot be mounted (not root, or no mount namespace), with one reason, so the skips count.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from flax import nnx
from PIL import Image

import vit
from vit.cli import main
from vit.preprocess import Preprocessing

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).parent.parent
RECIPE = ROOT / "configs" / "digits.py"
FREE_BYTES = 16 * 1024  # what a full-disk row leaves free: less than any output a row writes
MEMORY_CAP = 4 << 30  # address space of the out-of-memory rows' subprocess
NOT_UTF8 = os.fsdecode(b"is \xff red")  # as Python hands over argv bytes that are not UTF-8
NO_MOUNT = "a tmpfs cannot be mounted here (needs root in a mount namespace)"


@dataclasses.dataclass
class Row:
    id: str
    argv: str  # {placeholders}: the scratch folder's entries, see `_workspace`
    code: int
    says: tuple[str, ...]  # pieces of the one line
    full: bool = False  # a full tmpfs at {full}
    sub: bool = False  # run `vit` in a subprocess
    prelude: str = ""  # Python run in the subprocess before `vit` (a patch)
    cap: bool = False  # the subprocess's address space is capped at MEMORY_CAP
    env: dict = dataclasses.field(default_factory=dict)
    patch: Callable | None = None  # in-process: patch(monkeypatch)
    setup: Callable | None = None  # setup(work) before the files are hashed (disk still free)
    allowed: tuple[str, ...] = ()  # new paths the row may leave (relative to the scratch folder)


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _quota_full(*args, **kwargs):
    raise OSError(errno.EDQUOT, "Disk quota exceeded", "out/model.npz")


def _tensorstore_full(*args, **kwargs):
    raise ValueError('RESOURCE_EXHAUSTED: Error writing "x" in OCDBT database: Failed to write '
                     "33727 bytes to file 14: No space left on device [os_error_code='28']")


def _no_memory(*args, **kwargs):
    raise MemoryError()


def _patch(module: str, name: str, value) -> Callable:
    def patch(monkeypatch):
        import importlib

        monkeypatch.setattr(importlib.import_module(module), name, value)
    return patch


def _old_eval(work: Path) -> None:
    """A previous evaluation's files in {full}/ev_old, which a failed one must leave as they
    were."""
    (work / "full" / "ev_old").mkdir()
    (work / "full" / "ev_old" / "eval.json").write_text('{"accuracy": 0.5}')
    (work / "full" / "ev_old" / "confusion.png").write_bytes(b"an earlier picture")


def _old_maps(work: Path) -> None:
    """A first rollout into {full}/ro_old, rerun on the same images when the disk is full:
    every file of the first must stay whole (the rerun writes the same names)."""
    assert main(["rollout", str(work / "imgs"), "--checkpoint", str(work / "orbax"), "--out",
                 str(work / "full" / "ro_old")]) == 0


PREDICT = "predict {imgs} --checkpoint {orbax} --no-cache"
EVAL_FILES = ("ev", "ev/confusion.png", "ev/reliability.png", "ev/eval.json")  # vit eval's
TRAIN = "train --config {recipe} --workdir {work}/run --set"
# Subprocess: keep the compile cache's free-space floor out of the way, so JAX's own write meets
# the full disk.
NO_FLOOR = "import vit.inference.compile_cache as c; c.MIN_FREE_BYTES = 0"
NO_FORESIGHT = "import vit.inference.memory as m; m.check_fits = lambda *a, **k: None"

ROWS = [
    # -- a full disk: one line, the size needed, exit 2, nothing half-written -----------------
    Row("convert-orbax-full", "convert {orbax} {full}/new --format orbax", 2,
        ("full/new: no space left on device (needs about 0.1 MB)",), full=True, sub=True),
    Row("convert-hf-full", "convert {orbax} {full}/sub/new --format hf", 2,
        ("full/sub/new: no space left on device (needs about 0.1 MB)",), full=True),
    Row("convert-timm-full", "convert {orbax} {full}/new --format timm", 2,
        ("full/new: no space left on device (needs about 0.1 MB)",), full=True),
    Row("convert-npz-full", "convert {npz} {full}/new.npz", 2,
        ("full/new.npz: no space left on device (needs about 0.1 MB)",), full=True),
    Row("eval-out-full", "eval --checkpoint {orbax} --data digits --out {full}/ev", 2,
        ("full/ev/confusion.png: no space left on device (needs about",), full=True),
    Row("eval-out-full-keeps-earlier-files",
        "eval --checkpoint {orbax} --data digits --out {full}/ev_old --json", 2,
        ("full/ev_old/confusion.png: no space left on device",), full=True, setup=_old_eval),
    Row("rollout-out-full", "rollout {imgs} --checkpoint {orbax} --out {full}/ro", 2,
        ("full/ro: no space left on device",), full=True),
    Row("rollout-rerun-full-keeps-earlier-files",
        "rollout {imgs} --checkpoint {orbax} --out {full}/ro_old --html", 2,
        ("full/ro_old: no space left on device",), full=True, setup=_old_maps),
    Row("predict-caches-full", "predict {imgs} --checkpoint {orbax}", 2,
        ("prepared: no space left on device (needs about 0.1 MB)", "the answers above stand",
         "pass --no-cache"),
        full=True, sub=True, prelude=NO_FLOOR,
        env={"VIT_CACHE_DIR": "{full}/cache", "JAX_ENABLE_COMPILATION_CACHE": "true"},
        allowed=("full/cache", "full/cache/jax", "full/cache/prepared")),
    Row("predict-cache-disk-nearly-full", "predict {imgs} --checkpoint {orbax}", 0,
        ("vit predict: note: ", "full/cache/jax: only 0.", "MB free, so nothing is cached"),
        full=True, env={"VIT_CACHE_DIR": "{full}/cache"},
        allowed=("full/cache", "full/cache/jax")),
    Row("convert-quota-full", "convert {orbax} {work}/out/model.npz", 2,
        ("out/model.npz: no space left on device (needs about 0.1 MB)",),
        patch=_patch("vit.checkpoints", "save_checkpoint", _quota_full)),
    Row("a-full-disk-no-writer-named", "info vit_b16", 2,
        ("vit info: error: no space left on device; free some space",),
        patch=_patch("vit.commands.info", "run", _disk_full)),
    Row("tensorstore-full-disk-is-not-out-of-memory", "info vit_b16", 2,
        ("vit info: error: no space left on device",),
        patch=_patch("vit.commands.info", "run", _tensorstore_full)),

    # -- out of memory: what to lower, before a huge array is made ------------------------------
    Row("predict-image-size-4096", PREDICT + " --image-size 4096", 2,
        ("4096x4096 (1,048,577 tokens each) need at least", "attention scores",
         "lower --batch-size or --image-size"), sub=True, cap=True),
    Row("predict-image-size-4096-batch-1", PREDICT + " --image-size 4096 --batch-size 1", 2,
        ("1 image of 4096x4096", "needs at least", "; lower --image-size"), sub=True, cap=True),
    Row("rollout-image-size-1024", "rollout {imgs} --checkpoint {orbax} --image-size 1024 "
        "--out {work}/maps", 2, ("attention scores", "lower --batch-size or --image-size"),
        sub=True, cap=True),
    Row("predict-batch-100000000-is-capped", PREDICT + " --batch-size 100000000", 0,
        ("vit predict: 3 images classified",), sub=True, cap=True),
    Row("eval-batch-100000000-is-capped",
        "eval --checkpoint {orbax} --data digits --batch-size 100000000 --out {work}/ev", 0,
        ("digits",), sub=True, cap=True, allowed=EVAL_FILES),
    Row("xla-resource-exhausted", PREDICT + " --image-size 1024", 2,
        ("vit predict: error: out of memory (Out of memory allocating",
         "lower --batch-size or --image-size"), sub=True, cap=True, prelude=NO_FORESIGHT),
    Row("memory-error", "info vit_b16", 2,
        ("vit info: error: out of memory (MemoryError); lower",),
        patch=_patch("vit.commands.info", "run", _no_memory)),

    # -- the last tracebacks --------------------------------------------------------------------
    Row("predict-prompt-not-utf8", "predict {imgs} --checkpoint {text} --prompt {not_utf8}", 2,
        ("--prompt 'is \\xff red': not UTF-8 text (byte 0xff at character 4)",)),
    Row("rollout-prompt-not-utf8", "rollout {imgs} --checkpoint {text} --prompt {not_utf8} "
        "--out {work}/maps", 2, ("--prompt 'is \\xff red': not UTF-8 text",)),
    Row("predict-template-not-utf8", "predict {imgs} --checkpoint {text} --zero-shot {names} "
        "--template {not_utf8_template}", 2, ("--template 'is \\xff red {}': not UTF-8",)),
    *[Row(f"{cmd.split()[0]}-checkpoint-link-loops", cmd, 2,
          ("loop: is a symbolic link that loops (loop -> loop)",)) for cmd in (
        "predict {imgs} --checkpoint loop", "eval --checkpoint loop --data digits",
        "rollout {imgs} --checkpoint loop --out {work}/maps", "convert loop {work}/new.npz")],
    Row("predict-checkpoint-under-a-link-loop", "predict {imgs} --checkpoint loop/model", 2,
        ("loop/model (loop): is a symbolic link that loops",)),
    Row("predict-checkpoint-link-dangles", "predict {imgs} --checkpoint dangling", 2,
        ("dangling: is a symbolic link to nowhere, which does not exist",)),
    *[Row(f"recipe-{item}", f"{TRAIN} {item}", 2, (f"{shown}: must be {want}",))
      for item, shown, want in (
        ("optim.lr=-1", "optim.lr=-1.0", "a finite number of 0 or more"),
        ("optim.b1=1.0", "optim.b1=1.0", "in [0, 1)"),
        ("optim.b2=-0.1", "optim.b2=-0.1", "in [0, 1)"),
        ("optim.momentum=1.5", "optim.momentum=1.5", "in [0, 1)"),
        ("optim.weight_decay=-0.1", "optim.weight_decay=-0.1", "a finite number of 0 or more"),
        ("optim.clip_norm=-1", "optim.clip_norm=-1.0", "a finite number of 0 or more"),
        ("optim.layer_decay=0", "optim.layer_decay=0.0", "in (0, 1]"),
        ("optim.layer_decay=1.5", "optim.layer_decay=1.5", "in (0, 1]"),
        ("optim.warmup_steps=-5", "optim.warmup_steps=-5", "a whole number of 0 or more"),
        ("train.ema_decay=1.0", "train.ema_decay=1.0", "in [0, 1)"),
        ("seed=-1", "seed=-1", "a whole number from 0 to 2147483647"),
        ("seed=2147483648", "seed=2147483648", "a whole number from 0 to 2147483647"),
        ("input.label_smoothing=1.0", "input.label_smoothing=1.0", "in [0, 1)"),
        ("input.mixup=-1", "input.mixup=-1.0", "a finite number of 0 or more"),
        ("input.rotate=-3", "input.rotate=-3.0", "a finite number of 0 or more"))],
    *[Row(f"recipe-{key}={value}", f"{TRAIN} {key}={value}", 2,
          (f"{key}='{value}': must be one of {choices}",)) for key, value, choices in (
        ("optim.schedule", "cosin", "cosine, linear, constant; did you mean cosine?"),
        ("optim.name", "adam", "sgd, adamw"),
        ("train.loss", "xent", "softmax_xent, sigmoid_xent, prompt_xent"))],
    Row("recipe-file-stage-value", "train --config {stage_recipe} --workdir "
        "{work}/run", 2, ("stages.text.optim.b2=1.0: must be in [0, 1)",)),
    Row("recipe-file-infinite-lr", "train --config {inf_recipe} --workdir {work}/run", 2,
        ("optim.lr=inf: must be a finite number of 0 or more",)),
    Row("eval-class-folder-not-utf8", "eval --checkpoint {orbax} --data {classes} --split test "
        "--out {work}/ev", 0, ("confusion matrix",),
        allowed=EVAL_FILES),
    Row("eval-class-folder-not-utf8-json", "eval --checkpoint {orbax} --data {classes} --split "
        "test --out {work}/ev --json", 0, (), allowed=EVAL_FILES),
    Row("predict-fifo-in-folder", PREDICT.replace("{imgs}", "{odd}"), 0,
        # The FIFO and the device are skipped with a note; the dangling link is listed and
        # fails when opened, one failed image.
        ("vit: note: skipped", "odd/pipe.png: a FIFO (named pipe), not a regular file",
         "vit predict: 2 images classified, 1 failed"), sub=True),
    Row("predict-device-and-dangling-link-in-folder", PREDICT.replace("{imgs}", "{odd}"), 0,
        ("odd/null.png: a character device, not a regular file",
         "odd/gone.png: a dangling symbolic link, not a regular file"), sub=True),
    Row("rollout-fifo-in-folder", "rollout {odd} --checkpoint {orbax} --out {work}/maps", 0,
        ("odd/pipe.png: a FIFO (named pipe), not a regular file",), sub=True,
        allowed=("maps", "maps/manifest.jsonl", "maps/overlays", "maps/maps", "maps/inputs",
                 "maps/*/0.png", "maps/*/1.png", "maps/maps/0.npy", "maps/maps/1.npy")),
    Row("eval-fifo-in-class-folder", "eval --checkpoint {orbax} --data {classes} --split test "
        "--out {work}/ev", 0, ("c0/pipe.png: a FIFO (named pipe), not a regular file",),
        sub=True, allowed=EVAL_FILES),
    Row("predict-fifo-given", "predict {odd}/pipe.png {imgs}/0.png --checkpoint {orbax} "
        "--no-cache", 0, ("1 images classified, 1 failed",), sub=True),
    Row("predict-only-a-fifo-given", "predict {odd}/pipe.png --checkpoint {orbax} --no-cache",
        2, ("none of the 1 images could be read", "odd/pipe.png"), sub=True),
]


@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_files):
    """The inputs every row starts from: the tiny checkpoint as orbax and npz, a text model,
    three noisy 128x128 images (no overlay of theirs fits a full disk), a zero-shot names file,
    an image folder whose class names include one that is not UTF-8, a folder of images beside
    a FIFO, a character device and a dangling link named like images, links that loop or
    dangle, and recipes with a value out of range in a stage and in the file."""
    from vit.checkpoints import save_orbax

    root = tmp_path_factory.mktemp("faults")
    shutil.copytree(tiny_files["orbax"], root / "orbax")
    shutil.copy(tiny_files["npz"], root / "tiny.npz")
    text_model = vit.create_model("Ti/16", width=32, depth=1, mlp_dim=64, num_heads=4,
                                  patch_size=4, image_size=8, num_classes=10, attention_impl="xla",
                                  text=vit.TextConfig(width=32, depth=1, num_heads=2, mlp_dim=64,
                                                      max_len=16, similarity_dim=8),
                                  rngs=nnx.Rngs(0))
    save_orbax(root / "text", text_model, preprocessing=Preprocessing(size=(8, 8)))
    rng = np.random.RandomState(0)
    (root / "imgs").mkdir()
    for i in range(3):
        noise = rng.randint(0, 255, (128, 128, 3), np.uint8)
        Image.fromarray(noise).save(root / "imgs" / f"{i}.png")
    (root / "names.txt").write_text("cat\ndog\n")
    for split in ("train", "test"):
        for i in range(10):
            name = os.fsdecode(b"cl\xff3") if i == 3 else f"c{i}"
            folder = root / "classes" / split / name
            folder.mkdir(parents=True)
            shutil.copy(root / "imgs" / f"{i % 3}.png", folder / "0.png")
    (root / "odd").mkdir()
    for i in range(2):
        shutil.copy(root / "imgs" / f"{i}.png", root / "odd" / f"{i}.png")
    os.symlink("nowhere.png", root / "odd" / "gone.png")
    os.symlink("loop", root / "loop")
    os.symlink("nowhere", root / "dangling")
    (root / "stage_recipe.py").write_text(textwrap.dedent("""
        import ml_collections
        def get_config():
            c = ml_collections.ConfigDict()
            c.data = dict(name="digits")
            c.stages = {"text": {"steps": 1, "optim": {"b2": 1.0}}}
            return c
        """))
    (root / "inf_recipe.py").write_text(textwrap.dedent("""
        import ml_collections
        def get_config():
            c = ml_collections.ConfigDict()
            c.data = dict(name="digits")
            c.optim = dict(lr=float("inf"))
            return c
        """))
    return root


def _special_files(work: Path) -> None:
    """FIFOs and a device cannot be copied: made in each scratch folder."""
    os.mkfifo(work / "odd" / "pipe.png")
    os.mkfifo(work / "classes" / "test" / "c0" / "pipe.png")
    with contextlib.suppress(PermissionError):
        os.mknod(work / "odd" / "null.png", 0o666 | stat.S_IFCHR, os.makedev(1, 3))


def _tree(root: Path) -> dict[str, str]:
    """Every entry under `root` (links not followed): a digest of a regular file's bytes,
    else its kind. FIFOs and devices are never opened."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode):
                kind = hashlib.sha1(path.read_bytes()).hexdigest()
            elif stat.S_ISLNK(mode):
                kind = "link -> " + os.readlink(path)
            else:
                kind = "dir" if stat.S_ISDIR(mode) else f"special {stat.S_IFMT(mode)}"
            out[str(path.relative_to(root))] = kind
    return out


@pytest.fixture
def mounts():
    """Mounts a 1 MiB tmpfs at a folder, filled but for FREE_BYTES; unmounted afterwards."""
    mounted = []

    def mount(folder: Path) -> None:
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)],
                              capture_output=True)
        if done.returncode:
            pytest.skip(NO_MOUNT)
        mounted.append(folder)

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _fill(folder: Path) -> None:
    free = shutil.disk_usage(folder).free
    with open(folder / ".filler", "wb") as f:
        f.write(b"\0" * max(free - FREE_BYTES, 0))


def _workspace(base: Path, tmp_path: Path) -> tuple[Path, dict]:
    work = tmp_path / "w"
    shutil.copytree(base, work, symlinks=True)
    _special_files(work)
    names = {p.name for p in base.iterdir()}
    values = {name.removesuffix(".py").removesuffix(".txt"): str(work / name) for name in names}
    values.update(npz=str(work / "tiny.npz"), work=str(work), full=str(work / "full"),
                  recipe=str(RECIPE), not_utf8=NOT_UTF8, not_utf8_template=NOT_UTF8 + " {}")
    return work, values


def _argv(row: Row, values: dict) -> list[str]:
    return [part.format(**values) for part in row.argv.split()]


def _run_in_process(argv, capsys) -> tuple[int, list[str], str]:
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    return code, out.err.strip().splitlines(), out.out


def _run_subprocess(row: Row, argv, work: Path, values: dict) -> tuple[int, list[str], str]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "VIT_CACHE_DIR": str(work.parent / "cache"),
           **{k: v.format(**values) for k, v in row.env.items()}}

    # The cap is set by the child itself, before jax is imported (a preexec_fn would fork this
    # multithreaded process).
    cap = (f"import resource\nresource.setrlimit(resource.RLIMIT_AS, ({MEMORY_CAP}, "
           f"{MEMORY_CAP}))\n" if row.cap else "")
    code = f"{cap}import sys\n{row.prelude}\nfrom vit.cli import main\nsys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, *argv], cwd=work, env=env,
                          capture_output=True, timeout=180)
    err = done.stderr.decode("utf-8", "surrogateescape")
    return done.returncode, err.strip().splitlines(), done.stdout.decode("utf-8", "replace")


def _allowed(rel: str, patterns: tuple[str, ...]) -> bool:
    from fnmatch import fnmatch

    return any(fnmatch(rel, pattern) for pattern in patterns)


# The rows that train or evaluate a model for several seconds run with the slow set (.ci/run),
# and so do the FIFO rows past the first (each a subprocess of several seconds): the default
# set keeps predict-fifo-in-folder.
SLOW_ROWS = ("eval-batch-100000000-is-capped", "eval-fifo-in-class-folder",
             "xla-resource-exhausted", "predict-caches-full", "predict-image-size-4096",
             "eval-out-full", "predict-batch-100000000-is-capped", "predict-fifo-given",
             "predict-only-a-fifo-given", "rollout-fifo-in-folder")


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id, marks=pytest.mark.slow)
                                 if r.id in SLOW_ROWS else pytest.param(r, id=r.id)
                                 for r in ROWS])
def test_fault(row, base, tmp_path, mounts, monkeypatch, capsys):
    work, values = _workspace(base, tmp_path)
    monkeypatch.chdir(work)
    monkeypatch.setenv("VIT_CACHE_DIR", str(tmp_path / "cache"))  # outside the hashed tree
    for key, value in row.env.items():
        monkeypatch.setenv(key, value.format(**values))
    if row.full:
        mounts(work / "full")
    if row.setup:
        row.setup(work)
    if row.full:
        _fill(work / "full")
    before = _tree(work)
    argv = _argv(row, values)
    if row.sub:
        code, err, out = _run_subprocess(row, argv, work, values)
    else:
        if row.patch:
            row.patch(monkeypatch)
        code, err, out = _run_in_process(argv, capsys)

    shown = "\n".join(err)
    assert code == row.code, shown
    assert "Traceback" not in shown + out, shown
    if code == 2:
        assert err and err[-1].startswith(f"vit {argv[0]}: error: "), shown
        assert sum("error:" in line for line in err) == 1, shown
        for piece in row.says:
            assert piece in err[-1], err[-1]
    else:
        for piece in row.says:
            assert piece in shown + out, shown
    after = _tree(work)
    changed = [rel for rel, digest in before.items() if after.get(rel) != digest]
    assert not changed, f"changed or removed: {changed}"
    stray = [rel for rel in after.keys() - before.keys() if not _allowed(rel, row.allowed)]
    assert not stray, f"left behind: {sorted(stray)}"
    if row.id == "eval-class-folder-not-utf8-json":
        import json

        report = json.loads(out)
        assert report["per_class_accuracy"].keys() >= {"c0", "cl\\xff3"}


def test_the_full_disk_rows_fill_the_disk(tmp_path, mounts):
    """The full-disk rows mean something only if their tmpfs really is full: a write of twice
    FREE_BYTES there fails with ENOSPC."""
    mounts(tmp_path / "full")
    _fill(tmp_path / "full")
    with pytest.raises(OSError) as err:
        (tmp_path / "full" / "x").write_bytes(b"\1" * (2 * FREE_BYTES))
    assert err.value.errno == errno.ENOSPC


def test_the_memory_rows_fit_when_asked_less(base, tmp_path):
    """The out-of-memory rows refuse what cannot fit, not everything under the cap: the same
    command at the model's own size runs there."""
    row = Row("fits", PREDICT, 0, (), sub=True, cap=True)
    work, values = _workspace(base, tmp_path)
    code, err, _ = _run_subprocess(row, _argv(row, values), work, values)
    assert code == 0, "\n".join(err)
