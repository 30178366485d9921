"""Explain mode for text-conditioned models: which patches and which text tokens drove the
prompt-match answer (Chefer, Gur & Wolf 2021, "Generic attention-model explainability for
interpreting bi-modal and encoder-decoder transformers").

`explain_prompt(model, images, prompt)` explains the prompt-match logit
`model(images, text=tokens, text_mask=mask)` of each image with its prompt. Relevance matrices
start as `R^ss = I` (image tokens), `R^qq = I` (text tokens, index 0 the learned null token)
and `R^sq = 0`, and are updated with `Abar = E_h[(grad A * A)^+]`:

- text self-attention, in order: `R^qq += Abar R^qq` (no text encoder for
  `source="embeddings"`: `R^qq` stays `I`);
- image self-attention, in order: `R^ss += Abar R^ss`, `R^sq += Abar R^sq`;
- cross-attention (image queries, text keys): `rules.cross_attention_update`; `R^ss` is
  unchanged since text never attends to the image.

The text reaches the answer by a second route: the prompt head reads the pooled text (the
mean of the encoded text tokens, null included; for the things head also their attention
poolings, `TextPath.head_text`) beside the image. That pooling is treated as
one more attention layer, the answer attending to the text tokens, under the same rule:
`h_j = (grad a_j * a_j)^+`, the positive part of gradient x input of the logit with respect
to token j's term `a_j T_j` of the pooled text (`T_j` the encoded token the head reads, `a_j`
its pooling weight, 0 at padding), taken with the cross-attention held as it is, so it counts
the head route alone. It reaches the text tokens as the cross-attention rule does,
`rules.pooling_update`: `+ h Rbar^qq`.

The patch map is the readout row of `R^ss` over the patches, the text relevance the readout
row of `R^sq` over the real text tokens plus the head route `h Rbar^qq` (the readout is what
the prompt head pools: class token, patch mean, the MAP head's weights, or the patch head's
soft-maximum weights). The image's head route needs nothing more: the readout row of the
identity in `R^ss` is each patch's own share in what the head reads (for the patch head, its
weight in the soft maximum, `d logit / d score`). A gate still at 0 sends no gradient to its
cross-attention probabilities, so with every gate closed the text relevance is the head route
alone.

Unlike `maps.py` this keeps every layer's attention and gradient (`layers x heads x tokens^2`
per image): text models are explained a few images at a time. The forward pass is the model's
own (`encode_text`, `features` and the prompt head, with a hook at every attention and a
multiplicative zero perturbation of the tokens the head pools); the tests check its logits
against `model(images, text=...)`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vit.explanations import rules
from vit.explanations.tokens import TokenLayout, map_readout
from vit.models.text import BYTE_OFFSET, END, tokenize


class PromptExplanation(NamedTuple):
    maps: jax.Array  # [batch, rows, cols]: patch relevance for the prompt answer
    text_scores: jax.Array  # [batch, text_len]: relevance per text token, 0 at padding
    null_score: jax.Array  # [batch]: relevance of the learned null token (always present)
    text_mask: jax.Array  # [batch, text_len]: which text positions are real tokens
    logits: jax.Array  # [batch]: prompt-match logits, as model(images, text=...) gives them
    probs: jax.Array  # [batch]: sigmoid(logits), the probability the prompt is true
    tokens: np.ndarray | None  # [batch, text_len] byte-token ids; None for embeddings


def _prompt_forward(model, images, text, mask, text_hook, image_hook, cross_hook, pool_delta):
    """The prompt-match logit with a hook at every attention; returns (logits, final tokens,
    the readout the prompt head weighs patches by, or None when the pooling fixes it).

    The prompt head reads the pooled text of `T * (1 + pool_delta)` (`pool_delta [b, 1 + t]`,
    zero), so d logit / d pool_delta is gradient x input of each token on the head route
    alone: cross-attention reads the unperturbed `T`."""
    encoded = model.encode_text(text, mask, text_hook=text_hook)
    txt, kv_len = encoded[:2]
    scaled = txt * (1.0 + pool_delta[..., None]).astype(txt.dtype)
    head_text = model.text_path.head_text(scaled, kv_len)
    tokens = model.features(images, encoded_text=encoded, probs_hook=image_hook,
                            xattn_hook=cross_hook)
    return (model.answer(tokens, encoded, head_text=head_text), tokens,
            model.answer_readout(tokens, encoded))


def capture_prompt(model, images, text, mask):
    """Logits, readout row, and per kind (`text`, `image`, `cross`) every layer's
    probabilities and d logit / d probabilities, in the order the layers run; and, under
    `"pool"`, the prompt head's gradient x input per text token (`[b, 1 + t]`, null first).

    Gradients are taken with respect to zero deltas added to each layer's probabilities (as
    `capture.attention_grads`), so each gradient pairs with its own layer by construction.
    """
    cfg = model.config
    b, t = images.shape[0], text.shape[1]
    n = TokenLayout.for_model(model, images.shape[1:3]).num_tokens
    enc = model.text_path.encoder
    deltas = {
        "text": [jnp.zeros((b, cfg.text.num_heads, t, t), jnp.float32)
                 for _ in (enc.blocks if enc is not None else ())],
        "image": [jnp.zeros((b, cfg.num_heads, n, n), jnp.float32) for _ in model.blocks],
        "cross": [jnp.zeros((b, cfg.num_heads, n, 1 + t), jnp.float32) for _ in model.xattn],
        "pool": jnp.zeros((b, 1 + t), jnp.float32),
    }

    def target(deltas):
        recorded = {kind: {} for kind in ("text", "image", "cross")}

        def hook(kind):
            def perturb(i, probs):
                recorded[kind][i] = probs
                return probs + deltas[kind][i]
            return perturb

        logits, tokens, readout = _prompt_forward(model, images, text, mask, hook("text"),
                                                  hook("image"), hook("cross"),
                                                  deltas["pool"])
        if readout is not None:  # the patch head: its own soft-maximum weights
            pass
        elif cfg.classifier == "map":
            readout = map_readout(model.map_head, tokens)
        else:
            readout = TokenLayout.for_model(model, images.shape[1:3]).fixed_readout(b)
        probs = {kind: [rec[i] for i in range(len(rec))] for kind, rec in recorded.items()}
        return logits.sum(), (logits, jax.lax.stop_gradient(readout), probs)

    grads, (logits, readout, probs) = jax.grad(target, has_aux=True)(deltas)
    return logits, readout, probs, grads


def prompt_relevance_core(model, images, text, mask):
    """The unjitted body of `explain_prompt`: `(maps, text_row, logits)`, where `text_row`
    `[batch, 1 + text_len]` is the readout row of `R^sq` plus the prompt head's own route
    `h Rbar^qq` (null token first)."""
    layout = TokenLayout.for_model(model, images.shape[1:3])
    logits, readout, probs, grads = capture_prompt(model, images, text, mask)
    b, t, n = images.shape[0], text.shape[1], layout.num_tokens

    def abar(kind, i):
        return rules.positive_grad_attention(probs[kind][i], grads[kind][i]).mean(1)

    # d logit / d delta_j with T_j (1 + delta_j) pooled: already gradient x input
    head = jnp.maximum(grads["pool"], 0.0)

    r_qq = jnp.broadcast_to(jnp.eye(1 + t, dtype=jnp.float32), (b, 1 + t, 1 + t))
    for i in range(len(probs["text"])):
        # The encoder sees the text alone; the null token joins after it, untouched.
        r_qq = rules.relevancy_self_update(r_qq, jnp.pad(abar("text", i), ((0, 0), (1, 0),
                                                                          (1, 0))))
    r_ss = jnp.broadcast_to(jnp.eye(n, dtype=jnp.float32), (b, n, n))
    r_sq = jnp.zeros((b, n, 1 + t), jnp.float32)
    after = {i: j for j, i in enumerate(model.config.text.xattn_layers(len(model.blocks)))}
    for i in range(len(model.blocks)):
        a = abar("image", i)
        r_ss = rules.relevancy_self_update(r_ss, a)
        r_sq = rules.relevancy_self_update(r_sq, a)  # the same `R + Abar R`, on R^sq
        if i in after:
            r_sq = rules.cross_attention_update(r_ss, r_sq, r_qq, abar("cross", after[i]))
    row_ss = jnp.einsum("bq,bqk->bk", readout, r_ss)
    row_sq = rules.pooling_update(jnp.einsum("bq,bqk->bk", readout, r_sq), head, r_qq)
    return layout.patch_grid(row_ss), row_sq, logits


_prompt_relevance = nnx.jit(prompt_relevance_core)


def explain_prompt(model, images, prompt, text_mask=None) -> PromptExplanation:
    """Patch maps and text-token relevance for the prompt-match answer of each image.

    `images`: NHWC, preprocessed as the model expects. `prompt`: one string for every image or
    a list with one per image (byte models; tokenized to the model's `max_len`), or, for
    `source="embeddings"` models, `[batch, len, embed_dim]` vectors with their `text_mask`.
    """
    cfg = model.config
    if cfg.text is None or model.prompt_head is None:
        raise ValueError("this model has no text path, so no prompt to explain; build it with "
                         "a text config (ViTConfig.text)")
    images = jnp.asarray(images, jnp.float32)
    b = images.shape[0]
    tokens = None
    if cfg.text.source == "bytes":
        texts = [prompt] * b if isinstance(prompt, str) else list(prompt)
        if not all(isinstance(p, str) for p in texts):
            raise ValueError("this model reads text as bytes: give the prompt as a string or "
                             "a list of strings")
        if len(texts) != b:
            raise ValueError(f"{len(texts)} prompts for {b} images: give one prompt, or one "
                             "per image")
        tokens, mask = tokenize(texts, cfg.text.max_len)
        text = jnp.asarray(tokens)
    else:
        if isinstance(prompt, str) or (isinstance(prompt, list | tuple) and prompt
                                       and isinstance(prompt[0], str)):
            raise ValueError("this model takes text embeddings (text.source='embeddings'), "
                             "not strings: give [batch, len, embed_dim] vectors and a text_mask")
        if text_mask is None:
            raise ValueError("text embeddings need a text_mask [batch, len]")
        text = jnp.asarray(prompt, jnp.float32)
        mask = np.asarray(text_mask, bool)
        if text.ndim != 3 or text.shape[0] != b or mask.shape != text.shape[:2]:
            raise ValueError(f"expected embeddings [{b}, len, {cfg.text.embed_dim}] and a "
                             f"[{b}, len] mask, got {text.shape} and {mask.shape}")
    maps, row, logits = _prompt_relevance(model, images, text, jnp.asarray(mask))
    real = jnp.asarray(mask)
    return PromptExplanation(maps, jnp.where(real, row[:, 1:], 0.0), row[:, 0], real, logits,
                             jax.nn.sigmoid(logits), tokens)


def _token_label(token: int) -> str:
    if token == END:
        return "<end>"
    byte = token - BYTE_OFFSET
    return chr(byte) if 32 <= byte < 127 else f"\\x{byte:02x}"


def _utf8_width(lead: int) -> int:
    return 2 if 0xC0 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 else \
        4 if 0xF0 <= lead < 0xF8 else 1


def text_relevance(explanation: PromptExplanation, i: int,
                   per: str = "character") -> list[dict]:
    """Image `i`'s text relevance as `[{"token": str, "score": float}, ...]`, in text order.

    `per="token"`: one entry per model token, i.e. per UTF-8 byte (printable ASCII as itself,
    other bytes as `\\xNN`) plus `<end>`. `per="character"`: the bytes of each character
    grouped, with their scores summed (relevance adds up), so `é` is one entry; a character
    cut short by truncation keeps the bytes the model saw. Embedding inputs have no text:
    their tokens are `#0`, `#1`, ...
    """
    if per not in ("token", "character"):
        raise ValueError(f"per={per!r}: use 'token' or 'character'")
    real = np.asarray(explanation.text_mask[i], bool)
    scores = np.asarray(explanation.text_scores[i], np.float64)[real]
    if explanation.tokens is None:
        return [{"token": f"#{k}", "score": float(s)} for k, s in enumerate(scores)]
    ids = np.asarray(explanation.tokens[i])[real].tolist()
    if per == "token":
        return [{"token": _token_label(t), "score": float(s)}
                for t, s in zip(ids, scores, strict=True)]
    groups: list[tuple[bytearray | None, float]] = []
    want = 0  # continuation bytes the current character still expects
    for t, s in zip(ids, scores, strict=True):
        byte = t - BYTE_OFFSET
        if t != END and want and 0x80 <= byte < 0xC0:
            groups[-1][0].append(byte)
            groups[-1] = (groups[-1][0], groups[-1][1] + s)
            want -= 1
            continue
        if t == END:
            groups.append((None, s))
            want = 0
        else:
            groups.append((bytearray([byte]), s))
            want = _utf8_width(byte) - 1
    return [{"token": "<end>" if data is None else data.decode("utf-8", errors="replace"),
             "score": float(s)} for data, s in groups]


def points_inside(maps, boxes, image_size: int) -> np.ndarray:
    """`[batch]` bool: whether each map's strongest patch has its centre inside the image's
    box. `maps [batch, rows, cols]` (as `explain_prompt` gives them), `boxes [batch, 4]` as
    (y0, x0, y1, x1) in pixels of the `image_size` input, end exclusive: the check that the
    explanation of "is there a bag?" lands on the bag."""
    maps, boxes = np.asarray(maps, np.float64), np.asarray(boxes)
    b, rows, cols = maps.shape
    best = maps.reshape(b, -1).argmax(-1)
    r, c = np.divmod(best, cols)
    y = (r + 0.5) * image_size / rows
    x = (c + 0.5) * image_size / cols
    return (boxes[:, 0] <= y) & (y < boxes[:, 2]) & (boxes[:, 1] <= x) & (x < boxes[:, 3])


def pointing_rate(model, images, prompts, boxes, batch_size: int = 25) -> dict:
    """How often the relevancy map of each (image, prompt) has its strongest patch inside the
    asked item's box: `{"scenes", "inside", "rate"}`. `images` preprocessed NHWC, one prompt
    and one box (`points_inside`) per image; a few images at a time, as `explain_prompt`
    keeps every layer's attention."""
    images, boxes = np.asarray(images, np.float32), np.asarray(boxes)
    inside = []
    for start in range(0, len(images), batch_size):
        stop = start + batch_size
        result = explain_prompt(model, images[start:stop], list(prompts[start:stop]))
        inside.append(points_inside(result.maps, boxes[start:stop], images.shape[1]))
    inside = np.concatenate(inside) if inside else np.zeros(0, bool)
    return {"scenes": int(len(inside)), "inside": int(inside.sum()),
            "rate": float(inside.mean()) if len(inside) else None}
