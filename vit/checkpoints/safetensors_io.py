"""Safetensors files, read through numpy alone (no torch, no pickle) so that bfloat16 and float16
tensors load as float32; shared by the Hugging Face and timm readers and writers.

The format: 8 bytes (little-endian header length N), N bytes of JSON header
`{name: {dtype, shape, data_offsets: [start, end]}}`, then the raw tensor bytes. Every number in
the header is checked against the file's size before anything is allocated, so a truncated or
crafted file is a one-line error, never a huge allocation.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from vit.checkpoints.files import read_json_object
from vit.errors import CheckpointError

_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64,
           "I32": np.int32, "U8": np.uint8, "BOOL": np.bool_}
_ITEMSIZE = {"BF16": 2, **{k: np.dtype(v).itemsize for k, v in _DTYPES.items()}}


def _fail(path: Path, why: str) -> CheckpointError:
    return CheckpointError(f"{path}: not a readable safetensors file ({why}); the download or "
                           "copy may be incomplete: fetch it again")


def _read(path: Path, with_data: bool) -> tuple[dict, np.ndarray | None]:
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            n = int.from_bytes(f.read(8), "little")
            if size < 8 or n > size - 8:  # checked before reading: no allocation beyond the file
                raise _fail(path, f"header length {n} but the file has {max(size - 8, 0)} "
                                  "bytes after it")
            header = json.loads(f.read(n))
            data = np.frombuffer(f.read(), np.uint8) if with_data else None
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read ({err.strerror or err})") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise _fail(path, f"bad header: {err}") from None
    if not isinstance(header, dict):
        raise _fail(path, "the header is not a JSON object")
    header.pop("__metadata__", None)
    _check_header(path, header, size - 8 - n)
    return header, data


def _check_header(path: Path, header: dict, payload: int) -> None:
    """Every entry well-formed and inside the payload, its byte count matching its shape."""
    for name, info in header.items():
        try:
            dtype, shape, (start, end) = info["dtype"], info["shape"], info["data_offsets"]
            ok = (all(isinstance(v, int) and v >= 0 for v in (*shape, start, end))
                  and isinstance(dtype, str))
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise _fail(path, f"malformed header entry for tensor {name}")
        if not start <= end <= payload:
            raise _fail(path, f"tensor {name} lies at bytes {start}..{end} but the data holds "
                              f"{payload}: the file is truncated")
        if dtype in _ITEMSIZE and math.prod(shape) * _ITEMSIZE[dtype] != end - start:
            raise _fail(path, f"tensor {name}: {end - start} bytes for shape {shape} {dtype}")


def read_safetensors_header(path: Path) -> dict:
    """{name: {dtype, shape, data_offsets}} without reading the tensors."""
    return _read(path, with_data=False)[0]


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """All tensors of one file, floats as float32 (a header of JSON, then raw little-endian)."""
    header, data = _read(path, with_data=True)
    out = {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        raw = data[start:end]
        if info["dtype"] == "BF16":  # the high half of a float32
            value = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] in _DTYPES:
            value = raw.view(np.dtype(_DTYPES[info["dtype"]]).newbyteorder("<"))
        else:
            raise CheckpointError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
        value = value.reshape(info["shape"])  # sizes were checked against the header
        # float32 stays a (read-only) view of the file's bytes: no copy of a whole checkpoint.
        out[name] = value.astype(np.float32, copy=False) if value.dtype.kind == "f" else value
    return out


def read_safetensors_folder(folder: Path) -> dict[str, np.ndarray]:
    """`model.safetensors`, or every shard that `model.safetensors.index.json` names."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(
                isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{index}: no weight_map of tensor names to shard files; fix "
                                  "or replace the index")
        out = {}
        for shard in sorted(set(weight_map.values())):
            file = folder / shard
            if not file.is_file():
                raise CheckpointError(f"{index}: names shard {shard}, which is not in {folder}")
            out.update(read_safetensors(file))
        return out
    return read_safetensors(folder / "model.safetensors")


def write_safetensors(tensors: dict[str, np.ndarray], path: Path) -> None:
    """Writes float32 tensors with the `format: pt` metadata transformers checks for."""
    tensors = {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}
    save_file(tensors, str(path), metadata={"format": "pt"})
