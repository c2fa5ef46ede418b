"""benchmarks/taylor_forms.py runs on a CPU, checks the two forms agree in float64 and
prints their ratio (one short length, one round: a smoke test of the script, not a timing);
a length past the scores form is refused."""

import re
import subprocess
import sys

import pytest
from clitools import BENCHMARKS, load_script

SCRIPT = BENCHMARKS / "taylor_forms.py"


def run(*args):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.slow
def test_prints_the_ratio_of_the_two_forms():
    done = run("--lengths", "20", "--rounds", "1")
    assert done.returncode == 0, done.stderr
    ratio = re.search(r"^L\s+20\s+scores\s+\S+\s+features\s+\S+\s+features / scores (\S+)$",
                      done.stdout, re.M)  # fmt: skip
    assert ratio and float(ratio.group(1)) > 0


def test_a_length_past_the_scores_form_is_refused(monkeypatch, capsys):
    """Refused before anything is built (its main in this process: the process is the slow
    test's above)."""
    script = load_script("taylor_forms")
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--lengths", "274"])
    with pytest.raises(SystemExit) as exited:
        script.main()
    assert exited.value.code == 2 and "lengths are 1 to 273" in capsys.readouterr().err
