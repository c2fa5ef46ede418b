"""Packed training: the trainings of one run that differ only in seed and learning rate,
trained together as one batched model.

``train_packed(members, device, budgets)`` takes (spec, lr) pairs and returns, for each, the
row ``synthbench.run.train.train_eval(spec, lr, device, budget)`` returns, within float32
tolerance: the members of one (task, mechanism, protocol, parameters, threads) are stacked
along a leading member dimension and trained by one ``torch.vmap`` of
``torch.func.functional_call`` over that dimension, so each step runs the model's kernels
once for all of them instead of once each. (Each parameter is stacked as
``torch.func.stack_module_state`` stacks it, but as a view of one (members, P) tensor of all
the parameters, so that the optimizer is a handful of operations on it.) A training pass
holds the activations of as many members as ``activation_budget`` allows (1 GiB on a CPU),
the others in further passes of the same step; a pass of a curve point's evaluation takes at
most the examples of a separate one's. Those stacked tensors, their passes and their
optimizer are ``stacked_models.StackedModels``; this module is which trainings share a pack
and each member's course in it.

Each member keeps everything a separate training has: its own initialisation (its model
built right after ``torch.manual_seed(spec.seed)``, random buffers included), its own stream
of training batches, its own lr on its own schedule (its ``train.Horizon``: extended past
the protocol's steps while its curve rises, as a separate training's), AdamW with the
protocol's betas, weight decay and parameter groups (by hand, on the stacked tensors:
torch's formula, the lr a per-member column), its own gradient clipping, divergence check,
curve points and early stop. A member that stops (solved, its budget, diverged) leaves the
pack: the others are re-packed without it, so it never changes again. Its weights go back
into an ordinary ``Model``, which ``train.finish`` evaluates exactly as after a separate
training.

Not bit-identical to separate trainings: a batched kernel sums in another order than the
single one, and the optimizer is not torch's fused kernel, so weights differ in their last
bits, as between two machines. ``wall_seconds`` and ``cpu_seconds`` are each member's share
of the packed work: the setup and every step divided among the members still in the pack,
plus its own evaluation after training.

A mechanism that sets ``packable = False``, or whose forward or backward cannot be vmapped
(an ``autograd.Function`` without a vmap rule, randomness drawn in ``forward``,
data-dependent Python control flow), trains its members one by one with ``train_eval``; the
``NotPacked`` warning says so in one line. So do the members not yet finished when a packed
step raises anything (a mechanism's own error then gives them the rows it gives alone).
Nothing is ever raised for a training's failure: as with ``train_eval``, it is the row's
status.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from synthbench.core.interrupts import caught, describe, raise_pending
from synthbench.core.mechanism import MECHANISMS
from synthbench.core.model import Model
from synthbench.run import provenance, tracking
from synthbench.run.clock import Seconds, Stopwatch
from synthbench.run.evaluation import Diverged
from synthbench.run.lr_selection import Budget
from synthbench.run.phases import phase
from synthbench.run.spec import RunSpec
from synthbench.run.stacked_models import StackedModels
from synthbench.run.train import (
    RECENT_LOSSES,
    Horizon,
    RunData,
    blank_row,
    curve_point,
    evaluation_data,
    failures_recorded,
    finish,
    non_finite_gradient,
    non_finite_loss,
    parameter_count,
    run_tasks,
    seeded_model,
    start_curve,
    torch_threads,
    train_eval,
    training_generator,
)


class NotPacked(UserWarning):
    """The trainings of a mechanism ran one by one instead of packed (one line: the
    mechanism and the reason)."""

    def __init__(self, mechanism: str, reason: str, trainings: int) -> None:
        self.mechanism, self.reason, self.trainings = mechanism, reason, trainings
        super().__init__(
            f"packed training: {mechanism} cannot be packed ({reason}); its {trainings} "
            "trainings ran one at a time"
        )


def notes_on_one_line() -> None:
    """Show ``NotPacked`` warnings as one line, ``warning: ...``, instead of Python's file,
    line and source line (the command line and its workers call it; idempotent)."""
    default = warnings.formatwarning
    if getattr(default, "one_line_notes", False):
        return

    def formatwarning(message, category, filename, lineno, line=None):
        if issubclass(category, NotPacked):
            return f"warning: {message}\n"
        return default(message, category, filename, lineno, line)

    formatwarning.one_line_notes = True
    warnings.formatwarning = formatwarning


def pack_key(spec: RunSpec) -> str:
    """Runs with the same key differ at most in their seed: their trainings can be packed."""
    return spec.with_seed(0).run_id


def declared_unpackable(mechanism: str) -> str | None:
    """The reason a mechanism gives for never being packed (``packable = False``), or None."""
    if getattr(MECHANISMS.get(mechanism), "packable", True) is False:
        return "it declares packable = False"
    return None


def train_packed(
    members: Sequence[tuple[RunSpec, float]],
    device: torch.device,
    budgets: Sequence[Budget | None] | None = None,
) -> list[dict[str, Any]]:
    """The rows of ``train_eval(spec, lr, device, budget)`` for each member (spec, lr), in
    order, its trainings packed: members whose specs differ only in their seed train as one
    batched model (any mix of runs is accepted; each group of them is packed apart).
    ``budgets``: one per member (None: the whole schedule). Never raises for a training."""
    members = list(members)
    budgets = list(budgets) if budgets is not None else [None] * len(members)
    if len(budgets) != len(members):
        raise ValueError(f"{len(members)} members but {len(budgets)} budgets")
    groups: dict[str, list[int]] = {}
    for i, (spec, _) in enumerate(members):
        groups.setdefault(pack_key(spec), []).append(i)
    rows: list[dict[str, Any]] = [{} for _ in members]
    for indices in groups.values():
        group = [_Member(*members[i], budgets[i] or Budget()) for i in indices]
        for i, row in zip(indices, _train_group(group, device), strict=True):
            rows[i] = row
    return rows


@dataclass
class _Member:
    """One training of a pack, and where it stands."""

    spec: RunSpec
    lr: float
    budget: Budget
    row: dict[str, Any] = field(init=False)
    model: Model | None = None
    recent: list[float] = field(default_factory=list)
    val_metrics: dict[str, float] | None = None
    spent: Seconds = Seconds()  # its share of the packed work (wall and CPU)
    done: bool = False  # the row is final (ok, diverged, leaky or error)
    tracker: tracking.Tracker = tracking.NOT_TRACKED  # its log with --log, once packed

    def __post_init__(self) -> None:
        self.row = blank_row(self.spec, self.lr)
        # its own schedule's end, last step, curve points and lr factors, as train_eval's
        self.horizon = Horizon(self.spec.protocol, self.budget)
        self.generator = training_generator(self.spec)

    def fail(self, exc: BaseException) -> None:
        """The member stops with ``exc`` as its outcome (diverged, leaky or error)."""
        with failures_recorded(self.row):
            raise exc
        self.done, self.model = True, None

    def final_row(self, device: torch.device) -> dict[str, Any]:
        self.row.update(self.spent.row_fields())
        row = {**self.row, **provenance.stamp(device)}
        self.tracker.finish(row)
        return row


def _train_group(members: list[_Member], device: torch.device) -> list[dict[str, Any]]:
    spec = members[0].spec
    if len(members) == 1:  # nothing to pack with
        return [train_eval(spec, members[0].lr, device, members[0].budget)]
    reason = declared_unpackable(spec.mechanism)
    if reason is None:
        with torch_threads(spec.threads):
            try:
                _train_together(members, device)
            except BaseException as exc:  # what vmap refuses, or anything a step raises
                reason = _one_line(describe(caught(exc)))
    rows = []
    undone = [m for m in members if not m.done]
    if reason is not None and undone:
        warnings.warn(NotPacked(spec.mechanism, reason, len(undone)), stacklevel=3)
    for m in members:  # the finished ones keep their rows, the others train alone
        if not m.done:
            m.tracker.abandon("trained again alone")  # train_eval opens a log of its own
        rows.append(m.final_row(device) if m.done else train_eval(m.spec, m.lr, device, m.budget))
    return rows


def _one_line(text: str, limit: int = 240) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _train_together(members: list[_Member], device: torch.device) -> None:
    """Train ``members`` (specs equal but for the seed) as one pack, finishing each row as
    its member stops. Raises what stops the pack itself (vmap's refusal, a mechanism's
    error): the members not done then train alone."""
    p = members[0].spec.protocol
    watch = Stopwatch()
    task, long_task = run_tasks(members[0].spec)
    with phase("model build"):
        for m in members:
            m.model = seeded_model(m.spec, task, long_task, device)
            m.row["n_params"] = parameter_count(m.model)
        pack = StackedModels([m.model for m in members], [m.lr for m in members], p)
    data = evaluation_data(members[0].spec, task, long_task, device)
    with phase("model build"):  # one member's batch, from the validation set (no RNG)
        probe = data.val.inputs[: p.batch_size], data.val.targets[: p.batch_size]
        pack.plan_passes(*probe)
    for m in members:
        start_curve(m.row)
        m.tracker = tracking.start(m.spec, m.lr)
    _share(members, watch.elapsed())

    active = list(members)  # the pack's rows, in order
    # every member stops at its last step at the latest (a curve point): the pack empties
    for step in itertools.count():
        raise_pending()  # a Ctrl-C Python dropped (synthbench/core/interrupts.py)
        watch = Stopwatch()
        with phase("training batches"):
            batches = [task.generate(p.batch_size, m.generator, device) for m in active]
            inputs = torch.stack([b.inputs for b in batches])
            labels = torch.stack([b.training_targets for b in batches])
        with phase("training steps"):
            losses, grad_norms = pack.forward_backward(inputs, labels)
            pack.step([m.horizon.lr_factor(step) for m in active], grad_norms)
            values, norms = torch.stack([losses, grad_norms]).tolist()  # one sync
        for m, value, norm in zip(active, values, norms, strict=True):
            m.row["steps_done"] = step
            if not math.isfinite(value):
                m.fail(non_finite_loss(step))
            elif not math.isfinite(norm):
                m.fail(non_finite_gradient(step))
            else:
                m.recent = (m.recent + [value])[-RECENT_LOSSES:]
                m.tracker.step(step, value, m.lr * m.horizon.lr_factor(step))
        measured = [
            i for i, m in enumerate(active) if not m.done and step + 1 in m.horizon.measure_at
        ]
        stopped = []
        if measured:
            with phase("curve points"):
                scores = pack.evaluate(measured, data.val, p.eval_batch_size)
            for i, score in zip(measured, scores, strict=True):
                m = active[i]
                if isinstance(score, Diverged):
                    m.fail(score)
                    continue
                m.val_metrics = score
                m.tracker.point(step + 1, score)
                stops = curve_point(m.row, p, m.budget, step + 1, score)
                if not stops:  # at its schedule's end and still rising, it goes on
                    m.horizon.extend(step + 1, m.row["curve_val_token_acc"])
                if stops or step + 1 == m.horizon.last_step:
                    stopped.append(i)
        _share(active, watch.elapsed())
        for i in stopped:
            _finish_member(active[i], pack, i, data, step + 1)
        keep = [i for i, m in enumerate(active) if not m.done]
        if not keep:
            return
        if len(keep) < len(active):
            pack.keep(keep)
            active = [active[i] for i in keep]


def _share(members: list[_Member], spent: Seconds) -> None:
    for m in members:
        m.spent += spent / len(members)


def _finish_member(
    m: _Member, pack: StackedModels, index: int, data: RunData, steps_done: int
) -> None:
    """``train.finish`` on the member's trained weights, in its own model."""
    watch = Stopwatch()
    pack.unstack_into(index, m.model)
    with failures_recorded(m.row):
        finish(m.spec, m.model, data, m.row, steps_done, m.recent, m.val_metrics)
    m.spent += watch.elapsed()
    m.done, m.model = True, None
