"""key=value parameters from the command line, checked against defaults."""

import re
import time

import pytest

from synthbench.core.params import (
    MAX_VALUE_CHARS,
    MAX_VALUE_DEPTH,
    REQUIRED,
    parse_assignments,
    resolve_params,
)
from synthbench.core.text import did_you_mean
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.spec import RunSpec


def test_parse_assignments_reads_python_literals_and_falls_back_to_strings():
    parsed = parse_assignments(["n=64", "eps=1e-4", "flag=true", "name=abc", "lrs=(1, 2)"])
    assert parsed == {"n": 64, "eps": 1e-4, "flag": True, "name": "abc", "lrs": (1, 2)}


@pytest.mark.parametrize("bad", ["n", "=3", " =3"])
def test_parse_assignments_refuses_malformed_items(bad):
    with pytest.raises(ValueError, match="key=value"):
        parse_assignments([bad])


def test_resolve_params_fills_defaults_and_coerces_ints_to_floats():
    params = resolve_params("thing", {"n": 1, "eps": 1e-6, "flag": False}, {"eps": 0})
    assert params == {"n": 1, "eps": 0.0, "flag": False}
    assert isinstance(params["eps"], float)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"m": 1}, "has no parameter m "),
        ({"epss": 1}, "has no parameter epss; did you mean eps\\? \\(parameters: n, eps, flag\\)"),
        ({"epss": 1, "m": 1}, "has no parameter epss, m \\(parameters"),
        ({"n": "abc"}, "parameter n must be int"),
        ({"n": 1.5}, "parameter n must be int"),
        ({"n": True}, "parameter n must be int"),
        ({"flag": 1}, "parameter flag must be bool"),
        ({"eps": "small"}, "parameter eps must be float"),
    ],
)
def test_resolve_params_names_the_bad_parameter(overrides, message):
    with pytest.raises(ValueError, match=message):
        resolve_params("thing", {"n": 1, "eps": 1e-6, "flag": False}, overrides)


def test_required_parameter_without_value_is_refused():
    with pytest.raises(ValueError, match="needs a value for x"):
        resolve_params("thing", {"x": REQUIRED}, {})


def test_run_spec_checks_task_and_mechanism_parameters_before_running():
    smoke = PROTOCOLS.get("smoke")
    spec = RunSpec.resolve("copy", "linear", smoke, 0, {"n": 8}, {"eps": 1e-4})
    assert spec.task_params["n"] == 8 and spec.mechanism_params["eps"] == 1e-4
    with pytest.raises(ValueError, match="mechanism linear: eps must be >= 0"):
        RunSpec.resolve("copy", "linear", smoke, 0, mechanism_overrides={"eps": -1.0})
    with pytest.raises(ValueError, match="n >= 1"):
        RunSpec.resolve("copy", "linear", smoke, 0, task_overrides={"n": 0})


TOO_DEEP = f"its value is nested too deeply to read (more than {MAX_VALUE_DEPTH} levels)"


def _too_long(chars: int) -> str:
    return f"its value is {chars:,} characters, more than the {MAX_VALUE_CHARS:,} read"


def _nested_list(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("+".join(["1"] * 60_000), _too_long(119_999), id="sum-60000"),
        pytest.param("-" * 100_000 + "1", _too_long(100_001), id="minus-100000"),
        # under the size cap: past the parser's recursion and stack (a MemoryError in 3.11)
        pytest.param("+".join(["1"] * 4_000), TOO_DEEP, id="sum-4000"),
        pytest.param("-" * 9_000 + "1", TOO_DEEP, id="minus-9000"),
        pytest.param("~" * 9_000 + "1", TOO_DEEP, id="tilde-9000"),
        pytest.param("[" * 5_000, TOO_DEEP, id="open-5000"),  # the tokenizer's bound: 200
        pytest.param(_nested_list(300), TOO_DEEP, id="list-300"),
        # the lists and, one level below them, the 1
        pytest.param(_nested_list(MAX_VALUE_DEPTH), TOO_DEEP, id="list-at-bound"),
        pytest.param("{'a': " * 40 + "1" + "}" * 40, TOO_DEEP, id="dict-40"),
        pytest.param("+".join(["1"] * 40), TOO_DEEP, id="sum-40"),  # no literal, as deep
    ],
)
def test_parsing_is_bounded_in_size_and_depth(text, message):
    """One line naming the parameter, at once: no RecursionError or MemoryError (issue:
    ``n=1+1+...+1`` of 60,000 terms)."""
    started = time.perf_counter()
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        parse_assignments([f"n={text}"])
    assert time.perf_counter() - started < 2
    assert str(error.value).startswith("parameter 'n': ")
    assert len(str(error.value)) < 120 and "\n" not in str(error.value)


def test_parsing_bounds_leave_every_real_value_alone():
    sweep = ",".join(str(-v) for v in range(1_500))  # a sweep of 1,500 values: 7,888 chars
    assert len(sweep) <= MAX_VALUE_CHARS
    parsed = parse_assignments([f"pairs={sweep}", f"deep={_nested_list(MAX_VALUE_DEPTH - 1)}",
                                "name=a-b-c", "parts=euclidean,spherical", "z=1+2j"])  # fmt: skip
    assert parsed["pairs"] == tuple(-v for v in range(1_500))
    assert parsed["name"] == "a-b-c" and parsed["z"] == 1 + 2j
    assert parsed["parts"] == "euclidean,spherical"  # names, not a literal: the text
    depth = 0
    value = parsed["deep"]
    while isinstance(value, list):
        value, depth = value[0], depth + 1
    assert (depth, value) == (MAX_VALUE_DEPTH - 1, 1)


def test_a_refused_value_is_quoted_cut_to_a_line():
    with pytest.raises(ValueError) as error:
        resolve_params("task copy", {"n": 32}, parse_assignments(["n=" + "x" * 5_000]))
    assert len(str(error.value)) < 120 and str(error.value).endswith("...")


def test_did_you_mean_names_the_close_matches_or_nothing():
    assert did_you_mean("blok", ["core", "block"]) == "; did you mean block?"
    hint = did_you_mean("pair", ("pairs", "keys", "pair_count"))
    assert hint == "; did you mean pairs, pair_count?"
    assert did_you_mean("zzz", ["core", "block"]) == ""
    assert did_you_mean(3, [1, 3]) == "; did you mean 3?"  # names of any kind, compared as text
