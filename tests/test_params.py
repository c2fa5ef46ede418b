"""key=value parameters from the command line, checked against defaults."""

import time

import pytest

from synthbench.core.params import REQUIRED, parse_assignments, resolve_params
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
        ({"m": 1}, "has no parameter m"),
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


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("+".join(["1"] * 60_000), "its value is 119,999 characters, more than the 10,000 read"),
        ("+".join(["1"] * 4_000), "its value is nested too deeply to read"),
        ("-" * 9_000 + "1", "its value is nested too deeply to read"),
    ],
)
def test_parsing_is_bounded_in_size_and_depth(text, message):
    started = time.perf_counter()
    with pytest.raises(ValueError, match=message) as error:
        parse_assignments([f"n={text}"])
    assert time.perf_counter() - started < 10
    assert len(str(error.value)) < 120 and "\n" not in str(error.value)


def test_a_refused_value_is_quoted_cut_to_a_line():
    with pytest.raises(ValueError) as error:
        resolve_params("task copy", {"n": 32}, parse_assignments(["n=" + "[" * 5_000]))
    assert len(str(error.value)) < 120 and str(error.value).endswith("...")
