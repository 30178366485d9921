"""Prepared classifiers: what a second `vit predict` of the same checkpoint needs, ready on disk.

A cold `vit predict` reads the checkpoint (transposing torch-layout weights), traces the model
and compiles its forward. Afterwards it stores, under `<cache root>/prepared/<key>/`:

- `weights.bin`: the parameters in our layout, raw little-endian, one after another, and
  `meta.json`: their shapes and offsets, plus what the command prints and checks (the source,
  loader warnings, labels, preprocessing, class count);
- `forward-<key>.jaxexport`: the forward (softmax top-k) as a serialized `jax.export` module
  (StableHLO in a flatbuffer; no pickle), for one batch size, top-k and device set;
- for a hub id or timm name, `names/<hash>.json`: the snapshot folder it resolved to and the
  state of the hub cache that decided it (any change there is a miss).

A warm run maps the weights, deserializes the module and compiles it, which JAX's persistent
compilation cache turns into a load: no checkpoint parsing, no model trace, no flax import.

Keys: an entry is keyed on the checkpoint's files (path, size, modification time), the load
options (image size, overrides such as dtype) and the source of the `vit` package itself, so an
edited checkpoint or edited model code is a miss, never a stale hit. The forward adds the batch
size, top-k, jax/jaxlib versions and the devices. Anything unreadable is a miss (and removed);
the cache never fails a run: a full disk stores nothing (no partial file is left) and is
reported as `OutOfSpace` for the command to warn about. Only the `KEEP` most recently used
entries are kept.
Standard library, numpy and jax only (it sits beside `compile_cache`, below the commands).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vit.errors import OutOfSpace, is_out_of_space
from vit.paths import write_whole

FORMAT = 1
KEEP = 3  # prepared checkpoints kept (each holds a copy of the weights), least recent dropped
_PACKAGE = Path(__file__).resolve().parents[1]  # vit/, not vit/inference/


@dataclass
class Prepared:
    """A warm entry: `meta` (see `store`), the parameter leaves and the forward."""

    folder: Path
    meta: dict
    leaves: list
    exported: object  # jax.export.Exported


@functools.cache
def _code_hash() -> str:
    """The `vit` package's own source: a model change must never meet a stale forward."""
    digest = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        digest.update(str(path.relative_to(_PACKAGE)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _files_of(checkpoint) -> list | None:
    """(relative path, size, mtime_ns) of every file of a checkpoint on disk; None for a name
    that is not a path (a hub id is resolved by the loader: not cached here)."""
    path = Path(checkpoint).expanduser()
    try:
        path = path.resolve(strict=True)
        if path.is_file():
            st = path.stat()
            return [[str(path), st.st_size, st.st_mtime_ns]]
        files = []
        for root, dirs, names in os.walk(path):
            dirs.sort()
            for name in sorted(names):
                st = (Path(root) / name).stat()
                files.append([os.path.relpath(Path(root) / name, path), st.st_size,
                              st.st_mtime_ns])
        return [[str(path), 0, 0], *files]
    except (OSError, RuntimeError):  # RuntimeError: a symbolic link that loops
        return None


def _hash(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _hub_state(snapshot: Path) -> list | None:
    """What decides which snapshot a cached hub id or timm name resolves to: the listings of
    the hub cache, the repo's `refs/` and `snapshots/` (their modification times), and each
    ref's contents. None for a folder outside a hub cache's `models--*/snapshots/` layout."""
    snapshots = snapshot.parent
    repo = snapshots.parent
    if snapshots.name != "snapshots" or not repo.name.startswith("models--"):
        return None
    try:
        state = [[str(d), d.stat().st_mtime_ns] for d in (repo.parent, repo, snapshots)]
        refs = repo / "refs"
        if refs.is_dir():
            state += [[str(ref), ref.read_text()] for ref in sorted(refs.rglob("*"))
                      if ref.is_file()]
        return state
    except OSError:
        return None


def _alias(root: Path, name: str) -> Path:
    """Where a name (hub id, timm name) records the snapshot folder it resolved to."""
    where = [name, os.environ.get("HF_HUB_CACHE"), os.environ.get("HF_HOME")]
    return root / "prepared" / "names" / f"{_hash(where)}.json"


def _resolve_alias(root: Path, name: str) -> str | None:
    """The folder a name resolved to when it was stored, if nothing that decides the
    resolution has changed since; else None (a cold run resolves it again)."""
    try:
        alias = json.loads(_alias(root, name).read_text())
        folder = Path(alias["folder"])
        state = _hub_state(folder)
        return str(folder) if state is not None and alias["state"] == state else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def entry_folder(root: Path, checkpoint, load_options: dict) -> Path | None:
    """Where the entry of a checkpoint on disk and these load options lives; None for a name
    that is not a path."""
    files = _files_of(checkpoint)
    if files is None:
        return None
    key = _hash({"format": FORMAT, "files": files, "load": load_options, "code": _code_hash()})
    return root / "prepared" / key


def forward_key(batch_size: int, top_k: int) -> str:
    import jax
    import jaxlib

    devices = [(d.platform, d.device_kind) for d in jax.local_devices()]
    return _hash({"batch": batch_size, "top_k": top_k, "jax": jax.__version__,
                  "jaxlib": jaxlib.__version__, "devices": devices,
                  "processes": jax.process_count()})


def _forward_path(entry: Path, batch_size: int, top_k: int) -> Path:
    return entry / f"forward-{forward_key(batch_size, top_k)}.jaxexport"


def load(root: Path, checkpoint, load_options: dict, batch_size: int,
         top_k: int) -> Prepared | None:
    """The prepared entry for these options, or None (not stored, or unreadable: removed).
    A `checkpoint` that is not a path (a hub id, a timm name) is looked up by the snapshot
    folder it resolved to when stored."""
    if _files_of(checkpoint) is None:
        checkpoint = _resolve_alias(root, str(checkpoint))
        if checkpoint is None:
            return None
    entry = entry_folder(root, checkpoint, load_options)
    if entry is None:
        return None
    forward = _forward_path(entry, batch_size, top_k)
    if not forward.is_file():
        return None
    try:
        from jax import export

        meta = json.loads((entry / "meta.json").read_text())
        exported = export.deserialize(bytearray(forward.read_bytes()))
        leaves = _read_leaves(entry / "weights.bin", meta["leaves"])
        avals = exported.in_avals[:len(leaves)]
        if meta.get("format") != FORMAT or len(exported.in_avals) != len(leaves) + 1 or any(
                tuple(a.shape) != leaf.shape or a.dtype != leaf.dtype
                for a, leaf in zip(avals, leaves, strict=True)):
            raise ValueError("the forward and the weights do not match")
    except Exception:  # a damaged or foreign entry: drop it and run cold  # noqa: BLE001
        shutil.rmtree(entry, ignore_errors=True)
        return None
    os.utime(entry / "meta.json")  # most recently used
    return Prepared(entry, meta, leaves, exported)


def _read_leaves(path: Path, layout: list) -> list:
    import jax

    data = np.memmap(path, dtype=np.uint8, mode="r")
    end = max((offset + int(np.prod(shape)) * np.dtype(dtype).itemsize
               for shape, dtype, offset in layout), default=0)
    if end != data.size:
        raise ValueError(f"{path}: {data.size} bytes, the layout needs {end}")
    leaves = []
    for shape, dtype, offset in layout:
        count = int(np.prod(shape))
        view = np.frombuffer(data, np.dtype(dtype).newbyteorder("<"), count, offset)
        leaves.append(jax.device_put(view.reshape(shape)))
    return leaves


def store(root: Path, checkpoint, load_options: dict, batch_size: int, top_k: int, *,
          meta: dict, leaves: list, exported, resolved=None) -> Path | None:
    """Writes the entry (the weights only when the entry is new) and its forward, each through
    a temporary name renamed into place, so a crash leaves no half entry. Returns the entry
    folder, or None when nothing could be written (the run itself is unaffected); a disk too
    full for it raises `OutOfSpace` (the cache's folder and the size needed), with nothing
    written, for the command to report.

    `resolved`: the folder a `checkpoint` that is not a path (a hub id, a timm name) was read
    from; the entry is keyed on that folder and the name recorded as pointing to it."""
    name = None
    if _files_of(checkpoint) is None and resolved is not None:
        name, checkpoint = str(checkpoint), resolved
    entry = entry_folder(root, checkpoint, load_options)
    if entry is None:
        return None
    needed = 0
    try:
        forward = exported.serialize()
        new_entry = not (entry / "meta.json").is_file()
        needed = len(forward) + (sum(np.asarray(leaf).nbytes for leaf in leaves)
                                 if new_entry else 0)
        _check_space(entry.parent, needed)
        if new_entry:
            _store_weights(entry, meta, leaves)
        write_whole(_forward_path(entry, batch_size, top_k), lambda f: f.write(forward))
        state = _hub_state(Path(checkpoint)) if name is not None else None
        if state is not None:
            alias = _alias(root, name)
            alias.parent.mkdir(exist_ok=True)
            record = json.dumps({"name": name, "folder": str(checkpoint), "state": state})
            write_whole(alias, lambda f: f.write(record.encode()))
        _prune(entry.parent, keep=entry)
    except (OSError, ImportError) as err:  # a full disk, or jax.export without its serializer
        if is_out_of_space(err):
            raise OutOfSpace(entry.parent, needed) from None
        return None
    return entry


def _check_space(folder: Path, needed: int) -> None:
    """A full disk found before a byte is written: `OutOfSpace` when `folder`'s disk has less
    free than `needed`."""
    place = folder
    while not place.exists() and place.parent != place:
        place = place.parent
    if shutil.disk_usage(place).free < needed:
        raise OutOfSpace(folder, needed)


def _store_weights(entry: Path, meta: dict, leaves: list) -> None:
    """A new entry: `weights.bin` and `meta.json` written in a staging folder renamed into
    place, so a crash leaves no half entry."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        layout, offset = [], 0
        with open(staging / "weights.bin", "wb") as f:
            for leaf in leaves:
                array = np.ascontiguousarray(leaf)
                dtype = array.dtype.newbyteorder("<")
                f.write(array.astype(dtype, copy=False).tobytes())
                # numpy spells bfloat16 "<V2" (raw bytes): such a dtype is stored by name.
                layout.append([list(array.shape), dtype.name if dtype.kind == "V" else dtype.str,
                               offset])
                offset += array.nbytes
        (staging / "meta.json").write_text(json.dumps({**meta, "format": FORMAT,
                                                       "leaves": layout}))
    except BaseException:  # a full disk: no half entry stays behind
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        os.replace(staging, entry)
    except OSError:  # another run stored it first
        shutil.rmtree(staging, ignore_errors=True)


def _prune(prepared: Path, keep: Path) -> None:
    """Drops all but the `KEEP` most recently used entries (and stale staging folders)."""
    entries = []
    for child in prepared.iterdir():
        meta = child / "meta.json"
        if child.name == "names":  # aliases: a stale one only ever misses
            continue
        if child.name.startswith("."):
            if child.stat().st_mtime < time.time() - 3600:  # left by a crashed store
                shutil.rmtree(child, ignore_errors=True)
        elif meta.is_file():
            entries.append((meta.stat().st_mtime, child))
    for _, child in sorted(entries, reverse=True)[KEEP:]:
        if child != keep:
            shutil.rmtree(child, ignore_errors=True)
