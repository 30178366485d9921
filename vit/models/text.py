"""The text path: a byte-level tokenizer and the encoders that turn text into tokens that image
tokens can attend to.

Text reaches the model as `[batch, text_len]` token ids (or `[batch, text_len, embed_dim]`
vectors from a frozen text model run elsewhere) plus a `[batch, text_len]` boolean mask whose
True entries come first. The mask becomes per-example lengths (`kv_len`) rather than a dense
mask, so the Pallas flash kernel serves cross-attention too. A learned null token is always put
in front of the text, so no query ever attends to nothing (and an empty prompt is well defined).
"""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vit.models.blocks import Block, Keys, layer_norm
from vit.models.config import BLOCK_OPTIONS, TextConfig, ViTConfig

# Ids 0-2 are reserved; byte b has id b + 3. No vocabulary file: any language round-trips.
PAD, END, NULL = 0, 1, 2
BYTE_OFFSET = 3
VOCAB_SIZE = 256 + BYTE_OFFSET


def tokenize(texts: str | list[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """UTF-8 bytes + an end token, padded to `max_len` (static, so a new prompt never recompiles).

    Returns `(tokens [batch, max_len] int32, mask [batch, max_len] bool)`. The empty string is
    the null prompt: no tokens at all (the model still sees its learned null token). Longer
    texts are truncated, with a warning.
    """
    texts = [texts] if isinstance(texts, str) else list(texts)
    tokens = np.full((len(texts), max_len), PAD, np.int32)
    mask = np.zeros((len(texts), max_len), bool)
    for row, text in enumerate(texts):
        if not text:
            continue
        ids = [b + BYTE_OFFSET for b in text.encode("utf-8")] + [END]
        if len(ids) > max_len:
            warnings.warn(f"prompt {text!r} is {len(ids)} tokens long (UTF-8 bytes + end); "
                          f"truncated to the model's maximum of {max_len}", stacklevel=2)
            ids = ids[:max_len]
        tokens[row, :len(ids)] = ids
        mask[row, :len(ids)] = True
    return tokens, mask


def detokenize(tokens: np.ndarray) -> list[str]:
    """The inverse of `tokenize` (bytes up to the end token; invalid UTF-8 is replaced)."""
    out = []
    for row in np.atleast_2d(np.asarray(tokens)):
        data = bytearray()
        for t in row.tolist():
            if t in (END, PAD):
                break
            if t >= BYTE_OFFSET:
                data.append(t - BYTE_OFFSET)
        out.append(data.decode("utf-8", errors="replace"))
    return out


def lengths_of(mask: jax.Array) -> jax.Array:
    """`[batch, len]` prefix mask -> `[batch]` int32 lengths."""
    return jnp.sum(mask.astype(jnp.int32), axis=-1)


def check_prefix_mask(mask: np.ndarray, where: str) -> None:
    """Masks must be True-then-False per row: lengths, not arbitrary holes, reach the kernel."""
    mask = np.asarray(mask, bool)
    lengths = mask.sum(-1, keepdims=True)
    if not np.array_equal(mask, np.arange(mask.shape[-1]) < lengths):
        raise ValueError(f"{where}: text mask must be True for the first tokens of each row and "
                         "False after (left-aligned, padding at the end)")


def text_block_config(cfg: ViTConfig) -> ViTConfig:
    """The ViT config of the text encoder's blocks: the text sizes, the image model's dtype,
    attention backend and numerics, and none of its image-only options."""
    t = cfg.text
    standard = {name: getattr(ViTConfig(), name) for name in BLOCK_OPTIONS}
    return dataclasses.replace(
        cfg, width=t.width, depth=t.depth, num_heads=t.num_heads, mlp_dim=t.mlp_dim,
        qk_norm=False, layer_scale=None, drop_path=0.0, remat=False, text=None,
        posemb="learn", classifier="token", class_token=True, num_registers=0,
        pool_include_prefix=None, **standard)


def _word_byte_table() -> np.ndarray:
    """`[VOCAB_SIZE]` bool: ids of bytes that belong to words (ASCII letters and digits, and every
    byte of a multi-byte UTF-8 character, so any language has words); spaces, punctuation and
    the reserved ids separate words."""
    table = np.zeros(VOCAB_SIZE, bool)
    for b in range(256):
        table[b + BYTE_OFFSET] = b >= 128 or chr(b).isalnum()
    return table


def _fold_table() -> np.ndarray:
    """`[VOCAB_SIZE]` int32: each id with ASCII upper case mapped to lower case."""
    table = np.arange(VOCAB_SIZE, dtype=np.int32)
    for b in range(ord("A"), ord("Z") + 1):
        table[b + BYTE_OFFSET] = b + 32 + BYTE_OFFSET
    return table


WORD_BYTES, FOLD = _word_byte_table(), _fold_table()


def word_structure(tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Byte ids `[n, T]` -> (position of each byte within its word `[n, T]` int32, 0 outside
    words; `[n, T, T]` bool, True where two positions are bytes of the same word, and on the
    diagonal for every position)."""
    in_word = jnp.asarray(WORD_BYTES)[tokens]
    before = jnp.pad(in_word[:, :-1], ((0, 0), (1, 0)))
    starts = in_word & ~before
    idx = jnp.arange(tokens.shape[-1], dtype=jnp.int32)[None]
    start_at = jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
    position = jnp.where(in_word, idx - start_at, 0)
    word = jnp.where(in_word, jnp.cumsum(starts, axis=1), -1)
    same = (word[:, :, None] == word[:, None, :]) & in_word[:, :, None]
    return position, same | jnp.eye(tokens.shape[-1], dtype=bool)[None]


class ByteTextEncoder(nnx.Module):
    """Bytes read as words: each byte (upper case folded to lower) is embedded with its
    position *within its word*, and gets the mean of its word's bytes added, so every byte
    carries its word's identity; then pre-norm Transformer blocks over the bytes -> LayerNorm.

    No position in the sentence: a word means the same wherever a wording puts it, which is
    what lets "is there a red triangle?" be read from "red" and "triangle" learned apart.
    Case never matters (folded exactly)."""

    def __init__(self, cfg: ViTConfig, rngs: nnx.Rngs):
        t, bcfg = cfg.text, text_block_config(cfg)
        self.embed = nnx.Embed(VOCAB_SIZE, t.width, embedding_init=nnx.initializers.normal(0.02),
                               rngs=rngs)
        self.pos_embed = nnx.Param(0.02 * jax.random.normal(rngs.params(), (1, t.max_len,
                                                                            t.width)))
        self.blocks = nnx.List([Block(bcfg, 0.0, rngs) for _ in range(t.depth)])
        self.norm = layer_norm(t.width, bcfg, rngs)
        self.dtype = jnp.dtype(cfg.dtype)

    def __call__(self, tokens: jax.Array, lengths: jax.Array, keys: Keys,
                 probs_hook=None) -> jax.Array:
        """`probs_hook(layer, probs)` sees each block's self-attention (explain mode)."""
        if tokens.shape[-1] > self.pos_embed.shape[1]:
            raise ValueError(f"text of {tokens.shape[-1]} tokens is longer than the model's "
                             f"max_len {self.pos_embed.shape[1]}; tokenize with that max_len")
        tokens = jnp.asarray(FOLD)[tokens]
        position, same = word_structure(tokens)
        x = self.embed(tokens) + self.pos_embed[0][position]
        word = same.astype(x.dtype)
        x = x + jnp.einsum("nij,njd->nid", word, x) / jnp.sum(word, -1, keepdims=True)
        x = x.astype(self.dtype)
        for i, block in enumerate(self.blocks):
            hook = (lambda p, i=i: probs_hook(i, p)) if probs_hook is not None else None
            x = block(x, Keys(keys(i)), hook, kv_len=lengths)
        return self.norm(x)


# Things a prompt of the "things" head may name ("a bag and a shirt": two).
THINGS = 2


class TextPath(nnx.Module):
    """Text (token ids or supplied embeddings) -> `[batch, 1 + len, width]` tokens for
    cross-attention, the learned null token first, and their `kv_len` (always >= 1)."""

    def __init__(self, cfg: ViTConfig, rngs: nnx.Rngs):
        t: TextConfig = cfg.text
        self.source = t.source
        if t.source == "bytes":
            self.encoder = ByteTextEncoder(cfg, rngs)
            din = t.width
        else:
            self.encoder = None
            din = t.embed_dim
        # A learned projection into the image model's width (the LiT/Flamingo adapter).
        self.proj = nnx.Linear(din, cfg.width, dtype=jnp.dtype(cfg.dtype),
                               kernel_init=nnx.initializers.xavier_uniform(), rngs=rngs)
        self.null = nnx.Param(0.02 * jax.random.normal(rngs.params(), (1, 1, cfg.width)))
        self.dtype = jnp.dtype(cfg.dtype)
        # The things head's queries: one per thing a prompt may name, each picking its words.
        if t.head == "things":
            self.things_norm = layer_norm(cfg.width, cfg, rngs)
            self.things = nnx.Param(jax.random.normal(rngs.params(), (THINGS, cfg.width)))
        else:
            self.things_norm = self.things = None

    def __call__(self, text: jax.Array, mask: jax.Array, keys: Keys, probs_hook=None
                 ) -> tuple[jax.Array, jax.Array]:
        lengths = lengths_of(mask)
        if self.encoder is not None:
            if text.ndim != 2:
                raise ValueError(f"text must be [batch, len] token ids, got shape {text.shape}")
            x = self.encoder(text, lengths, keys, probs_hook)
        else:
            if text.ndim != 3:
                raise ValueError("text must be [batch, len, embed_dim] embeddings, got shape "
                                 f"{text.shape}")
            x = text
        x = self.proj(x.astype(self.dtype))
        null = jnp.broadcast_to(self.null[...].astype(x.dtype), (x.shape[0], 1, x.shape[-1]))
        return jnp.concatenate([null, x], axis=1), lengths + 1

    def pooled(self, tokens: jax.Array, kv_len: jax.Array) -> jax.Array:
        """Mean over the real tokens (null included): one vector per text, for the prompt and
        similarity heads."""
        real = (jnp.arange(tokens.shape[1])[None, :] < kv_len[:, None])[..., None]
        total = jnp.sum(jnp.where(real, tokens.astype(jnp.float32), 0.0), axis=1)
        return total / kv_len[:, None].astype(jnp.float32)

    def head_text(self, tokens: jax.Array, kv_len: jax.Array) -> jax.Array:
        """What the prompt head reads of the text: the mean (`pooled`), or for `text.head`
        "things" `[batch, THINGS, width]`: the mean plus, per thing, an attention pooling of the
        real tokens under that thing's query (`softmax_j(q_k . LN(T_j) / sqrt(d)) T_j`), so a
        thing's text leans on the words that name it."""
        mean = self.pooled(tokens, kv_len)
        if self.things is None:
            return mean
        x = tokens.astype(jnp.float32)
        keys = self.things_norm(x).astype(jnp.float32)
        logits = jnp.einsum("kd,bjd->bkj", self.things[...], keys) / jnp.sqrt(x.shape[-1])
        real = jnp.arange(x.shape[1])[None, None, :] < kv_len[:, None, None]
        weights = jax.nn.softmax(jnp.where(real, logits, -jnp.inf), axis=-1)
        return mean[:, None, :] + jnp.einsum("bkj,bjd->bkd", weights, x)
