"""Safetensors files, read through numpy alone (no torch, no pickle) so that bfloat16 and float16
tensors load as float32; shared by the Hugging Face and timm readers and writers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from vit.errors import CheckpointError

_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64,
           "I32": np.int32, "U8": np.uint8, "BOOL": np.bool_}


def _read(path: Path, with_data: bool) -> tuple[dict, np.ndarray | None]:
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
            data = np.frombuffer(f.read(), np.uint8) if with_data else None
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path}: not a readable safetensors file ({err})") from None
    header.pop("__metadata__", None)
    return header, data


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
        value = value.reshape(info["shape"])
        out[name] = value.astype(np.float32) if value.dtype.kind == "f" else value
    return out


def read_safetensors_folder(folder: Path) -> dict[str, np.ndarray]:
    """`model.safetensors`, or every shard that `model.safetensors.index.json` names."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        out = {}
        for shard in shards:
            out.update(read_safetensors(folder / shard))
        return out
    return read_safetensors(folder / "model.safetensors")


def write_safetensors(tensors: dict[str, np.ndarray], path: Path) -> None:
    """Writes float32 tensors with the `format: pt` metadata transformers checks for."""
    tensors = {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}
    save_file(tensors, str(path), metadata={"format": "pt"})
