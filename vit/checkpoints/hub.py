"""Checkpoints by name through `huggingface_hub`: the user's cache first, else a download of the
files our readers need (never pickles), with the hub's own progress bars.

`name@revision` picks a branch, tag or commit. The environment is read at each call, as
huggingface_hub reads it when it starts: HF_HUB_CACHE / HF_HOME / XDG_CACHE_HOME for the cache,
HF_ENDPOINT for the server, HF_HUB_OFFLINE=1 (or TRANSFORMERS_OFFLINE=1) for no network at all.
"""

from __future__ import annotations

import os
from pathlib import Path

from vit.errors import CheckpointError, OutOfSpace, is_out_of_space

# What each reader opens: a Hugging Face folder (one file or shards with their index) and its
# preprocessor config; a timm folder. Pickled weights (.bin, .pth) are never fetched.
HF_FILES = ["config.json", "preprocessor_config.json", "model.safetensors",
            "model.safetensors.index.json", "model-*-of-*.safetensors"]
TIMM_FILES = ["config.json", "model.safetensors"]
DEFAULT_ENDPOINT = "https://huggingface.co"


def hub_cache() -> Path:
    """The hub cache folder, found as huggingface_hub finds it."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.environ[var])).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set to a true value now, or when huggingface_hub
    was imported (it then refuses every request itself)."""
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in {"1", "ON", "YES", "TRUE"} or constants.HF_HUB_OFFLINE


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def split_revision(name: str) -> tuple[str, str | None]:
    """`org/model@v1.0` -> (`org/model`, `v1.0`); no `@` -> (name, None)."""
    base, at, revision = name.partition("@")
    return (base, revision) if at else (name, None)


def has_weights(folder: Path) -> bool:
    return any((folder / f).exists() for f in ("model.safetensors", "model.safetensors.index.json"))


def cached(repo_id: str, revision: str | None, files: list[str]) -> Path | None:
    """The cached snapshot of `repo_id` at `revision` (default: the branch `main`) when it holds
    the weights; no network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(repo_id, revision=revision, cache_dir=hub_cache(),
                                        allow_patterns=files, local_files_only=True))
    except (LocalEntryNotFoundError, IncompleteSnapshotError, ValueError):
        return None
    return folder if has_weights(folder) else None


def fetch(name: str, repo_id: str, revision: str | None, files: list[str]) -> Path:
    """The snapshot folder of `repo_id` holding `files`: from the cache when it is there, else
    downloaded (unless offline). Every failure is one CheckpointError naming `name`."""
    found = cached(repo_id, revision, files)
    if found is not None:
        return found
    at = f" at revision {revision}" if revision else ""
    if offline():
        raise CheckpointError(f"{name}: not in the Hugging Face cache ({hub_cache()}){at} and "
                              "HF_HUB_OFFLINE=1 forbids downloading it; unset HF_HUB_OFFLINE, "
                              f"or fetch it on a connected machine with `hf download {repo_id}`"
                              " and copy the cache")
    folder = _download(name, repo_id, revision, files)
    if not has_weights(folder):
        raise CheckpointError(f"{name}: {repo_id}{at} on {endpoint()} has no model.safetensors "
                              "(vit reads safetensors weights, never pickled .bin or .pth files)"
                              "; convert them to safetensors, or choose another checkpoint")
    return folder


def _download(name: str, repo_id: str, revision: str | None, files: list[str]) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = endpoint()
    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=hub_cache(),
                                      allow_patterns=files, endpoint=where))
    except GatedRepoError:
        raise CheckpointError(f"{name}: {repo_id} is gated on {where}; accept its terms on its "
                              "page and log in with `hf auth login`") from None
    except RevisionNotFoundError:
        raise CheckpointError(f"{name}: {repo_id} has no revision {revision!r} on {where}; give "
                              "a branch, tag or commit it has") from None
    except RepositoryNotFoundError:
        raise CheckpointError(f"{name}: no repository {repo_id} on {where} (or it is private: "
                              "log in with `hf auth login`); check the name, or give a local "
                              "path") from None
    except LocalEntryNotFoundError:  # the hub could not be reached and nothing is cached
        raise CheckpointError(f"{name}: not in the Hugging Face cache ({hub_cache()}) and "
                              f"{where} cannot be reached; check the connection (or HF_ENDPOINT)"
                              ", or give a local path") from None
    except HfHubHTTPError as err:
        status = getattr(getattr(err, "response", None), "status_code", "an error")
        raise CheckpointError(f"{name}: {where} answered {status} for {repo_id}; try again "
                              "later, or give a local path") from None
    except ValueError as err:  # huggingface_hub's HFValidationError: a name it cannot take
        raise CheckpointError(f"{name}: not a valid hub id ({err}); give org/name, a timm name "
                              "or a local path") from None
    except OSError as err:
        if is_out_of_space(err):
            raise OutOfSpace(hub_cache()) from None
        raise CheckpointError(f"{name}: cannot download {repo_id} into {hub_cache()} "
                              f"({err.strerror or err}); check the folder, or set HF_HUB_CACHE"
                              ) from None
