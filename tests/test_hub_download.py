"""Checkpoints by name through huggingface_hub's real client, against a stand-in hub on
127.0.0.1 (tests/hub_server.py); nothing leaves the machine."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hub_server import HubServer

from vit.checkpoints import load_checkpoint, save_checkpoint
from vit.errors import CheckpointError

REPO = "someorg/tiny-vit"
TIMM_NAME = "vit_tiny_patch16_224.test_tag"


@pytest.fixture
def hub(tmp_path, monkeypatch, make_tiny):
    """A running stand-in hub serving REPO (an HF folder, with a decoy pickle beside it) at
    `main` and `v1`, and TIMM_NAME (a timm folder); an empty cache; HF_ENDPOINT pointing at
    the server. Nothing outside the test's environment is touched."""
    served = tmp_path / "served"
    save_checkpoint(make_tiny(seed=0), served / "hf-main", "hf")
    (served / "hf-main" / "pytorch_model.bin").write_bytes(b"not to be fetched")
    (served / "hf-main" / "README.md").write_text("a card")
    save_checkpoint(make_tiny(seed=3), served / "hf-v1", "hf")
    save_checkpoint(make_tiny(seed=4), served / "timm", "timm")
    server = HubServer()
    server.main_sha = server.add(REPO, served / "hf-main")
    server.v1_sha = server.add(REPO, served / "hf-v1", refs=("v1",))
    server.add(f"timm/{TIMM_NAME}", served / "timm")
    server.start()
    cache = tmp_path / "cache"
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    from huggingface_hub import constants  # read at import: online here, whatever the caller

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    server.cache = cache
    yield server
    server.stop()


def fetched(server) -> list[str]:
    """The files the client asked the server for (GETs of /resolve/)."""
    return sorted(p.split("/resolve/")[1].split("/", 1)[1] for m, p in server.requests
                  if m == "GET" and "/resolve/" in p)


def same_params(a, b) -> bool:
    from vit.checkpoints import flatten

    fa, fb = flatten(a.params), flatten(b.params)
    return fa.keys() == fb.keys() and all(np.array_equal(fa[k], fb[k]) for k in fa)


def test_a_hub_id_downloads_once_then_reads_from_the_cache(hub, make_tiny, monkeypatch):
    loaded = load_checkpoint(REPO)
    assert same_params(loaded, make_tiny(seed=0)) and loaded.family == "hf"
    assert fetched(hub) == ["config.json", "model.safetensors", "preprocessor_config.json"]
    assert not any(p.endswith((".bin", ".md")) for _, p in hub.requests)  # never pickles
    snapshot = hub.cache / "models--someorg--tiny-vit" / "snapshots" / hub.main_sha
    assert (snapshot / "model.safetensors").is_file() and str(snapshot) in loaded.source
    hub.stop()  # the server is gone: the cache answers alone
    hub.requests.clear()
    again = load_checkpoint(REPO)
    assert same_params(again, loaded) and hub.requests == []
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # offline, a cached name still works
    assert same_params(load_checkpoint(REPO), loaded)


def test_a_revision_reaches_the_server(hub, make_tiny):
    loaded = load_checkpoint(f"{REPO}@v1")
    assert same_params(loaded, make_tiny(seed=3))
    assert ("GET", f"/api/models/{REPO}/revision/v1") in hub.requests
    assert hub.v1_sha in loaded.source
    by_commit = load_checkpoint(f"{REPO}@{hub.main_sha}")  # a commit hash works too
    assert same_params(by_commit, make_tiny(seed=0))
    with pytest.raises(CheckpointError, match=r"has no revision 'v9'"):
        load_checkpoint(f"{REPO}@v9")


def test_a_timm_name_is_fetched_from_the_timm_org(hub, make_tiny):
    with pytest.raises(CheckpointError, match="without a pretrained tag; name one, e.g. "
                       "vit_tiny_patch16_224.augreg2_in21k_ft_in1k"):
        load_checkpoint("vit_tiny_patch16_224")  # nothing cached yet: no guess on the hub
    assert hub.requests == []
    loaded = load_checkpoint(TIMM_NAME)
    assert loaded.family == "timm" and same_params(loaded, make_tiny(seed=4))
    assert fetched(hub) == ["config.json", "model.safetensors"]
    assert all(f"timm/{TIMM_NAME}" in p for _, p in hub.requests)
    # The bare architecture finds its one cached tag, offline.
    hub.stop()
    assert same_params(load_checkpoint("vit_tiny_patch16_224"), loaded)


def test_unknown_repository_is_one_line(hub):
    with pytest.raises(CheckpointError) as err:
        load_checkpoint("someorg/absent")
    assert str(err.value).startswith("someorg/absent: no repository someorg/absent on "
                                     f"{hub.url}")
    assert "\n" not in str(err.value)


def _cli(args, env):
    code = "import sys; from vit.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_the_cli_downloads_with_a_progress_bar_and_honours_offline(hub, tmp_path):
    """In a fresh process, as huggingface_hub reads its environment at import."""
    from PIL import Image

    image = tmp_path / "x.png"
    Image.fromarray(np.random.RandomState(0).randint(0, 255, (8, 8, 3), np.uint8)).save(image)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "VIT_CACHE_DIR": str(tmp_path / "vit-cache")}
    offline = _cli(["predict", str(image), "--checkpoint", REPO, "--json"],
                   {**env, "HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 2, offline.stderr
    lines = offline.stderr.strip().splitlines()
    want = f"vit predict: error: {REPO}: not in the Hugging Face cache"
    assert len(lines) == 1 and lines[0].startswith(want), lines
    assert "HF_HUB_OFFLINE=1" in lines[0] and hub.requests == []

    online = _cli(["predict", str(image), "--checkpoint", REPO, "--json"], env)
    assert online.returncode == 0, online.stderr
    assert json.loads(online.stdout)["top_k"]
    assert "Fetching 3 files" in online.stderr  # huggingface_hub's progress bar
    assert fetched(hub) == ["config.json", "model.safetensors", "preprocessor_config.json"]
