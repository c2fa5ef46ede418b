"""Where a run's time goes: the phase timer (synthbench/run/phases.py) and
benchmarks/cost_breakdown.py on a real, tiny run, in process and with two workers."""

import json
import subprocess
import sys

import pytest
from clitools import BENCHMARKS

from synthbench.run import phases

SCRIPT = BENCHMARKS / "cost_breakdown.py"
TRAINING_PHASES = {
    "model build", "evaluation data", "training batches", "training steps", "curve points",
    "causality after training", "test evaluation", "chance",
}  # fmt: skip


def test_a_phase_costs_nothing_unless_asked(monkeypatch, tmp_path):
    monkeypatch.delenv(phases.ENV, raising=False)
    with phases.phase("unasked"):
        pass
    assert "unasked" not in phases._seconds
    monkeypatch.setenv(phases.ENV, str(tmp_path))
    with phases.phase("asked"), phases.phase("asked"):  # entered twice
        pass
    phases.write()
    record = json.loads((tmp_path / f"{phases.os.getpid()}.json").read_text())
    assert record["counts"]["asked"] == 2 and record["seconds"]["asked"] >= 0
    assert record["timed_from_import"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [1, 2])
def test_the_breakdown_of_a_real_run(tmp_path, jobs):
    out = tmp_path / "out"
    command = [sys.executable, str(SCRIPT), "--protocol", "smoke", "--tasks", "copy,sort",
               "--mechs", "softmax", "--jobs", str(jobs), "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "breakdown.json").read_text())
    seconds = report["seconds"]
    assert TRAINING_PHASES <= set(seconds) and {"planning", "leak guard", "writing"} <= set(seconds)
    assert report["trainings"] == 2  # smoke: one lr, one seed, two tasks
    # each training's phases lie inside its row's wall time, counted once
    in_trainings = sum(seconds[name] for name in TRAINING_PHASES)
    assert 0.5 * report["rows_wall_seconds"] < in_trainings <= report["rows_wall_seconds"]
    assert seconds["training steps"] > 0 and min(seconds.values()) >= 0
    assert 0 < report["overhead_share"] < 1
    assert "overhead (all but steps)" in done.stdout
    workers = [p for p in (out / "phases").glob("*.json")]
    assert len(workers) == (1 if jobs == 1 else 3)  # the driver, and each worker
