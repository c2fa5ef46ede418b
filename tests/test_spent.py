"""What stored runs cost (synthbench/report/spent.py, ``synthbench results --cost``): every
training's hours, on the CPU's two clocks and on accelerators, counted from hand-made rows
whose sums are known, and from real runs against their own rows."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from clitools import SMOKE, invoke

from synthbench.report.spent import COLUMNS, TOTAL, cost_table


def row(run_id, mech="softmax", wall=0.0, cpu=None, device="cpu", steps=100, version=7,
        status="ok"):  # fmt: skip
    return {"protocol": "quick", "protocol_version": version, "mechanism": mech,
            "run_id": run_id, "wall_seconds": wall, "cpu_seconds": cpu, "device": device,
            "steps_done": steps, "status": status}  # fmt: skip


def test_every_training_counts_on_its_devices_clocks():
    rows = pd.DataFrame([
        row("a", wall=360.0, cpu=324.0),
        row("a", wall=720.0, cpu=None, status="diverged"),  # an older checkpoint's: unknown
        row("a", wall=36.0, device="NVIDIA H200", steps=50),
        row("b", mech="linear", wall=1800.0, cpu=1440.0, status="error", steps=0),
        row("c", wall=99.0, cpu=99.0, version=6),  # another recipe: a line of its own
    ])  # fmt: skip
    assert list(cost_table(rows).columns) == COLUMNS
    table = cost_table(rows).set_index(["version", "mechanism"])
    softmax = table.loc[(7, "softmax")]
    assert (softmax["runs"], softmax["trainings"], softmax["steps"]) == (1, 3, 250)
    assert softmax["cpu_wall_hours"] == pytest.approx((360 + 720) / 3600)
    assert softmax["cpu_time_hours"] == pytest.approx(324 / 3600)
    assert (softmax["cpu_time_trainings"], softmax["cpu_trainings"]) == (1, 2)
    assert softmax["accelerator_hours"] == pytest.approx(36 / 3600)
    assert softmax["accelerator_share"] == pytest.approx(1 / 3)
    total = table.loc[(7, TOTAL)]
    assert (total["runs"], total["trainings"], total["steps"]) == (2, 4, 250)
    assert total["cpu_wall_hours"] == pytest.approx((360 + 720 + 1800) / 3600)
    assert total["cpu_time_hours"] == pytest.approx((324 + 1440) / 3600)
    assert total["accelerator_share"] == pytest.approx(1 / 4)
    assert table.loc[(6, TOTAL), "cpu_time_hours"] == pytest.approx(99 / 3600)
    assert sorted(table.index) == [(6, TOTAL), (6, "softmax"), (7, TOTAL), (7, "linear"),
                                   (7, "softmax")]  # fmt: skip


def test_rows_before_cpu_time_existed_count_none_of_it():
    rows = pd.DataFrame([row("a", wall=10.0)]).drop(columns="cpu_seconds")
    line = cost_table(rows).iloc[0]
    assert (line["cpu_time_hours"], line["cpu_time_trainings"], line["cpu_trainings"]) == (0, 0, 1)


def test_results_cost_sums_what_the_rows_of_real_runs_say(tmp_path):
    results = tmp_path / "results"
    for mech in ("softmax", "linear"):
        done = invoke("run", "--task", "copy", *SMOKE, "--mech", mech, "--results", results)
        assert done.exit_code == 0, done.output
    rows = json.loads(invoke("results", "--results", results, "--json", "--all-lrs").output)
    listed = invoke("results", "--results", results, "--cost", "--json")
    assert listed.exit_code == 0, listed.output
    costs = {line["mechanism"]: line for line in json.loads(listed.output)}
    assert set(costs) == {"softmax", "linear", TOTAL}
    for mech, line in costs.items():
        mine = [r for r in rows if mech in (TOTAL, r["mechanism"])]
        assert line["trainings"] == len(mine) == line["cpu_time_trainings"]
        assert line["steps"] == sum(r["steps_done"] for r in mine)
        assert line["cpu_wall_hours"] * 3600 == pytest.approx(sum(r["wall_seconds"] for r in mine))
        cpu = sum(r["cpu_seconds"] for r in mine)
        assert line["cpu_time_hours"] * 3600 == pytest.approx(cpu) and cpu > 0
        assert line["accelerator_hours"] == 0 and not math.isnan(line["cpu_time_hours"])
    table = invoke("results", "--results", results, "--cost")
    assert table.exit_code == 0, table.output
    assert table.output.splitlines()[0].split() == [
        "protocol", "version", "mechanism", "runs", "trainings", "steps", "cpu_wall_h",
        "cpu_time_h", "accelerator_h", "accelerator_share",
    ]  # fmt: skip
