"""benchmarks/recipe_panel.py: the panel's counts, on hand-made rows whose answers are known."""

import json

import pandas as pd
import pytest
from clitools import load_script

panel = load_script("recipe_panel")


def run(mech, seed, vals, selected, score, curve=(0.1, 0.2, 0.3), chance=0.1, se=0.01,
        statuses=None, device="cpu"):  # fmt: skip
    """The rows of one run: one per lr of ``vals`` (validation scores)."""
    statuses = statuses or ["ok"] * len(vals)
    return [
        {
            "protocol": "quick",
            "protocol_version": 6,
            "task": "kv_recall",
            "mechanism": mech,
            "run_id": f"{mech}-{seed}",
            "seed": seed,
            "lr": 1e-3 * (i + 1),
            "status": status,
            "selected": i == selected,
            "val_token_acc": val,
            "chance_token_acc": chance,
            "curve_val_token_acc": list(curve),
            "target_metric": "token_acc",
            "token_acc": score,
            "token_acc_se": se,
            "wall_seconds": 10.0,
            "steps_done": 100,
            "device": device,
            "task_params": "{}",
            "mechanism_params": "{}",
        }  # fmt: skip
        for i, (val, status) in enumerate(zip(vals, statuses, strict=True))
    ]


def test_the_counts_follow_their_definitions():
    rows = pd.DataFrame(
        # a knife-edge (0.95 against 0.4 and a diverged lr); rising, but past 0.9
        run("softmax", 0, [0.4, 0.95, None], 1, 0.95, statuses=["ok", "ok", "diverged"])
        # robust, plateaued
        + run("softmax", 1, [0.9, 0.93, 0.92], 1, 0.93, curve=(0.9, 0.9, 0.9))
        # learned nothing (best 0.12 < chance 0.1 + 0.05), yet still rising (0.10 to 0.13)
        + run("linear", 0, [0.11, 0.12, 0.10], 1, 0.12, curve=(0.10, 0.11, 0.13))
        + run("linear", 1, [0.11, 0.11, 0.10], 0, 0.11, curve=(0.11, 0.11, 0.11), device="gpu")
    )
    runs = panel.run_table(panel.panel_rows(rows))
    result = panel.counts(runs)
    assert result["runs"] == 4 and result["cells"] == 2
    assert result["knife_edge"] == 1
    assert result["learned_nothing"] == 2
    assert result["undertrained"] == 1  # linear seed 0
    assert result["bimodal"] == 0
    assert result["cpu_seconds"] == 90 and result["gpu_seconds"] == 30
    assert result["steps"] == 1200 and result["modelled_seconds"] is None  # no table given
    per_step = {("quick", 6, "kv_recall", m): 0.01 for m in ("softmax", "linear")}
    assert panel.counts(panel.run_table(rows, per_step))["modelled_seconds"] == 12
    # softmax (0.94 +- small) against linear (0.115 +- small): one pair, separated
    assert result["separated"] == {"kv_recall": 1}
    # rows before schema 10 have no CPU time: none counted
    assert result["cpu_time"] == 0 and result["cpu_time_runs"] == 0


def test_cpu_time_counts_the_runs_whose_cpu_rows_all_have_it():
    rows = pd.DataFrame(
        run("softmax", 0, [0.4, 0.95], 1, 0.95)
        + run("softmax", 1, [0.9, 0.93], 1, 0.93)
        + run("linear", 0, [0.11, 0.12], 1, 0.12)
        + run("linear", 1, [0.11, 0.11], 0, 0.11, device="gpu")
    )
    rows["cpu_seconds"] = 4.0
    rows.loc[(rows["run_id"] == "softmax-1") & (rows["lr"] > 0.0015), "cpu_seconds"] = None
    result = panel.counts(panel.run_table(panel.panel_rows(rows)))
    # softmax seed 0 (8) and linear seed 0 (8); softmax seed 1 is half unknown; a GPU's none
    assert result["cpu_time"] == 16 and result["cpu_time_runs"] == 2
    assert result["cpu_seconds"] == 60  # the wall seconds of the CPU rows, as before


def test_the_panel_separates_pairs_by_the_packages_rule():
    """One rule, in synthbench/report/informative.py (``audit --informative`` applies it)."""
    from synthbench.report import informative

    assert panel.separated_pairs is informative.separated_pairs
    assert not hasattr(panel, "interval") and not hasattr(panel, "Z95")


def test_a_pair_is_clean_when_neither_cell_holds_a_knife_edge_or_an_undertrained_run():
    """softmax (0.95) and linear (0.30) are far apart on every seed: separated. The pair is
    clean only while neither cell holds a run that one lr (a knife-edge) or the budget (still
    rising below 0.9) decided."""

    def cells(softmax_vals, linear_curve):
        rows = []
        for seed, (high, low) in enumerate([(0.95, 0.30), (0.94, 0.31), (0.96, 0.29)]):
            rows += run("softmax", seed, [v + high - 0.95 for v in softmax_vals], 1, high)
            rows += run("linear", seed, [low, low - 0.01], 0, low, curve=linear_curve)
        return panel.counts(panel.run_table(panel.panel_rows(pd.DataFrame(rows))))

    flat = (0.3, 0.3, 0.3)
    plain = cells([0.9, 0.95], flat)
    assert plain["separated"] == {"kv_recall": 1} and plain["separated_clean"] == {"kv_recall": 1}
    knife = cells([0.4, 0.95], flat)  # softmax beats its other lr by 0.55 on every seed
    assert knife["knife_edge"] == 3 and knife["separated_clean"] == {"kv_recall": 0}
    rising = cells([0.9, 0.95], (0.1, 0.2, 0.3))  # linear still rising at its last point
    assert rising["undertrained"] == 3 and rising["separated_clean"] == {"kv_recall": 0}
    assert knife["separated"] == rising["separated"] == {"kv_recall": 1}


def test_a_cell_of_several_settings_is_refused():
    rows = pd.DataFrame(run("softmax", 0, [0.5], 0, 0.5) + run("softmax", 1, [0.5], 0, 0.5))
    rows.loc[rows["seed"] == 1, "task_params"] = '{"pairs": 8}'
    with pytest.raises(ValueError, match="several parameter settings"):
        panel.panel_rows(rows)


def test_a_step_cost_table_prices_the_versions_whose_steps_cost_the_same(tmp_path):
    from synthbench.run.cost import SAME_STEPS
    from synthbench.run.protocols import PROTOCOLS

    table = tmp_path / "costs.csv"
    table.write_text(
        "protocol,protocol_version,task,mechanism,step_seconds\n"
        "quick,5,copy,softmax,0.01\nquick-block,3,copy,softmax,0.03\n"
    )
    found = panel.step_costs([table])
    here = PROTOCOLS.get("quick").version
    assert found[("quick", 5, "copy", "softmax")] == 0.01
    assert (found.get(("quick", here, "copy", "softmax")) == 0.01) == (5 in SAME_STEPS["quick"])
    # the block changed in quick-block v4: its v3 steps price nothing of today's
    assert ("quick-block", PROTOCOLS.get("quick-block").version, "copy", "softmax") not in found


def test_a_source_without_a_panel_run_is_said_and_skipped(tmp_path, capsys):
    rows = pd.DataFrame(run("softmax", 0, [0.5], 0, 0.5)).assign(task="copy")
    source = tmp_path / "rows.parquet"
    rows.to_parquet(source)
    assert panel.main([str(source)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"warning: {source}: no complete run of the panel\n"


def test_cells_of_counts_every_recipe_on_one_recipes_cells(tmp_path, capsys):
    """A panel under way (v7: softmax alone so far) against the same cells of another (v6:
    softmax and linear): --cells-of quick:7 leaves v6's linear out."""
    v6 = run("softmax", 0, [0.9], 0, 0.9) + run("linear", 0, [0.5], 0, 0.5)
    v7 = [{**r, "protocol_version": 7, "run_id": "v7"} for r in run("softmax", 0, [0.9], 0, 0.9)]
    source = tmp_path / "rows.parquet"
    pd.DataFrame(v6 + v7).to_parquet(source)
    assert panel.main([str(source), "--cells-of", "quick:7"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["version"], r["runs"], r["cells"]) for r in lines] == [(6, 1, 1), (7, 1, 1)]
    assert panel.main([str(source)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["version"], r["runs"]) for r in lines] == [(6, 2), (7, 1)]
    for wrong, said in (("quick:8", "no run of quick v8"), ("quick", "is not PROTOCOL:VERSION")):
        assert panel.main([str(source), "--cells-of", wrong]) == 2
        assert said in capsys.readouterr().err


def test_cells_prints_each_seed_with_its_lr_and_flags(tmp_path, capsys):
    """softmax: a knife-edge seed (0.95 against 0.4) and a plain one; linear: seeds 0.9 and
    0.2 apart by more than BIMODAL, the low one still rising below 0.9."""
    rows = (
        run("softmax", 0, [0.4, 0.95], 1, 0.95)
        + run("softmax", 1, [0.9, 0.93], 1, 0.93, curve=(0.9, 0.9, 0.9))
        + run("linear", 0, [0.9, 0.88], 0, 0.9, curve=(0.9, 0.9, 0.9))
        + run("linear", 1, [0.2, 0.1], 0, 0.2, curve=(0.1, 0.15, 0.2))
    )
    source = tmp_path / "rows.parquet"
    pd.DataFrame(rows).to_parquet(source)
    assert panel.main([str(source), "--cells", "quick:6"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "| kv_recall | linear | 0.900 (0.001), 0.200 (0.001 U) | 0.550 | B |"
    assert lines[3] == "| kv_recall | softmax | 0.950 (0.002 K), 0.930 (0.002) | 0.940 |  |"
    assert panel.main([str(source), "--cells", "quick:7"]) == 2
    assert "no run of quick v7" in capsys.readouterr().err
    assert panel.main([str(source), "--cells", "quick"]) == 2
    assert "is not PROTOCOL:VERSION" in capsys.readouterr().err
