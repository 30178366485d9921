"""Every checkpoint format in and out: vit_jax / big_vision npz, Hugging Face and timm
safetensors, and our own orbax checkpoints (training writes them through here).

`load_checkpoint(path)` reads any of them, infers the architecture from the file itself, and
returns a `LoadedCheckpoint` (config, params as our pure dict, preprocessing, labels);
`save_checkpoint(src, dst, format)` writes one. Readers hold the parameters as numpy float32
arrays, so a round trip is bit-identical; a format that cannot hold a property of the model
(its head, GELU form, preprocessing, labels, ...) is refused, naming it, before anything is
written (each writer's `cannot_hold`), unless `lossy=True` asks for the nearest it can hold.

This file only re-exports; each thing lives in its own module:

- `api`: `load_checkpoint`, `save_checkpoint`, `WRITE_FORMATS`;
- `fit`: fitting parameters to a config, the one place it is done: `adapt_params` (head,
  pre-logits, position embeddings, text conditioning), `check_fits`, `expected_shapes`,
  `load_params`, and text conditioning across formats: `TEXT_SUBTREES`, `fit_text` (fresh text
  weights for a plain checkpoint, dropped ones for a plain model);
- `loaded`: `LoadedCheckpoint`, `zero_head_warning`;
- `tree`: `flatten`, `nest`, `path_name`, `as_jax`;
- `torch_tensors`: PyTorch's tensor layout, `torch_readers` and `torch_writers` (timm and HF);
- `safetensors_io`: the numpy safetensors reader (sizes checked against the file) and writer;
- `files`: JSON files read as one-line errors; destinations checked before any work and written
  through a temporary sibling, so nothing is left half-written; `written_whole`: around any
  writer, orbax's included, what a failed write began is removed and a full disk is one line;
- one module per format (`npz`, `hf` with one module per transformers family in `hf_*`,
  `timm`, `orbax_io`; `orbax_format` names our items; `onnx_export` writes an ONNX
  classifier), `resolve` (format detection, names), `hub` (hub ids
  and timm names through huggingface_hub: cache first, else a download), `lossy` (what
  `--lossy` approximates) and `labels` (class names).

Modules inside this package import from each other, never from this file.
"""

from vit.checkpoints.api import WRITE_FORMATS, load_checkpoint, save_checkpoint
from vit.checkpoints.fit import (
    TEXT_SUBTREES,
    adapt_params,
    check_fits,
    expected_shapes,
    fit_text,
    load_params,
)
from vit.checkpoints.loaded import LoadedCheckpoint, zero_head_warning
from vit.checkpoints.orbax_io import save_orbax
from vit.checkpoints.torch_tensors import torch_readers, torch_writers
from vit.checkpoints.tree import as_jax, flatten, nest, path_name

__all__ = ["TEXT_SUBTREES", "WRITE_FORMATS", "LoadedCheckpoint", "adapt_params", "as_jax",
           "check_fits", "expected_shapes", "fit_text", "flatten", "load_checkpoint",
           "load_params", "nest", "path_name", "save_checkpoint", "save_orbax", "torch_readers",
           "torch_writers", "zero_head_warning"]
