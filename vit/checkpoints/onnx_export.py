"""An ONNX file of the classifier (`vit convert SRC model.onnx`), through jax2onnx.

The graph is the model's forward in float32 with XLA attention (no Pallas kernel), from
preprocessed images to two outputs: `logits` and `probabilities` (their softmax, what
`vit predict` ranks). Its input `pixel_values` is `[batch, 3, height, width]` (NCHW, as
transformers and timm feed their models) with a dynamic batch; height and width are the
model's. Preprocessing is not in the graph: its settings (`Preprocessing.to_dict`, and the
resize rule in words) and the class names are stored in the file's metadata (`metadata_props`, keys
`vit.preprocessing` and `vit.labels`; onnxruntime shows them in
`InferenceSession(path).get_modelmeta().custom_metadata_map`).
"""

from __future__ import annotations

import dataclasses
import json
import logging

from vit.checkpoints.files import staged
from vit.checkpoints.loaded import LoadedCheckpoint, refuse_text
from vit.errors import CheckpointError

INPUT, OUTPUTS = "pixel_values", ("logits", "probabilities")
OPSET = 21


def cannot_hold(loaded: LoadedCheckpoint) -> list[str]:
    if loaded.config.num_classes == 0:
        return ["a model without a class head (num_classes 0): the ONNX export is a classifier"]
    return []


def preprocessing_metadata(loaded: LoadedCheckpoint) -> dict:
    """What a user of the ONNX file must do to an image before the graph sees it."""
    pre = loaded.preprocessing
    return {"layout": "NCHW", **pre.to_dict(), "size": list(pre.size),
            "mean": list(pre.mean), "std": list(pre.std),
            "scale": "pixels * rescale_factor, then (x - mean) / std per channel",
            "crop": pre.describe_geometry()}


def write(loaded: LoadedCheckpoint, dst) -> list[str]:
    cfg = loaded.config
    refuse_text(cfg, "an ONNX classifier")
    problems = cannot_hold(loaded)
    if problems:
        raise CheckpointError(f"an ONNX classifier cannot hold {'; '.join(problems)}: use "
                              "--format orbax, hf or timm")
    try:
        import jax
        import onnx
        from jax2onnx import to_onnx
    except ImportError as err:
        raise CheckpointError(f"--format onnx needs jax2onnx and onnx ({err.name} is not "
                              "installed): pip install 'vit[onnx]'") from None
    notes = []
    if cfg.dtype != "float32":
        notes.append(f"the ONNX graph computes in float32 (the checkpoint's dtype {cfg.dtype} "
                     "is a run setting)")
    if cfg.dynamic_image_size:
        notes.append(f"the ONNX graph takes {cfg.image_size[0]}x{cfg.image_size[1]} images only "
                     "(dynamic_image_size is not exported; --image-size picks another size)")
    exported = dataclasses.replace(
        loaded, config=cfg.replace(attention_impl="xla", dtype="float32", remat=False))
    model = exported.build_model()

    def forward(images_nhwc):
        logits = model(images_nhwc)
        return logits, jax.nn.softmax(logits, axis=-1)

    height, width = cfg.image_size
    quiet = logging.getLogger("onnx_ir")  # it logs a warning per folded constant
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        proto = to_onnx(forward, [("batch", height, width, cfg.in_channels)], model_name="vit",
                        opset=OPSET, inputs_as_nchw=[0], input_names=[INPUT],
                        output_names=list(OUTPUTS))
    finally:
        quiet.setLevel(level)
    metadata = {"vit.preprocessing": json.dumps(preprocessing_metadata(loaded)),
                "vit.outputs": "logits; probabilities = softmax(logits)"}
    if loaded.labels:
        metadata["vit.labels"] = json.dumps(list(loaded.labels))
    onnx.helper.set_model_props(proto, metadata)
    data = proto.SerializeToString()
    with staged(dst) as tmp:
        tmp.write_bytes(data)
    return notes
