"""Damaged and mistyped checkpoint inputs are one-line `CheckpointError`s, and writes are checked
before any work and never left half-written: malformed JSON in any config file, truncated or
crafted safetensors files, a mistyped relative path, an existing or unwritable destination."""

import json
import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

from vit.checkpoints import load_checkpoint, save_checkpoint
from vit.checkpoints import safetensors_io as st
from vit.errors import CheckpointError, OutOfSpace

pytestmark = pytest.mark.timeout(300)


def one_line(err) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


# -- malformed JSON ----------------------------------------------------------------------------
@pytest.mark.parametrize("fmt,name", [("hf", "config.json"), ("hf", "preprocessor_config.json"),
                                      ("timm", "config.json")])
def test_malformed_json_names_the_file(tmp_path, tiny_files, fmt, name):
    import shutil

    folder = shutil.copytree(tiny_files[fmt], tmp_path / fmt)
    (folder / name).write_text('{"hidden_size": 32,,}')
    with pytest.raises(CheckpointError, match="not valid JSON") as err:
        load_checkpoint(folder)
    assert f"{name}: not valid JSON (line 1, column" in one_line(err)
    (folder / name).write_text("[1, 2]")  # valid JSON, not an object
    with pytest.raises(CheckpointError, match="expected a JSON object"):
        load_checkpoint(folder)


def test_malformed_shard_index(tmp_path, tiny_files):
    import shutil

    folder = shutil.copytree(tiny_files["hf"], tmp_path / "hf")
    index = folder / "model.safetensors.index.json"
    index.write_text('{"weight_map": ')
    with pytest.raises(CheckpointError, match="index.json: not valid JSON"):
        load_checkpoint(folder)
    index.write_text(json.dumps({"weight_map": {"vit.embeddings.cls_token": "part-2.safetensors"}}))
    with pytest.raises(CheckpointError, match="names shard part-2.safetensors"):
        load_checkpoint(folder)
    index.write_text(json.dumps({"metadata": {}}))
    with pytest.raises(CheckpointError, match="no weight_map"):
        load_checkpoint(folder)


def test_malformed_workdir_files(tmp_path, tiny_files):
    import shutil

    run = tmp_path / "run" / "checkpoints"
    shutil.copytree(tiny_files["orbax"], run / "5")
    (run / "best.json").write_text("{step: 5")
    with pytest.raises(CheckpointError, match="best.json: not a valid best-checkpoint record"):
        load_checkpoint(tmp_path / "run")
    (run / "best.json").unlink()
    (run / "5" / "meta" / "metadata").write_text('{"format": ')
    with pytest.raises(CheckpointError, match="unreadable checkpoint metadata") as err:
        load_checkpoint(tmp_path / "run")
    one_line(err)
    (run / "5" / "meta" / "metadata").write_text('{"format": "vit-orbax-1"}')
    with pytest.raises(CheckpointError, match="lacks model_config"):
        load_checkpoint(tmp_path / "run")


# -- safetensors: truncated payloads and crafted headers ---------------------------------------
@pytest.fixture
def weights(tmp_path):
    path = tmp_path / "w.safetensors"
    save_file({"a": np.arange(12, dtype=np.float32).reshape(3, 4),
               "b": np.ones(5, np.float32)}, str(path))
    return path


def test_safetensors_reads_back(weights):
    out = st.read_safetensors(weights)
    np.testing.assert_array_equal(out["a"], np.arange(12, dtype=np.float32).reshape(3, 4))


def test_truncated_safetensors_payload(weights):
    data = weights.read_bytes()
    weights.write_bytes(data[:-7])
    with pytest.raises(CheckpointError, match="truncated") as err:
        st.read_safetensors(weights)
    assert "fetch it again" in one_line(err)


def test_safetensors_header_longer_than_the_file_is_refused_before_reading(tmp_path):
    path = tmp_path / "crafted.safetensors"
    path.write_bytes(struct.pack("<Q", 2 ** 60) + b"{}")  # a 1 EiB header in a 10-byte file
    with pytest.raises(CheckpointError, match="header length 1152921504606846976"):
        st.read_safetensors_header(path)
    path.write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        st.read_safetensors(path)


@pytest.mark.parametrize("entry,words", [
    ({"dtype": "F32", "shape": [1000000, 1000000], "data_offsets": [0, 4]}, "4 bytes for shape"),
    ({"dtype": "F32", "shape": [1], "data_offsets": [0, 2 ** 40]}, "truncated"),
    ({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}, "malformed header entry"),
    ({"dtype": "F32", "shape": [1]}, "malformed header entry"),
])
def test_crafted_header_entries(tmp_path, entry, words):
    header = json.dumps({"x": entry}).encode()
    path = tmp_path / "crafted.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    with pytest.raises(CheckpointError, match=words):
        st.read_safetensors(path)


# -- a mistyped relative path is a path, not a hub id -------------------------------------------
def test_mistyped_relative_path_suggests_the_nearest(tmp_path, monkeypatch, tiny_files):
    import shutil

    shutil.copytree(tiny_files["orbax"], tmp_path / "runs" / "demo")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing leaves the machine
    with pytest.raises(CheckpointError) as err:
        load_checkpoint("runs/dmeo")
    message = one_line(err)
    assert message.startswith("runs/dmeo: no such file or directory")
    assert "did you mean runs/demo?" in message and "hf download" not in message
    with pytest.raises(CheckpointError, match="hf download org/model"):  # still a hub id
        load_checkpoint("org/model")


# -- destinations: checked first, never half-written -------------------------------------------
def test_existing_destination_is_refused_for_every_format(tmp_path, tiny):
    for fmt, name in (("npz", "a.npz"), ("hf", "hf"), ("timm", "timm"), ("orbax", "orbax")):
        dst = tmp_path / name
        dst.mkdir() if fmt != "npz" else dst.write_bytes(b"keep")
        with pytest.raises(CheckpointError, match="already exists"):
            save_checkpoint(tiny, dst, fmt)
    assert (tmp_path / "a.npz").read_bytes() == b"keep"


def test_a_failed_write_leaves_nothing(tmp_path, tiny, monkeypatch):
    import vit.checkpoints.timm as timm

    def broken(tensors, path):
        path.write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(timm, "write_safetensors", broken)
    with pytest.raises(OutOfSpace, match=r"/out: no space left on device"):
        save_checkpoint(tiny, tmp_path / "out", "timm")
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_writes_still_in_flight_after_a_failure_are_removed_too(tmp_path):
    """One of orbax's writes fails while tensorstore's others go on and make their folders
    again after the first removal: what they make is removed as well, and what was there
    before is kept."""
    import threading
    import time

    from vit.checkpoints.written_whole import written_whole

    (tmp_path / "kept").write_text("before")
    dst = tmp_path / "new"
    late = threading.Event()

    def late_writer():
        time.sleep(0.2)  # after the block has failed and its first removal has run
        folder = tmp_path / "new.orbax-checkpoint-tmp" / "params" / "d"
        folder.mkdir(parents=True)
        (folder / "chunk").write_bytes(b"late")
        late.set()

    with (pytest.raises(OutOfSpace, match=r"/new: no space left on device"),
          written_whole(dst, needed=1000)):
        (tmp_path / "new.orbax-checkpoint-tmp").mkdir()
        threading.Thread(target=late_writer).start()
        raise OSError(28, "No space left on device")
    assert late.is_set()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]


def test_a_failed_training_save_is_removed_though_its_writes_come_back(tmp_path):
    """`TrainCheckpoints.remove_unfinished` after a failed save: orbax's temporary step folder
    made again by a write still in flight goes too; finished steps stay."""
    import threading
    import time

    from vit.training.checkpointing import TrainCheckpoints

    ckpts = TrainCheckpoints(tmp_path / "run", keep=1)
    folder = ckpts.directory
    (folder / "4").mkdir(parents=True)
    (folder / "4" / "kept").write_text("a finished step")
    (folder / "8.orbax-checkpoint-tmp-1").mkdir()

    def late_writer():
        time.sleep(0.2)
        (folder / "8.orbax-checkpoint-tmp-1" / "params" / "d").mkdir(parents=True)

    writer = threading.Thread(target=late_writer)
    writer.start()
    ckpts.remove_unfinished()
    writer.join()
    assert sorted(p.name for p in folder.iterdir()) == ["4"]
    ckpts.close_quietly()
