"""The run's progress: an ETA that works with several workers and trainings of minutes."""

from __future__ import annotations

import pytest

from synthbench.cli.common import out
from synthbench.cli.progress import Eta, RunningColumn, RunView, clock_text
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.runner import Unit
from synthbench.run.spec import RunSpec

SMOKE = PROTOCOLS.get("smoke")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def units(mech: str, n: int, task_params=None) -> list[Unit]:
    spec = RunSpec.resolve("copy", mech, SMOKE, 0, task_params or {"n": 8})
    return [Unit(spec.with_seed(seed), 1e-3) for seed in range(n)]


def test_no_estimate_before_the_first_training_finishes():
    eta = Eta(2)
    eta.add(units("linear", 3))
    assert eta.remaining() is None and clock_text(None) == "-:--:--"


def test_two_workers_on_equal_trainings_of_minutes():
    """8 trainings of 100 s on 2 workers: 400 s in all, whatever rich's speed window."""
    clock = Clock()
    eta, todo = Eta(2, clock), units("linear", 8)
    eta.add(todo)
    for unit in todo[:2]:
        eta.started(unit)
    clock.now = 100
    for i in range(0, 8, 2):
        for unit in todo[i : i + 2]:
            eta.finished(unit, 100)
        for unit in todo[i + 2 : i + 4]:
            eta.started(unit)
        assert eta.remaining() == pytest.approx(400 - clock.now)
        clock.now += 50  # half way through the next pair
        if i < 6:
            assert eta.remaining() == pytest.approx(400 - clock.now)
        clock.now += 50


def test_each_mechanism_is_estimated_at_its_own_cost():
    clock = Clock()
    eta = Eta(1, clock)
    fast, slow = units("linear", 2), units("softmax", 2)
    eta.add(fast + slow)
    eta.started(fast[0])
    eta.finished(fast[0], 10)
    eta.started(slow[0])
    eta.finished(slow[0], 40)
    assert eta.remaining() == pytest.approx(10 + 40)


def test_cost_grows_with_the_sequence_length():
    clock = Clock()
    eta = Eta(1, clock)
    short, long = units("linear", 1, {"n": 8}), units("linear", 1, {"n": 32})
    eta.add(short + long)
    eta.started(short[0])
    eta.finished(short[0], 10)
    ratio = long[0].spec.make_task().seq_len / short[0].spec.make_task().seq_len
    assert eta.remaining() == pytest.approx(10 * ratio)


def test_never_less_than_the_longest_running_training():
    clock = Clock()
    eta = Eta(4, clock)
    done, running = units("linear", 1), units("softmax", 1)
    eta.add(done + running)
    eta.started(done[0])
    eta.finished(done[0], 10)
    eta.started(running[0])
    assert eta.remaining() == pytest.approx(10)  # one training left: 10 s, not 10 / 4


@pytest.mark.parametrize("seconds, text", [(0, "0:00:00"), (59.6, "0:01:00"), (3725, "1:02:05")])
def test_clock_text(seconds, text):
    assert clock_text(seconds) == text


def test_the_bar_names_what_trains_from_the_first_second():
    """Before any training finishes (no ETA yet) the bar says what is running."""
    clock = Clock()
    eta = Eta(2, clock)
    todo = units("linear", 3)
    eta.add(todo)
    column = RunningColumn(eta)
    assert column.render(None).plain == ""
    eta.started(todo[0])
    assert column.render(None).plain == "now copy linear seed 0 lr 0.001"
    clock.now = 1
    eta.started(todo[1])
    assert column.render(None).plain == "now copy linear seed 0 lr 0.001 (+1 more)"
    eta.finished(todo[0], 5)
    assert column.render(None).plain == "now copy linear seed 1 lr 0.001"


@pytest.mark.parametrize(
    "picked, header",
    [
        (
            [("copy", 0), ("copy", 1), ("sort", 0), ("sort", 1)],
            "4 runs (2 tasks x 1 mechanism x 2 seeds,",
        ),
        ([("copy", 0), ("sort", 1)], "2 runs (over 2 tasks, 1 mechanism, 2 seeds,"),
    ],
)
def test_the_header_counts_add_up(picked, header, tmp_path):
    """A full product says so (tasks x mechanisms x seeds); a sample of runs (reproduce draws
    one) says what it spans, never a product that is not its count."""
    specs = [RunSpec.resolve(task, "linear", SMOKE, seed) for task, seed in picked]
    with out.capture() as captured:
        RunView(specs, tmp_path, "device cpu", False).planned(len(specs), 0, [], 0)
    assert captured.get().startswith(header), captured.get()
