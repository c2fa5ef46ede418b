"""benchmarks/step_speedup.py runs on a CPU, checks a mechanism agrees in float64 with
itself as a git revision wrote it and prints the suite's ratios (one short task, one round:
a smoke test of the script, not a timing), in both tracks; a block-track base needs a
published layer."""

import re
import subprocess
import sys

import pytest
from clitools import BENCHMARKS

SCRIPT = BENCHMARKS / "step_speedup.py"


def run(*args):
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--tasks", "modular", "--rounds", "1", "--steps", "1", *args],
        capture_output=True,
        text=True,
        cwd=SCRIPT.parents[1],
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.slow
def test_prints_the_suite_ratios_against_a_revision():
    done = run()
    assert done.returncode == 0, done.stderr
    assert re.search(r"^modular\s+32\s", done.stdout, re.M)
    ratios = re.findall(r"slay / softmax: (\d+\.\d+)", done.stdout)
    assert len(ratios) == 2 and all(float(r) > 0 for r in ratios)
    assert "base / slay at softmax's steps" in done.stdout


@pytest.mark.slow
def test_a_published_layer_against_its_revision_in_the_block_track():
    done = run("--mech", "based", "--track", "block")
    assert done.returncode == 0, done.stderr
    assert re.search(r"^modular\s+32\s", done.stdout, re.M)
    speedup = re.search(r"suite speed-up, base / based at softmax's steps: (\d+\.\d+)", done.stdout)
    assert speedup and float(speedup.group(1)) > 0


def test_the_block_track_refuses_a_mechanism_without_a_layer_of_its_own():
    done = run("--mech", "linear", "--track", "block")
    assert done.returncode == 1
    assert "linear has no published layer of its own" in done.stderr
