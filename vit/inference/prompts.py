"""Texts for a text model: `--prompt` texts, `--text-embeddings` files and `--zero-shot` names,
each made into `Prompts` (labels, tokens or embeddings, mask) after checking that the model can
read them; and what a model read in training (`checkpoint_prompt_words`), so a prompt with words
it never saw is named as such (`unknown_word_notices`), and one naming a thing by a word it
never saw ("is there a belt?") is answered "no" by rule (`Prompts.never_seen`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vit.errors import CheckpointError, DataError


@dataclasses.dataclass(frozen=True)
class Prompts:
    """Texts ready for a text model: display `labels`, `text` (token ids `[P, T]`, or supplied
    embeddings `[P, T, D]`) and its left-aligned `mask [P, T]`. `never_seen` holds, for each
    prompt, the words it names a thing by that the model never read, or every word of a prompt
    with no word the model read (empty: none, or nothing known of the model's training); such
    a prompt is answered "no" by rule."""

    labels: list[str]
    text: np.ndarray
    mask: np.ndarray
    never_seen: tuple[tuple[str, ...], ...] = ()

    def ruled_no(self, index: int) -> tuple[str, ...]:
        """The never-seen words that answer prompt `index` "no", or ()."""
        return self.never_seen[index] if self.never_seen else ()


def require_text(config, flag: str, *, source: str | None = None,
                 similarity: bool = False) -> None:
    """Refuses (one line, naming `flag`) a model that cannot take what `flag` gives it."""
    t = config.text
    if t is None:
        raise CheckpointError(f"{flag}: this model has no text path (it was not built with "
                              "text conditioning), so it cannot score text")
    if similarity and not t.similarity_dim:
        raise CheckpointError(f"{flag}: this model has no similarity head "
                              "(text.similarity_dim=0), which zero-shot scoring needs")
    if source == "bytes" and t.source == "embeddings":
        raise CheckpointError(
            f"{flag}: this model was trained on embeddings from an outside text model "
            f"(text.source='embeddings'), so it cannot read text itself; give "
            f"--text-embeddings FILE.npz (tokens [P, T, {t.embed_dim}], mask [P, T]) made with "
            "that text model")
    if source == "embeddings" and t.source == "bytes":
        raise CheckpointError(f"{flag}: this model reads text itself (text.source='bytes'), "
                              "not embeddings; give --prompt TEXT")


def require_utf8(flag: str, text: str) -> None:
    """Refuses text that is not UTF-8: bytes the shell passed in another encoding reach
    Python as surrogate escapes, which no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raw = text.encode("utf-8", "surrogateescape")
        shown = raw.decode("utf-8", "backslashreplace")
        raise DataError(f"{flag} '{shown}': not UTF-8 text (byte "
                        f"{text[err.start].encode('utf-8', 'surrogateescape')[0]:#04x} at "
                        f"character {err.start + 1}); give the text in UTF-8") from None


def encode_prompts(config, texts: Sequence[str], *, labels: Sequence[str] | None = None,
                   flag: str = "--prompt", words=None) -> Prompts:
    """Tokenizes once at the model's fixed `max_len` (so a new prompt never recompiles).

    The empty string is the null prompt; a too-long prompt is truncated with a UserWarning.
    With what the model read in training (`words`, a `PromptWords`), each prompt holding words
    outside its vocabulary gets a UserWarning too (`unknown_word_notices`), and the words that
    name a thing are kept in `Prompts.never_seen`.
    """
    import warnings

    from vit.models.text import tokenize

    require_text(config, flag, source="bytes")
    texts = list(texts)
    if not texts:
        raise DataError(f"{flag}: no texts given")
    for text in texts:
        require_utf8(flag, text)
    for line in unknown_word_notices(words, texts):
        warnings.warn(line, UserWarning, stacklevel=2)
    tokens, mask = tokenize(texts, config.text.max_len)
    never_seen = tuple(tuple(ruled_no_words(words, t)) for t in texts) if words else ()
    return Prompts(list(labels) if labels is not None else texts, tokens, mask, never_seen)


def load_text_embeddings(config, path) -> Prompts:
    """`--text-embeddings`: an .npz of `tokens [P, T, D]` float and `mask [P, T]` bool (True
    first), optionally `texts [P]` (a unicode array) to label them; P prompts per image."""
    from vit.checkpoints.npz import NotNpzError, load_npz
    from vit.models.text import check_prefix_mask

    flag = f"--text-embeddings {path}"
    require_text(config, flag, source="embeddings")
    dim = config.text.embed_dim
    want = f"tokens [P, T, {dim}] float and mask [P, T] bool"
    try:
        arrays = load_npz(path)
    except FileNotFoundError:
        raise DataError(f"{flag}: no such file") from None
    except NotNpzError as err:  # empty, cut short, not a zip, or a pickled array inside
        raise DataError(f"{flag}: not a readable .npz of arrays ({err}); write it with "
                        "np.savez(path, tokens=..., mask=...)") from None
    if "tokens" not in arrays or "mask" not in arrays:
        raise DataError(f"{flag}: has {sorted(arrays)}; wanted {want} (and optionally texts [P])")
    tokens, mask, texts = arrays["tokens"], arrays["mask"], arrays.get("texts")
    if (tokens.ndim != 3 or tokens.shape[2] != dim or tokens.shape[0] < 1
            or not np.issubdtype(tokens.dtype, np.floating)):
        raise DataError(f"{flag}: tokens has shape {list(tokens.shape)} {tokens.dtype}; wanted "
                        f"[P, T, {dim}] float (D = the model's text.embed_dim)")
    if mask.shape != tokens.shape[:2] or mask.dtype != bool:
        raise DataError(f"{flag}: mask has shape {list(mask.shape)} {mask.dtype}; wanted "
                        f"[{tokens.shape[0]}, {tokens.shape[1]}] bool (one row per prompt)")
    try:
        check_prefix_mask(mask, flag)
    except ValueError as err:
        raise DataError(str(err)) from None
    if not np.isfinite(tokens).all():
        raise DataError(f"{flag}: tokens hold NaN or infinite values")
    if texts is None:
        labels = [f"embedding {i}" for i in range(len(tokens))]
    elif texts.shape != (len(tokens),) or texts.dtype.kind != "U":
        raise DataError(f"{flag}: texts has shape {list(texts.shape)} {texts.dtype}; wanted "
                        f"[{len(tokens)}] strings (a numpy unicode array)")
    else:
        labels = [str(s) for s in texts]
    return Prompts(labels, tokens.astype(np.float32), mask)


def read_names(path) -> list[str]:
    """A zero-shot names file: one name a line; blank lines are skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"--zero-shot {path}: cannot read ({err})") from None
    names = [line.strip() for line in lines if line.strip()]
    if not names:
        raise DataError(f"--zero-shot {path}: no names in it; give one name per line")
    return names


def zero_shot_prompts(config, names: Sequence[str], template: str = "{}") -> Prompts:
    """Names written into `template` ("a photo of a {}") and tokenized; labelled by the names."""
    require_text(config, "--zero-shot", source="bytes", similarity=True)
    require_utf8("--template", template)
    if "{}" not in template:
        raise DataError(f"--template {template!r}: has no {{}} where the name goes")
    return encode_prompts(config, [template.replace("{}", n) for n in names], labels=names,
                          flag="--zero-shot")


def prompts_forward(merged, prompts: Prompts):
    """`(forward, (text, mask))`: every image against every prompt, the sigmoid of each match.

    Each prompt is encoded once per batch and shared by its images (`answer_prompts`)."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def forward(state, images, text, mask):
        b = images.shape[0]
        logits = merged(state).answer_prompts(images, text, mask)
        return (jax.nn.sigmoid(logits.reshape(b, -1)),)  # [b] when there is one prompt

    # Arguments, not constants: other prompts of the same count reuse the compile.
    return forward, (jnp.asarray(prompts.text), jnp.asarray(prompts.mask))


def ruled_no_words(words, text: str) -> list[str]:
    """The words that make `text` a question the model cannot know (`words`, a `PromptWords`):
    the never-seen words it names a thing by, or all of its words when it holds none the
    model read. [] for a question the model answers itself."""
    from vit.data.prompt_words import knows_none

    if knows_none(text, words.vocabulary):
        return words.unknown(text)
    return words.never_seen_named(text)


def unknown_word_notices(words, texts: Sequence[str]) -> list[str]:
    """One line for each prompt with words the model never saw in its training prompts, naming
    them (`words`, a `PromptWords`: what it read). A prompt with no known word at all, or one
    that names a thing by a word never seen, is answered "no" by rule (`Prompts.never_seen`);
    one with other unknown words is answered from its known ones. Nothing for the null prompt
    "", or without `words`."""
    from vit.data.prompt_words import knows_none

    if not words:
        return []
    out = []
    for text in texts:
        unknown = words.unknown(text)
        if not unknown:
            continue
        named = ", ".join(repr(w) for w in unknown)
        never_seen = words.never_seen_named(text)
        if knows_none(text, words.vocabulary):
            out.append(f"prompt {text!r} holds no word seen in training ({named}): the model "
                       "cannot know what it asks, so the answer is \"no\" by rule")
        elif never_seen:
            out.append(f"prompt {text!r} asks about {', '.join(map(repr, never_seen))}, never "
                       "seen in training: the model cannot know it, so the answer is \"no\" by "
                       "rule")
        else:
            out.append(f"prompt {text!r}: {named} never seen in training; the answer rests on "
                       "its other words")
    return out


def checkpoint_prompt_words(checkpoint):
    """What the `vit train` run a checkpoint comes from read in its prompts (a `PromptWords`):
    the workdir's `config.json` (at the checkpoint or up to three folders above it) names the
    dataset, and the dataset lists its words and templates. None when no run or no prompt
    dataset is found (a checkpoint copied out of its workdir, another library's model)."""
    import json

    from vit.data.sources import prompt_words_of

    path = Path(checkpoint)
    for folder in [path, *path.parents][:4]:
        config = folder / "config.json"
        if not config.is_file():
            continue
        try:
            data = json.loads(config.read_text(encoding="utf-8")).get("data")
        except (OSError, ValueError, AttributeError):
            return None
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            return prompt_words_of(data["name"])
    return None
