"""Parameters of tasks and mechanisms: parsing ``key=value`` from the command line and
checking overrides against the defaults (unknown names, wrong types), in one place."""

from __future__ import annotations

import ast
import inspect
from typing import Any

from synthbench.core.text import did_you_mean, short_repr

REQUIRED = object()  # marks a parameter without a default
# the longest value text parse_assignments reads: a sweep's list of a thousand values fits
MAX_VALUE_CHARS = 10_000
# how deeply a value may nest (``[[-1]]`` is 4 deep: list, list, minus, number): far past
# any real value, and far inside Python's parser and stack, so the bound is the same
# wherever parse_assignments is called from
MAX_VALUE_DEPTH = 32


def parse_assignments(items: list[str] | None) -> dict[str, Any]:
    """``["n=64", "eps=1e-4", "name=abc"]`` -> ``{"n": 64, "eps": 1e-4, "name": "abc"}``.

    A value is a Python literal, ``true``/``false``, or else the text itself. A value
    longer than ``MAX_VALUE_CHARS`` or nested deeper than ``MAX_VALUE_DEPTH`` is a
    ValueError naming the parameter, before Python's parser could run out of stack or
    memory on it (``1+1+...+1``, ``----1``, ``[[[...]]]``).
    """
    parsed: dict[str, Any] = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"parameter {short_repr(item)} is not of the form key=value")
        key, text = key.strip(), text.strip()
        if len(text) > MAX_VALUE_CHARS:
            raise ValueError(
                f"parameter {short_repr(key)}: its value is {len(text):,} characters, more "
                f"than the {MAX_VALUE_CHARS:,} read"
            )
        parsed[key] = _parse_value(key, text)
    return parsed


def _parse_value(key: str, text: str) -> Any:
    """The literal ``text`` stands for, or ``text`` itself; too deep a value is refused."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        if "too many nested" in str(exc.msg):  # the tokenizer's own bound: 200 brackets
            raise _too_deep(key) from None
        return _word(text)
    except ValueError:  # a null byte (a SyntaxError from Python 3.12 on)
        return _word(text)
    except (RecursionError, MemoryError):  # ----1 or 1+1+...+1: past the parser's stack
        raise _too_deep(key) from None
    if _depth_exceeds(tree.body, MAX_VALUE_DEPTH):  # literal_eval recurses on every level
        raise _too_deep(key)
    try:
        return ast.literal_eval(tree)
    except (ValueError, TypeError):  # an expression that is not a literal (abc, a-b)
        return _word(text)


def _too_deep(key: str) -> ValueError:
    return ValueError(
        f"parameter {short_repr(key)}: its value is nested too deeply to read (more than "
        f"{MAX_VALUE_DEPTH} levels)"
    )


def _word(text: str) -> Any:
    return {"true": True, "false": False}.get(text.lower(), text)


def _depth_exceeds(node: ast.AST, limit: int) -> bool:
    """Whether the tree under ``node`` is more than ``limit`` nodes deep; iterative, so
    that a deep tree costs no stack (load/store markers do not count)."""
    pending = [(node, 1)]
    while pending:
        node, depth = pending.pop()
        if depth > limit:
            return True
        pending.extend(
            (child, depth + 1)
            for child in ast.iter_child_nodes(node)
            if not isinstance(child, ast.expr_context)
        )
    return False


def resolve_params(owner: str, defaults: dict[str, Any], overrides: dict[str, Any]) -> dict:
    """Defaults updated with overrides; a ValueError names an unknown parameter, a value of
    the wrong type, or a required parameter left without a value."""
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        hint = did_you_mean(unknown[0], defaults) if len(unknown) == 1 else ""
        raise ValueError(
            f"{owner} has no parameter {', '.join(unknown)}{hint} "
            f"(parameters: {', '.join(defaults) or 'none'})"
        )
    params = dict(defaults)
    for name, value in overrides.items():
        params[name] = _coerce(owner, name, defaults[name], value)
    missing = [name for name, value in params.items() if value is REQUIRED]
    if missing:
        raise ValueError(f"{owner} needs a value for {', '.join(missing)}")
    return params


def _coerce(owner: str, name: str, default: Any, value: Any) -> Any:
    """Match the default's type where it is a plain number or flag (an int for a float is
    fine); anything else is passed through for the owner to validate."""
    kind = type(default)
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    else:
        return value
    if not ok:
        raise ValueError(
            f"{owner} parameter {name} must be {kind.__name__}, got {short_repr(value)}"
        )
    return value


def check_int(name: str, value: Any, low: int, high: int | None = None) -> None:
    """Raise ValueError unless ``value`` is an int (not a bool) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {short_repr(value)}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be an integer <= {high}, got {short_repr(value)}")


def check_positive(**values: Any) -> None:
    """Raise ValueError naming the first of ``values`` that is not a number > 0."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(f"{name} must be a number > 0, got {short_repr(value)}")


def constructor_params(owner: str, cls: type, overrides: dict[str, Any] | None = None) -> dict:
    """The full parameter set of a class built as ``cls(head_dim, n_heads, **params)`` (a
    mechanism, a rotation): its constructor defaults updated with ``overrides``.

    Raises ValueError naming an unknown parameter, a wrong type or a missing value.
    """
    defaults = {
        name: REQUIRED if p.default is inspect.Parameter.empty else p.default
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if name not in ("self", "head_dim", "n_heads")
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }
    return resolve_params(owner, defaults, dict(overrides or {}))
