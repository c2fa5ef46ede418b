"""Grids of runs: one command over lists of task knobs, mechanism parameters, protocol fields
and difficulty presets, every combination a run of its own (a sweep; the learning rates of
one run are synthbench/run/lr_selection.py's).

Where a parameter's value is a list (``--task-param pairs=4,8,16``, or a list in a sweep
file) the grid takes each value in turn; lists of several parameters are crossed. A
parameter whose default is itself a sequence (rewa's ``parts``) takes a flat list as its
value, and sweeps only over a list of lists.

Protocol fields are set per point with ``dataclasses.replace``: the protocol keeps its name
and version and its changed config is in the run id, like any other parameter, so a point of
a grid and the same run typed alone are one stored run.

A sweep file (TOML) holds a whole grid, so that a paper's grid is one file in its
repository; ``load_sweep_file`` reads it into the options of ``synthbench run``
(docs/RUNNING.md, "Sweeps").
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from synthbench.core.params import resolve_params
from synthbench.core.text import did_you_mean
from synthbench.run.protocols import PROTOCOLS, Protocol

# Protocol fields a grid may set. Not: name, version, description (they name the preset),
# seeds (--seeds), pos (--pos, with its rotation's parameters), task_params (--task-param),
# lrs and betas (the lr grid is the selection's, not a knob).
PROTOCOL_FIELDS = (
    "arch",
    "d_model",
    "n_heads",
    "n_layers",
    "steps",
    "batch_size",
    "lr_extend",
    "stop_at",
    "pace_margin",
    "lr_signal",
    "max_steps",
    "extend_steps",
    "rise_margin",
    "max_seeds",
    "seed_spread",
    "weight_decay",
    "warmup_frac",
    "min_lr_frac",
    "grad_clip",
    "val_examples",
    "test_examples",
    "eval_batch_size",
    "select_metric",
)
# the direction in which a protocol field makes a task harder, for the frontier report
# (synthbench/report/frontier.py): a smaller model, a shorter or noisier training
PROTOCOL_HARDER = {
    "d_model": "smaller",
    "n_layers": "smaller",
    "steps": "smaller",
    "batch_size": "smaller",
}


def is_sweep(value: Any, default: Any) -> bool:
    """Whether ``value`` lists the values of a sweep rather than being one value."""
    if not isinstance(value, list | tuple):
        return False
    if isinstance(default, list | tuple):  # a sequence parameter: only a list of lists sweeps
        return bool(value) and all(isinstance(v, list | tuple) for v in value)
    return True


def points(params: dict[str, Any], defaults: dict[str, Any] | None = None) -> list[dict]:
    """Every combination of the listed values of ``params`` (a scalar is in every one).
    ``defaults`` tells a sequence parameter's value from a sweep over it (``is_sweep``)."""
    defaults = defaults or {}
    axes = []
    for name, value in params.items():
        if is_sweep(value, defaults.get(name)):
            values = [tuple(v) if isinstance(v, list) else v for v in value]
            if not values:
                raise ValueError(f"parameter {name} lists no value")
            if len(set(map(repr, values))) < len(values):
                raise ValueError(f"parameter {name} lists a value twice: {list(value)}")
            axes.append([(name, v) for v in values])
        else:
            axes.append([(name, tuple(value) if isinstance(value, list) else value)])
    return [dict(combo) for combo in itertools.product(*axes)]


def n_points(params: dict[str, Any], defaults: dict[str, Any] | None = None) -> int:
    """``len(points(params, defaults))``, without making them."""
    defaults = defaults or {}
    return math.prod(
        len(value) for name, value in params.items() if is_sweep(value, defaults.get(name))
    )


def task_defaults(task_cls: type) -> dict[str, Any]:
    """The default of each parameter of a task (its ``Params`` dataclass), for ``points``."""
    return {f.name: f.default for f in dataclasses.fields(task_cls.Params)}


def constructor_defaults(cls: type) -> dict[str, Any]:
    """The default of each constructor parameter of ``cls`` (a mechanism), for ``points``."""
    return {
        name: p.default
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def protocol_points(protocol: Protocol, overrides: dict[str, Any] | None) -> list[Protocol]:
    """The protocol at every combination of ``overrides`` (field -> value or list), each
    checked by the protocol's own validation."""
    if not overrides:
        return [protocol]
    settable = {f.name: getattr(protocol, f.name) for f in dataclasses.fields(protocol)}
    unknown = sorted(set(overrides) - set(PROTOCOL_FIELDS))
    if unknown:
        name = unknown[0]
        if name in settable:
            why = {"pos": "use --pos", "seeds": "use --seeds", "task_params": "use --task-param"}
            raise ValueError(
                f"protocol field {name} cannot be set per run"
                + (f" ({why[name]})" if name in why else "")
            )
        hint = did_you_mean(name, PROTOCOL_FIELDS)
        raise ValueError(
            f"protocol has no field '{name}'{hint} (settable: {', '.join(PROTOCOL_FIELDS)})"
        )
    defaults = {name: settable[name] for name in PROTOCOL_FIELDS}
    found = []
    for point in points(overrides, defaults):
        values = resolve_params(f"protocol {protocol.name}", defaults, point)
        changed = {k: v for k, v in values.items() if v != defaults[k]}
        found.append(dataclasses.replace(protocol, **changed))
    return found


def protocol_changes(name: str | None, stored: dict) -> dict[str, Any]:
    """The grid fields of a protocol config (``Protocol.config()``, or a stored row's) that
    differ from the registered preset of the same name and version; {} for the preset
    itself, another version, or a protocol that is not registered."""
    if name not in PROTOCOLS or not stored:
        return {}
    preset = PROTOCOLS.get(name)
    if stored.get("version") != preset.version:
        return {}
    own = preset.config()
    return {
        field: stored[field]
        for field in PROTOCOL_FIELDS
        if field in stored and stored[field] != own.get(field)
    }


def point_values(spec) -> dict[str, Any]:
    """What a run (a RunSpec) sets that a grid can vary: task and mechanism parameters and the
    protocol's fields."""
    protocol = {name: getattr(spec.protocol, name) for name in PROTOCOL_FIELDS}
    return {**spec.task_params, **spec.mechanism_params, **protocol}


def varying_keys(specs) -> tuple[str, ...]:
    """The keys of ``point_values`` that differ between runs of the same task and mechanism."""
    seen: dict[tuple[str, str], dict[str, set[str]]] = {}
    for spec in specs:
        values = seen.setdefault((spec.task, spec.mechanism), {})
        for key, value in point_values(spec).items():
            values.setdefault(key, set()).add(repr(value))
    keys = {k for values in seen.values() for k, v in values.items() if len(v) > 1}
    return tuple(sorted(keys))


def point_label(spec, keys: tuple[str, ...]) -> str:
    """``pairs=8 d_model=32``: the values of ``keys`` that the run has."""
    values = point_values(spec)
    return " ".join(f"{k}={values[k]}" for k in keys if k in values)


# -- sweep files ---------------------------------------------------------------------------

# key -> what it is; the keys of `synthbench run` a sweep file may hold
SWEEP_KEYS = {
    "task": "task names: a name, 'all', 'extended' or a list",
    "category": "only the tasks of this category",
    "mech": "mechanism names: a name, 'all' or a list",
    "protocol": "protocol preset",
    "seeds": "seeds 0..N-1",
    "difficulty": "difficulty presets: a name or a list",
    "task_params": "table: task knob -> value or list of values",
    "mech_params": "table: mechanism parameter -> value or list of values",
    "protocol_params": "table: protocol field -> value or list of values",
    "pos": "positional encoding",
    "pos_params": "table: rotation parameter -> value",
    "eval_length_mult": "also test at this multiple of the trained length",
}
TABLES = ("task_params", "mech_params", "protocol_params", "pos_params")


MAX_SWEEP_BYTES = 2**20  # a sweep file of a thousand lists is a few dozen kilobytes


def _read_toml(path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - the stdlib has it from 3.11
        import tomli as tomllib
    if path.stat().st_size > MAX_SWEEP_BYTES:
        raise ValueError(f"sweep file {path} is larger than {MAX_SWEEP_BYTES:,} bytes")
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"sweep file {path} is not valid TOML: {exc}") from None
    except (RecursionError, MemoryError):  # arrays nested past the parser's stack
        raise ValueError(f"sweep file {path} nests too deeply to read") from None
    except UnicodeDecodeError as exc:  # a binary file: TOML is UTF-8 text
        raise ValueError(f"sweep file {path} is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ValueError(f"sweep file {path} cannot be read: {exc.strerror or exc}") from None


def load_sweep_file(path: Path) -> dict[str, Any]:
    """A sweep file's grid as the options of ``synthbench run``: names as comma-separated
    text, the tables as dicts (a list sweeps), every key checked."""
    if not path.is_file():
        raise ValueError(f"sweep file {path} does not exist" if not path.exists() else
                         f"sweep file {path} is not a file")  # fmt: skip
    if path.suffix.lower() != ".toml":
        raise ValueError(f"sweep file {path}: only TOML files are read (.toml)")
    data = _read_toml(path)
    unknown = sorted(set(data) - set(SWEEP_KEYS))
    if unknown:
        name = unknown[0]
        hint = did_you_mean(name, SWEEP_KEYS)
        raise ValueError(
            f"sweep file {path}: unknown key '{name}'{hint} (keys: {', '.join(SWEEP_KEYS)})"
        )
    if "task" not in data:
        raise ValueError(f'sweep file {path} names no task (task = "kv_recall", say)')
    options: dict[str, Any] = {}
    for key, value in data.items():
        if key in TABLES:
            if not isinstance(value, dict):
                raise ValueError(f"sweep file {path}: {key} must be a table ([{key}])")
            options[key] = value
        elif key in ("task", "mech", "difficulty"):
            names = [value] if isinstance(value, str) else value
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ValueError(f"sweep file {path}: {key} must be a name or a list of names")
            options[key] = ",".join(names)
        elif key == "seeds":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"sweep file {path}: seeds must be an integer, got {value!r}")
            options[key] = value
        elif key == "eval_length_mult":
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"sweep file {path}: eval_length_mult must be a number")
            options[key] = float(value)
        else:
            if not isinstance(value, str):
                raise ValueError(f"sweep file {path}: {key} must be a string, got {value!r}")
            options[key] = value
    return options


def difficulty_points(
    task: str, task_cls, difficulties: list[str] | None
) -> Iterator[dict[str, Any]]:
    """The parameter overrides of each difficulty preset of the task ``task`` (one empty
    dict without a ladder)."""
    if not difficulties:
        yield {}
        return
    presets = task_cls.presets()
    for name in difficulties:
        if name not in presets:
            raise ValueError(
                f"task {task} has no difficulty '{name}'{did_you_mean(name, presets)} "
                f"(presets: {', '.join(presets)})"
            )
        yield task_cls.preset_overrides(name)  # a difficulty's, or a ladder level's
