"""What a user sees of a run (issue 72, part 3): `results` names each run's parameters that
differ from the defaults; the board's state column shows what the runs measured and stored
(a plugin's too, without --plugin); the block track is described as the code builds it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from clitools import SMOKE, invoke
from typer.testing import CliRunner

from synthbench.cli import app
from synthbench.cli.results import ChangedParams
from synthbench.core.mechanism import MECHANISMS, STATE_LENGTH, layer_state
from synthbench.report import leaderboard
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.schema import ADDED_IN
from synthbench.run.spec import RunSpec
from synthbench.run.store import ResultStore
from synthbench.run.train import blank_row

REPO = Path(__file__).resolve().parent.parent

PLUGIN = """
import torch
import torch.nn.functional as F
from synthbench import MECHANISMS, FeatureMapMechanism


@MECHANISMS.register("show-temp", complexity="linear", family="feature-map", reference="a test")
class Tempered(FeatureMapMechanism):
    def __init__(self, head_dim, n_heads, temperature: float = 1.0):
        super().__init__(head_dim, n_heads)
        self.temperature = temperature

    def feature_map(self, x, is_query):
        return F.relu(x / self.temperature) + 1e-2

    @property
    def feature_dim(self):
        return self.head_dim


@MECHANISMS.register("show-copies", complexity="linear", family="feature-map", reference="a test")
class Copies(FeatureMapMechanism):
    # no default: declared at its defaults, it cannot be built (the board once showed --)
    def __init__(self, head_dim, n_heads, copies: int):
        super().__init__(head_dim, n_heads)
        self.copies = copies

    def feature_map(self, x, is_query):
        return torch.cat([F.relu(x) + 1e-2] * self.copies, dim=-1)

    @property
    def feature_dim(self):
        return self.head_dim * self.copies
"""


@pytest.fixture
def plugin(tmp_path, forget_plugins) -> Path:
    path = tmp_path / "show_plugin.py"
    path.write_text(PLUGIN)
    return path


def run(results: Path, *args) -> None:
    done = invoke("run", "--task", "copy", *SMOKE, "--results", results, *args)
    assert done.exit_code == 0, done.output


def listing(*args) -> list[dict[str, str]]:
    """`synthbench results` (piped: plain aligned rows) as one dict per row."""
    result = invoke("results", *args)
    assert result.exit_code == 0, result.output
    head, *lines, count = result.stdout.splitlines()
    starts = [m.start() for m in re.finditer(r"\S+", head)]
    names = head.split()
    rows = []
    for line in lines:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        rows.append(dict(zip(names, cells, strict=True)))
    assert count == f"{len(rows)} row{'s' if len(rows) != 1 else ''}"
    return rows


# -- results: the parameters that differ from the defaults ---------------------------------


def test_two_temperatures_of_a_plugin_mechanism_are_told_apart(tmp_path, plugin):
    results = tmp_path / "results"
    # one command, a grid of three (1.0: its default)
    run(results, "--mech", "show-temp", "--plugin", plugin,
        "--mech-param", "temperature=0.5,2.0,1.0")  # fmt: skip
    run(results, "--mech", "softmax", "--task-param", "n=8")
    rows = listing("--results", results, "--plugin", plugin)
    # the columns before it keep their places: params comes last
    assert list(rows[0]) == ["task", "mechanism", "protocol", "seed", "lr", "status", "target",
                             "token_acc", "exact_match", "wall_s", "cpu_s", "run_id",
                             "params"]  # fmt: skip
    by_mech = {}
    for row in rows:
        by_mech.setdefault(row["mechanism"], []).append(row["params"])
    assert sorted(by_mech["show-temp"]) == ["", "mech: temperature=0.5", "mech: temperature=2.0"]
    assert by_mech["softmax"] == ["task: n=8"]
    assert len({r["run_id"] for r in rows}) == 4


def test_a_parameter_the_task_derives_is_not_shown():
    """kv_recall's queries follow its pairs (half of them) unless given: pairs=4 says it."""
    quick = json.dumps({"protocol": {"name": "quick", "d_model": 64, "n_heads": 4,
                                     "arch": "attn-only"}})  # fmt: skip
    changed = ChangedParams()
    spec = RunSpec.resolve("kv_recall", "linear", PROTOCOLS.get("quick"), 0, {"pairs": 4})
    task_params = json.dumps(spec.task_params, sort_keys=True)
    mech_params = json.dumps(spec.mechanism_params, sort_keys=True)
    assert changed.text("kv_recall", task_params, "linear", mech_params, quick) == "task: pairs=4"
    given = RunSpec.resolve("kv_recall", "linear", PROTOCOLS.get("quick"), 0,
                            {"pairs": 4, "queries": 4})  # fmt: skip
    text = changed.text("kv_recall", json.dumps(given.task_params), "linear", mech_params, quick)
    assert text == "task: pairs=4, queries=4"
    # the defaults of the run's track: mamba2's layer (block) has other defaults than its core
    block = json.dumps({"protocol": {"name": "quick-block", "d_model": 64, "n_heads": 4,
                                     "arch": "block"}})  # fmt: skip
    layer = RunSpec.resolve("copy", "mamba2", PROTOCOLS.get("quick-block"), 0)
    params = json.dumps(layer.mechanism_params)
    assert changed.text("copy", json.dumps(layer.task_params), "mamba2", params, block) == ""


def test_a_mechanism_not_registered_here_shows_every_parameter():
    config = json.dumps({"protocol": {"name": "smoke", "d_model": 32, "n_heads": 2,
                                      "arch": "attn-only"}})  # fmt: skip
    said = ChangedParams().text("copy", "{}", "not-loaded", '{"temperature": 0.5}', config)
    assert said == "mech: temperature=0.5"


# -- the state column: what the runs stored ------------------------------------------------


def state_cell(board: Path, mechanism: str) -> str:
    """The state column's cell of ``mechanism``'s row in a leaderboard.md."""
    for line in board.read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) > 3 and cells[2].removesuffix(" ≈") == mechanism:
            return cells[-1]
    raise AssertionError(f"no row of {mechanism} in {board}")


def test_a_row_stores_the_state_its_mechanism_declares():
    for protocol, mech in (("smoke", "linear"), ("smoke", "softmax"), ("smoke-block", "mamba2")):
        p = PROTOCOLS.get(protocol)
        spec = RunSpec.resolve("copy", mech, p, 0)
        expected = layer_state(mech, p.d_model, p.n_heads, p.arch, None, STATE_LENGTH)
        assert blank_row(spec, 1e-3)["state_size"] == expected, (protocol, mech)
    assert leaderboard.STATE_LENGTH == STATE_LENGTH
    assert "state_size" in ADDED_IN[9]


def test_the_board_shows_a_plugins_state_without_the_plugin(tmp_path, plugin):
    """A plugin mechanism with no default for one parameter: its board cell was -- even with
    --plugin (its declared state cannot be built at its defaults) though `check` printed its
    state. The runs store what they measured; the board shows it, the plugin not loaded."""
    results, out = tmp_path / "results", tmp_path / "reports"
    run(results, "--mech", "show-copies", "--plugin", plugin, "--mech-param", "copies=3")
    run(results, "--mech", "linear")
    checked = invoke("check", "show-copies", "--plugin", plugin, "--mech-param", "copies=3",
                     "--protocol", "smoke", "--length", 64)  # fmt: skip
    assert checked.exit_code == 0, checked.output
    per_head = re.search(r"state-size.*?([\d,]+) numbers per head", checked.stdout)
    assert per_head, checked.stdout
    # as a later command that is not given --plugin (tests/conftest.py's forget_plugins)
    MECHANISMS._entries.pop("show-copies")
    MECHANISMS._aliases.pop("show-copies")
    assert "show-copies" not in MECHANISMS
    done = invoke("report", "--results", results, "--out", out, "--no-reference",
                  "--format", "md")  # fmt: skip
    assert done.exit_code == 0, done.output
    board = out / "leaderboard.md"
    assert state_cell(board, "show-copies") == per_head.group(1)  # 3 x 16 x 17 = 816
    assert per_head.group(1) == f"{3 * 16 * 17:,}"
    assert "as its runs measured and stored it" in board.read_text()


def test_rows_written_before_the_state_column_still_read_and_show_the_declared_state(tmp_path):
    """A tree of schema 8 (no state_size): read as ever, and the board quotes the registered
    mechanism's declared state; one row of schema 9 beside them does not change that."""
    results, out = tmp_path / "results", tmp_path / "reports"
    run(results, "--mech", "linear")
    (path,) = results.rglob("*.parquet")
    table = pq.read_table(path)
    older = table.drop_columns(["state_size"]).replace_schema_metadata(
        {b"synthbench_schema_version": b"8"}
    )
    pq.write_table(older, path)
    report = ResultStore(results).load()
    assert report.skipped == [] and report.rows_left_out == []
    assert report.rows["state_size"].isna().all()
    done = invoke("report", "--results", results, "--out", out, "--no-reference",
                  "--format", "md")  # fmt: skip
    assert done.exit_code == 0, done.output
    declared = leaderboard.declared_state("linear", "smoke")
    assert state_cell(out / "leaderboard.md", "linear") == f"{declared:,}"


def test_the_block_track_quotes_a_layers_stored_state_per_layer(tmp_path):
    results, out = tmp_path / "results", tmp_path / "reports"
    run(results, "--mech", "mamba2", "--track", "block")
    (row,) = pq.read_table(next(results.rglob("*.parquet"))).to_pylist()
    p = PROTOCOLS.get("smoke-block")
    assert row["state_size"] == layer_state("mamba2", p.d_model, p.n_heads, p.arch, None,
                                            STATE_LENGTH)  # fmt: skip
    done = invoke("report", "--results", results, "--out", out, "--no-reference",
                  "--format", "md")  # fmt: skip
    assert done.exit_code == 0, done.output
    board = out / "leaderboard.md"
    assert "state/layer" in board.read_text()
    assert state_cell(board, "mamba2") == f"{row['state_size']:,}"


# -- the block track, described as the code builds it ---------------------------------------

FLA_BLOCK = ("RMSNorm before the mixer and before the MLP", "final RMSNorm", "SwiGLU",
             "N(0, 0.02)")  # fmt: skip


def test_the_block_track_is_described_as_fla_builds_it():
    """README, `list protocols`, the docs and the CLI's help say what arch=block builds
    (tests/test_tracks.py checks the model itself), and none calls it a standard block."""
    listed = invoke("list", "protocols", "--json")
    assert listed.exit_code == 0, listed.output
    for protocol in json.loads(listed.stdout):
        if protocol["name"].endswith("-block"):
            assert all(part in protocol["description"] for part in FLA_BLOCK), protocol
            assert "block-plain" in protocol["description"]
    help_text = " ".join(
        CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "400"}).stdout.split()
    )
    assert all(part in help_text for part in FLA_BLOCK), help_text
    texts = {
        name: " ".join((REPO / name).read_text().split())
        for name in (
            "README.md",
            "docs/MECHANISMS.md",
            "docs/PROTOCOLS.md",
            "docs/CLI.md",
            "docs/RUNNING.md",
        )  # fmt: skip
    }
    texts["help"] = help_text
    for name, text in texts.items():
        assert "standard block" not in text and "standard pre-norm" not in text, name
    for name in ("README.md", "docs/PROTOCOLS.md", "docs/CLI.md"):
        assert all(part in texts[name] for part in FLA_BLOCK), name
    assert "N(0, 0.02)" in texts["docs/MECHANISMS.md"] and "block-plain" in texts["README.md"]
    track = leaderboard.TRACK_TEXT["block"]
    assert all(part in track for part in FLA_BLOCK), track
