"""What the Hugging Face model families (`hf_vit`, `hf_dinov2`, `hf_beit`, `hf_clip`) share:
`config.json` fields read as one-line errors, a transformers encoder layer read into our block
and written back by one table of names, and the `Read` a family reader returns to `hf.read`.

transformers keeps query, key and value as three linears (`weight` `[out, in]`); our blocks
hold one fused `qkv` (outputs side by side). A layer without a key bias (BEiT) reads as a zero
one, which is the same function, and is written back only while it stays zero.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from vit.checkpoints.files import field_error, json_int, json_number, json_size
from vit.checkpoints.named_arrays import NamedArrays
from vit.checkpoints.torch_tensors import conv_of, patch_kernel_of, torch_readers, torch_writers
from vit.errors import CheckpointError

# transformers' `hidden_act` -> our act_layer, and back (`ACT_NAMES`).
ACTS = {"gelu": "gelu", "gelu_python": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
        "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh", "quick_gelu": "quick_gelu",
        "silu": "silu", "swish": "silu"}
ACT_NAMES = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "quick_gelu": "quick_gelu",
             "silu": "silu"}

# The modules of one encoder layer under their transformers names, by role: `q`, `k`, `v`,
# `proj` (attention output), `fc1`, `fc2`, `norm1`, `norm2`, and where a family has them the
# layer scales `ls1`, `ls2` (bare parameters) and BEiT's relative position bias table `rel`.
VIT_LAYER = {"norm1": "layernorm_before", "q": "attention.attention.query",
             "k": "attention.attention.key", "v": "attention.attention.value",
             "proj": "attention.output.dense", "norm2": "layernorm_after",
             "fc1": "intermediate.dense", "fc2": "output.dense"}
CLIP_LAYER = {"norm1": "layer_norm1", "q": "self_attn.q_proj", "k": "self_attn.k_proj",
              "v": "self_attn.v_proj", "proj": "self_attn.out_proj", "norm2": "layer_norm2",
              "fc1": "mlp.fc1", "fc2": "mlp.fc2"}


@dataclasses.dataclass
class Read:
    """A family reader's result: our params, the ViTConfig fields, the transformers class the
    file was read as, and the arrays it skips on purpose (`(key prefix, why)`, prefixes taken
    under the family's own prefix). `projection`: the head is an embedding projection (CLIP's
    `visual_projection`), not a classifier with class names."""

    get: NamedArrays
    params: dict
    fields: dict
    arch: str
    skipped: tuple[tuple[str, str], ...] = ()
    notes: list[str] = dataclasses.field(default_factory=list)
    projection: bool = False

    def skipped_why(self, key: str) -> str | None:
        for prefix in self.get.prefixes:
            if prefix and key.startswith(prefix):
                key = key[len(prefix):]
                break
        return next((why for start, why in self.skipped if key.startswith(start)), None)


class Fields:
    """`config.json` fields of one model (`hc`: the whole file, or its `vision_config`), with
    transformers' defaults for absent or null ones; a wrong type is a one-line error."""

    def __init__(self, hc: dict, file: Path, defaults: dict, where: str = ""):
        self.hc, self.file, self.defaults, self.where = hc, file, defaults, where

    def raw(self, name: str):
        value = self.hc.get(name)
        return self.defaults.get(name) if value is None else value

    def int(self, name: str, minimum: int = 1) -> int:
        return json_int(self.file, self.where + name, self.raw(name), minimum)

    def number(self, name: str, positive: bool = False) -> float:
        return json_number(self.file, self.where + name, self.raw(name), positive=positive)

    def bool(self, name: str) -> bool:
        value = self.raw(name)
        if not isinstance(value, bool):
            raise field_error(self.file, self.where + name, value, "true or false")
        return value

    def size(self, name: str) -> tuple[int, int]:
        return json_size(self.file, self.where + name, self.raw(name))

    def act(self, name: str = "hidden_act") -> str:
        act = self.raw(name)
        if not isinstance(act, str) or act not in ACTS:
            raise CheckpointError(f"{self.file}: {self.where}{name} {act!r} is not supported; "
                                  f"supported: {', '.join(ACTS)}")
        return ACTS[act]

    def common(self) -> dict:
        """The ViTConfig fields every family states the same way."""
        return {"depth": self.int("num_hidden_layers"),
                "num_heads": self.int("num_attention_heads"),
                "image_size": self.size("image_size"),
                "layer_norm_eps": self.number("layer_norm_eps", positive=True),
                "act_layer": self.act()}


def prefix_of(arrays: dict, prefixes: tuple[str, ...], probe: str) -> tuple[str, ...]:
    """The prefixes to read under: the one whose `probe` key the file holds first, then the
    bare names (heads lie outside the encoder's prefix)."""
    first = next((p for p in prefixes if p + probe in arrays), prefixes[0])
    return (first, "") if first else ("",)


def reshaped(value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`value` as `shape` (a missing key's empty placeholder, or a wrong size, passes through
    for the missing-key error or the fit check to name)."""
    return value.reshape(shape) if value.size == int(np.prod(shape)) and value.size else value


def fused(parts: list[np.ndarray]) -> np.ndarray:
    """Separate query, key and value parameters as one fused `qkv` (outputs side by side);
    empty when one is missing, for the missing-keys error to name it."""
    if not all(part.size for part in parts):
        return np.zeros((0,), np.float32)
    return np.concatenate(parts, axis=-1)


def read_patch(get: NamedArrays, name: str, bias: bool = True) -> dict:
    """Our patch kernel (and bias) from a torch OIHW convolution `name`."""
    out = {"patch_kernel": patch_kernel_of(get(f"{name}.weight"))}
    if bias:
        out["patch_bias"] = get(f"{name}.bias")
    return out


def read_layer(get: NamedArrays, layer: str, names: dict, *, qkv_bias: bool = True,
               k_bias: bool = True) -> dict:
    """One encoder layer (`layer`: its key prefix) read by the role -> name table `names`."""
    linear, norm = torch_readers(get)
    parts = [linear(f"{layer}.{names[r]}", qkv_bias and (r != "k" or k_bias)) for r in "qkv"]
    qkv = {"kernel": fused([p["kernel"] for p in parts])}
    if qkv_bias:
        q_bias = parts[0]["bias"]
        biases = [p.get("bias", np.zeros_like(q_bias)) for p in parts]
        qkv["bias"] = fused(biases)
    block = {"norm1": norm(f"{layer}.{names['norm1']}"),
             "attn": {"qkv": qkv, "proj": linear(f"{layer}.{names['proj']}")},
             "norm2": norm(f"{layer}.{names['norm2']}"),
             "mlp": {"fc1": linear(f"{layer}.{names['fc1']}"),
                     "fc2": linear(f"{layer}.{names['fc2']}")}}
    if "ls1" in names:
        block["ls1"] = {"gamma": get(f"{layer}.{names['ls1']}")}
        block["ls2"] = {"gamma": get(f"{layer}.{names['ls2']}")}
    if "rel" in names:
        block["attn"]["rel_pos_bias"] = {"table": get(f"{layer}.{names['rel']}")}
    return block


def write_layer(out: dict, prefix: str, layer: str, names: dict, block: dict, *,
                k_bias: bool = True, qkv_bias: bool = True) -> None:
    """The inverse of `read_layer`: `block` as torch tensors under `prefix + layer`.
    `qkv_bias=True` on a block without biases writes zero ones (a family whose layers always
    have them); `k_bias=False` leaves the key's out (its part of our bias must be zero)."""
    put_linear, put_norm = torch_writers(out, f"{prefix}{layer}.")
    qkv = block["attn"]["qkv"]
    kernels = np.split(np.asarray(qkv["kernel"]), 3, axis=1)
    width = kernels[0].shape[0]
    bias = np.asarray(qkv["bias"]) if "bias" in qkv else np.zeros(3 * width, np.float32)
    for role, kernel, b in zip("qkv", kernels, np.split(bias, 3), strict=True):
        dense = {"kernel": kernel}
        if qkv_bias and (role != "k" or k_bias):
            dense["bias"] = b
        put_linear(names[role], dense)
    put_linear(names["proj"], block["attn"]["proj"])
    put_linear(names["fc1"], block["mlp"]["fc1"])
    put_linear(names["fc2"], block["mlp"]["fc2"])
    put_norm(names["norm1"], block["norm1"])
    put_norm(names["norm2"], block["norm2"])
    if "ls1" in names:
        out[f"{prefix}{layer}.{names['ls1']}"] = block["ls1"]["gamma"]
        out[f"{prefix}{layer}.{names['ls2']}"] = block["ls2"]["gamma"]
    if "rel" in names:
        out[f"{prefix}{layer}.{names['rel']}"] = block["attn"]["rel_pos_bias"]["table"]


def write_patch(out: dict, name: str, params: dict) -> None:
    out[f"{name}.weight"] = conv_of(params["patch_kernel"])
    if "patch_bias" in params:
        out[f"{name}.bias"] = params["patch_bias"]


def k_bias_is_zero(params: dict, depth: int) -> bool:
    """Whether every block's key bias (the middle third of `qkv.bias`) is zero or absent."""
    for i in range(depth):
        bias = params["blocks"][i]["attn"]["qkv"].get("bias")
        if bias is not None and np.any(np.split(np.asarray(bias), 3)[1]):
            return False
    return True


def common_problems(loaded, *, allow: tuple[str, ...] = ()) -> list[str]:
    """The properties of `loaded` that no transformers family here holds, and the ones only
    some hold (each family `allow`s its own): the start of every family's `cannot_hold`."""
    cfg, problems = loaded.config, []
    if cfg.num_registers:
        problems.append(f"{cfg.num_registers} register tokens")
    if cfg.stem:
        problems.append(f"a convolutional stem {list(cfg.stem)}")
    if cfg.patch_classes:
        problems.append(f"a per-patch readout of {cfg.patch_classes} classes")
    if cfg.qk_norm:
        problems.append("qk-norm")
    if cfg.posemb != "learn":
        problems.append(f"{cfg.posemb} position embeddings")
    if cfg.patch_size[0] != cfg.patch_size[1]:
        problems.append(f"non-square patches {cfg.patch_size}")
    if cfg.norm_layer != "layernorm":
        problems.append(f"norm_layer {cfg.norm_layer}")
    if cfg.block_fn != "block":
        problems.append(f"block_fn {cfg.block_fn}")
    for name, what in (("embed_norm", "a norm on the patch embeddings"),
                       ("scale_attn_norm", "a norm before attn.proj"),
                       ("scale_mlp_norm", "a norm before mlp.fc2")):
        if getattr(cfg, name):
            problems.append(what)
    if not cfg.proj_bias:
        problems.append("attention output and MLP layers without biases")
    checks = {
        "layer_scale": (cfg.layer_scale is not None, "layer scale"),
        "pre_norm": (cfg.pre_norm, "a norm before the blocks (pre_norm)"),
        "no_patch_bias": (not cfg.patch_bias, "a patch embedding without bias"),
        "no_final_norm": (not cfg.final_norm, "no final norm"),
        "fc_norm": (cfg.fc_norm, "a norm after the pooling (fc_norm)"),
        "rel_pos_bias": (cfg.rel_pos_bias != "none", "a relative position bias"),
        "dist_token": (cfg.dist_token, "a distillation token"),
        "no_class_token": (not cfg.class_token, "no class token"),
        "mlp_layer": (cfg.mlp_layer != "mlp", f"mlp_layer {cfg.mlp_layer}"),
        "representation": (bool(cfg.representation_size and cfg.num_classes),
                           "a pre-logits layer before a classifier"),
        "pre_logits": (bool(cfg.representation_size and not cfg.num_classes),
                       "a pre-logits layer"),
    }
    problems += [what for key, (present, what) in checks.items() if present and key not in allow]
    return problems


def head_problem(cfg, allowed: tuple[str, ...], why: str) -> list[str]:
    """The classifier, unless one of `allowed`."""
    return [] if cfg.classifier in allowed else [f"a '{cfg.classifier}' head ({why})"]


def square_size(cfg) -> list[str]:
    if cfg.image_size[0] != cfg.image_size[1]:
        return [f"non-square images {cfg.image_size} (config.json holds one image_size)"]
    return []


def labels_json(loaded, classify: bool) -> dict:
    """`id2label` and `label2id` for a classifier's `config.json` (transformers' placeholders
    where the checkpoint has no names)."""
    if not classify:
        return {}
    labels = loaded.labels or [f"LABEL_{i}" for i in range(loaded.config.num_classes)]
    return {"id2label": {str(i): name for i, name in enumerate(labels)},
            "label2id": {name: i for i, name in enumerate(labels)}}
