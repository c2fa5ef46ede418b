"""The run's progress: an ETA that works with several workers and trainings of minutes,
from the first second (the plan's estimate seeds it); what trains now, fitted to an
80-column terminal; plain flushed lines without a terminal."""

from __future__ import annotations

import dataclasses
import io

import pytest
from rich.console import Console

from synthbench.cli.common import out
from synthbench.cli.progress import (
    Eta,
    RunningLine,
    RunView,
    clock_text,
    run_line,
    running_text,
)
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


def test_no_estimate_before_the_first_training_finishes_without_a_prior():
    eta = Eta(2)
    eta.add(units("linear", 3))
    assert eta.remaining() is None and clock_text(None) == "-:--:--"


def test_the_plans_estimate_gives_an_eta_from_the_first_second():
    """3 trainings the estimate puts at 20 s each, 2 at once: 30 s before any finishes; once
    one took twice what it said, the others are expected to as well."""
    clock = Clock()
    said = {}
    eta = Eta(2, clock, prior=lambda unit: said.setdefault(unit.key, 20.0))
    todo = units("linear", 3)
    eta.add(todo)
    assert eta.remaining() == pytest.approx(30)
    eta.started(todo[0])
    eta.started(todo[1])
    clock.now = 10
    assert eta.remaining() == pytest.approx((10 + 10 + 20) / 2)
    clock.now = 40
    eta.finished(todo[0], 40)  # twice the estimate; the mechanism's own rate from now on
    # the waiting one 40 s, the running one (started at 0) due now: over the 2 workers
    assert eta.remaining() == pytest.approx(40 / 2)


def test_the_prior_is_scaled_by_how_far_off_it_was():
    """A mechanism without a finished training of its own takes the estimate's figure,
    times the finished trainings' measured / estimated."""
    clock = Clock()
    eta = Eta(1, clock, prior=lambda unit: 10.0)
    done, other = units("linear", 1), units("softmax", 1)
    eta.add(done + other)
    eta.started(done[0])
    eta.finished(done[0], 30)  # three times what the estimate said
    assert eta.remaining() == pytest.approx(30)


def test_a_training_nothing_prices_leaves_the_eta_unknown_until_one_finishes():
    clock = Clock()
    eta = Eta(1, clock, prior=lambda unit: 10.0 if unit.spec.mechanism == "linear" else None)
    priced, unpriced = units("linear", 1), units("softmax", 1)
    eta.add(priced + unpriced)
    assert eta.remaining() is None
    eta.started(priced[0])
    eta.finished(priced[0], 10)
    assert eta.remaining() is not None


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
    """Before any training finishes (no ETA yet) the line under the bar says what runs."""
    clock = Clock()
    eta = Eta(2, clock)
    todo = units("linear", 3)
    eta.add(todo)
    line = RunningLine(eta)
    assert line.text().plain == ""
    eta.started(todo[0])
    assert line.text().plain == "now copy linear seed 0 lr 0.001"
    clock.now = 1
    eta.started(todo[1])
    assert line.text().plain == "now copy linear seed 0 lr 0.001 (+1 more)"
    eta.finished(todo[0], 5)
    assert line.text().plain == "now copy linear seed 1 lr 0.001"


@pytest.mark.parametrize("width", [45, 60, 80])
def test_long_names_are_shortened_never_the_seed(width):
    text = running_text("selective_copy", "gated-deltanet-plugin", 123456, 3.3e-3, 3, width)
    assert len(text) <= width, text
    assert text.endswith(" seed 123456 lr 0.0033 (+3 more)"), text
    assert text.startswith("now sel")
    assert ("…" in text) == (width < 72), text  # whole names where they fit
    assert running_text("copy", "linear", 0, 1e-3, 0, 80) == "now copy linear seed 0 lr 0.001"


def test_the_bar_fits_80_columns_with_the_seed_whole(tmp_path, monkeypatch):
    """At COLUMNS=80 in a terminal, the bar's line and the line of what trains fit, and the
    seed is whole (it was cut off the end of a single line before)."""
    monkeypatch.setenv("COLUMNS", "80")
    terminal = Console(file=io.StringIO(), force_terminal=True, color_system=None)
    assert terminal.width == 80
    monkeypatch.setattr("synthbench.cli.progress.out", terminal)
    spec = RunSpec.resolve("selective_copy", "gated-deltanet", SMOKE, 987654)
    todo = [Unit(spec, 3.3e-3), Unit(spec.with_seed(7), 1e-3)]
    view = RunView(
        [spec],
        tmp_path,
        "device cpu",
        False,
        estimate=lambda units, capacity: (["estimated ..."], lambda u: 600.0),
    )
    view.planned(1, 0, todo, 2)
    assert view.progress is not None  # a terminal: the bar
    view.progress.stop()  # drawn once, below, without the live display's cursor moves
    view.started(todo[0])
    view.started(todo[1])
    screen = Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None)
    screen.print(*view.progress.get_renderables())
    lines = [line.rstrip() for line in screen.file.getvalue().splitlines()]
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[0].startswith("trainings") and "0/2" in lines[0]
    assert lines[0].endswith("eta 0:10:00")  # from the estimate: 600 s each, 2 at once
    assert lines[1] == "now selective_copy gated-deltanet seed 987654 lr 0.0033 (+1 more)"


def plain_view(monkeypatch, tmp_path, specs, prior):
    """A RunView printing to a console that is not a terminal; the texts out at each flush."""
    console = Console(file=io.StringIO(), width=1000)
    assert not console.is_terminal
    monkeypatch.setattr("synthbench.cli.progress.out", console)
    flushed = []
    monkeypatch.setattr(
        "synthbench.cli.progress._flush", lambda: flushed.append(console.file.getvalue())
    )
    view = RunView(specs, tmp_path, "device cpu", False,
                   estimate=lambda units, capacity: (["estimated ..."], prior))  # fmt: skip
    return view, console, flushed


def ok_row(unit: Unit, seconds: float, selected: bool) -> dict:
    return {
        "status": "ok", "wall_seconds": seconds, "lr": unit.lr, "token_acc": 0.5,
        "exact_match": 0.25, "steps_done": unit.spec.protocol.steps, "selected": selected,
    }  # fmt: skip


def test_without_a_terminal_each_finished_training_is_a_plain_line(tmp_path, monkeypatch):
    """Piped or in CI: no bar, but a line per finished training as it finishes, flushed,
    with the count, the wall time and the ETA; then the run's line."""
    two_lrs = dataclasses.replace(SMOKE, lrs=(1e-3, 3e-3))
    spec = RunSpec.resolve("copy", "linear", two_lrs, 0, {"n": 8})
    todo = [Unit(spec, 1e-3), Unit(spec, 3e-3)]
    view, console, flushed = plain_view(monkeypatch, tmp_path, [spec], lambda u: 30.0)
    view.planned(1, 0, todo, 1)
    assert view.progress is None
    rows = []
    for unit in todo:
        view.started(unit)
        rows.append(ok_row(unit, 12.5, unit.lr == 1e-3))
        view.finished(unit, rows[-1])
        if unit is todo[0]:  # out before the next training ends
            assert flushed[-1].splitlines()[-1].startswith("   trained copy linear seed 0 lr 0.001")
    view.run_done(spec, rows)
    view.close()
    lines = console.file.getvalue().splitlines()
    assert lines[1] == "estimated ..."
    assert lines[2].startswith("   trained copy linear seed 0 lr 0.001: ok (12.5 s wall); "
                               "1/2 trainings, ")  # fmt: skip
    # the other training, at the finished one's rate (the same mechanism), not the 30 s said
    assert lines[2].endswith("eta 0:00:12")
    assert lines[3].startswith("   trained copy linear seed 0 lr 0.003: ok (12.5 s wall); 2/2")
    assert lines[4].startswith("ok copy")
    assert lines[4].endswith("(2 trainings: 25.0 s wall summed); 2/2 trainings, 0:00:00 wall, "
                             "eta 0:00:00")  # fmt: skip
    assert len(lines) == 5


def test_an_added_lr_says_why_it_was_added(tmp_path, monkeypatch):
    """An lr grown past the grid's edge, and a knife-edge's midpoint, each said as what it is."""
    recipe = dataclasses.replace(SMOKE, lrs=(1e-3, 3e-3, 1e-2), lr_extend=1, lr_refine=1)
    spec = RunSpec.resolve("copy", "linear", recipe, 0, {"n": 8})
    view, console, _ = plain_view(monkeypatch, tmp_path, [spec], lambda u: 30.0)
    view.planned(1, 0, [Unit(spec, lr) for lr in recipe.lrs], 1)
    view.grew([Unit(spec, 0.0333333), Unit(spec, 0.00547723)])
    lines = console.file.getvalue().splitlines()[-2:]
    assert lines[0].endswith(": best lr at the grid's edge, adding lr 0.0333333")
    assert lines[1].endswith(
        ": a knife-edge (best lr far ahead of a neighbour), refined, adding lr 0.00547723"
    )


def test_a_run_of_one_training_is_one_plain_line(tmp_path, monkeypatch):
    """smoke's runs train once: the run's line carries the count (no line twice)."""
    specs = [RunSpec.resolve(task, "linear", SMOKE, 0) for task in ("copy", "sort")]
    todo = [Unit(spec, 1e-3) for spec in specs]
    view, console, flushed = plain_view(monkeypatch, tmp_path, specs, lambda u: 5.0)
    view.planned(2, 0, todo, 1)
    assert flushed  # the header and the estimate, before the first training
    for unit in todo:
        view.started(unit)
        row = ok_row(unit, 2.0, True)
        view.finished(unit, row)
        view.run_done(unit.spec, [row])
    view.close()
    lines = console.file.getvalue().splitlines()
    assert len(lines) == 4, lines
    assert lines[2].startswith("ok copy") and "(2.0 s wall); 1/2 trainings" in lines[2]
    assert lines[3].startswith("ok sort") and "(2.0 s wall); 2/2 trainings" in lines[3]


def test_a_failed_runs_line_is_one_line_however_many_its_error_has():
    spec = RunSpec.resolve("copy", "linear", SMOKE, 0)
    error = "BackendCompilerFailed: backend raised:\nOSError: no compiler\n\nSet X=1"
    row = {"status": "error", "wall_seconds": 2.0, "lr": 1e-3, "selected": False, "error": error}
    line = run_line(spec, [row])
    assert "\n" not in line
    assert "error: BackendCompilerFailed: backend raised: OSError: no compiler Set X=1" in line


def test_a_runs_time_is_its_trainings_wall_seconds():
    spec = RunSpec.resolve("copy", "linear", SMOKE, 0)
    row = {"status": "ok", "wall_seconds": 2.0, "lr": 1e-3, "token_acc": 0.5,
           "exact_match": 0.25, "steps_done": SMOKE.steps, "selected": True}  # fmt: skip
    assert run_line(spec, [row]).endswith("(2.0 s wall)")
    second = {**row, "lr": 3e-3, "wall_seconds": 3.5, "selected": False}
    assert run_line(spec, [row, second]).endswith("(2 trainings: 5.5 s wall summed)")


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
