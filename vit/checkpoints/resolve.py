"""From what the user typed to a reader: local paths by their contents; hub ids and timm model
names (`name@revision`) through huggingface_hub (`hub`): the cache first, else a download."""

from __future__ import annotations

import difflib
import errno
import os
import re
from pathlib import Path

import vit.checkpoints.hf as hf
import vit.checkpoints.hub as hub
import vit.checkpoints.npz as npz
import vit.checkpoints.orbax_io as orbax_io
import vit.checkpoints.timm as timm
from vit.checkpoints.loaded import LoadedCheckpoint
from vit.checkpoints.safetensors_io import read_safetensors_header
from vit.errors import CheckpointError

PICKLED = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


def looks_like_path(name: str) -> bool:
    """A name with a `/` whose first part exists here (`runs/dmeo` beside `runs/`), or one that
    starts like a path (`./`, `../`, `/`, `~`): a mistyped path, not a hub id."""
    if name.startswith(("./", "../", "/", "~")) or os.sep != "/" and os.sep in name:
        return True
    first = name.split("/", 1)[0]
    return "/" in name and bool(first) and (Path(first).exists() or Path(first).is_symlink())


def missing_path_error(name: str) -> CheckpointError:
    """The one-line error for a missing path: the first part that is missing, and the nearest
    names beside it."""
    path = Path(name).expanduser()
    parts = path.parts
    base = Path(parts[0]) if path.is_absolute() else Path(".")
    rest = parts[1:] if path.is_absolute() else parts
    for part in rest:
        if not (base / part).exists():
            break
        base = base / part
    else:  # every part exists: cannot happen for a missing path, but say something plain
        return CheckpointError(f"{name}: no such file or directory")
    if (base / part).is_symlink():
        return _link_error(name, base / part)
    try:
        names = sorted(p.name for p in base.iterdir()) if base.is_dir() else []
    except OSError:
        names = []
    near = difflib.get_close_matches(part, names, n=3, cutoff=0.5)
    hint = ""
    if near:
        shown = [str(base / n) if str(base) != "." else n for n in near]
        hint = f"; did you mean {' or '.join(shown)}?"
    where = f"{base}/" if str(base) != "." else "the current folder"
    return CheckpointError(f"{name}: no such file or directory ({part!r} is not in {where})"
                           f"{hint}")


def _link_error(name: str, link: Path) -> CheckpointError:
    """A symbolic link on the way that leads nowhere: one that loops, or a dangling one."""
    try:
        os.stat(link)
        where = "is a symbolic link that cannot be followed"
    except OSError as err:
        target = os.readlink(link)
        where = (f"is a symbolic link that loops ({link} -> {target})" if err.errno == errno.ELOOP
                 else f"is a symbolic link to {target}, which does not exist")
    at = "" if str(link) == name else f" ({link})"
    return CheckpointError(f"{name}{at}: {where}; point it at a checkpoint, or give the "
                           "checkpoint's own path")


def _resolve_name(name: str) -> Path:
    """A hub id (`google/vit-base-patch16-224`) or timm name, optionally `@revision`: from the
    Hugging Face cache, else downloaded (`hub.fetch`)."""
    base, revision = hub.split_revision(name)
    if looks_like_path(base):
        # A hub id whose org is also a local folder name resolves from the cache only: a
        # mistyped path must not start a download.
        found = hub.cached(base, revision, hub.HF_FILES) if HUB_ID.fullmatch(base) else None
        if found is None:
            raise missing_path_error(name)
        return found
    if timm.is_timm_name(base):
        repo_id = timm.hub_repo(base)
        if "." not in base:  # a bare architecture: the one cached pretrained tag, if one
            tagged = sorted(hub.hub_cache().glob(f"models--{timm.HUB_ORG}--{base}.*"))
            if len(tagged) != 1:
                raise CheckpointError(
                    f"{name}: a timm architecture without a pretrained tag; name one, e.g. "
                    f"{base}.augreg2_in21k_ft_in1k (timm publishes each as {timm.HUB_ORG}/"
                    "<architecture>.<tag>)")
            repo_id = tagged[0].name.removeprefix("models--").replace("--", "/", 1)
        return hub.fetch(name, repo_id, revision, hub.TIMM_FILES)
    if HUB_ID.fullmatch(base):
        return hub.fetch(name, base, revision, hub.HF_FILES)
    raise missing_path_error(name)


def detect(path) -> tuple[str, Path]:
    """(format, path) with format one of npz, hf, timm, orbax."""
    path = Path(path)
    if not path.exists():
        if path.is_symlink():
            raise _link_error(str(path), path)
        path = _resolve_name(str(path))
    if path.is_file():
        if path.suffix == ".npz":
            return "npz", path
        if path.suffix == ".safetensors":
            keys = _safetensors_keys(path)
            if timm.is_timm_keys(keys):
                return "timm", path
            if hf.is_hf_keys(keys):
                return "hf", path.parent
            raise CheckpointError(f"{path}: unknown safetensors layout: expected timm keys "
                                  "(patch_embed.proj.weight, blocks.0.attn.qkv.weight) or "
                                  "Hugging Face ViT keys (vit.embeddings.patch_embeddings...)")
        if path.suffix in PICKLED:
            raise CheckpointError(f"{path}: pickled PyTorch files are not read (unpickling can "
                                  "run code); use the model's .safetensors weights")
        if path.name == "config.json":
            return detect(path.parent)
        raise CheckpointError(f"{path}: unknown checkpoint file; expected .npz, .safetensors, a "
                              "Hugging Face or timm folder, or an orbax checkpoint directory")
    if orbax_io.is_workdir(path) or orbax_io.is_orbax_dir(path):
        return "orbax", path
    weights = [path / "model.safetensors", path / "model.safetensors.index.json"]
    if weights[1].exists():
        return "hf", path
    if weights[0].exists():
        return ("timm" if timm.is_timm_keys(_safetensors_keys(weights[0])) else "hf"), path
    npz = sorted(path.glob("*.npz"))
    if len(npz) == 1:
        return "npz", npz[0]
    raise CheckpointError(f"{path}: no checkpoint found; expected model.safetensors (Hugging "
                          "Face or timm), one .npz file, an orbax checkpoint (params/, meta/) "
                          "or a training workdir (checkpoints/)")


def _safetensors_keys(path: Path) -> list[str]:
    return list(read_safetensors_header(path))


def read(path, named: str = "--checkpoint") -> LoadedCheckpoint:
    """The `LoadedCheckpoint` at `path`, whatever its format; `named` is how the user gave
    `path` (the flag), for the errors that name it."""
    kind, resolved = detect(path)
    if kind == "orbax":
        return orbax_io.read(resolved, named=named)
    return {"npz": npz.read, "hf": hf.read, "timm": timm.read}[kind](resolved)
