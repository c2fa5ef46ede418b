"""Task knobs declare which direction makes the task harder (``Task.harder``), for the
frontier report: every built-in task declares one for each numeric knob, and nothing else."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from synthbench.core.task import TASKS, Task, check_harder, in_default_suite

BUILTINS = [e.name for e in TASKS.entries() if e.source == "builtin"]
SUITE = [e.name for e in TASKS.entries() if e.source == "builtin" and in_default_suite(e)]
Copy = TASKS.get("copy")
# numeric knobs with no harder direction, each with its reason
NO_DIRECTION = {("bigram", "table_seed"): "a seed picks another table, neither harder nor easier"}


def numeric_knobs(cls: type[Task]) -> set[str]:
    """The int and float fields of ``cls.Params`` (bool is an int, but not a numeric knob)."""
    hints = typing.get_type_hints(cls.Params)

    def numeric(hint) -> bool:  # int, float, or one of them | None (a default resolved later)
        options = set(typing.get_args(hint)) - {type(None)} or {hint}
        return len(options) == 1 and options <= {int, float}

    return {f.name for f in dataclasses.fields(cls.Params) if numeric(hints[f.name])}


def test_the_builtin_tasks_are_all_here():
    """22 in the default suite, and the two State tasks outside it (suite="extended")."""
    assert len(SUITE) == 22
    assert sorted(set(BUILTINS) - set(SUITE)) == ["mod_counting", "permutation"]


@pytest.mark.parametrize("name", BUILTINS)
def test_every_numeric_knob_declares_its_harder_direction(name):
    cls = TASKS.get(name)
    exempt = {knob for task, knob in NO_DIRECTION if task == name}
    assert "harder" in vars(cls), f"{name} declares harder itself, not through a parent"
    assert set(cls.harder) == numeric_knobs(cls) - exempt
    for knob in exempt:
        assert cls.harder_direction(knob) is None


@pytest.mark.parametrize("name", TASKS.names())
def test_declarations_are_valid(name):
    check_harder(TASKS.get(name))


def test_harder_direction():
    kv_recall = TASKS.get("kv_recall")
    assert kv_recall.harder_direction("pairs") == "larger"
    assert kv_recall.harder_direction("queries") == "smaller"
    assert TASKS.get("noisy_copy").harder_direction("rate") == "larger"  # a float knob
    assert kv_recall.harder_direction("distinct_values") is None  # a bool: no direction
    assert TASKS.get("bigram").harder_direction("table_seed") is None


def test_harder_direction_of_an_unknown_knob_names_the_task_and_its_knobs():
    with pytest.raises(ValueError) as raised:
        TASKS.get("kv_recall").harder_direction("wobble")
    assert str(raised.value) == (
        "task kv_recall has no parameter 'wobble' "
        "(knobs: pairs, queries, keys, values, distinct_values, gap)"
    )


def test_an_undeclared_task_has_no_directions():
    class Undeclared(Copy):
        harder = {}

    assert Task.harder == {}
    assert Undeclared.harder_direction("n") is None
    check_harder(Undeclared)


@pytest.mark.parametrize(
    ("harder", "message"),
    [
        ({"wobble": "larger"}, r"^task Bad declares a harder direction for 'wobble', which is not"),
        ({"n": "bigger"}, r"^task Bad: the harder direction of n must be 'larger' or 'smaller'"),
        ({"n": None}, r"must be 'larger' or 'smaller', not None$"),
    ],
)
def test_check_harder_refuses_a_bad_declaration(harder, message):
    Bad = type("Bad", (Copy,), {"harder": harder})
    with pytest.raises(ValueError, match=message):
        check_harder(Bad)


def test_check_harder_refuses_a_bool_knob():
    Bad = type("Bad", (TASKS.get("parity"),), {"harder": {"dense": "larger"}})
    with pytest.raises(ValueError, match=r"^task Bad: dense is a bool, it has no harder direction"):
        check_harder(Bad)
