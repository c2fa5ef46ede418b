"""Train and evaluate one run at one learning rate: one results row.

The run is fully described by its :class:`~synthbench.run.spec.RunSpec`; the runner
(synthbench/run/runner.py) decides which learning rates to train and which one a run reports.
A failure is never raised: it is the row's status (``diverged``, ``leaky``: the trained
model sees later positions, or ``error`` with its message), never an accuracy of 0. How a
model is scored (teacher-forced and free-running) is synthbench/run/evaluation.py.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from synthbench.core.interrupts import caught, describe, raise_pending
from synthbench.core.model import Model
from synthbench.core.task import IGNORE, TASKS, Batch, Task
from synthbench.integrity.audit import Chance, chance
from synthbench.integrity.causality import BATCH as CHECK_BATCH
from synthbench.integrity.causality import Leaky, check_model_causality
from synthbench.run import checkpoint, provenance, tracking
from synthbench.run.clock import Seconds, Stopwatch
from synthbench.run.evaluation import Diverged, evaluate, held_out_metrics
from synthbench.run.lr_selection import ROW_MARKS, Budget
from synthbench.run.phases import phase
from synthbench.run.protocols import Protocol, curve_points
from synthbench.run.schema import LEAKY, RESULT_METRICS
from synthbench.run.spec import TEST_SEED, VAL_SEED, RunSpec

FUSED_ADAMW_DEVICES = ("cpu", "cuda")  # where torch has a fused AdamW
# "still rising" compares a curve's last point with the one this many points before, not
# its neighbour: the gain over one interval is the noisier sign of where a curve is going
RISE_POINTS = 2


def lr_schedule(protocol: Protocol, horizon: int | None = None):
    """Linear warm-up to 1, then cosine decay to ``min_lr_frac`` (a multiplier per step) at
    ``horizon``: ``protocol.steps``, or the later end of a training extended past it (the
    warm-up stays that of ``protocol.steps``; the decay is stretched to the new end)."""
    warmup = int(protocol.warmup_frac * protocol.steps)
    end = horizon or protocol.steps

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, end - warmup)
        cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return protocol.min_lr_frac + (1.0 - protocol.min_lr_frac) * cosine

    return factor


@functools.lru_cache(maxsize=64)
def _chance(task_class: type[Task], task_params: str) -> Chance:
    return chance(task_class(**json.loads(task_params)))


def task_chance_of(spec: RunSpec) -> Chance:
    """The audit's chance of the run's task (computed once per task and parameters in a
    process: every lr and seed of a task shares it)."""
    return _chance(TASKS.get(spec.task), json.dumps(spec.task_params, sort_keys=True))


def build_model(spec: RunSpec, *tasks: Task) -> Model:
    """The run's model, with vocabulary and positions for every one of ``tasks``."""
    p = spec.protocol
    return Model(
        max(t.vocab_size for t in tasks),
        max(t.seq_len for t in tasks),
        spec.make_mechanism,
        d_model=p.d_model,
        n_heads=p.n_heads,
        n_layers=p.n_layers,
        arch=p.arch,
        pos=p.pos,
        pos_params=spec.pos_params,
    )


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW's parameter groups: every parameter with the protocol's weight decay, but one a
    mechanism marks ``_no_weight_decay`` (as Mamba-2 marks its A_log and dt_bias) without.
    Without such a parameter, one group in the model's order: as before the marks existed."""
    decayed, exempt = [], []
    for param in model.parameters():
        (exempt if getattr(param, "_no_weight_decay", False) else decayed).append(param)
    groups = [{"params": decayed, "weight_decay": weight_decay}]
    return groups + ([{"params": exempt, "weight_decay": 0.0}] if exempt else [])


@dataclass(frozen=True)
class RunData:
    """What every training of a run reads besides its own training batches: the task (and
    the task at the evaluation length multiplier, if any) and the fixed evaluation sets, the
    same for every seed and lr of the run (VAL_SEED, TEST_SEED)."""

    task: Task
    long_task: Task | None
    val: Batch
    test: Batch
    long_test: Batch | None


def run_tasks(spec: RunSpec) -> tuple[Task, Task | None]:
    """The run's task, and the task at its evaluation length (None without one)."""
    task = spec.make_task()
    return task, task.at_length(spec.eval_length_mult) if spec.eval_length_mult else None


def evaluation_data(
    spec: RunSpec, task: Task, long_task: Task | None, device: torch.device
) -> RunData:
    """The run's tasks with its fixed validation and test sets (and the long test set)."""
    p = spec.protocol
    with phase("evaluation data"):
        val = task.generate(p.val_examples, torch.Generator().manual_seed(VAL_SEED), device)
        test = task.generate(p.test_examples, torch.Generator().manual_seed(TEST_SEED), device)
        long_test = None
        if long_task is not None:
            gen = torch.Generator().manual_seed(TEST_SEED)
            long_test = long_task.generate(p.test_examples, gen, device)
    return RunData(task, long_task, val, test, long_test)


def seeded_model(spec: RunSpec, task: Task, long_task: Task | None, device: torch.device) -> Model:
    """The run's model as its seed initialises it (torch's global RNG seeded right before:
    the weights and any random features a mechanism draws), for its tasks (``run_tasks``)."""
    torch.manual_seed(spec.seed)  # model init and any random features of the mechanism
    return build_model(spec, task, *([long_task] if long_task else [])).to(device)


# graphs torch.compile keeps per compiled function before it falls back to eager: one per
# mechanism, shape (training and evaluation batches, lengths) and grad mode; its default of
# 8 would leave a worker's third or fourth mechanism eager without a word
COMPILED_GRAPHS = 1024


def compile_in_place(model: torch.nn.Module) -> None:
    """``run --compile``: ``model`` compiled in place (its parameters and state_dict stay the
    module's: optimizer, checkpoints and counts as eager), each graph at its first call and
    reused by every later training of the same shapes in this process."""
    for limit in ("recompile_limit", "accumulated_recompile_limit"):
        setattr(
            torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), COMPILED_GRAPHS)
        )
    model.compile()


def check_compiler(device: torch.device) -> None:
    """Raise a one-line ValueError where torch.compile cannot build on ``device`` in this
    process (no C++ compiler; setuptools unloadable, as after an ``import pip``): a tiny
    function compiled and called once, so that ``run --compile`` says so before it trains."""
    try:  # built anew, not read from inductor's cache (which skips the compiler)
        with torch._inductor.config.patch(force_disable_caches=True):
            torch.compile(lambda x: x * 2 + 1)(torch.ones(2, device=device))
    except Exception as exc:  # the backend's failure wraps the cause: name that
        cause = getattr(exc, "inner_exception", None) or exc
        first = next((line for line in str(cause).splitlines() if line.strip()), "")
        raise ValueError(
            f"torch.compile cannot build on {device} here ({type(cause).__name__}: {first})"
        ) from exc


def parameter_count(model: torch.nn.Module) -> int:
    return sum(t.numel() for t in model.parameters())


def training_generator(spec: RunSpec) -> torch.Generator:
    """Where a run's training batches come from: a stream of its own, from its seed."""
    return torch.Generator().manual_seed(spec.seed)


def training_steps(protocol: Protocol, budget: Budget, horizon: int | None = None) -> int:
    """The steps a training runs at most while its schedule ends at ``horizon``
    (``protocol.steps`` unless extended): a budget's limit cuts the training short, never
    the lr schedule."""
    horizon = horizon or protocol.steps
    return min(horizon, budget.steps or horizon)


def measured_steps(protocol: Protocol, last_step: int, horizon: int | None = None) -> set[int]:
    """The steps after which the validation set is scored (the learning curve's points, up
    to ``horizon`` for a training extended past ``protocol.steps``)."""
    return set(curve_points(protocol.steps, horizon=horizon)) | {last_step}


def still_rising(protocol: Protocol, accuracies: list[float]) -> bool:
    """Whether a learning curve (its validation token accuracies so far) still rises: its
    last point gained at least ``rise_margin``, and more than nothing, on the point
    ``RISE_POINTS`` before it. A curve too short to tell does not."""
    if len(accuracies) <= RISE_POINTS:
        return False
    gain = accuracies[-1] - accuracies[-1 - RISE_POINTS]
    return gain > 0 and gain >= protocol.rise_margin


class Horizon:
    """Where a training's lr schedule ends (``end``), and what follows from it: the lr factor
    of each step, the last step (sooner under a budget's steps limit) and the steps the
    curve is measured after. It starts at ``protocol.steps``; with ``protocol.max_steps``
    (recipe v2, docs/PROTOCOLS.md) a training still rising at its end goes on (``extend``).
    ``train_eval`` and each member of a pack (synthbench/run/packed.py) keep one."""

    def __init__(self, protocol: Protocol, budget: Budget, end: int | None = None) -> None:
        self.protocol, self.budget = protocol, budget
        self.move_to(end or protocol.steps)

    def move_to(self, end: int) -> None:
        """The schedule ends at ``end`` from now on."""
        self.end = end
        self.lr_factor = lr_schedule(self.protocol, end)
        self.last_step = training_steps(self.protocol, self.budget, end)
        self.measure_at = measured_steps(self.protocol, self.last_step, end)

    def steps_from(self, first: int) -> Iterator[int]:
        """The steps to train from ``first`` on: up to the last step, read at every step
        (it moves when the horizon does)."""
        step = first
        while step < self.last_step:
            yield step
            step += 1

    def extend(self, step: int, accuracies: list[float]) -> bool:
        """After the curve point ``step`` of a training that did not stop there, with its
        curve's ``accuracies`` so far: whether the schedule goes on, to its new ``end``
        (``extend_steps`` later, or half of ``steps``, up to ``max_steps``). Only at the
        end, below ``max_steps``, with a budget (if any) that allows steps past it, and
        while the curve still rises."""
        p, limit = self.protocol, self.budget.steps
        if step != self.end or self.end >= p.max_steps or (limit and limit <= self.end):
            return False
        if not still_rising(p, accuracies):
            return False
        self.move_to(min(self.end + (p.extend_steps or max(1, p.steps // 2)), p.max_steps))
        return True


def restart_lr(scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """The lr of the next step from the schedule as it is now (LambdaLR computed it at its
    last ``step()``, before the horizon moved)."""
    factors = zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)
    lrs = [base_lr * factor(scheduler.last_epoch) for base_lr, factor in factors]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    scheduler._last_lr = lrs


def training_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss a training minimises: the cross-entropy at the labelled positions."""
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)


def non_finite_loss(step: int) -> Diverged:
    return Diverged(f"non-finite loss at step {step}")


def non_finite_gradient(step: int) -> Diverged:
    return Diverged(f"non-finite gradient at step {step}")


RECENT_LOSSES = 20  # final_loss: the mean training loss of the last this many steps


def start_curve(row: dict) -> None:
    row["curve_steps"], row["curve_val_token_acc"] = [], []


def curve_point(
    row: dict, protocol: Protocol, budget: Budget, step: int, val_metrics: dict[str, float]
) -> bool:
    """Add the validation scores after ``step`` to the row's learning curve; whether the
    training stops there (before its last step)."""
    row["curve_steps"].append(step)
    row["curve_val_token_acc"].append(val_metrics["token_acc"])
    if protocol.stop_at and val_metrics[protocol.select_metric] >= protocol.stop_at:
        return True  # solved: the rest of the schedule would only cost time
    # too far behind the edge it was grown past to be selected
    return budget.falls_behind(protocol, step, val_metrics["token_acc"])


def _train_and_evaluate(
    spec: RunSpec,
    lr: float,
    device: torch.device,
    row: dict,
    budget: Budget,
    saved: Path | None,
    watch: Stopwatch,
    tracker: tracking.Tracker = tracking.NOT_TRACKED,
) -> Seconds:
    """Train and evaluate into ``row``; with ``saved`` (a checkpoint path) resume from the
    checkpoint there and keep one (synthbench/run/checkpoint.py); its curve goes to
    ``tracker`` as it trains (``--log``). Returns the seconds the training had run before it
    resumed (none when it did not); ``watch`` was started with the training."""
    p = spec.protocol
    horizon = Horizon(p, budget)
    task, long_task = run_tasks(spec)
    with phase("model build"):
        model = seeded_model(spec, task, long_task, device)
        if spec.compiled:
            compile_in_place(model)
        row["n_params"] = parameter_count(model)
        optimizer = torch.optim.AdamW(
            parameter_groups(model, p.weight_decay),
            lr=lr,
            betas=p.betas,
            weight_decay=p.weight_decay,
            # one kernel for all parameters: 3x less optimizer time on these small models
            fused=device.type in FUSED_ADAMW_DEVICES or None,
        )
        # the lr factor of the schedule's current end (it moves if the training is extended)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: horizon.lr_factor(s))
    train_gen = training_generator(spec)
    data = evaluation_data(spec, task, long_task, device)

    recent: list[float] = []
    val_metrics: dict[str, float] | None = None  # the last curve point's
    start_curve(row)
    first_step, before, state = 0, Seconds(), None
    if saved:
        ident = checkpoint.identity(spec.run_id, lr, budget, device)
        state = checkpoint.load(saved, ident)
    if state is not None:  # the same training, stopped after a whole step: go on from there
        checkpoint.restore(state, model, optimizer, scheduler, train_gen)
        recent, val_metrics = state["recent"], state["val_metrics"]
        row["curve_steps"], row["curve_val_token_acc"] = state["curve"]
        first_step = state["step"]
        # a checkpoint of a version before cpu_seconds: that part's CPU time is unknown
        before = Seconds(state["seconds"], state.get("cpu_seconds"))
        # where an extended training's schedule ends (its optimizer's lr was saved as is)
        horizon.move_to(state.get("horizon", p.steps))
    last_save = time.perf_counter()
    for step in horizon.steps_from(first_step):
        raise_pending()  # a Ctrl-C Python dropped (synthbench/core/interrupts.py)
        with phase("training batches"):
            batch = task.generate(p.batch_size, train_gen, device)
        with phase("training steps"):
            logits = model(batch.inputs)
            loss = training_loss(logits, batch.training_targets)
            row["steps_done"] = step
            if not torch.isfinite(loss):
                raise non_finite_loss(step)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grads = [q.grad for q in model.parameters() if q.grad is not None]
            grad_norm = torch.nn.utils.get_total_norm(grads)
            if not torch.isfinite(grad_norm):
                raise non_finite_gradient(step)
            if p.grad_clip:
                torch.nn.utils.clip_grads_with_norm_(model.parameters(), p.grad_clip, grad_norm)
            optimizer.step()
            scheduler.step()
            recent = (recent + [loss.item()])[-RECENT_LOSSES:]
            tracker.step(step, recent[-1], lr * horizon.lr_factor(step))  # the lr it took
        if step + 1 in horizon.measure_at:
            with phase("curve points"):
                val_metrics = evaluate(model, data.val, p.eval_batch_size)
            tracker.point(step + 1, val_metrics)
            if curve_point(row, p, budget, step + 1, val_metrics):
                break
            if horizon.extend(step + 1, row["curve_val_token_acc"]):
                restart_lr(scheduler)
        due = time.perf_counter() - last_save >= checkpoint.CHECKPOINT_SECONDS
        if saved and due and step + 1 < horizon.last_step:
            with phase("checkpoints"):
                state = checkpoint.capture(model, optimizer, scheduler, train_gen)
                state.update(
                    step=step + 1,  # the next step to train
                    recent=recent,
                    val_metrics=val_metrics,
                    curve=(row["curve_steps"], row["curve_val_token_acc"]),
                    horizon=horizon.end,  # an extended training resumes on its own schedule
                )
                spent = before + watch.elapsed()
                state.update(seconds=spent.wall, cpu_seconds=spent.cpu)
                if not checkpoint.save(saved, ident, state):
                    saved = None  # nowhere to keep one: train on without
            last_save = time.perf_counter()
    finish(spec, model, data, row, step + 1, recent, val_metrics)
    return before


def finish(
    spec: RunSpec,
    model: Model,
    data: RunData,
    row: dict,
    steps_done: int,
    recent: list[float],
    val_metrics: dict[str, float],
) -> None:
    """Everything after a training's last step, into ``row``: its steps and final loss, the
    trained model's causality check, the test metrics (and the long ones), the task's chance,
    the last validation scores (``val_metrics``: the last point of the curve), status ok."""
    p = spec.protocol
    row["steps_done"] = steps_done
    row["final_loss"] = sum(recent) / len(recent)
    # a leak can be switched on by a learned parameter: the trained model is checked too,
    # on test sequences at every length it is evaluated at, before any result is kept
    with phase("causality after training"):
        for test in (data.test, data.long_test):
            if test is not None:
                verdict = check_model_causality(model, test.inputs[:CHECK_BATCH])
                if verdict.leaks:
                    raise Leaky(f"not causal after training: {verdict.detail}")

    with phase("test evaluation"):
        feed_back = data.task.answers_in_stream
        row.update(held_out_metrics(model, data.test, p.eval_batch_size, feed_back))
        if data.long_test is not None:
            long_metrics = evaluate(model, data.long_test, p.eval_batch_size)
            row.update({f"long_{k}": v for k, v in long_metrics.items()})
    with phase("chance"):
        task_chance = task_chance_of(spec)
    row["chance_token_acc"] = task_chance.token_acc
    row["chance_exact_match"] = task_chance.exact_match
    row.update({f"val_{k}": v for k, v in val_metrics.items()})
    row["status"] = "ok"


def blank_row(spec: RunSpec, lr: float) -> dict[str, Any]:
    """A row of ``spec`` at ``lr`` with no result yet: status error, every metric null."""
    return {
        **spec.row_fields(),
        "lr": lr,
        **ROW_MARKS,  # the sweep's marks: the runner sets them once the sweep is complete
        "steps_done": 0,
        "status": "error",
        "error": None,
        **dict.fromkeys(RESULT_METRICS),
        "wall_seconds": 0.0,
        "cpu_seconds": None,  # not measured: train_eval measures it (synthbench/run/clock.py)
    }


def failed_row(spec: RunSpec, lr: float, device: torch.device, error: str) -> dict[str, Any]:
    """The row of a training that could not run at all (its worker died, say)."""
    return {**blank_row(spec, lr), "error": error, **provenance.stamp(device)}


def train_eval(
    spec: RunSpec,
    lr: float,
    device: torch.device,
    budget: Budget | None = None,
    saved: str | Path | None = None,
) -> dict[str, Any]:
    """One training run at one learning rate -> one results row (never raises on failure).
    With a ``budget`` it stops at its limits (synthbench/run/lr_selection.py says when), the lr
    schedule unchanged. With ``protocol.max_steps``, a training still rising at its
    schedule's end goes on, the schedule stretched (``Horizon``): ``steps_done`` says how
    far it went. With ``saved``, a checkpoint path, it resumes from the checkpoint
    there (if that is this training's) and keeps one as it goes (synthbench/run/
    checkpoint.py): the row is the same, its wall_seconds and cpu_seconds counting the time
    before too (synthbench/run/clock.py).

    Runs with ``spec.threads`` torch threads (restored afterwards): the count is part of the
    run's config because it changes the floating-point sums.
    """
    row = blank_row(spec, lr)
    before = Seconds()
    # its log with --log (synthbench/run/tracking.py), ended if a Ctrl-C stops it
    with tracking.start(spec, lr) as tracker, torch_threads(spec.threads):
        watch = Stopwatch()
        with failures_recorded(row):
            path = Path(saved) if saved is not None else None
            budget = budget or Budget()
            before = _train_and_evaluate(spec, lr, device, row, budget, path, watch, tracker)
    row.update((before + watch.elapsed()).row_fields())
    row = {**row, **provenance.stamp(device)}
    tracker.finish(row)
    return row


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads set to ``threads`` inside, the caller's restored after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@contextmanager
def failures_recorded(row: dict) -> Iterator[None]:
    """What the block raises becomes the row's status and error, never raised: a
    divergence, a leak, or anything else as an error (the user's Ctrl-C is raised again)."""
    try:
        yield
    except Diverged as exc:
        row.update(status="diverged", error=str(exc))
    except Leaky as exc:  # never a result; not retrained either (it would leak again)
        row.update(status=LEAKY, error=str(exc))
    except BaseException as exc:  # stored as an error row; the suite goes on (sys.exit in a
        # plugin too: synthbench/core/interrupts.py; the user's Ctrl-C is raised again)
        row.update(status="error", error=describe(caught(exc)))
