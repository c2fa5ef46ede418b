"""A grid says its size before it is expanded, and one past MAX_RUNS needs --yes (issue 32):
the count is a product of the lists' lengths, never a plan of every run."""

from __future__ import annotations

import time

import pytest
from clitools import assert_error, invoke

from synthbench.core.mechanism import MECHANISMS
from synthbench.run import runner
from synthbench.run.limits import MAX_RUNS
from synthbench.run.protocols import PROTOCOLS

SMOKE = PROTOCOLS.get("smoke")


@pytest.mark.parametrize(
    ("tasks", "mechs", "seeds", "options"),
    [
        (["copy"], ["softmax"], 1, {}),
        (["copy", "kv_recall"], ["softmax", "linear"], 3, {}),
        (["kv_recall"], ["softmax"], 2, {"task_params": {"pairs": [2, 4, 8]}}),
        (["copy"], ["performer"], 1, {"mechanism_params": {"nb_features": [8, 16]}}),
        (["copy"], ["softmax"], 1, {"protocol_params": {"d_model": [16, 32], "steps": [5, 9]}}),
        (
            ["copy"],
            ["softmax"],
            1,
            {"protocol_params": {"arch": ["attn-only", "transformer"], "steps": 5}},
        ),
        (["kv_recall", "copy"], ["softmax"], 1, {"difficulties": ["easy", "default"]}),
    ],
)
def test_plan_size_is_the_number_of_runs_planned(tasks, mechs, seeds, options):
    planned = runner.plan(tasks, mechs, SMOKE, seeds, **options)
    assert runner.plan_size(tasks, mechs, SMOKE, seeds, **options) == len(planned)


def test_a_grid_past_the_cap_is_refused_at_once_without_yes(tmp_path):
    pairs = ",".join(map(str, range(1, 400)))  # 399 x 25 mechanisms x 3 seeds: 29,925
    args = ["run", "--task", "kv_recall", "--mech", "all", "--task-param", f"pairs={pairs}"]
    started = time.perf_counter()
    result = invoke(*args, "--results", tmp_path / "results")
    assert time.perf_counter() - started < 30  # not after planning them all
    runs = 399 * len(MECHANISMS.names()) * 3  # those the suite registered count too
    assert_error(result, 2, f"this grid is {runs:,} runs, more than {MAX_RUNS:,}")
    assert "--yes" in result.stderr
    assert not (tmp_path / "results").exists()


def test_a_sweep_file_past_the_cap_is_refused_too(tmp_path):
    pairs = ", ".join(map(str, range(1, 400)))
    sweep = tmp_path / "big.toml"
    sweep.write_text(f'task = "kv_recall"\nmech = "all"\n[task_params]\npairs = [{pairs}]\n')
    result = invoke("sweep", sweep, "--results", tmp_path / "results")
    assert_error(result, 2, f"this grid is {399 * len(MECHANISMS.names()) * 3:,} runs")


def test_a_large_grid_says_its_size_before_planning(tmp_path):
    pairs = ",".join(map(str, range(2, 12)))  # 10 x 2 x 30 seeds = 600 runs
    args = ["run", "--task", "kv_recall", "--mech", "softmax,linear", "--protocol", "smoke"]
    args += ["--seeds", 30, "--task-param", f"pairs={pairs}", "--protocol-param", "steps=0"]
    result = invoke(*args, "--results", tmp_path / "results")
    # the count comes first; the protocol's own check (steps) refuses the plan after it
    assert result.stdout.startswith("planning 600 runs"), result.output
    assert_error(result, 2, "sizes and counts must be >= 1")


def test_a_binary_sweep_file_is_named(tmp_path):
    sweep = tmp_path / "binary.toml"
    sweep.write_bytes(bytes(range(256)))
    assert_error(invoke("sweep", sweep), 2, f"sweep file {sweep} is not UTF-8 text")


def test_a_sweep_file_nested_past_the_parser_or_too_large_is_named(tmp_path):
    deep = tmp_path / "deep.toml"
    deep.write_text('task = "copy"\nx = ' + "[" * 100_000 + "]" * 100_000 + "\n")
    assert_error(invoke("sweep", deep), 2, f"sweep file {deep} ")
    large = tmp_path / "large.toml"
    large.write_text('task = "copy"\n' + "# padding\n" * 200_000)
    assert_error(invoke("sweep", large), 2, f"sweep file {large} is larger than 1,048,576 bytes")
