"""Nothing a user has is lost to `vit train`: the fault table.

Each row makes one fault happen, for real where it can be forced (a second process racing for
the lock at a barrier, a run paused holding the lock, orbax's own keep-policy removal of the
step being read, a full tmpfs, two SIGINTs), and asserts the exit code, the one line
(`vit train: error: ...`), that no traceback was printed, and that every file that was there
before is there after, byte for byte (or, where the row changes a file on purpose, what it must
still hold). Tiny models on the bundled digits, so each row takes seconds.

The full-disk rows mount a small tmpfs; where mounting is not allowed they skip, saying so
(pytest counts the skips).
"""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from builders import HalfFullDisk, tiny_recipe_sets
from builders import digests as tree
from PIL import Image

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "digits.py"
OLD_WORKDIR = ROOT / "tests" / "data" / "workdir_0_1_0"
# The --set items of this file's runs: the tiny recipe, every step kept, to damage or count.
RUN_SETS = tiny_recipe_sets("train.keep_checkpoints=10")
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}

# A `vit train` process with a hook, for the rows that need a second process at a known point.
# argv: HOOK SYNC_FOLDER VIT_ARGS...
DRIVER = r"""
import os, sys, time
from pathlib import Path
hook, sync, argv = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]

def wait_for(name):
    while not (sync / name).exists():
        time.sleep(0.01)

if hook == "together":  # both processes reach the lock, then race for it
    from vit.training import workdir
    acquire = workdir.WorkdirLock.acquire
    def at_barrier(self):
        (sync / f"ready-{os.getpid()}").touch()
        while len(list(sync.glob("ready-*"))) < 2:
            time.sleep(0.001)
        acquire(self)
    workdir.WorkdirLock.acquire = at_barrier
elif hook == "pause":  # holds the lock, checkpoints 1 and 2 finished, until told to go on
    from vit.training.checkpointing import TrainCheckpoints
    wait = TrainCheckpoints.wait
    def paused(self):
        wait(self)
        if (self.latest_step() or 0) >= 2 and not (sync / "paused").exists():
            (sync / "paused").touch()
            wait_for("go")
    TrainCheckpoints.wait = paused
elif hook == "sigint":  # says when the first SIGINT was handled
    from vit.training.signals import StopSignals
    handle = StopSignals._handle
    def handled(self, signum, frame):
        first = self.received is None
        handle(self, signum, frame)
        if first:
            (sync / "sigint-1").touch()
    StopSignals._handle = handled
from vit.cli import main
sys.exit(main(argv))
"""


# -- what every row checks --------------------------------------------------------------------

def assert_outcome(code: int, err: str, want: int, *says: str) -> str:
    """Exit code `want`, no traceback; for exit 2, one error line, the last, naming `says`."""
    assert "Traceback" not in err and "Exception ignored" not in err, err[-4000:]
    assert code == want, err[-3000:]
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith("vit train: error:")]
    if want == 2:
        assert len(errors) == 1 and lines[-1] == errors[0], lines[-5:]
        for word in says:
            assert word in errors[0], errors[0]
        return errors[0]
    assert not errors, errors
    return ""


def assert_kept(before: dict, after: dict, *changed: str) -> None:
    """Every file of `before` is in `after` with the same bytes, but those named in `changed`
    (which the row checks itself)."""
    lost = {k: v for k, v in before.items() if k not in changed and after.get(k) != v}
    assert not lost, f"changed or removed: {sorted(lost)[:10]}"


def leftovers(root: Path) -> list[str]:
    """Temporary files and folders a run must never leave."""
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob("*")
                  if ".orbax-checkpoint-tmp" in p.name or p.name.endswith((".tmp", ".part")))


def argv(workdir, *extra) -> list[str]:
    out = ["train", "--config", str(RECIPE), "--workdir", str(workdir)]
    for item in RUN_SETS + list(extra):
        out += ["--set", item]
    return out


@pytest.fixture
def vit_train(capsys):
    """-> run(workdir, *sets): `vit train` in this process -> (exit code, stderr)."""
    from vit.cli import main

    def run(workdir, *extra, args=None):
        capsys.readouterr()
        code = main(args or argv(workdir, *extra))
        return code, capsys.readouterr().err

    return run


SPAWNED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_process_left():
    """A row that fails part-way leaves no process behind (one held at a barrier would wait
    for ever)."""
    yield
    while SPAWNED:
        proc = SPAWNED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def driver(hook: str, sync: Path, args: list[str]) -> subprocess.Popen:
    sync.mkdir(parents=True, exist_ok=True)
    SPAWNED.append(subprocess.Popen(
        [sys.executable, "-c", DRIVER, hook, str(sync), *args], cwd=ROOT, env=ENV,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return SPAWNED[-1]


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(proc.communicate()[1][-3000:])
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def steps_in(workdir: Path) -> list[int]:
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def logged_steps(workdir: Path, name: str = "metrics.jsonl") -> list[int]:
    return [json.loads(line)["step"] for line in (workdir / name).read_text().splitlines()
            if json.loads(line)["split"] == "train"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-step run (checkpoints 1 and 2), made once; rows copy it."""
    from vit.cli import main

    workdir = tmp_path_factory.mktemp("finished") / "run"
    assert main(argv(workdir)) == 0
    assert steps_in(workdir) == [1, 2]
    return workdir


@pytest.fixture
def copy_of(tmp_path):
    def copy(src: Path, name: str = "run") -> Path:
        shutil.copytree(src, tmp_path / name)
        return tmp_path / name

    return copy


@pytest.fixture
def image(tmp_path) -> Path:
    path = tmp_path / "digit.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (8, 8, 3), np.uint8)).save(path)
    return path


@contextlib.contextmanager
def small_disk(path: Path, size_kb: int):
    """A tmpfs of `size_kb` at `path`, unmounted after; skips where mounting is not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs",
                              str(path)], capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"mounting a tmpfs is not allowed here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def used_kb(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize // 1024


# -- folders that are not ours ---------------------------------------------------------------

@pytest.mark.parametrize("kind", ["hf", "timm", "random"])
def test_a_folder_that_is_not_a_run_is_refused_and_untouched(kind, tiny_files, tmp_path,
                                                            vit_train):
    """`--workdir` on a downloaded model folder (or any folder of files) is refused, naming
    what is there, and its config.json is not replaced by the recipe."""
    if kind == "random":
        folder = tmp_path / "mine"
        (folder / "photos").mkdir(parents=True)
        (folder / "notes.txt").write_text("mine\n")
        (folder / "photos" / "a.png").write_bytes(b"\x89PNG")
        names = ["notes.txt", "photos/"]
    else:
        folder = shutil.copytree(tiny_files[kind], tmp_path / kind)
        names = ["config.json", "model.safetensors", f"--init {folder}"]
    before = tree(folder)
    code, err = vit_train(folder)
    assert_outcome(code, err, 2, str(folder), *names)
    assert tree(folder) == before  # no lock file, no marker, nothing


# -- two writers --------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_runs_started_together_into_one_new_workdir_one_runs(tmp_path):
    """Guards: two runs racing into one new workdir ended in tracebacks, a deleted workdir or
    both "succeeding". Both wait at the lock until both are there, then race. Slow set: two
    fresh `vit train` processes; the default set checks a held lock's refusal in
    test_a_lock_left_by_a_killed_run_is_no_lock."""
    workdir = tmp_path / "new" / "run"
    procs = [driver("together", tmp_path / "sync", argv(workdir)) for _ in range(2)]
    outs = [p.communicate(timeout=500) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], [o[1][-2000:] for o in outs]
    winner, loser = (0, 1) if procs[0].returncode == 0 else (1, 0)
    assert_outcome(0, outs[winner][1], 0)
    assert_outcome(2, outs[loser][1], 2, str(workdir), f"pid {procs[winner].pid}",
                   socket.gethostname())
    assert steps_in(workdir) == [1, 2] and logged_steps(workdir) == [1, 2]
    assert not (workdir / ".vit-workdir.lock").exists() and not leftovers(workdir)


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_a_second_run_mid_run_is_refused_and_readers_still_read(tmp_path, vit_train, image,
                                                                capsys):
    """Guards: a second `vit train` on a workdir being trained resumed beside the first and cut
    its metrics.jsonl back. The first run is held with a finished checkpoint and the lock while
    the second starts; a reader (`vit predict`) reads the run meanwhile, without the lock."""
    from vit.cli import main

    workdir = tmp_path / "run"
    first = driver("pause", tmp_path / "sync", argv(workdir, "train.steps=4"))
    wait_for(tmp_path / "sync" / "paused", first)
    before = tree(workdir)
    code, err = vit_train(workdir, "train.steps=4")
    assert_outcome(code, err, 2, str(workdir), "being trained by another run",
                   f"pid {first.pid}", socket.gethostname())
    assert tree(workdir) == before
    capsys.readouterr()
    assert main(["predict", str(image), "--checkpoint", str(workdir), "--json",
                 "--no-cache"]) == 0
    reader = capsys.readouterr()
    assert json.loads(reader.out.splitlines()[0])["top_k"] and "Traceback" not in reader.err
    assert tree(workdir) == before
    (tmp_path / "sync" / "go").touch()
    out, err = first.communicate(timeout=300)
    assert_outcome(first.returncode, err, 0)
    assert logged_steps(workdir) == [1, 2, 3, 4]  # the first run's history, whole and in order


@pytest.mark.slow
def test_a_lock_left_by_a_killed_run_is_no_lock(finished, copy_of, vit_train):
    """Guards: a SIGKILLed run must not leave a stale lock: the kernel releases it."""
    workdir = copy_of(finished)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from vit.training.workdir import WorkdirLock; "
         "WorkdirLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(600)",
         str(workdir)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True)
    SPAWNED.append(holder)
    assert holder.stdout.readline().strip() == "locked"
    code, err = vit_train(workdir)
    assert_outcome(code, err, 2, f"pid {holder.pid}")  # held: refused
    holder.kill()
    holder.wait()
    assert (workdir / ".vit-workdir.lock").exists()  # the file stays; its lock went
    before = tree(workdir)
    code, err = vit_train(workdir, "train.steps=3")
    assert_outcome(code, err, 0)
    assert_kept(before, tree(workdir), ".vit-workdir.lock", "metrics.jsonl", "config.json",
                "curves.png", "checkpoints/best.json")
    assert steps_in(workdir) == [1, 2, 3] and not (workdir / ".vit-workdir.lock").exists()


# -- history ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_retraining_after_checkpoints_were_deleted_keeps_the_old_metrics(finished, copy_of,
                                                                         vit_train):
    """Guards: re-training a workdir whose checkpoints/ was deleted wiped metrics.jsonl."""
    workdir = copy_of(finished)
    old = (workdir / "metrics.jsonl").read_bytes()
    shutil.rmtree(workdir / "checkpoints")
    before = tree(workdir)
    code, err = vit_train(workdir)
    assert_outcome(code, err, 0)
    assert "moved to" in err and "metrics.dropped.jsonl" in err
    assert (workdir / "metrics.dropped.jsonl").read_bytes() == old  # every old line, as it was
    assert logged_steps(workdir) == [1, 2]
    assert_kept(before, tree(workdir), "metrics.jsonl", "config.json", "curves.png")


@pytest.mark.slow
def test_a_resume_that_drops_records_keeps_them_aside(finished, copy_of, vit_train):
    """Guards: a resume cut metrics.jsonl back to its step, deleting the later records."""
    workdir = copy_of(finished)
    shutil.rmtree(workdir / "checkpoints" / "2")  # records of step 2 now lie past the resume
    old = (workdir / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    before = tree(workdir)
    code, err = vit_train(workdir)
    assert_outcome(code, err, 0)
    dropped = (workdir / "metrics.dropped.jsonl").read_bytes().splitlines(keepends=True)
    assert dropped and all(json.loads(line)["step"] > 1 for line in dropped)
    kept = (workdir / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    assert kept[:len(old) - len(dropped)] + dropped == old  # nothing lost, order kept
    assert logged_steps(workdir) == [1, 2]
    assert_kept(before, tree(workdir), "metrics.jsonl", "config.json", "curves.png",
                "checkpoints/best.json")


# -- readers ------------------------------------------------------------------------------------

def _drop_while_read(monkeypatch, workdir: Path) -> list[int]:
    """On the first params read, a new step is finished (renamed into place, as orbax does) and
    the keep policy's own removal drops the step being read. Returns the steps dropped."""
    import vit.checkpoints.orbax_io as orbax_io
    from vit.training.checkpointing import TrainCheckpoints

    read, dropped = orbax_io._restore_params, []

    def reading(directory):
        if not dropped:
            step = int(directory.parent.name)
            new = workdir / "checkpoints" / str(step + 1)
            shutil.copytree(directory.parent, f"{new}.orbax-checkpoint-tmp-1")
            os.rename(f"{new}.orbax-checkpoint-tmp-1", new)
            ckpts = TrainCheckpoints(workdir, keep=1)
            ckpts.manager.delete(step)  # the keep policy's removal, with training's options
            ckpts.empty_trash()
            ckpts.close()
            dropped.append(step)
        return read(directory)

    monkeypatch.setattr(orbax_io, "_restore_params", reading)
    return dropped


def test_a_reader_takes_the_next_step_when_the_keep_policy_drops_the_one_it_reads(
        finished, copy_of, monkeypatch, image, capsys):
    """Guards: a reader that lost its step to the keep policy was told the step is damaged."""
    from vit.cli import main

    workdir = copy_of(finished)
    shutil.rmtree(workdir / "checkpoints" / "1")
    dropped = _drop_while_read(monkeypatch, workdir)
    before = tree(workdir)
    assert main(["predict", str(image), "--checkpoint", str(workdir), "--json",
                 "--no-cache"]) == 0
    out = capsys.readouterr()
    assert dropped == [2] and steps_in(workdir) == [3]
    assert json.loads(out.out.splitlines()[0])["top_k"]
    assert "damaged" not in out.err and "Traceback" not in out.err
    assert_kept(before, tree(workdir), *[k for k in before if k.startswith("checkpoints/2")])


def test_a_step_dropped_while_read_by_name_is_said_to_be_gone_not_damaged(
        finished, copy_of, monkeypatch, image, capsys):
    from vit.cli import main

    workdir = copy_of(finished)
    _drop_while_read(monkeypatch, workdir)
    step = workdir / "checkpoints" / "2"
    code = main(["predict", str(image), "--checkpoint", str(step), "--no-cache"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert "removed while it was read" in line and "damaged" not in line, line


@pytest.mark.slow
def test_a_save_in_flight_is_not_a_step(finished, copy_of, vit_train, image, capsys):
    """Guards: a run started during a save was told "checkpoints/N is damaged ... delete
    checkpoints/N". A half-written `3.orbax-checkpoint-tmp-*` is no step to readers, and the
    run resuming after the crash that left it clears it without a word about damage."""
    from vit.cli import main

    workdir = copy_of(finished)
    half = workdir / "checkpoints" / "3.orbax-checkpoint-tmp-1700000000"
    shutil.copytree(workdir / "checkpoints" / "2", half)
    shutil.rmtree(half / "params")
    before = tree(workdir)
    capsys.readouterr()
    assert main(["predict", str(image), "--checkpoint", str(workdir), "--json",
                 "--no-cache"]) == 0
    assert "damaged" not in capsys.readouterr().err
    assert tree(workdir) == before
    code, err = vit_train(workdir, "train.steps=3")
    assert_outcome(code, err, 0)
    assert "damaged" not in err and steps_in(workdir) == [1, 2, 3] and not leftovers(workdir)
    assert_kept(before, tree(workdir), "metrics.jsonl", "config.json", "curves.png",
                "checkpoints/best.json",
                *[k for k in before if k.startswith(half.name, len("checkpoints/"))])


# -- a 0.1.0 workdir ----------------------------------------------------------------------------

@pytest.mark.slow
def test_a_release_0_1_0_workdir_is_ours_and_is_marked_when_written(copy_of, vit_train):
    """Guards: the marker must not lock out workdirs written before it existed."""
    workdir = copy_of(OLD_WORKDIR)
    # The `--set`s that made it (tests/test_public_api.py), keeping every checkpoint.
    old = ["train.eval_every=20", "train.checkpoint_every=20", "model.width=16",
           "model.depth=1", "model.mlp_dim=32", "model.num_heads=2", "train.batch_size=32",
           "train.log_every=20", "optim.warmup_steps=5", "optim.lr=0.01",
           "train.keep_checkpoints=10"]

    def args(steps):
        sets = [*old, f"train.steps={steps}"]
        return ["train", "--config", str(RECIPE), "--workdir", str(workdir),
                *[x for item in sets for x in ("--set", item)]]

    before = tree(workdir)
    code, err = vit_train(workdir, args=args(10))
    assert_outcome(code, err, 2, "train.steps=10")  # refused: left as it was, no marker
    assert tree(workdir) == before
    code, err = vit_train(workdir, args=args(41))
    assert_outcome(code, err, 0)
    assert json.loads((workdir / ".vit-workdir").read_text())["format"] == "vit-workdir-1"
    assert_kept(before, tree(workdir), "metrics.jsonl", "config.json", "curves.png",
                "checkpoints/best.json")


# -- a full disk --------------------------------------------------------------------------------

@pytest.mark.timeout(600)
def test_a_full_disk_during_a_save_is_one_line_and_keeps_the_last_checkpoint(finished,
                                                                            tmp_path,
                                                                            vit_train):
    """Guards: a full disk gave exit 1, dozens of tracebacks and `N.orbax-checkpoint-tmp`
    left behind. A tmpfs with room for the finished run and about half a checkpoint more."""
    from vit.checkpoints import load_checkpoint

    step_kb = sum(p.stat().st_size for p in (finished / "checkpoints" / "2").rglob("*")
                  if p.is_file()) // 1024
    with small_disk(tmp_path / "disk", 64 * 1024) as disk:
        workdir = Path(shutil.copytree(finished, disk / "run"))
        room = used_kb(disk) + max(step_kb // 2, 8)
        shrunk = subprocess.run(["mount", "-o", f"remount,size={room}k", str(disk)],
                                capture_output=True, text=True)
        if shrunk.returncode:
            pytest.skip(f"resizing a tmpfs is not allowed here: {shrunk.stderr.strip()}")
        before = tree(workdir)
        code, err = vit_train(workdir, "train.steps=6")
        line = assert_outcome(code, err, 2, "no space left on device", str(workdir),
                              "is intact")
        assert not leftovers(workdir), leftovers(workdir)
        assert_kept(before, tree(workdir), "metrics.jsonl", "config.json", "curves.png",
                    "checkpoints/best.json")
        assert (workdir / "metrics.jsonl").read_bytes().startswith(
            (finished / "metrics.jsonl").read_bytes())
        json.loads((workdir / "config.json").read_text())  # whole, never half-written
        kept = steps_in(workdir)[-1]
        assert f"checkpoints/{kept}, is intact" in line
        assert load_checkpoint(workdir / "checkpoints" / str(kept)).params


def _disk_fills_at(where: str, monkeypatch) -> None:
    """The write of `where` (and only it) fails half-way, in `vit.paths`, the one module that
    writes outputs: config.json and curves.png as they are written under a temporary name,
    metrics.jsonl as a record is appended."""
    import vit.paths

    mode_of = "a" if where == "metrics.jsonl" else "w"

    def opening(path, mode="r", *args, **kwargs):
        if Path(path).name.lstrip(".").startswith(where) and mode_of in mode:
            return HalfFullDisk(path, mode)
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(vit.paths, "open", opening, raising=False)


@pytest.mark.parametrize("where", ["config.json", "metrics.jsonl", "curves.png"])
@pytest.mark.slow
def test_a_full_disk_on_the_workdir_files_is_one_line(where, finished, copy_of, vit_train,
                                                      monkeypatch):
    """Guards: config.json.tmp, half a metrics line or a cut curves.png left by a full disk."""
    workdir = copy_of(finished)
    before = tree(workdir)
    old_metrics = (workdir / "metrics.jsonl").read_bytes()
    _disk_fills_at(where, monkeypatch)
    code, err = vit_train(workdir, "train.steps=3")
    monkeypatch.undo()
    line = assert_outcome(code, err, 2, str(workdir / where), "no space left on device",
                          "is intact: free some space, then run the same command")
    assert not leftovers(workdir), leftovers(workdir)
    if where == "metrics.jsonl":  # the first write of the run: nothing else was written
        assert tree(workdir) == before
    else:  # the step-3 record was logged before the save; curves come after the last save
        assert (workdir / "metrics.jsonl").read_bytes().startswith(old_metrics)
        assert_kept(before, tree(workdir), "metrics.jsonl", "checkpoints/best.json",
                    *(["config.json"] if where == "curves.png" else []))
    assert f"checkpoints/{steps_in(workdir)[-1]}, is intact" in line


# -- memory -------------------------------------------------------------------------------------

MEMORY_CAP = 12 * 2**30  # address space: a run that tries a huge array fails, not the host


def _capped(args: list[str]) -> subprocess.CompletedProcess:
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, "
            f"({MEMORY_CAP}, {MEMORY_CAP})); from vit.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=280)


@pytest.mark.slow
def test_a_batch_larger_than_the_data_is_capped_under_a_memory_cap(tmp_path):
    """Guards: `train.batch_size=100000000` built a batch of 10^8 images before the first step."""
    workdir = tmp_path / "run"
    done = _capped(argv(workdir, "train.batch_size=100000000", "train.steps=1"))
    assert_outcome(done.returncode, done.stderr, 0)
    assert "train.batch_size=100000000" in done.stderr and "capped at 1293" in done.stderr
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["train"]["batch_size"] == 1293


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_first_step_that_cannot_fit_says_what_to_lower(tmp_path):
    """Guards: a compile or allocation that cannot fit ended in XLA's traceback. Slow set: a
    1024-pixel training step compiled under a memory cap; the default set checks the
    out-of-memory line in tests/test_faults.py's memory rows. 1024 px: 65,537 tokens an image,
    so even one image's attention (a 65,537-square matrix a head) cannot fit under the cap,
    though a CPU step runs its batch in
    micro-batches (at 512 px, one image a piece, the step fit)."""
    workdir = tmp_path / "new" / "run"
    done = _capped(argv(workdir, "input.image_size=1024", "train.steps=1"))
    assert_outcome(done.returncode, done.stderr, 2, "memory", "train.batch_size=8",
                   "input.image_size=1024")
    assert not (tmp_path / "new").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_first_validation_that_cannot_fit_names_the_eval_batch(tmp_path):
    """Guards: a validation that could not fit said to lower train.batch_size, which it does
    not use. 256 px: 4,097 tokens an image, batches taken whole (`train.micro_tokens=0`): the
    training step's 8 images fit, while validation's batch of 144 needs far more attention
    memory at once than the cap allows."""
    done = _capped(argv(tmp_path / "run", "input.image_size=256", "train.steps=1",
                        "train.micro_tokens=0"))
    assert_outcome(done.returncode, done.stderr, 2, "the first validation", "memory",
                   "train.eval_batch_size=144", "input.image_size=256")
    assert "train.batch_size" not in done.stderr.strip().splitlines()[-1]


# -- signals ------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_second_ctrl_c_ends_the_run_cleanly_and_keeps_the_last_checkpoint(tmp_path):
    """Guards: a double Ctrl-C printed orbax's thread tracebacks or crashed at exit. The second
    SIGINT is sent once the first was handled: the run is then finishing its step or saving.
    Slow set, as test_train's SIGTERM/SIGKILL test: real signals to a real training process."""
    from vit.checkpoints import load_checkpoint

    workdir = tmp_path / "run"
    run = driver("sigint", tmp_path / "sync", argv(workdir, "train.steps=100000",
                                                   "model.depth=2"))
    deadline = time.time() + 240
    while not ((workdir / "checkpoints").is_dir() and steps_in(workdir)):
        assert run.poll() is None and time.time() < deadline, run.communicate()[1][-3000:]
        time.sleep(0.05)
    finished = steps_in(workdir)
    before = {k: v for k, v in tree(workdir).items()
              if k.startswith(tuple(f"checkpoints/{s}/" for s in finished))}
    run.send_signal(signal.SIGINT)
    wait_for(tmp_path / "sync" / "sigint-1", run)
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=120)
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
    assert run.returncode in (130, 0), err[-3000:]  # 0: the save had finished first
    if run.returncode == 130:  # at once, or (the save done first) as a first Ctrl-C after it
        assert err.strip().splitlines()[-1].startswith("vit train: interrupted"), err[-2000:]
    assert_kept(before, tree(workdir))
    last = steps_in(workdir)[-1]
    assert load_checkpoint(workdir / "checkpoints" / str(last)).params
    from vit.cli import main  # the lock went with the process, the unfinished step with the rerun

    assert main(argv(workdir, "model.depth=2", f"train.steps={last + 1}")) == 0
    assert not leftovers(workdir)


def test_a_finished_step_means_the_same_to_training_and_to_the_readers(tmp_path):
    """A finished step is a folder named by its step alone holding `params` and `meta`: what
    the workdir checks, the resume and the checkpoint readers all count."""
    from vit import step_folders
    from vit.checkpoints import orbax_format
    from vit.checkpoints.orbax_io import finished_steps
    from vit.training import workdir

    assert (step_folders.PARAMS, step_folders.META) == (orbax_format.PARAMS, orbax_format.META)
    run = tmp_path / "run"
    folders = {"3": ("params", "meta"), "5": ("meta",), "7.orbax-checkpoint-tmp-1": ("params",
               "meta"), "9": ("params", "meta", "opt_state"), "best.json": ()}
    for name, items in folders.items():
        for item in items:
            (run / "checkpoints" / name / item).mkdir(parents=True)
    (run / "checkpoints" / "best.json").write_text("{}")
    assert step_folders.finished_steps(run / "checkpoints") == [3, 9]
    assert finished_steps(run / "checkpoints") == [3, 9]
    assert workdir.latest_step(run) == 9 and workdir.has_finished_step(run)
    half = tmp_path / "half"  # a step that is not finished makes no run of a folder
    (half / "checkpoints" / "5" / "meta").mkdir(parents=True)
    assert not workdir.has_finished_step(half) and workdir.latest_step(half) is None
    staged = tmp_path / "staged"  # a stage's finished step counts for the whole run
    for item in ("params", "meta"):
        (staged / "stages" / "first" / "checkpoints" / "2" / item).mkdir(parents=True)
    assert workdir.has_finished_step(staged) and workdir.is_run(staged)
