"""Experiment tracking: each training's learning curve, lr, config and final metrics, logged
to TensorBoard, Weights & Biases or MLflow while it trains (``synthbench run --log``;
docs/RUNNING.md, "Experiment tracking").

Tracking watches a training; it is no part of what the training measures. Its setting is not
in the run's config, so run ids and rows are the same with or without it. The command makes
a picklable ``Tracking`` (the backends, where logs go) and hands it to the executor; a worker
trains within ``logging_to(setting)`` (synthbench/run/work.py) and every training opens its
own ``Tracker`` there (``start``): one run per training in the backend's UI, named
task/mechanism/seed/lr. Each backend's package is imported only where it is used; a missing
one is a one-line error naming the extra to install (``from_options``).

What is logged, against the optimizer steps done: ``train/loss`` and ``train/lr`` after every
step (sent at each curve point), ``val/token_acc`` and ``val/exact_match`` at the curve's
points (the row's ``curve_val_token_acc``), and at the end the row's metrics under their
column names (``token_acc``, ``final_loss``, ``steps_done``, ...) with its status.

A backend that fails while a training runs (a log folder it cannot write, a server gone) is
dropped for that training with one warning line (once per backend and kind of failure in a
process); the training goes on and its row is stored as without ``--log``.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from synthbench.core.interrupts import describe
from synthbench.core.text import did_you_mean
from synthbench.run.schema import RESULT_METRICS

# the logs' folder in the results tree, <results>/.logs/<backend>/...: hidden, as .checkpoints
# is, so that the store and pandas, pyarrow, DuckDB and Polars, which read the tree as one
# table of Parquet files, never meet a log file
LOGS = ".logs"
PROJECT = "synthbench"  # W&B's project and MLflow's experiment, unless the environment names one
# a row's numbers logged at the end, beside the curve's: what the training measured
FINAL_COLUMNS = (*RESULT_METRICS, "steps_done", "wall_seconds", "cpu_seconds")


class TrackingError(ValueError):
    """``--log`` cannot be honoured: an unknown backend, its package missing, or a place the
    logs cannot go (one line)."""


@dataclass(frozen=True)
class Tracking:
    """Where the trainings of a command log: picklable, so it travels to every worker."""

    backends: tuple[str, ...]
    folder: str  # absolute: <results>/.logs
    mlflow_uri: str | None = None  # resolved by the command, so every worker uses the same
    mlflow_experiment: str = PROJECT


@dataclass(frozen=True)
class Training:
    """One training as the backends name and describe it."""

    name: str  # task/mechanism/seed/lr: what a researcher recognises in a run list
    protocol: str
    task: str
    mechanism: str
    seed: int
    lr: float
    run_id: str
    config: dict[str, Any]  # the run's resolved config (what its run id hashes), lr and id

    @classmethod
    def of(cls, spec, lr: float) -> Training:
        return cls(
            name=f"{spec.task}/{spec.mechanism}/seed{spec.seed}/lr{lr:g}",
            protocol=spec.protocol.name,
            task=spec.task,
            mechanism=spec.mechanism,
            seed=spec.seed,
            lr=lr,
            run_id=spec.run_id,
            config={"run_id": spec.run_id, "lr": lr, **spec.config()},
        )

    @property
    def folder(self) -> PurePosixPath:
        """Its own folder under a backend's: protocol/task/mechanism/seed/lr/run id (the run
        id tells apart the grid points of a task)."""
        return PurePosixPath(self.protocol, self.name, self.run_id)

    def labels(self) -> dict[str, Any]:
        """What a run list filters by."""
        return {
            "task": self.task,
            "mechanism": self.mechanism,
            "protocol": self.protocol,
            "seed": self.seed,
            "lr": self.lr,
            "run_id": self.run_id,
        }

    def flat_config(self) -> dict[str, str]:
        """The config as flat text parameters (``protocol.d_model``: "64"), as MLflow keeps
        them."""
        flat: dict[str, str] = {}

        def add(prefix: str, value: Any) -> None:
            if isinstance(value, dict):
                for key, inner in value.items():
                    add(f"{prefix}.{key}" if prefix else str(key), inner)
            else:
                text = value if isinstance(value, str) else json.dumps(value, default=str)
                flat[prefix] = text[:6000]  # MLflow's limit on a parameter's value

        add("", self.config)
        return flat


@dataclass(frozen=True)
class Point:
    """What a training logs after ``step`` optimizer steps, at ``seconds`` (time.time())."""

    step: int
    seconds: float
    metrics: dict[str, float]


def final_metrics(row: dict[str, Any]) -> dict[str, float]:
    """The row's finite numbers among ``FINAL_COLUMNS`` (a failed training has few)."""
    found = {}
    for column in FINAL_COLUMNS:
        value = row.get(column)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(value):
                found[column] = float(value)
    return found


# -- the backends -----------------------------------------------------------------------------
# Each: ``modules`` to import (the first missing one means its extra is not installed),
# ``package`` (what pip installs), ``prepare(setting)`` in the command before any training,
# ``where(setting)`` (a phrase), and per training: built with (training, setting),
# ``log(points)`` (each a ``Point``), ``finish(final, status, error)``, ``close()`` (give up
# quietly after a failure).


class TensorBoardLog:
    """A ``SummaryWriter`` in <results>/.logs/tensorboard/<training.folder>: the curve as
    scalars, the config as text, and at the end the hparams (the training's labels and
    status) with the final metrics, so TensorBoard's HPARAMS tab compares trainings."""

    package = "tensorboard"
    modules = ("tensorboard", "torch.utils.tensorboard")

    @staticmethod
    def prepare(setting: Tracking) -> None:
        Path(setting.folder, "tensorboard").mkdir(parents=True, exist_ok=True)

    @staticmethod
    def where(setting: Tracking) -> str:
        return f"tensorboard in {Path(setting.folder, 'tensorboard')}"

    def __init__(self, training: Training, setting: Tracking) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.training = training
        folder = Path(setting.folder, "tensorboard", training.folder)
        self.writer = SummaryWriter(log_dir=str(folder))
        self.writer.add_text("config", markdown_json(training.config))
        self.writer.flush()

    def log(self, points: list[Point]) -> None:
        for point in points:
            for key, value in point.metrics.items():
                self.writer.add_scalar(key, value, point.step, walltime=point.seconds)
        self.writer.flush()  # on disk now: TensorBoard shows the curve while it trains

    def finish(self, final: dict[str, float], status: str, error: str | None) -> None:
        self.writer.add_text("status", f"{status}: {error}" if error else status)
        hparams = {**self.training.labels(), "status": status}
        # run_name ".": the hparams in the training's own folder, not in a new one
        step = int(final.get("steps_done", 0))
        self.writer.add_hparams(hparams, final, run_name=".", global_step=step)
        self.writer.close()

    def close(self) -> None:
        self.writer.close()


class WandbLog:
    """A W&B run per training (``reinit="create_new"``: the trainings of a pack log at once),
    in project ``$WANDB_PROJECT`` or synthbench, grouped by protocol/task/mechanism, its files
    in <results>/.logs/wandb (``$WANDB_DIR``/wandb if set). W&B's variables decide the rest:
    WANDB_MODE=offline logs to files only (``wandb sync`` uploads them later), online needs
    ``wandb login``."""

    package = "wandb"
    modules = ("wandb",)

    @staticmethod
    def folder(setting: Tracking) -> Path:
        """Where W&B makes its ``wandb`` folder."""
        return Path(os.environ.get("WANDB_DIR") or setting.folder)

    @classmethod
    def prepare(cls, setting: Tracking) -> None:
        cls.folder(setting).mkdir(parents=True, exist_ok=True)

    @classmethod
    def where(cls, setting: Tracking) -> str:
        mode = os.environ.get("WANDB_MODE") or "online"
        return f"wandb ({mode}) in {cls.folder(setting) / 'wandb'}"

    def __init__(self, training: Training, setting: Tracking) -> None:
        import wandb

        folder = self.folder(setting)
        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or PROJECT,
            name=training.name,
            group=f"{training.protocol}/{training.task}/{training.mechanism}",
            tags=[training.protocol, training.task, training.mechanism],
            config=training.config,
            dir=str(folder),
            reinit="create_new",
            settings=wandb.Settings(silent=True, console="off"),  # the progress bar's terminal
        )

    def log(self, points: list[Point]) -> None:
        for point in points:
            self.run.log(point.metrics, step=point.step)

    def finish(self, final: dict[str, float], status: str, error: str | None) -> None:
        self.run.summary.update({**final, "status": status, **({"error": error} if error else {})})
        self.run.finish(exit_code=0 if status == "ok" else 1)

    def close(self) -> None:
        self.run.finish(exit_code=1)


_MLFLOW_EXPERIMENTS: dict[tuple[str, str], str] = {}  # (uri, name) -> id, once per process


class MlflowLog:
    """An MLflow run per training, in experiment ``$MLFLOW_EXPERIMENT_NAME`` or synthbench, at
    ``$MLFLOW_TRACKING_URI`` or a file store in <results>/.logs/mlflow (what mlflow-skinny
    writes without a server; ``mlflow ui --backend-store-uri`` shows it): the config as
    parameters, the curve as metric histories, the final metrics at the last step, the
    status as a tag and the run's state (FINISHED for ok, else FAILED)."""

    package = "mlflow-skinny"
    modules = ("mlflow.tracking",)
    BATCH = 100  # MLflow's limit on the parameters of one log_batch (metrics: 1000)

    @staticmethod
    def connect(setting: Tracking):
        if setting.mlflow_uri.startswith("file:"):
            # MLflow 3 keeps its file store only on request; mlflow-skinny has no database
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        return MlflowClient(setting.mlflow_uri)

    @classmethod
    def experiment(cls, client, setting: Tracking) -> str:
        """The experiment's id, made if missing (by the command's ``prepare``: workers making
        it at once would make it twice in a file store)."""
        key = (setting.mlflow_uri, setting.mlflow_experiment)
        if key not in _MLFLOW_EXPERIMENTS:
            found = client.get_experiment_by_name(setting.mlflow_experiment)
            made = found.experiment_id if found else None
            _MLFLOW_EXPERIMENTS[key] = made or client.create_experiment(setting.mlflow_experiment)
        return _MLFLOW_EXPERIMENTS[key]

    @classmethod
    def prepare(cls, setting: Tracking) -> None:
        cls.experiment(cls.connect(setting), setting)

    @staticmethod
    def where(setting: Tracking) -> str:
        return f"mlflow at {setting.mlflow_uri}, experiment {setting.mlflow_experiment}"

    def __init__(self, training: Training, setting: Tracking) -> None:
        from mlflow.entities import Param

        self.client = self.connect(setting)
        tags = {key: str(value) for key, value in training.labels().items()}
        run = self.client.create_run(
            self.experiment(self.client, setting), run_name=training.name, tags=tags
        )
        self.run_id = run.info.run_id
        params = [Param(key, value) for key, value in training.flat_config().items()]
        for i in range(0, len(params), self.BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + self.BATCH])

    def log(self, points: list[Point]) -> None:
        from mlflow.entities import Metric

        metrics = [
            Metric(key, value, int(point.seconds * 1000), point.step)
            for point in points
            for key, value in point.metrics.items()
        ]
        for i in range(0, len(metrics), 10 * self.BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 10 * self.BATCH])

    def finish(self, final: dict[str, float], status: str, error: str | None) -> None:
        self.log([Point(int(final.get("steps_done", 0)), time.time(), final)])
        self.client.set_tag(self.run_id, "status", status)
        if error:
            self.client.set_tag(self.run_id, "error", error[:5000])
        self.client.set_terminated(self.run_id, "FINISHED" if status == "ok" else "FAILED")

    def close(self) -> None:
        self.client.set_terminated(self.run_id, "FAILED")


BACKENDS = {"tensorboard": TensorBoardLog, "wandb": WandbLog, "mlflow": MlflowLog}


def markdown_json(value: Any) -> str:
    """``value`` as indented JSON in a Markdown code block (TensorBoard renders text so)."""
    body = json.dumps(value, indent=2, sort_keys=True, default=str)
    return "\n".join("    " + line for line in body.splitlines())


# -- the command's side -----------------------------------------------------------------------


def backends_of(values: Iterable[str] | None) -> tuple[str, ...]:
    """The backends ``--log`` names (repeatable, each comma-separated), in order, once each;
    TrackingError for an unknown one (with the close matches) or an empty name."""
    names: list[str] = []
    for value in values or ():
        parts = [part.strip().lower() for part in value.split(",")]
        if not any(parts):
            raise TrackingError(f"--log names no backend (got {value!r}); {_choices()}")
        for name in filter(None, parts):
            if name not in BACKENDS:
                hint = did_you_mean(name, BACKENDS)
                raise TrackingError(f"unknown --log backend '{name}'{hint} ({_choices()})")
            if name not in names:
                names.append(name)
    return tuple(names)


def _choices() -> str:
    return "choose from " + ", ".join(BACKENDS)


def check_installed(name: str) -> None:
    """TrackingError naming the extra to install where the backend's package is missing."""
    backend = BACKENDS[name]
    for module in backend.modules:
        try:
            importlib.import_module(module)
        except ImportError:
            raise TrackingError(
                f"--log {name} needs the {backend.package} package: "
                f"pip install 'synthbench[{name}]'"
            ) from None


def from_options(values: Iterable[str] | None, results: str | Path) -> Tracking | None:
    """The ``Tracking`` of ``--log VALUES`` with the logs under ``results`` (None without
    ``--log``), each backend's package checked; TrackingError otherwise. Reads MLflow's
    variables here, once, for every worker."""
    backends = backends_of(values)
    if not backends:
        return None
    for name in backends:
        check_installed(name)
    folder = Path(results, LOGS).resolve()
    uri = None
    if "mlflow" in backends:
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (folder / "mlflow").as_uri()
    experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or PROJECT
    return Tracking(backends, str(folder), uri, experiment)


def where(tracking: Tracking) -> str:
    """One line: what the trainings log to, and where."""
    places = [BACKENDS[name].where(tracking) for name in tracking.backends]
    return "logging each training to " + "; ".join(places)


def prepare(tracking: Tracking) -> str:
    """Before the first training, in the command: each backend's folders (and MLflow's
    experiment) made; TrackingError naming the backend if it cannot be. Returns ``where``."""
    for name in tracking.backends:
        try:
            BACKENDS[name].prepare(tracking)
        except Exception as exc:
            raise TrackingError(f"--log {name}: {_one_line(describe(exc))}") from None
    return where(tracking)


# -- the worker's side ------------------------------------------------------------------------

_ACTIVE: ContextVar[Tracking | None] = ContextVar("synthbench_tracking", default=None)
_SAID: set[tuple[str, str]] = set()  # (backend, error type) warned of in this process


@contextmanager
def logging_to(tracking: Tracking | None) -> Iterator[None]:
    """The trainings started inside log as ``tracking`` says (None: not at all)."""
    token = _ACTIVE.set(tracking)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


class Tracker:
    """One training's log in each backend of the setting; with none it does nothing (what
    every training gets without ``--log``). Never raises: a backend that fails is dropped."""

    def __init__(self, training: Training | None = None, backends: Iterable = ()) -> None:
        self.training = training
        self._backends = list(backends)  # (name, backend)
        self._pending: dict[int, Point] = {}  # by steps done: not yet sent

    def _at(self, steps_done: int) -> dict[str, float]:
        """The metrics pending after ``steps_done`` steps (timed at the first one)."""
        if steps_done not in self._pending:
            self._pending[steps_done] = Point(steps_done, time.time(), {})
        return self._pending[steps_done].metrics

    def step(self, step: int, loss: float, lr: float) -> None:
        """Optimizer step ``step`` (from 0) is done: its training loss and the lr it took."""
        if self._backends:
            self._at(step + 1).update({"train/loss": loss, "train/lr": lr})

    def point(self, steps_done: int, val_metrics: dict[str, float]) -> None:
        """A curve point: the validation scores after ``steps_done`` steps; what is pending
        goes to the backends now."""
        if self._backends:
            self._at(steps_done).update({f"val/{k}": float(v) for k, v in val_metrics.items()})
            self._send()

    def finish(self, row: dict[str, Any]) -> None:
        """The training's row is final: its metrics and status end the log."""
        if self._backends:
            self._send()
            self._each("finish", final_metrics(row), row["status"], row.get("error"))
            self._backends = []

    def abandon(self, reason: str) -> None:
        """The training goes on elsewhere (a pack that fell apart: it trains again alone):
        this log ends with ``reason`` as its status."""
        if self._backends:
            self._send()
            self._each("finish", {}, reason, None)
            self._backends = []

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, kind, exc, traceback) -> None:
        """Whatever stops the training before its row (the user's Ctrl-C) ends the log."""
        if exc is not None:
            self.abandon(f"stopped: {type(exc).__name__}")

    def _send(self) -> None:
        points = [self._pending[steps] for steps in sorted(self._pending)]
        self._pending = {}
        if points:
            self._each("log", points)

    def _each(self, method: str, *args) -> None:
        for entry in list(self._backends):
            name, backend = entry
            try:
                getattr(backend, method)(*args)
            except Exception as exc:
                self._backends.remove(entry)
                failed(name, self.training, exc)
                try:
                    backend.close()
                except Exception:  # already failing: the warning said so
                    pass


NOT_TRACKED = Tracker()


def start(spec, lr: float) -> Tracker:
    """The tracker of a training of ``spec`` at ``lr`` as the active setting says
    (``logging_to``; ``NOT_TRACKED`` outside). Never raises."""
    tracking = _ACTIVE.get()
    if tracking is None:
        return NOT_TRACKED
    training = Training.of(spec, lr)
    opened = []
    for name in tracking.backends:
        try:
            opened.append((name, BACKENDS[name](training, tracking)))
        except Exception as exc:
            failed(name, training, exc)
    return Tracker(training, opened)


def failed(name: str, training: Training | None, exc: BaseException) -> None:
    """One warning line on stderr: a backend failed for a training, which goes on; once per
    backend and kind of failure in this process (the same cause fails every training)."""
    key = (name, type(exc).__name__)
    if key in _SAID:
        return
    _SAID.add(key)
    which = f" for {training.name}" if training else ""
    print(
        f"warning: --log {name} failed{which}: {_one_line(describe(exc))}; the training goes "
        "on and its row is stored as without --log",
        file=sys.stderr,
        flush=True,
    )


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
