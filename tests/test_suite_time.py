"""benchmarks/suite_time.py: paired legs in alternating order, resumed, failures in one line.
The two installs are stand-in executables that log their calls."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from clitools import BENCHMARKS

SCRIPT = BENCHMARKS / "suite_time.py"


def fake_synthbench(path: Path, name: str, calls: Path, exit_code: int = 0) -> str:
    path.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = list ]; then echo \'[{{"name": "a"}}, {{"name": "b"}}]\'; exit 0; fi\n'
        f'echo "{name} $3" >> {calls}\n'
        f'[ {exit_code} -eq 0 ] || echo "boom on $3" >&2\n'
        f"exit {exit_code}\n"
    )
    path.chmod(0o755)
    return str(path)


def run(base: str, new: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), "--base", base, "--new", new, "--out", str(out)]
    return subprocess.run([*command, *extra], capture_output=True, text=True)


def test_legs_alternate_and_resume(tmp_path):
    calls = tmp_path / "calls"
    base = fake_synthbench(tmp_path / "base", "base", calls)
    new = fake_synthbench(tmp_path / "new", "new", calls)
    done = run(base, new, tmp_path / "out")  # every task the new install lists
    assert done.returncode == 0, done.stderr
    assert calls.read_text().split("\n")[:-1] == ["base a", "new a", "new b", "base b"]
    rows = [
        json.loads(line) for line in (tmp_path / "out" / "times.jsonl").read_text().splitlines()
    ]
    assert sorted((r["side"], r["task"]) for r in rows) == [
        ("base", "a"), ("base", "b"), ("new", "a"), ("new", "b")
    ]  # fmt: skip
    assert "total (2 tasks)" in done.stdout
    again = run(base, new, tmp_path / "out")
    assert again.returncode == 0 and len(calls.read_text().splitlines()) == 4  # nothing re-run


def test_a_failing_leg_is_one_line_and_keeps_the_timed_ones(tmp_path):
    calls = tmp_path / "calls"
    base = fake_synthbench(tmp_path / "base", "base", calls)
    new = fake_synthbench(tmp_path / "new", "new", calls, exit_code=3)
    done = run(base, new, tmp_path / "out", "--tasks", "a")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [f"error: {new} run --task a exited 3: boom on a"]
    rows = (tmp_path / "out" / "times.jsonl").read_text().splitlines()
    assert [json.loads(r)["side"] for r in rows] == ["base"]


def test_a_missing_executable_is_refused_before_any_leg(tmp_path):
    done = run(str(tmp_path / "nope"), sys.executable, tmp_path / "out")
    assert done.returncode == 1 and "is not an executable" in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_side_runs_in_its_track_with_the_seeds_asked(tmp_path):
    calls = tmp_path / "calls"
    logger = tmp_path / "synthbench"
    logger.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    logger.chmod(0o755)
    done = run(str(logger), str(logger), tmp_path / "out", "--tasks", "a", "--new-track", "block",
               "--seeds", "1")  # fmt: skip
    assert done.returncode == 0, done.stderr
    base, new = calls.read_text().splitlines()  # task a: base first
    assert "--track core --seeds 1" in base and "--track block --seeds 1" in new


@pytest.mark.slow
def test_the_paired_step_cost_of_the_two_tracks_runs(tmp_path):
    script = SCRIPT.parent / "track_step_cost.py"
    done = subprocess.run(
        [sys.executable, str(script), "--mech", "deltanet", "--protocol", "smoke", "--tasks",
         "copy", "--rounds", "2", "--steps", "1"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "smoke (core) against smoke-block (block)" in done.stdout
    assert "suite (1 tasks, every task alike): block / core x" in done.stdout
