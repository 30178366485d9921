"""`--set KEY=VALUE` text -> a typed value: one set of rules for recipe keys and model fields.

The text is read as a Python literal (ints, floats, quoted strings, tuples and lists, `1,2`
without brackets), with `true`/`false`/`none`/`null` in any case and `384x512` for a pair;
anything else is the text itself. The value is then checked against the type the key expects:
a recipe key's type in `vit.recipes.defaults` (else its current value's, `vit.recipes.load`) or a
model field's annotation (`vit.recipes.model_fields`). A recipe file's own values pass the same
check (`convert`). An int passes where a float is expected (and becomes one), 0 and 1
where a bool is, a single value where a list is (a one-item list); where text is expected, the
text is kept as typed. Anything else is a one-line ConfigError naming the key, the text and the
expected type.

Standard library only, so `vit info --set` pays for neither ml_collections nor jax.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import types
import typing
from typing import Any

from vit.errors import ConfigError

_WORDS = {"true": True, "false": False, "none": None, "null": None}


class _Mismatch(Exception):
    pass


class _Words(ast.NodeTransformer):
    """JSON/YAML spellings (`true`, `null`, any case) as constants, also inside lists."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id.lower() in _WORDS:
            return ast.copy_location(ast.Constant(_WORDS[node.id.lower()]), node)
        return node


def literal(text: str) -> Any:
    """The value `text` spells: a Python literal, `true`/`none` words, `AxB`; else the text."""
    stripped = text.strip()
    if re.fullmatch(r"\d+x\d+", stripped):  # "384x512", the usual way to write an image size
        return tuple(int(p) for p in stripped.split("x"))
    try:
        return ast.literal_eval(_Words().visit(ast.parse(stripped, mode="eval")))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return text


def expected_type(current: Any) -> Any:
    """The type a recipe key expects: its current value's (a list's by its items' types).

    None expects anything (`typing.Any`).
    """
    if current is None:
        return Any
    if isinstance(current, tuple | list):
        items = {expected_type(v) for v in current}
        if items == {int, float}:
            items = {float}
        if len(items) != 1 or Any in items:  # empty or mixed: items unchecked
            return list if isinstance(current, list) else tuple
        item = items.pop()
        return list[item] if isinstance(current, list) else tuple[item, ...]
    return type(current)


def parse_value(key: str, text: str, expected: Any, example: Any = None) -> Any:
    """`text` as a value of type `expected` (a type or an annotation such as `int | None`).

    `example` (a valid value, when known) is shown in the error.
    """
    try:
        return _convert(literal(text), expected, text)
    except _Mismatch:
        hint = "" if example is None else f", e.g. --set {key}={_as_text(example)}"
        raise ConfigError(f"--set {key}={text}: expected {describe(expected)}{hint}") from None


def convert(value: Any, expected: Any) -> Any:
    """A recipe file's `value` as `expected` (the rules above, for a value rather than text);
    TypeError when it does not fit."""
    try:
        return _convert(value, expected)
    except _Mismatch:
        raise TypeError(f"expected {describe(expected)}") from None


def split_item(item: str, form: str = "KEY=VALUE", example: str = "train.steps=100"
               ) -> tuple[str, str]:
    """`"a.b=1"` -> `("a.b", "1")`; text without `=` is a one-line ConfigError."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: write {form}, e.g. --set {example}")
    key, text = item.split("=", 1)
    return key.strip(), text


def _convert(value: Any, expected: Any, text: str | None = None) -> Any:
    """`value` as `expected`, or _Mismatch. `text` (top level only) is what a str field keeps."""
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if expected is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:  # "none" means None even beside `str`
            return None
        for arm in args:
            try:
                return _convert(value, arm, text)
            except _Mismatch:
                pass
        raise _Mismatch
    if expected is type(None):
        if value is None:
            return None
    elif expected is str:
        if isinstance(value, str):
            return value
        if text is not None:  # "123" or "none" for a text field: the text as typed
            return text
    elif expected is bool:
        if isinstance(value, bool) or (type(value) is int and value in (0, 1)):
            return bool(value)
    elif expected is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif expected is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif expected in (tuple, list) or origin in (tuple, list):
        container = origin or expected
        items = list(value) if isinstance(value, tuple | list) else [value]
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            items = [_convert(v, args[0]) for v in items]
        elif args:  # a fixed-length tuple such as tuple[int, int]
            if len(items) != len(args):
                raise _Mismatch
            items = [_convert(v, a) for v, a in zip(items, args, strict=True)]
        return container(items)
    elif dataclasses.is_dataclass(expected):
        if isinstance(value, dict | expected):  # the dataclass checks a dict's fields itself
            return value
    elif isinstance(expected, type) and isinstance(value, expected):
        return value
    raise _Mismatch


_PLURALS = {"int": "ints", "float": "floats", "text": "texts", "true or false": "booleans"}


def describe(expected: Any) -> str:
    """Words for a type, as in "expected int or none"."""
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if expected is Any:
        return "any value"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if expected in (tuple, list):
        return "a comma-separated list"
    if origin in (tuple, list):
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            item = describe(args[0])
            return f"a comma-separated list of {_PLURALS.get(item, item + ' values')}"
        if len(set(args)) == 1:
            item = describe(args[0])
            return f"{len(args)} comma-separated {_PLURALS.get(item, item + ' values')}"
        return f"({', '.join(describe(a) for a in args)})"
    if dataclasses.is_dataclass(expected):
        return f"a dict of {expected.__name__} fields"
    names = {type(None): "none", bool: "true or false", str: "text"}
    return names.get(expected, getattr(expected, "__name__", str(expected)))


def _as_text(value: Any) -> str:
    """A value as one would type it after `--set KEY=`."""
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, tuple | list) and value and all(
            isinstance(v, int | float | str) for v in value):
        return ",".join(_as_text(v) for v in value)
    return str(value)
