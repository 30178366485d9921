"""The IDX file format of MNIST and Fashion-MNIST (`train-images-idx3-ubyte[.gz]`).

A file is a big-endian header (two zero bytes, a type code, the number of dimensions, then one
uint32 per dimension) and the array, row-major. Only unsigned bytes (type 0x08) occur in these
sets, so only they are read; anything else is refused, naming the file.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from vit.errors import DataError

UBYTE = 0x08


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """An IDX file (gzip-compressed or not) -> its uint8 array, every byte of it accounted for."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        raise DataError(f"{path}: cannot read ({err}); reinstall the dataset") from None
    if len(raw) < 4 or raw[:2] != b"\0\0":
        raise DataError(f"{path}: not an IDX file (no IDX header); give the dataset's "
                        "*-idx?-ubyte files")
    kind, ndim = raw[2], raw[3]
    if kind != UBYTE:
        raise DataError(f"{path}: IDX type 0x{kind:02x}, only unsigned bytes (0x08) are read")
    head = 4 + 4 * ndim
    if ndim == 0 or len(raw) < head:
        raise DataError(f"{path}: truncated IDX header")
    shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, 4))
    size = int(np.prod(shape))
    if len(raw) - head != size:
        raise DataError(f"{path}: IDX header says {shape} ({size} bytes) but the file holds "
                        f"{len(raw) - head}; the file is damaged, reinstall the dataset")
    return np.frombuffer(raw, np.uint8, size, head).reshape(shape)

