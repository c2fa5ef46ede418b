"""A training's two clocks (synthbench/run/clock.py): wall seconds and the CPU seconds its
process spent, which waiting does not add to."""

from __future__ import annotations

import time

import pytest

from synthbench.run.clock import Seconds, Stopwatch


def test_waiting_counts_on_the_wall_clock_only():
    watch = Stopwatch()
    time.sleep(0.3)
    spent = watch.elapsed()
    assert spent.wall >= 0.3
    assert spent.cpu < 0.1


def test_work_counts_on_both_clocks():
    watch = Stopwatch()
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:  # busy: 0.2 s of this process's CPU
        pass
    spent = watch.elapsed()
    assert spent.cpu >= 0.2
    assert spent.wall >= spent.cpu - 0.01  # one thread cannot spend more than it waits


def test_sums_and_shares_keep_an_unknown_cpu_time_unknown():
    assert Seconds(2.0, 1.5) + Seconds(1.0, 0.5) == Seconds(3.0, 2.0)
    assert Seconds(2.0, None) + Seconds(1.0, 0.5) == Seconds(3.0, None)
    assert Seconds(3.0, 1.5) / 3 == Seconds(1.0, 0.5)
    assert (Seconds(3.0, None) / 3).cpu is None
    assert Seconds(1.0, None).row_fields() == {"wall_seconds": 1.0, "cpu_seconds": None}


@pytest.mark.usefixtures("single_thread")
def test_a_trained_row_stores_what_its_training_cost_on_both_clocks():
    import dataclasses

    import torch

    from synthbench.run.protocols import PROTOCOLS
    from synthbench.run.spec import RunSpec
    from synthbench.run.train import train_eval

    spec = RunSpec.resolve(
        "copy", "softmax", dataclasses.replace(PROTOCOLS.get("smoke"), steps=5), 0
    )
    watch = Stopwatch()
    row = train_eval(spec, 3e-3, torch.device("cpu"))
    around = watch.elapsed()
    assert row["status"] == "ok"
    assert 0 < row["cpu_seconds"] <= around.cpu
    assert 0 < row["wall_seconds"] <= around.wall
