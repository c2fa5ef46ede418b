"""benchmarks/slay_step.py runs on a CPU, checks the two slays agree in float64 and prints
the suite's ratios (one short task, one round: a smoke test of the script, not a timing)."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "slay_step.py"


def test_prints_the_suite_ratios_against_a_revision():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--tasks", "modular", "--rounds", "1", "--steps", "1"],
        capture_output=True,
        text=True,
        cwd=SCRIPT.parents[1],
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert re.search(r"^modular\s+32\s", done.stdout, re.M)
    ratios = re.findall(r"slay / softmax: (\d+\.\d+)", done.stdout)
    assert len(ratios) == 2 and all(float(r) > 0 for r in ratios)
    assert "base / slay at softmax's steps" in done.stdout
