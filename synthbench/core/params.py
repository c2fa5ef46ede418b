"""Parameters of tasks and mechanisms: parsing ``key=value`` from the command line and
checking overrides against the defaults (unknown names, wrong types), in one place."""

from __future__ import annotations

import ast
import inspect
from typing import Any

from synthbench.core.text import short_repr

REQUIRED = object()  # marks a parameter without a default
# the longest value text parse_assignments reads: a sweep's list of a thousand values fits
MAX_VALUE_CHARS = 10_000


def parse_assignments(items: list[str] | None) -> dict[str, Any]:
    """``["n=64", "eps=1e-4", "name=abc"]`` -> ``{"n": 64, "eps": 1e-4, "name": "abc"}``."""
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
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = {"true": True, "false": False}.get(text.lower(), text)
        except (RecursionError, MemoryError):  # 1+1+...+1, ----1: past Python's parser
            raise ValueError(
                f"parameter {short_repr(key)}: its value is nested too deeply to read"
            ) from None
        parsed[key] = value
    return parsed


def resolve_params(owner: str, defaults: dict[str, Any], overrides: dict[str, Any]) -> dict:
    """Defaults updated with overrides; a ValueError names an unknown parameter, a value of
    the wrong type, or a required parameter left without a value."""
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise ValueError(
            f"{owner} has no parameter {', '.join(unknown)} "
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
