"""Experiment tracking (``synthbench run --log``, synthbench/run/tracking.py).

Fast tier: the option's errors (an unknown backend, a missing extra), the tracker against a
recording backend (a tiny training's curve, lr and final metrics against the row it returns,
packed too), and a backend that fails mid-run (the row stored all the same, one warning).
Slow tier: the real backends, offline, through the command with worker processes: the
TensorBoard event files, W&B's offline run file and MLflow's file store read back and
compared with the rows the store wrote, read as one table by pandas (the logs must not
trip it), and rows the same as without ``--log``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from clitools import SMOKE, assert_error, invoke

from synthbench import DATASET_SCHEMA
from synthbench.core import interrupts
from synthbench.run import clock, runner, tracking
from synthbench.run.packed import train_packed
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.spec import RunSpec
from synthbench.run.tracking import Tracking, TrackingError
from synthbench.run.train import RECENT_LOSSES, train_eval

CPU = torch.device("cpu")
# smoke cut to 6 steps and a few examples: a curve point after every step, in a fraction of
# a second (the first training of a process takes ~2 s: imports and the task's chance)
TINY = dataclasses.replace(PROTOCOLS.get("smoke"), steps=6, val_examples=16, test_examples=16)
LR = 1e-3
# what the row and a log of it may differ in: when and how long
UNSTABLE = {*clock.COLUMNS, "created_at"}
FINAL = ("token_acc", "exact_match", "val_token_acc", "val_exact_match", "final_loss")


def scheduled_lr(protocol, lr: float, step: int) -> float:
    """docs/PROTOCOLS.md's schedule, restated: linear warm-up to ``lr`` over warmup_frac of
    the steps, then cosine decay to min_lr_frac * lr at the last step."""
    warmup = int(protocol.warmup_frac * protocol.steps)
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, protocol.steps - warmup)
    return lr * (
        protocol.min_lr_frac + (1 - protocol.min_lr_frac) * (1 + math.cos(math.pi * progress)) / 2
    )


def same_curve(logged: dict[int, float], row, rel: float = 0.0) -> None:
    """The validation curve logged (steps done -> token accuracy) is the row's."""
    assert sorted(logged) == list(row["curve_steps"])
    expected = list(row["curve_val_token_acc"])
    assert [logged[s] for s in sorted(logged)] == pytest.approx(expected, rel=rel, abs=rel)


# -- the option -------------------------------------------------------------------------------


def test_backends_are_read_in_order_once_each():
    assert tracking.backends_of(["mlflow, tensorboard", "MLflow", "wandb"]) == (
        "mlflow",
        "tensorboard",
        "wandb",
    )
    assert tracking.backends_of(None) == () and tracking.from_options(None, "results") is None


@pytest.mark.parametrize(
    "given, message",
    [
        ("tensorbord", "unknown --log backend 'tensorbord'; did you mean tensorboard?"),
        ("ml-flow", "unknown --log backend 'ml-flow'; did you mean mlflow?"),
        ("comet", "unknown --log backend 'comet' (choose from tensorboard, wandb, mlflow)"),
        (" , ", "--log names no backend"),
    ],
)
def test_an_unknown_backend_is_one_line_with_the_close_matches(given, message):
    with pytest.raises(TrackingError) as caught:
        tracking.backends_of(["wandb", given])
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_command_refuses_an_unknown_backend_before_planning(tmp_path):
    result = invoke("run", "--task", "copy", *SMOKE, "--results", tmp_path, "--log", "wandbb")
    assert_error(result, 2, "unknown --log backend 'wandbb'; did you mean wandb?")
    assert not any(tmp_path.iterdir())  # nothing planned, nothing written


@pytest.mark.parametrize(
    "backend, module, package",
    [
        ("tensorboard", "tensorboard", "tensorboard"),
        ("wandb", "wandb", "wandb"),
        ("mlflow", "mlflow", "mlflow-skinny"),
    ],
)
def test_a_missing_extra_is_named(monkeypatch, tmp_path, backend, module, package):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: its import fails
    with pytest.raises(TrackingError) as caught:
        tracking.from_options([backend], tmp_path)
    expected = f"--log {backend} needs the {package} package: pip install 'synthbench[{backend}]'"
    assert str(caught.value) == expected
    result = invoke("run", "--task", "copy", *SMOKE, "--results", tmp_path, "--log", backend)
    assert_error(result, 2, expected)


def test_a_log_folder_that_cannot_be_made_is_refused_before_training(monkeypatch, tmp_path):
    monkeypatch.setattr(tracking.TensorBoardLog, "modules", ())  # installed or not: its folder
    results = tmp_path / "results"
    results.mkdir()
    (results / ".logs").write_text("a file where the logs' folder must go")
    args = ["run", "--task", "copy", "--mech", "softmax", *SMOKE, "--results", results]
    result = invoke(*args, "--log", "tensorboard")
    assert_error(result, 2, "--log tensorboard: NotADirectoryError")
    assert not list(results.glob("protocol=*"))  # nothing trained


# -- the tracker, against a recording backend ------------------------------------------------


class Recorder:
    """A backend that keeps what it is told, per training name (class-wide: the tracker
    builds one per training)."""

    modules: tuple[str, ...] = ()
    package = "nothing"
    logs: dict[str, dict] = {}

    @staticmethod
    def prepare(setting):
        pass

    @staticmethod
    def where(setting):
        return "a recorder"

    def __init__(self, training, setting):
        self.log_of = Recorder.logs[training.name] = {
            "training": training,
            "points": [],
            "finish": None,
            "closed": False,
        }

    def log(self, points):
        self.log_of["points"].extend(points)

    def finish(self, final, status, error):
        self.log_of["finish"] = (final, status, error)

    def close(self):
        self.log_of["closed"] = True


class Failing(Recorder):
    """A backend whose every log fails as a full disk would."""

    def log(self, points):
        raise OSError(28, "No space left on device")


@pytest.fixture
def recorded(monkeypatch):
    """BACKENDS' tensorboard replaced by a Recorder; its logs, emptied."""
    monkeypatch.setitem(tracking.BACKENDS, "tensorboard", Recorder)
    monkeypatch.setattr(Recorder, "logs", {})
    monkeypatch.setattr(tracking, "_SAID", set())
    return Recorder.logs


def series(log: dict, key: str) -> dict[int, float]:
    return {p.step: p.metrics[key] for p in log["points"] if key in p.metrics}


def untimed(log: dict) -> list[tuple[int, dict[str, float]]]:
    """The points a backend was sent, without when."""
    return [(p.step, p.metrics) for p in log["points"]]


def check_log(log: dict, row: dict, protocol) -> None:
    """A recorded log against the row of its training."""
    assert log["training"].run_id == row["run_id"] and log["finish"][1] == row["status"] == "ok"
    same_curve(series(log, "val/token_acc"), row)
    losses = series(log, "train/loss")
    assert sorted(losses) == list(range(1, row["steps_done"] + 1))  # after every step
    recent = [losses[s] for s in sorted(losses)][-RECENT_LOSSES:]
    assert sum(recent) / len(recent) == pytest.approx(row["final_loss"], rel=1e-12)
    lrs = series(log, "train/lr")
    expected = {s: scheduled_lr(protocol, row["lr"], s - 1) for s in lrs}
    assert lrs == pytest.approx(expected, rel=1e-12)
    final = log["finish"][0]
    assert {k: final[k] for k in FINAL} == {k: row[k] for k in FINAL}
    assert final["steps_done"] == row["steps_done"] and "curve_steps" not in final


def test_a_training_logs_its_curve_lr_and_final_metrics(recorded, single_thread):
    spec = RunSpec.resolve("copy", "softmax", TINY, 0)
    setting = Tracking(("tensorboard",), "unused")
    with tracking.logging_to(setting):
        row = train_eval(spec, LR, CPU)
    log = recorded[f"copy/softmax/seed0/lr{LR:g}"]
    check_log(log, row, TINY)
    assert log["training"].config == {"run_id": spec.run_id, "lr": LR, **spec.config()}
    assert json.loads(row["config"]) == spec.config()  # the config logged is the row's
    # outside logging_to, nothing is logged; and the row is the same with or without
    recorded.clear()
    untracked = train_eval(spec, LR, CPU)
    assert not recorded
    assert {k: v for k, v in row.items() if k not in UNSTABLE} == {
        k: v for k, v in untracked.items() if k not in UNSTABLE
    }


def test_each_member_of_a_pack_logs_its_own_training(recorded, single_thread):
    spec = RunSpec.resolve("copy", "softmax", TINY, 0)
    members = [(spec, LR), (spec.with_seed(1), 3e-3)]
    with tracking.logging_to(Tracking(("tensorboard",), "unused")):
        rows = train_packed(members, CPU)
    assert len(recorded) == 2
    for (member, lr), row in zip(members, rows, strict=True):
        check_log(recorded[f"copy/softmax/seed{member.seed}/lr{lr:g}"], row, TINY)


def test_a_failing_backend_is_dropped_the_others_go_on(recorded, monkeypatch, capsys):
    monkeypatch.setitem(tracking.BACKENDS, "wandb", Failing)
    row = {"status": "ok", "error": None, "token_acc": 0.5, "exact_match": float("nan"),
           "n_params": 10, "steps_done": 2, "curve_steps": [2]}  # fmt: skip
    for seed in (0, 1):  # the same failure twice: said once
        training = tracking.Training.of(RunSpec.resolve("copy", "softmax", TINY, seed), LR)
        backends = [("wandb", Failing(training, None)), ("tensorboard", Recorder(training, None))]
        tracker = tracking.Tracker(training, backends)
        tracker.step(0, 2.0, 0.1)
        tracker.step(1, 1.0, 0.2)
        tracker.point(2, {"token_acc": 0.25})
        tracker.finish(row)
        log = recorded[training.name]
        assert untimed(log) == [
            (1, {"train/loss": 2.0, "train/lr": 0.1}),
            (2, {"train/loss": 1.0, "train/lr": 0.2, "val/token_acc": 0.25}),
        ]
        # finite numbers only (NaN, None, lists left out); the status
        assert log["finish"] == (
            {"token_acc": 0.5, "n_params": 10.0, "steps_done": 2.0},
            "ok",
            None,
        )
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: --log wandb failed for copy/softmax")
    assert "OSError: [Errno 28] No space left on device" in lines[0]
    assert "its row is stored" in lines[0]


def test_a_pack_abandoned_ends_its_logs(recorded):
    training = tracking.Training.of(RunSpec.resolve("copy", "softmax", TINY, 0), LR)
    tracker = tracking.Tracker(training, [("tensorboard", Recorder(training, None))])
    tracker.step(0, 2.0, 0.1)
    tracker.abandon("trained again alone")
    tracker.finish({"status": "ok"})  # ended: nothing more
    assert recorded[training.name]["finish"] == ({}, "trained again alone", None)
    assert untimed(recorded[training.name]) == [(1, {"train/loss": 2.0, "train/lr": 0.1})]


def test_a_training_stopped_by_ctrl_c_ends_its_log(recorded, monkeypatch):
    def interrupted(spec, lr, device, row, budget, saved, watch, tracker):
        tracker.step(0, 2.0, 0.1)
        raise KeyboardInterrupt

    monkeypatch.setattr("synthbench.run.train._train_and_evaluate", interrupted)
    # the user's Ctrl-C (once the command line counts them, only a SIGINT is)
    monkeypatch.setattr(interrupts, "from_user", lambda exc: isinstance(exc, KeyboardInterrupt))
    with (
        tracking.logging_to(Tracking(("tensorboard",), "unused")),
        pytest.raises(KeyboardInterrupt),
    ):
        train_eval(RunSpec.resolve("copy", "softmax", TINY, 0), LR, CPU)
    log = recorded[f"copy/softmax/seed0/lr{LR:g}"]
    assert untimed(log) == [(1, {"train/loss": 2.0, "train/lr": 0.1})]
    assert log["finish"] == ({}, "stopped: KeyboardInterrupt", None)


def run_whose_tensorboard_log_fails(results: Path) -> pd.DataFrame:
    """One smoke run with --log tensorboard whose logging fails: it says so in one warning
    line and stores its row all the same; the rows stored."""
    args = ["run", "--task", "copy", "--mech", "softmax", *SMOKE, "--results", results]
    result = invoke(*args, "--log", "tensorboard")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "--log tensorboard failed for copy/softmax/seed0" in warnings[0]
    return pd.read_parquet(results, schema=DATASET_SCHEMA)


def test_a_run_whose_logging_fails_still_stores_its_row(recorded, monkeypatch, tmp_path):
    monkeypatch.setitem(tracking.BACKENDS, "tensorboard", Failing)
    rows = run_whose_tensorboard_log_fails(tmp_path / "results")
    assert len(rows) == 1 and rows["status"].tolist() == ["ok"]
    log = recorded["copy/softmax/seed0/lr0.001"]
    assert log["closed"] and log["finish"] is None  # dropped at its first log


# -- the real backends, offline, through the command (slow) ----------------------------------

WANDB_BLOCK, WANDB_HEADER = 32768, 7  # W&B's .wandb file: LevelDB's log format, a 7-byte header


def wandb_records(path: Path):
    """The records of a W&B run file (LevelDB log format: blocks of 32 KiB, each record a
    crc32 (4 bytes), a length (2), a type (1: full, 2: first, 3: middle, 4: last))."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    position, pending = WANDB_HEADER, b""
    while position + 7 <= len(data):
        left = WANDB_BLOCK - position % WANDB_BLOCK
        if left < 7:  # a block's tail too short for a header: padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if kind == 0:
            position += left
            continue
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def wandb_run(path: Path) -> dict:
    """A W&B offline run file read back: its name, config, history by step and summary."""
    run = {"history": {}, "summary": {}, "config": {}, "exit_code": None}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run["name"] = record.run.display_name
            run["config"] = {u.key: json.loads(u.value_json) for u in record.run.config.update}
        elif kind == "history":
            values = {"/".join(i.nested_key) or i.key: json.loads(i.value_json)
                      for i in record.history.item}  # fmt: skip
            run["history"][values["_step"]] = values
        elif kind == "summary":
            for item in record.summary.update:
                run["summary"]["/".join(item.nested_key) or item.key] = json.loads(item.value_json)
        elif kind == "exit":
            run["exit_code"] = record.exit.exit_code
    return run


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """copy x softmax, smoke, 2 seeds in 2 worker processes, logged to all three backends
    offline (W&B's offline mode, MLflow's file store under the results): the results tree."""
    for module in ("tensorboard", "wandb", "mlflow"):
        pytest.importorskip(module)
    root = tmp_path_factory.mktemp("tracking")
    with pytest.MonkeyPatch.context() as env:
        # MLFLOW_ALLOW_FILE_STORE: the command sets it for its file store; restored after
        for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_ALLOW_FILE_STORE",
                     "WANDB_PROJECT", "WANDB_DIR", "WANDB_API_KEY"):  # fmt: skip
            env.delenv(name, raising=False)
        env.setenv("WANDB_MODE", "offline")  # never a login
        for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
            env.setenv(name, str(root / "wandb-home"))
        env.setenv("OMP_NUM_THREADS", "1")
        args = ["run", "--task", "copy", "--mech", "softmax", "--protocol", "smoke"]
        args += ["--seeds", "2", "--jobs", "2"]
        result = invoke(*args, "--results", root / "logged", "--log", "tensorboard,wandb",
                        "--log", "mlflow")  # fmt: skip
        assert result.exit_code == 0, result.output
        assert "warning" not in result.output, result.output
    return root / "logged"


def stored_rows(results: Path) -> list[dict]:
    """The rows the store wrote, read as one table by pandas (the logs beside them must not
    trip it), by seed."""
    rows = pd.read_parquet(results, schema=DATASET_SCHEMA).sort_values("seed")
    return rows.to_dict("records")


@pytest.mark.slow
def test_logging_changes_no_run_id_and_no_result(logged, single_thread):
    """The rows trained with the real backends logging are those of the same runs trained
    here without (the workers' rows equal this process's: tests/test_runner.py)."""
    specs = runner.plan(["copy"], ["softmax"], PROTOCOLS.get("smoke"), 2)
    without = [row for spec in specs for row in runner.run_sweep(spec, CPU)]
    with_log = stored_rows(logged)
    assert len(with_log) == 2
    for a, b in zip(with_log, sorted(without, key=lambda r: r["seed"]), strict=True):
        assert a["run_id"] == b["run_id"] and a["config"] == b["config"]
        for column in (*FINAL, "steps_done", "status"):
            assert a[column] == b[column], column
        assert list(a["curve_val_token_acc"]) == list(b["curve_val_token_acc"])


@pytest.mark.slow
def test_tensorboard_event_files_hold_each_training(logged):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    smoke = PROTOCOLS.get("smoke")
    for row in stored_rows(logged):
        folder = logged / ".logs/tensorboard/smoke/copy/softmax"
        events = EventAccumulator(str(folder / f"seed{row['seed']}/lr0.001/{row['run_id']}"))
        events.Reload()
        scalars = {tag: {e.step: e.value for e in events.Scalars(tag)}
                   for tag in events.Tags()["scalars"]}  # fmt: skip
        same_curve(scalars["val/token_acc"], row, rel=1e-6)  # float32 in the event file
        losses = scalars["train/loss"]
        assert sorted(losses) == list(range(1, smoke.steps + 1))
        recent = [losses[s] for s in sorted(losses)][-RECENT_LOSSES:]
        assert sum(recent) / len(recent) == pytest.approx(row["final_loss"], rel=1e-6)
        lrs = scalars["train/lr"]
        assert lrs == pytest.approx({s: scheduled_lr(smoke, LR, s - 1) for s in lrs}, rel=1e-6)
        for column in FINAL:
            assert scalars[column] == {row["steps_done"]: pytest.approx(row[column], rel=1e-6)}
        text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
        config = json.loads(text)
        assert config == {**json.loads(row["config"]), "run_id": row["run_id"], "lr": LR}
        status = events.Tensors("status/text_summary")[0].tensor_proto.string_val[0]
        assert status == b"ok"
        assert "_hparams_/session_start_info" in events.PluginTagToContent("hparams")


@pytest.mark.slow
def test_wandb_offline_runs_hold_each_training(logged):
    files = sorted((logged / ".logs/wandb").glob("offline-run-*/run-*.wandb"))
    runs = {run["name"]: run for run in map(wandb_run, files)}
    for row in stored_rows(logged):
        run = runs[f"copy/softmax/seed{row['seed']}/lr0.001"]
        assert run["config"]["run_id"] == row["run_id"]
        assert run["config"]["protocol"] == json.loads(row["config"])["protocol"]
        history = run["history"]
        curve = {step: values["val/token_acc"] for step, values in history.items()
                 if "val/token_acc" in values}  # fmt: skip
        same_curve(curve, row)
        assert sorted(s for s, v in history.items() if "train/loss" in v) == list(range(1, 21))
        for column in FINAL:
            assert run["summary"][column] == row[column]
        assert run["summary"]["status"] == "ok" and run["exit_code"] == 0


@pytest.mark.slow
def test_mlflow_file_store_holds_each_training(logged, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient((logged / ".logs/mlflow").resolve().as_uri())
    experiment = client.get_experiment_by_name("synthbench")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert len(runs) == 2
    for row in stored_rows(logged):
        run = runs[f"copy/softmax/seed{row['seed']}/lr0.001"]
        assert run.info.status == "FINISHED" and run.data.tags["status"] == "ok"
        params = run.data.params
        assert params["run_id"] == row["run_id"] and params["protocol.steps"] == "20"
        assert params["task_params.n"] == str(json.loads(row["task_params"])["n"])
        history = client.get_metric_history(run.info.run_id, "val/token_acc")
        same_curve({m.step: m.value for m in history}, row)
        losses = client.get_metric_history(run.info.run_id, "train/loss")
        assert sorted(m.step for m in losses) == list(range(1, 21))
        for column in FINAL:
            assert run.data.metrics[column] == row[column]


@pytest.mark.slow
def test_an_unwritable_log_folder_keeps_the_rows(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    monkeypatch.setattr(tracking, "_SAID", set())  # its warning not said before in this process
    results = tmp_path / "results"
    (results / ".logs/tensorboard").mkdir(parents=True)
    (results / ".logs/tensorboard/smoke").write_text("a file where a folder must go")
    rows = run_whose_tensorboard_log_fails(results)
    assert rows["status"].tolist() == ["ok"] and len(rows["curve_steps"][0]) == 10


@pytest.mark.ray
def test_ray_workers_log_too(tmp_path):
    """The setting travels to Ray's workers (slow: the conftest marks every Ray test)."""
    pytest.importorskip("ray")
    pytest.importorskip("tensorboard")
    results = tmp_path / "results"
    args = ["run", "--task", "copy", "--mech", "softmax", "--protocol", "smoke", "--seeds", "1"]
    result = invoke(*args, "--executor", "ray", "--jobs", "1", "--results", results,
                    "--log", "tensorboard")  # fmt: skip
    assert result.exit_code == 0, result.output
    [row] = stored_rows(results)
    folder = results / f".logs/tensorboard/smoke/copy/softmax/seed0/lr0.001/{row['run_id']}"
    assert list(folder.glob("events.out.tfevents.*"))
