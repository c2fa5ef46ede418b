"""Every width, count and length is checked before anything trains (issue: `--protocol-param
d_model=0` trained and was stored as ok).

The cases are generated from the registries: every integer constructor parameter of every
registered mechanism, every integer parameter of every task, each at 0 and -1. A new
mechanism or task is covered without touching this file; one whose integer parameter may
legitimately be 0 is listed in ZERO_ALLOWED, with why.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
import torch
from clitools import assert_error, invoke

from synthbench.core.mechanism import MECHANISMS
from synthbench.core.model import Model
from synthbench.core.params import MAX_VALUE_CHARS, MAX_VALUE_DEPTH
from synthbench.core.task import TASKS
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.spec import RunSpec

SMOKE = PROTOCOLS.get("smoke")
HEAD_DIM, N_HEADS = SMOKE.d_model // SMOKE.n_heads, SMOKE.n_heads
VOCAB, MAX_LEN = 12, 24

# Integer parameters for which 0 is a value, not an empty size; -1 is still refused. Keyed
# by parameter name alone where the name means the same everywhere.
ZERO_ALLOWED = {
    "seed": "a generator seed (random-feature mechanisms): 0 seeds like any other",
    "table_seed": "bigram's seed of its transition table",
    ("based", "window_heads"): "no sliding-window head: Taylor linear attention on every head",
    ("counting", "queries"): "0 asks every position (suite v1, as slay-paper pins it)",
    ("histogram", "queries"): "0 answers every x_i (suite v1, as slay-paper pins it)",
    ("distant_match", "probes"): "0: the one-answer layout of suite v1 (slay-paper)",
    ("kv_recall", "queries"): "0 queries every key once (suite v1, as slay-paper pins it)",
    ("selective_copy", "tail"): "0 copies every data token (suite v2, as slay-paper pins it)",
    ("compression", "max_pad"): "0 pads nothing (suite v2, as slay-paper pins it)",
    "gap": "0 blanks between the context and the queries (the layout before the ladders)",
}
# what stands for the mechanism's own size, not a parameter of it
MODEL_GIVEN = ("self", "head_dim", "n_heads")


def _is_int(annotation, default) -> bool:
    """An int parameter: an int default (not a bool), or None where the annotation says int
    (``feature_dim: int | None = None``: None stands for a computed size)."""
    if isinstance(default, bool):
        return False
    if isinstance(default, int):
        return True
    text = annotation if isinstance(annotation, str) else str(annotation)
    return default is None and re.search(r"\bint\b", text) is not None


def _mechanism_int_params() -> list[tuple[str, str]]:
    return [
        (entry.name, name)
        for entry in MECHANISMS.entries()
        for name, p in inspect.signature(entry.obj.__init__).parameters.items()
        if name not in MODEL_GIVEN
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        and _is_int(p.annotation, p.default)
    ]


def _task_int_params() -> list[tuple[str, str]]:
    return [
        (entry.name, field.name)
        for entry in TASKS.entries()
        for field in dataclasses.fields(entry.obj.Params)
        if _is_int(field.type, field.default)
    ]


def _zero_allowed(owner: str, param: str) -> bool:
    return param in ZERO_ALLOWED or (owner, param) in ZERO_ALLOWED


def _names(message: str, param: str) -> bool:
    return re.search(rf"\b{re.escape(param)}\b", message) is not None


def _build_model(mechanism: str, params: dict) -> Model:
    cls = MECHANISMS.get(mechanism)
    return Model(VOCAB, MAX_LEN, lambda: cls(HEAD_DIM, N_HEADS, **params),
                 d_model=SMOKE.d_model, n_heads=N_HEADS)  # fmt: skip


MECHANISM_CASES = [
    pytest.param(mech, param, value, id=f"{mech}-{param}={value}")
    for mech, param in _mechanism_int_params()
    for value in (0, -1)
]
TASK_CASES = [
    pytest.param(task, param, value, id=f"{task}-{param}={value}")
    for task, param in _task_int_params()
    for value in (0, -1)
]


def test_the_cases_cover_the_registries():
    """The generated cases reach the parameters they are meant to (a change of annotation
    style must not empty them), and every exception names a real parameter."""
    mechanism_params, task_params = set(_mechanism_int_params()), set(_task_int_params())
    expected = {("sliding-window", "window"), ("based", "feature_dim"), ("slay", "prf_features"),
                ("cosformer", "horizon"), ("rewa-geometric", "euclidean_dim")}  # fmt: skip
    assert expected <= mechanism_params
    assert {("copy", "n"), ("copy", "vocab"), ("kv_recall", "queries")} <= task_params
    names = {param for _, param in mechanism_params | task_params}
    for key in ZERO_ALLOWED:
        assert (key in names) if isinstance(key, str) else (key in mechanism_params | task_params)


@pytest.mark.parametrize(("mechanism", "param", "value"), MECHANISM_CASES)
def test_a_mechanism_size_of_zero_or_less_is_refused_by_name(mechanism, param, value):
    if value == 0 and _zero_allowed(mechanism, param):
        _build_model(mechanism, {param: value})  # a meaningful value: it builds
        return
    with pytest.raises(ValueError) as error:
        _build_model(mechanism, {param: value})
    assert _names(str(error.value), param), str(error.value)
    # and so is the run that would use it, before anything trains
    with pytest.raises(ValueError, match=rf"mechanism {mechanism}: .*\b{param}\b"):
        RunSpec.resolve("copy", mechanism, SMOKE, 0, mechanism_overrides={param: value})


@pytest.mark.parametrize(("task", "param", "value"), TASK_CASES)
def test_a_task_size_of_zero_or_less_is_refused_by_name(task, param, value):
    cls = TASKS.get(task)
    if value == 0 and _zero_allowed(task, param):
        cls(**{param: value}).generate(2, torch.Generator().manual_seed(0))
        return
    with pytest.raises(ValueError) as error:
        cls(**{param: value})
    message = str(error.value)
    assert _names(message, param) and "\n" not in message, message
    with pytest.raises(ValueError):
        RunSpec.resolve(task, "softmax", SMOKE, 0, task_overrides={param: value})


DIMENSIONS = [("d_model", 0), ("n_heads", 0), ("n_layers", 0), ("d_model", -8),
              ("vocab_size", 0), ("max_len", 0), ("d_model", 33)]  # fmt: skip


@pytest.mark.parametrize(("name", "value"), DIMENSIONS)
def test_the_model_refuses_an_empty_or_indivisible_dimension(name, value):
    """Whoever builds a model (not only a protocol's run): n_heads = 0 divided by zero."""
    sizes = {"vocab_size": VOCAB, "max_len": MAX_LEN, "d_model": 32, "n_heads": 4,
             "n_layers": 1, name: value}  # fmt: skip
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        Model(mechanism=lambda: MECHANISMS.get("softmax")(8, 4), **sizes)


@pytest.mark.parametrize("field", ["d_model", "n_heads", "n_layers"])
@pytest.mark.parametrize("value", [0, -1])
def test_every_protocol_refuses_an_empty_model(field, value):
    for entry in PROTOCOLS.entries():
        with pytest.raises(ValueError, match=rf"protocol '{entry.name}': .*\b{field}\b"):
            dataclasses.replace(entry.obj, **{field: value})


# -- through the command line: one line, exit 2, nothing stored -------------------------------

CLI_CASES = [
    (["--protocol-param", "d_model=0"], "sizes and counts must be >= 1: d_model"),
    (["--protocol-param", "n_heads=0"], "sizes and counts must be >= 1: n_heads"),
    (["--protocol-param", "n_layers=0"], "sizes and counts must be >= 1: n_layers"),
    (["--protocol-param", "d_model=33"], "d_model must be divisible by n_heads"),
    (["--mech", "sliding-window", "--mech-param", "window=0"], "window must be an integer >= 1"),
    (["--mech", "performer", "--mech-param", "nb_features=-1"], "nb_features must be"),
    (["--mech", "linear", "--mech-param", "chunk_size=0"], "chunk_size >= 1"),
    (["--task-param", "n=0"], "copy needs n >= 1"),
    (["--task-param", "vocab=-1"], "vocab >= 2"),
    (
        ["--task-param", "n=" + "+".join(["1"] * 60_000)],
        f"more than the {MAX_VALUE_CHARS:,} read",
    ),
    (["--task-param", "n=" + "-" * 5_000 + "1"], "nested too deeply"),
    (["--task-param", "n=" + "[" * 300 + "1" + "]" * 300], "nested too deeply"),
]


@pytest.mark.parametrize(("args", "message"), CLI_CASES, ids=lambda x: str(x)[:40])
def test_run_refuses_an_impossible_size_in_one_line_before_training(tmp_path, args, message):
    results = tmp_path / "results"
    defaults = [] if "--mech" in args else ["--mech", "softmax"]
    result = invoke("run", "--task", "copy", *defaults, *args, "--protocol", "quick",
                    "--seeds", "1", "--results", results)  # fmt: skip
    assert_error(result, 2, message)
    assert not results.exists() or not any(results.rglob("*.parquet"))


def test_check_refuses_a_mechanism_size_in_one_line():
    assert_error(invoke("check", "sliding-window", "--mech-param", "window=-1"), 2, "window")


def test_show_task_refuses_a_task_size_in_one_line():
    assert_error(invoke("show-task", "copy", "--param", "n=0"), 2, "copy needs n >= 1")
    deep = "[" * (MAX_VALUE_DEPTH + 1) + "1" + "]" * (MAX_VALUE_DEPTH + 1)
    assert_error(invoke("show-task", "copy", "--param", f"n={deep}"), 2, "nested too deeply")
