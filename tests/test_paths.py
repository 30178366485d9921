"""`vit.paths`, the one module that writes outputs safely: after a write that fails half-way
(a full disk, injected), the output is absent or holds its old bytes, and nothing temporary is
left beside it; after one that succeeds, it holds the new bytes."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from builders import HalfFullDisk

from vit import paths


def _full(*_):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _half_then_full(data: bytes):
    """A writer that puts half of `data` down, then meets a full disk."""
    def write(f):
        f.write(data[:len(data) // 2])
        f.flush()
        _full()
    return write


def _entries(folder: Path) -> dict[str, bytes | None]:
    """Every name under `folder`, with a file's bytes (None for a folder)."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("old", [None, b"the old content\n"])
def test_write_whole_is_whole_or_as_it_was(tmp_path, old):
    target = tmp_path / "out.json"
    if old is not None:
        target.write_bytes(old)
    before = _entries(tmp_path)
    with pytest.raises(OSError) as err:
        paths.write_whole(target, _half_then_full(b"x" * 10_000))
    assert err.value.errno == errno.ENOSPC
    assert _entries(tmp_path) == before  # absent or old bytes, and no temporary sibling
    paths.write_whole(target, lambda f: f.write(b"new"))
    assert _entries(tmp_path) == {"out.json": b"new"}


def test_replacing_replaces_only_when_the_block_ends_well(tmp_path):
    target = tmp_path / "manifest.jsonl"
    target.write_bytes(b"old\n")
    with pytest.raises(KeyboardInterrupt), paths.replacing(target) as f:
        f.write(b"half a new file")
        raise KeyboardInterrupt
    assert _entries(tmp_path) == {"manifest.jsonl": b"old\n"}
    with paths.replacing(target) as f:
        f.write(b"new\n")
        assert target.read_bytes() == b"old\n"  # not before the block is over
    assert _entries(tmp_path) == {"manifest.jsonl": b"new\n"}


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_staged_leaves_no_half_output(tmp_path, kind):
    """A file or a folder made by its name under the staged path: absent after a failure."""
    target = tmp_path / "model"

    def make(part: Path) -> None:
        if kind == "folder":
            part.mkdir()
            (part / "config.json").write_text("{}")
        else:
            part.write_bytes(b"weights")

    with pytest.raises(OSError), paths.staged(target) as part:
        make(part)
        _full()
    assert _entries(tmp_path) == {}
    with paths.staged(target) as part:
        make(part)
    assert target.is_dir() == (kind == "folder") and target.exists()
    assert not [p for p in tmp_path.iterdir() if p.name != "model"]


def test_append_whole_cuts_a_refused_append_back_off(tmp_path, monkeypatch):
    log = tmp_path / "metrics.jsonl"
    log.write_bytes(b'{"step": 1}\n')

    monkeypatch.setattr(paths, "open", HalfFullDisk, raising=False)
    with pytest.raises(OSError) as err:
        paths.append_whole(log, b'{"step": 2, "loss": 0.5}\n')
    assert err.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert _entries(tmp_path) == {"metrics.jsonl": b'{"step": 1}\n'}
    paths.append_whole(log, b'{"step": 2}\n')
    assert log.read_bytes() == b'{"step": 1}\n{"step": 2}\n'


def test_the_callers_write_through_vit_paths(tmp_path, monkeypatch):
    """The workdir's small files, the curves, the metrics log and a command's output files are
    written by `vit.paths`: a full disk met there leaves each as it was, named in one line."""
    from vit.commands.checks import write_outputs
    from vit.errors import OutOfSpace
    from vit.training.metrics import MetricsLog, plot_curves
    from vit.training.workdir import replace_file

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "split": "train", "loss": 1.0, '
                                            '"accuracy": 0.5}\n{"step": 2, "split": "train", '
                                            '"loss": 0.9, "accuracy": 0.6}\n')
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "eval.json").write_text("{}")
    before = _entries(tmp_path)
    real_open = open

    def opening(path, mode="r", *args, **kwargs):
        if "w" in mode or "a" in mode:
            _full()
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(paths, "open", opening, raising=False)
    calls = [lambda: replace_file(tmp_path / "config.json", '{"new": 1}'),
             lambda: plot_curves(tmp_path / "metrics.jsonl", tmp_path / "curves.png"),
             lambda: MetricsLog(tmp_path, resume_step=1).write({"step": 2}),
             lambda: MetricsLog(tmp_path, resume_step=2).write({"step": 3}),
             lambda: write_outputs(tmp_path / "out", {"a.png": b"png", "eval.json": b"{}"})]
    for call in calls:
        with pytest.raises(OutOfSpace):
            call()
        assert _entries(tmp_path) == before
