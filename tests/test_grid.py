"""Grids of runs (synthbench/run/grid.py): lists of task knobs, mechanism parameters, protocol
fields and difficulty presets, on the command line and in a sweep file; and the frontier
report built from them (synthbench/report/frontier.py)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from clitools import SMOKE, assert_error, invoke

from synthbench.core.task import TASKS
from synthbench.report import frontier
from synthbench.report.formats import to_markdown
from synthbench.run import grid, runner
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.spec import RunSpec

QUICK = PROTOCOLS.get("quick")


def test_points_cross_lists_and_keep_scalars():
    found = grid.points({"pairs": (4, 8), "queries": 2, "keys": [16, 32]})
    assert found == [
        {"pairs": 4, "queries": 2, "keys": 16},
        {"pairs": 4, "queries": 2, "keys": 32},
        {"pairs": 8, "queries": 2, "keys": 16},
        {"pairs": 8, "queries": 2, "keys": 32},
    ]


def test_a_sequence_parameter_sweeps_only_over_a_list_of_lists():
    defaults = {"parts": ("a", "b")}
    assert grid.points({"parts": ["a"]}, defaults) == [{"parts": ("a",)}]
    assert grid.points({"parts": [["a"], ["a", "b"]]}, defaults) == [
        {"parts": ("a",)},
        {"parts": ("a", "b")},
    ]


@pytest.mark.parametrize(
    ("params", "message"),
    [({"n": []}, "lists no value"), ({"n": (4, 4)}, "lists a value twice")],
)
def test_points_reject_an_empty_or_repeated_list(params, message):
    with pytest.raises(ValueError, match=message):
        grid.points(params)


def test_protocol_points_replace_fields_and_keep_the_name():
    found = grid.protocol_points(QUICK, {"d_model": (32, 128), "steps": 50})
    assert [(p.name, p.version, p.d_model, p.steps) for p in found] == [
        ("quick", QUICK.version, 32, 50),
        ("quick", QUICK.version, 128, 50),
    ]
    assert grid.protocol_changes("quick", found[0].config()) == {"d_model": 32, "steps": 50}
    assert grid.protocol_changes("quick", QUICK.config()) == {}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"d_modle": 32}, "protocol has no field 'd_modle'; did you mean d_model?"),
        ({"pos": "rope"}, "protocol field pos cannot be set per run (use --pos)"),
        ({"lrs": 0.1}, "protocol field lrs cannot be set per run"),
        ({"d_model": "wide"}, "parameter d_model must be int"),
        ({"d_model": 30}, "d_model must be divisible by n_heads"),
    ],
)
def test_protocol_points_reject_bad_fields(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        grid.protocol_points(QUICK, overrides)


def test_a_grid_point_is_the_same_run_as_typed_alone():
    specs = runner.plan(
        ["kv_recall"], ["softmax", "linear"], QUICK, 2,
        task_params={"pairs": (4, 8), "queries": 4}, protocol_params={"d_model": (32, 64)},
    )  # fmt: skip
    assert len(specs) == 2 * 2 * 2 * 2
    alone = RunSpec.resolve(
        "kv_recall", "linear", grid.protocol_points(QUICK, {"d_model": 32})[0], 1,
        task_overrides={"pairs": 8, "queries": 4},
    )  # fmt: skip
    assert alone.run_id in {s.run_id for s in specs}
    # d_model 64 is quick's own: that point is the plain run
    plain = RunSpec.resolve("kv_recall", "softmax", QUICK, 0, {"pairs": 4, "queries": 4})
    assert plain.run_id in {s.run_id for s in specs}
    assert len({s.run_id for s in specs}) == len(specs)


def test_a_difficulty_ladder_is_each_preset_with_the_task_params_on_top():
    specs = runner.plan(
        ["copy", "kv_recall"], ["softmax"], QUICK, 1, difficulties=["easy", "default", "hard"]
    )
    for spec in specs:
        presets = [TASKS.get(spec.task).from_difficulty(d).param_dict() for d in
                   ("easy", "default", "hard")]  # fmt: skip
        assert spec.task_params in presets
    assert len(specs) == 6
    specs = runner.plan(["copy"], ["softmax"], QUICK, 1, task_params={"vocab": 8},
                        difficulties=["easy", "hard"])  # fmt: skip
    assert {s.task_params["vocab"] for s in specs} == {8}
    assert len({s.task_params["n"] for s in specs}) == 2


def test_an_unknown_difficulty_names_the_presets():
    typo = "task copy has no difficulty 'harder'; did you mean hard\\? \\(presets: "
    with pytest.raises(ValueError, match=typo):
        runner.plan(["copy"], ["softmax"], QUICK, 1, difficulties=["harder"])


def test_a_mechanism_parameter_list_sweeps():
    specs = runner.plan(
        ["copy"], ["performer"], QUICK, 1, mechanism_params={"nb_features": (8, 16)}
    )
    assert sorted(s.mechanism_params["nb_features"] for s in specs) == [8, 16]


# -- sweep files -----------------------------------------------------------------------------


def write(tmp_path, text: str, name: str = "grid.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_sweep_file_reads_into_the_run_options(tmp_path):
    path = write(
        tmp_path,
        'task = "kv_recall"\nmech = ["softmax", "linear"]\nseeds = 2\n'
        'difficulty = "default"\n[task_params]\npairs = [4, 8]\nqueries = 4\n'
        "[protocol_params]\nd_model = [32, 64]\n",
    )
    assert grid.load_sweep_file(path) == {
        "task": "kv_recall",
        "mech": "softmax,linear",
        "seeds": 2,
        "difficulty": "default",
        "task_params": {"pairs": [4, 8], "queries": 4},
        "protocol_params": {"d_model": [32, 64]},
    }


@pytest.mark.parametrize(
    ("text", "name", "message"),
    [
        ('task = "copy"\nmechs = "softmax"\n', "g.toml", "unknown key 'mechs'; did you mean mech?"),
        ('mech = "softmax"\n', "g.toml", "names no task"),
        ('task = "copy"\n[task_params\n', "g.toml", "is not valid TOML"),
        ('task = "copy"\n', "g.yaml", "only TOML files are read"),
        ('task = "copy"\nseeds = "3"\n', "g.toml", "seeds must be an integer"),
        ('task = "copy"\ntask_params = 3\n', "g.toml", "task_params must be a table"),
    ],
)
def test_a_bad_sweep_file_is_one_clear_error(tmp_path, text, name, message):
    with pytest.raises(ValueError, match=message):
        grid.load_sweep_file(write(tmp_path, text, name))


def test_sweep_and_run_with_lists_store_the_same_runs(tmp_path, single_thread):
    """The sweep command runs the grid end to end (the smoke protocol: tiny); run with the
    same lists finds every run stored."""
    path = write(
        tmp_path,
        'task = "copy"\nmech = "softmax"\nprotocol = "smoke"\nseeds = 1\n'
        "[task_params]\nn = [4, 6]\n[protocol_params]\nd_model = [16, 32]\n",
    )
    results = tmp_path / "results"
    result = invoke("sweep", path, "--results", results, "--jobs", "1")
    assert result.exit_code == 0, result.output
    assert "4 runs (1 task x 1 mechanism x 4 grid points x 1 seed" in result.output
    assert "n=4" in result.output and "d_model=16" in result.output
    again = invoke(
        "run", "--task", "copy", *SMOKE, "--task-param", "n=4,6", "--protocol-param",
        "d_model=16,32", "--results", results,
    )  # fmt: skip
    assert again.exit_code == 0, again.output
    assert "4 already stored, 0 to run" in again.output

    out = tmp_path / "reports"
    report = invoke("report", "--results", results, "--out", out, "--format", "md,png",
                    "--no-reference")  # fmt: skip
    assert report.exit_code == 0, report.output
    table = (out / "smoke" / "frontier.md").read_text()
    assert "| copy" in table and "n (larger)" in table and "d_model (smaller)" in table
    for page in ("leaderboard.md",):  # the page has it too: --format html below
        assert "Frontiers at accuracy 0.9, protocol smoke" in (out / page).read_text()
    assert (out / "smoke" / "frontier-copy-n.png").is_file()
    assert (out / "smoke" / "state-copy.png").is_file()
    # the tables keep the grid's points apart: a width is a variant, never a seed
    full = (out / "smoke" / "target" / "full.md").read_text()
    assert "softmax (d_model=16)" in full and "softmax (d_model=32)" in full
    page = invoke("report", "--results", results, "--out", out, "--format", "html",
                  "--no-reference")  # fmt: skip
    assert page.exit_code == 0, page.output
    html = (out / "leaderboard.html").read_text()
    assert '<section class="frontier"><h2>Frontiers at accuracy 0.9, protocol smoke' in html


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--protocol-param", "d_modle=8"], "did you mean d_model?"),
        (["--difficulty", "medium"], "task copy has no difficulty 'medium'"),
        (["--task-param", "n=4,4"], "lists a value twice"),
    ],
)
def test_bad_grid_options_are_one_line_errors(tmp_path, args, message):
    result = invoke("run", "--task", "copy", *SMOKE, *args, "--results", tmp_path / "r")
    assert_error(result, 2, message)
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").rglob("*.parquet"))


def test_sweep_of_a_missing_file_is_one_line(tmp_path):
    assert_error(invoke("sweep", tmp_path / "none.toml"), 2, "does not exist")


# -- frontiers -------------------------------------------------------------------------------


def grid_rows(accuracy: dict, base=QUICK) -> pd.DataFrame:
    """Stored-like rows of kv_recall at ``base`` (quick): ``accuracy[(mechanism, pairs,
    d_model)]`` is a list of per-seed test accuracies, each the selected lr's."""
    rows = []
    for (mechanism, pairs, d_model), values in accuracy.items():
        protocol = grid.protocol_points(base, {"d_model": d_model})[0]
        for seed, value in enumerate(values):
            spec = RunSpec.resolve("kv_recall", mechanism, protocol, seed,
                                   {"pairs": pairs, "queries": 4})  # fmt: skip
            fields = spec.row_fields()
            rows.append({**fields, "status": "ok", "selected": True, "lr": 1e-2,
                         "token_acc": value, "lr_edge": False})  # fmt: skip
    return pd.DataFrame(rows)


def test_the_frontier_is_the_hardest_value_held_from_the_easiest_on():
    rows = grid_rows({
        ("softmax", 4, 64): [1.0, 1.0], ("softmax", 8, 64): [1.0, 0.98],
        ("softmax", 16, 64): [0.97, 0.95],
        ("linear", 4, 64): [1.0, 0.99], ("linear", 8, 64): [0.80, 0.85],
        ("linear", 16, 64): [0.95, 0.93],  # back above: the frontier stays at 4
        ("linear", 4, 32): [0.5, 0.6], ("linear", 8, 32): [0.2, 0.1],
        ("softmax", 4, 32): [1.0, 1.0], ("softmax", 8, 32): [0.9, 0.9],
    })  # fmt: skip
    found = frontier.lines(frontier.grid_runs(rows))
    by = {(line.knob.name, line.context, line.mechanism): line for line in found}
    assert by[("pairs", "d_model=64", "softmax")].frontier() == (16, True)
    assert by[("pairs", "d_model=64", "linear")].frontier() == (4, False)
    assert by[("pairs", "d_model=32", "linear")].frontier() == (None, False)
    assert by[("pairs", "d_model=32", "softmax")].frontier() == (8, True)
    # width: smaller is harder, so 64 comes first
    width = by[("d_model", "pairs=8", "linear")]
    assert list(width.points["value"]) == [64, 32]
    assert width.frontier() == (None, False)
    table = to_markdown(frontier.frontier_grid(found, "quick", QUICK.version))
    assert "| kv_recall | pairs (larger)" in table
    assert "16 (all)" in table and "none" in table
    assert "4: 0.99, 8: 0.82, 16: 0.94" in table
    # linear at width 64 falls at 8 and is back above at 16: the table says so, once
    assert by[("pairs", "d_model=64", "linear")].back_above() == 16
    assert by[("pairs", "d_model=64", "softmax")].back_above() is None
    assert by[("pairs", "d_model=32", "linear")].back_above() is None
    assert table.count("back above at") == 2  # the row and the note
    assert "| 4 (back above at 16) " in table


def test_state_points_use_the_declared_state_size():
    rows = grid_rows({("linear", 4, 32): [0.5], ("linear", 4, 64): [0.7],
                      ("softmax", 4, 64): [1.0]})  # fmt: skip
    states = frontier.state_points(frontier.grid_runs(rows)).set_index(["mechanism", "d_model"])
    from synthbench.core.mechanism import MECHANISMS

    length = TASKS.get("kv_recall")(pairs=4, queries=4).seq_len
    for (mechanism, d_model), row in states.iterrows():
        heads, layers = QUICK.n_heads, QUICK.n_layers
        expected = (
            layers * heads * MECHANISMS.get(mechanism)(d_model // heads, heads).state_size(length)
        )
        assert row["state"] == expected
    assert states.loc[("linear", 32), "state"] < states.loc[("linear", 64), "state"]


def test_block_state_points_use_the_published_layers_whole_state():
    """Under quick-block the rows store the published layer's parameters: the point's state
    is n_layers x the layer's own state_size (deltanet's convolution windows included), and
    an attention-family core's per-head state times the heads, as in the core track."""
    block = PROTOCOLS.get("quick-block")
    rows = grid_rows({("deltanet", 4, 64): [0.9], ("softmax", 4, 64): [1.0]}, base=block)
    states = frontier.state_points(frontier.grid_runs(rows)).set_index("mechanism")
    length = TASKS.get("kv_recall")(pairs=4, queries=4).seq_len
    heads, head, layers = block.n_heads, block.d_model // block.n_heads, block.n_layers
    conv = 3 * (4 - 1) * block.d_model  # q, k and v windows of a kernel-4 convolution
    assert states.loc["deltanet", "state"] == layers * (conv + heads * head * head)
    assert states.loc["softmax", "state"] == layers * heads * 2 * length * head


def test_a_difficulty_ladder_is_one_knob_ordered_easy_to_hard():
    rows = []
    for name, value in (("hard", 0.2), ("easy", 1.0), ("default", 0.95)):
        spec = RunSpec.resolve("copy", "linear", QUICK, 0,
                               TASKS.get("copy").difficulties.get(name, {}))  # fmt: skip
        rows.append({**spec.row_fields(), "status": "ok", "selected": True, "lr": 1e-2,
                     "token_acc": value, "lr_edge": False})  # fmt: skip
    found = frontier.lines(frontier.grid_runs(pd.DataFrame(rows)))
    ladder = [line for line in found if line.knob.name == "difficulty"]
    assert len(ladder) == 1
    assert list(ladder[0].points["value"]) == ["easy", "default", "hard"]
    assert ladder[0].frontier() == ("default", False)
    assert not [line for line in found if line.knob.name == "n"]  # the ladder says it


def test_a_knob_sweep_through_presets_is_no_ladder():
    """selective_copy's easy preset is k = 4 at the default length: a k sweep 4, 8, 16 meets
    the easy and default presets, but one knob moved, so there is one line (k), no ladder."""
    rows = []
    for k, value in ((4, 1.0), (8, 0.95), (16, 0.5)):
        spec = RunSpec.resolve("selective_copy", "linear", QUICK, 0, {"k": k})
        rows.append({**spec.row_fields(), "status": "ok", "selected": True, "lr": 1e-2,
                     "token_acc": value, "lr_edge": False})  # fmt: skip
    found = frontier.lines(frontier.grid_runs(pd.DataFrame(rows)))
    assert [line.knob.name for line in found] == ["k"]
    assert found[0].frontier() == (8, False)


def test_a_knob_without_an_order_is_a_context_not_a_line():
    """Two architectures are two contexts of the pairs line, never a frontier of their own."""
    rows = []
    for arch, pairs, value in (("attn-only", 4, 1.0), ("attn-only", 8, 0.5),
                               ("attn-conv", 4, 1.0), ("attn-conv", 8, 0.95)):  # fmt: skip
        protocol = grid.protocol_points(QUICK, {"arch": arch})[0]
        spec = RunSpec.resolve("kv_recall", "linear", protocol, 0, {"pairs": pairs, "queries": 2})
        rows.append({**spec.row_fields(), "status": "ok", "selected": True, "lr": 1e-2,
                     "token_acc": value, "lr_edge": False})  # fmt: skip
    found = frontier.lines(frontier.grid_runs(pd.DataFrame(rows)))
    assert {(line.knob.name, line.context) for line in found} == {
        ("pairs", "arch=attn-conv"), ("pairs", "arch=attn-only")}  # fmt: skip
    by = {line.context: line.frontier() for line in found}
    assert by == {"arch=attn-conv": (8, True), "arch=attn-only": (4, False)}


def test_rows_without_a_grid_have_no_frontier():
    spec = RunSpec.resolve("copy", "linear", QUICK, 0)
    rows = pd.DataFrame([{**spec.row_fields(), "status": "ok", "selected": True, "lr": 1e-2,
                          "token_acc": 1.0, "lr_edge": False}])  # fmt: skip
    assert frontier.lines(frontier.grid_runs(rows)) == []
    assert json.loads(rows["task_params"][0])["n"] == 32


def test_knob_values_read_as_typed_beside_another_tasks_rows():
    """Rows of two tasks share one frame, so a task's knob column holds the other's missing
    values: the tables still say pairs=16 and d_model=32, never 16.0."""
    rows = grid_rows({("softmax", 16, 32): [1.0], ("softmax", 16, 64): [1.0],
                      ("softmax", 32, 32): [0.1]})  # fmt: skip
    other = RunSpec.resolve("copy", "softmax", QUICK, 0)
    copy_row = {**other.row_fields(), "status": "ok", "selected": True, "lr": 1e-2,
                "token_acc": 1.0, "lr_edge": False}  # fmt: skip
    rows = pd.concat([rows, pd.DataFrame([copy_row])])
    table = to_markdown(frontier.frontier_grid(frontier.lines(frontier.grid_runs(rows)), "quick",
                                               QUICK.version))  # fmt: skip
    assert "pairs=16 " in table and "d_model=32 " in table and "16.0" not in table
    assert "16: 1.00, 32: 0.10" in table


def test_lines_come_in_numeric_order_of_their_context():
    rows = grid_rows({(m, p, d): [0.95] for m in ("softmax",) for p in (4, 16) for d in (128, 32)})
    found = frontier.lines(frontier.grid_runs(rows))
    assert [line.context for line in found if line.knob.name == "pairs"] == [
        "d_model=32", "d_model=128"
    ]  # fmt: skip
    assert [line.context for line in found if line.knob.name == "d_model"] == [
        "pairs=4",
        "pairs=16",
    ]


def test_a_kv_recall_sweep_over_pairs_alone_queries_half_of_each():
    """The check's one command: kv_recall pairs 4 to 32, nothing else set (queries defaults to
    half the pairs, as the default's 12 of 24: that run keeps its id)."""
    specs = runner.plan(["kv_recall"], ["softmax", "linear"], QUICK, 1,
                        task_params={"pairs": (4, 8, 16, 32)})  # fmt: skip
    assert sorted({(s.task_params["pairs"], s.task_params["queries"]) for s in specs}) == [
        (4, 2), (8, 4), (16, 8), (32, 16)
    ]  # fmt: skip
    default = RunSpec.resolve("kv_recall", "softmax", QUICK, 0)
    assert default.task_params["queries"] == 12
    assert (
        default.run_id == RunSpec.resolve("kv_recall", "softmax", QUICK, 0, {"queries": 12}).run_id
    )
