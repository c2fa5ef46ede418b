"""benchmarks/step_costs.py: the block track's scaled figures written beside the kept rows,
from cached measurements (--no-measure: nothing trains here)."""

import contextlib
import io
import json
import statistics
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from clitools import BENCHMARKS, load_script

from synthbench.run import cost, cost_table
from synthbench.run.protocols import PROTOCOLS

SCRIPT = BENCHMARKS / "step_costs.py"


def script_constant(name: str):
    """A constant or function of the script (it is not a package module)."""
    return getattr(load_script("step_costs"), name)


def run(*args: str) -> subprocess.CompletedProcess:
    """The script's main() in this process (a child would spend two seconds importing torch),
    with its exit status and its streams as a child's would be."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = script_constant("main")(list(args))
        except SystemExit as exit_:  # argparse's errors
            status = exit_.code
    return subprocess.CompletedProcess([str(SCRIPT), *args], status, out.getvalue(), err.getvalue())


def quick_only_reference(tmp_path: Path) -> Path:
    """The shipped reference's quick rows alone (it may hold the block track's too): these
    tests give the block track rows of their own, or none."""
    rows = pd.read_parquet(script_constant("REFERENCE"))
    path = tmp_path / "quick-reference.parquet"
    rows[rows["protocol"] == "quick"].to_parquet(path)
    return path


def cache_of(path: Path, mechanism: str, ratios: dict[str, float]) -> Path:
    """Step times of quick (tagged quick-block) and quick-block, in the script's cache keys."""
    lines = []
    for task, ratio in ratios.items():
        for key, step_ms in (
            (f"quick/{task}/{mechanism}/default/quick-block/steps40", 10.0),
            (f"quick-block/{task}/{mechanism}/default/steps40", 10.0 * ratio),
        ):
            record = {"key": key, "measured_steps": 40, "wall_s": 1.0, "step_ms": step_ms}
            lines.append(json.dumps(record | {"at": "2026-11-26"}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_scaled_block_rows_join_the_kept_table(tmp_path):
    shipped = cost.read_table()
    out = tmp_path / "step_costs.csv"
    cost.write_table(shipped[shipped["protocol"] != "quick-block"], out)
    sample = script_constant("SCALED_TASKS")
    ratios = {task: 1.4 + 0.1 * i for i, task in enumerate(sample)}
    cache = cache_of(tmp_path / "cache.jsonl", "deltanet", ratios)
    done = run("--cache", str(cache), "--out", str(out), "--no-measure", "--protocols",
               "quick-block", "--reference", str(quick_only_reference(tmp_path)))  # fmt: skip
    assert done.returncode == 0, done.stderr
    table = cost.read_table(out)
    block = table[table["protocol"] == "quick-block"]
    assert set(block["mechanism"]) == {"deltanet"}  # only the measured mechanism
    quick = table[(table["protocol"] == "quick") & (table["mechanism"] == "deltanet")]
    assert set(block["task"]) == set(quick["task"])
    scale = statistics.median(ratios.values())
    merged = block.merge(quick, on="task", suffixes=("", "_quick"))
    assert merged["scale"].tolist() == pytest.approx([scale] * len(merged))
    assert merged["step_seconds"].to_numpy() == pytest.approx(
        merged["step_seconds_quick"].to_numpy() * scale, rel=1e-5
    )
    assert (block["source"] == "scaled").all()
    assert (block["protocol_version"] == PROTOCOLS.get("quick-block").version).all()
    others = table[table["protocol"] != "quick-block"].reset_index(drop=True)
    kept = shipped[shipped["protocol"] != "quick-block"]
    assert len(others) == len(kept)
    assert sorted(others["step_seconds"].round(9)) == sorted(kept["step_seconds"].round(9))


def test_unknown_protocol_and_missing_table_are_one_line_errors(tmp_path):
    done = run("--out", str(tmp_path / "t.csv"), "--no-measure", "--protocols", "quick-blok")
    assert done.returncode == 2
    assert "no figures for protocol quick-blok; choose from" in done.stderr.splitlines()[-1]
    done = run("--out", str(tmp_path / "t.csv"), "--no-measure", "--protocols", "quick-block")
    assert done.returncode == 2
    assert "which does not exist" in done.stderr.splitlines()[-1]
    for reference, said in ((tmp_path / "none.parquet", "no such file"),
                            (tmp_path / "t.csv", "cannot read the reference rows")):  # fmt: skip
        (tmp_path / "t.csv").write_text("not parquet")
        done = run("--out", str(tmp_path / "t.csv"), "--no-measure", "--reference", str(reference))
        assert done.returncode == 2 and said in done.stderr.splitlines()[-1]


@pytest.mark.slow
def test_pairs_the_reference_holds_in_the_block_track_take_its_rows(tmp_path):
    """Once the rebuilt reference holds quick-block rows, those pairs' figures are the rows'
    own (as quick's), with their trainings per run; the other pairs are still scaled."""
    quick_rows = pd.read_parquet(quick_only_reference(tmp_path))
    version = PROTOCOLS.get("quick-block").version
    block = []
    # a GPU's rows (a lease's) never price this machine: kv_recall, held on a GPU alone, is
    # scaled; sort's GPU row is left out of its figure
    for task, runs in (("copy", [(100.0, 2000, "cpu"), (60.0, 1000, "cpu"), (90.0, 1000, "cpu")]),
                       ("sort", [(40.0, 500, "cpu"), (1.0, 2000, "NVIDIA H200")]),
                       ("kv_recall", [(2.0, 2000, "NVIDIA H200")])):  # fmt: skip
        for i, (wall, steps, device) in enumerate(runs):
            block.append({"task": task, "mechanism": "deltanet", "protocol": "quick-block",
                          "protocol_version": version, "run_id": f"{task}-{i // 2}",
                          "status": "ok", "wall_seconds": wall, "steps_done": steps,
                          "steps": 2000, "task_params": "{}", "device": device})  # fmt: skip
    reference = tmp_path / "reference.parquet"
    pd.concat([quick_rows, pd.DataFrame(block)], ignore_index=True).to_parquet(reference)
    shipped = cost.read_table()
    out = tmp_path / "step_costs.csv"
    cost.write_table(shipped[shipped["protocol"] != "quick-block"], out)
    sample = script_constant("SCALED_TASKS")
    cache = cache_of(tmp_path / "cache.jsonl", "deltanet", dict.fromkeys(sample, 1.5))
    done = run("--cache", str(cache), "--out", str(out), "--no-measure", "--protocols",
               "quick-block", "--reference", str(reference))  # fmt: skip
    assert done.returncode == 0, done.stderr
    table = cost.read_table(out)
    block_rows = table[table["protocol"] == "quick-block"].set_index("task")
    copy, sort = block_rows.loc["copy"], block_rows.loc["sort"]
    assert copy["source"] == sort["source"] == "reference"
    # copy: per step 0.05, 0.06, 0.09 (median 0.06); 3 trainings over 2 runs, mean share of
    # the steps (1 + 0.5 + 0.5) / 3
    assert copy["step_seconds"] == pytest.approx(0.06)
    assert copy["trainings_per_run"] == pytest.approx(1.5)
    assert copy["steps_frac"] == pytest.approx(2 / 3)
    assert (sort["step_seconds"], sort["trainings_per_run"]) == pytest.approx((0.08, 1.0))
    scaled = block_rows.drop(index=["copy", "sort"])
    assert len(scaled) == 20 and (scaled["source"] == "scaled").all()
    assert "kv_recall" in scaled.index
    assert scaled["scale"].tolist() == pytest.approx([1.5] * 20)


@pytest.mark.slow
def test_a_mechanism_without_a_measured_ratio_takes_its_whole_runs(tmp_path):
    """No measurement (no cache): the block track's pairs the reference lacks on the CPU are
    scaled by the median ratio of its CPU figures over quick's on the tasks it holds."""
    quick_rows = pd.read_parquet(quick_only_reference(tmp_path))
    quick_rows = quick_rows[quick_rows["mechanism"] == "softmax"]
    figures = cost.figures_of_rows(quick_rows).set_index("task")["step_seconds"]
    version = PROTOCOLS.get("quick-block").version
    block = [
        {"task": task, "mechanism": "softmax", "protocol": "quick-block",
         "protocol_version": version, "run_id": f"{task}-block", "status": "ok",
         "wall_seconds": figures[task] * ratio * 1000, "steps_done": 1000, "steps": 2000,
         "task_params": "{}", "device": "cpu"}
        for task, ratio in (("copy", 2.0), ("sort", 3.0), ("parity", 5.0))
    ]  # fmt: skip
    reference = tmp_path / "reference.parquet"
    pd.concat([quick_rows, pd.DataFrame(block)], ignore_index=True).to_parquet(reference)
    out = tmp_path / "step_costs.csv"
    shipped = cost.read_table()
    cost.write_table(shipped[shipped["protocol"] != "quick-block"], out)
    done = run("--out", str(out), "--no-measure", "--protocols", "quick-block",
               "--reference", str(reference))  # fmt: skip
    assert done.returncode == 0, done.stderr
    table = cost.read_table(out)
    rows = table[table["protocol"] == "quick-block"].set_index("task")
    assert set(rows["mechanism"]) == {"softmax"}
    assert (rows.loc[["copy", "sort", "parity"], "source"] == "reference").all()
    scaled = rows[rows["source"] == "scaled"]
    assert len(scaled) == len(figures) - 3
    assert scaled["scale"].tolist() == pytest.approx([3.0] * len(scaled), rel=1e-4)  # median


@pytest.mark.slow
def test_a_scaled_protocol_keeps_its_ratios_and_takes_the_new_quick_figures(tmp_path):
    """Nothing measured this time (no cache): standard keeps each mechanism's ratio from the
    table and multiplies today's quick figures by it (what the reference rebuild needs)."""
    shipped = cost.read_table()
    stale = shipped.copy()
    stale.loc[stale["protocol"] == "standard", "step_seconds"] *= 3  # an older quick's
    out = tmp_path / "step_costs.csv"
    cost.write_table(stale, out)
    done = run("--out", str(out), "--no-measure", "--protocols", "quick,standard",
               "--reference", str(quick_only_reference(tmp_path)))  # fmt: skip
    assert done.returncode == 0, done.stderr
    table = cost.read_table(out)
    key = ["task", "mechanism"]
    quick = table[table["protocol"] == "quick"].set_index(key)
    after = table[table["protocol"] == "standard"].set_index(key)
    before = shipped[shipped["protocol"] == "standard"].set_index(key)
    ratio_known = quick.index.get_level_values("mechanism").isin(before.index.get_level_values(1))
    assert sorted(after.index) == sorted(quick.index[ratio_known])  # every such quick pair
    assert len(after) and (after["source"] == "scaled").all()
    before = before.loc[after.index]
    assert after["scale"].to_numpy() == pytest.approx(before["scale"].to_numpy())
    assert after["step_seconds"].to_numpy() == pytest.approx(
        (quick.loc[after.index, "step_seconds"] * after["scale"]).to_numpy(), rel=1e-5
    )
    assert after["step_ms"].notna().sum() == before["step_ms"].notna().sum() > 0


def test_the_docs_table_is_written_between_its_markers_and_the_rest_kept(tmp_path):
    start, end = script_constant("DOC_MARKERS")
    doc = tmp_path / "PROTOCOLS.md"
    doc.write_text(f"# before\n\n{start}| an old table |\n{end}\n\nafter\n")
    table = cost.read_table()
    table = table[table["protocol"].isin(["smoke", "quick"])]
    script_constant("write_docs_table")(table, doc)
    text = doc.read_text()
    assert text == f"# before\n\n{start}{cost_table.markdown_table(table)}{end}\n\nafter\n"
    assert "| an old table |" not in text and "smoke: 1 lr x 20 steps" in text


@pytest.mark.slow
def test_mechs_writes_only_those_mechanisms_and_keeps_the_others(tmp_path):
    """--mechs: a mechanism the table lacks is added (here standard, scaled by its measured
    ratio) while every other mechanism's rows of that protocol stay as they were."""
    shipped = cost.read_table()
    out = tmp_path / "step_costs.csv"
    without = shipped[~((shipped["protocol"] == "standard") & (shipped["mechanism"] == "gla"))]
    cost.write_table(without, out)
    lines = []
    for task in script_constant("SCALED_TASKS"):
        for key, step_ms in ((f"quick/{task}/gla/default/standard/steps40", 10.0),
                             (f"standard/{task}/gla/default/steps12", 42.0)):  # fmt: skip
            record = {"key": key, "measured_steps": 40, "wall_s": 1.0, "step_ms": step_ms}
            lines.append(json.dumps(record))
    cache = tmp_path / "cache.jsonl"
    cache.write_text("\n".join(lines) + "\n")
    reference = quick_only_reference(tmp_path)
    done = run("--cache", str(cache), "--out", str(out), "--no-measure", "--protocols",
               "standard", "--mechs", "gla", "--reference", str(reference))  # fmt: skip
    assert done.returncode == 0, done.stderr
    table = cost.read_table(out)
    standard = table[table["protocol"] == "standard"]
    gla = standard[standard["mechanism"] == "gla"].set_index("task")
    quick = table[(table["protocol"] == "quick") & (table["mechanism"] == "gla")].set_index("task")
    assert set(gla.index) == set(quick.index) and (gla["source"] == "scaled").all()
    assert gla["scale"].tolist() == pytest.approx([4.2] * len(gla))
    assert gla["step_seconds"].to_numpy() == pytest.approx(
        quick.loc[gla.index, "step_seconds"].to_numpy() * 4.2, rel=1e-5
    )
    key = ["protocol", "task", "mechanism"]
    others = table[(table["protocol"] != "standard") | (table["mechanism"] != "gla")]
    pd.testing.assert_frame_equal(
        others.sort_values(key).reset_index(drop=True),
        without.sort_values(key).reset_index(drop=True),
        check_dtype=False,
    )


def test_an_unknown_mechanism_is_a_one_line_error_with_close_matches(tmp_path):
    out = tmp_path / "step_costs.csv"
    cost.write_table(cost.read_table(), out)
    done = run("--out", str(out), "--no-measure", "--protocols", "standard", "--mechs", "glaa",
               "--reference", str(quick_only_reference(tmp_path)))  # fmt: skip
    assert done.returncode == 2
    last = done.stderr.splitlines()[-1]
    assert "no quick rows of glaa (close: gla" in last and "it holds softmax" in last
