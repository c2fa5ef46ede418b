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
most the examples of a separate one's.

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
bits, as between two machines. ``wall_seconds`` is each member's share of the packed work:
the setup and every step divided among the members still in the pack, plus its own
evaluation after training.

A mechanism that sets ``packable = False``, or whose forward or backward cannot be vmapped
(an ``autograd.Function`` without a vmap rule, randomness drawn in ``forward``,
data-dependent Python control flow), trains its members one by one with ``train_eval``; the
``NotPacked`` warning says so in one line. So do the members not yet finished when a packed
step raises anything (a mechanism's own error then gives them the rows it gives alone).
Nothing is ever raised for a training's failure: as with ``train_eval``, it is the row's
status.
"""

from __future__ import annotations

import copy
import itertools
import math
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

from synthbench.core.interrupts import caught, describe, raise_pending
from synthbench.core.mechanism import MECHANISMS
from synthbench.core.model import Model
from synthbench.run import provenance
from synthbench.run.lr_selection import Budget
from synthbench.run.phases import phase
from synthbench.run.spec import RunSpec
from synthbench.run.train import (
    RECENT_LOSSES,
    Diverged,
    Horizon,
    RunData,
    blank_row,
    curve_point,
    evaluation_batches,
    evaluation_data,
    failures_recorded,
    finish,
    mean_scores,
    non_finite_gradient,
    non_finite_loss,
    parameter_count,
    parameter_groups,
    run_tasks,
    seeded_model,
    start_curve,
    teacher_forced_metrics,
    torch_threads,
    train_eval,
    training_generator,
    training_loss,
)

ADAMW_EPS = 1e-8  # torch.optim.AdamW's default, which train_eval uses
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grads_with_norm_'s
ACTIVATION_BYTES = 2**30  # what a pack's training pass may hold on a CPU (activation_budget)
# torch has no batching rule for the CPU flash attention kernel yet: it loops over the
# members, correctly; the warning says nothing a run can act on
_SDPA_LOOP = "There is a performance drop because we have not yet implemented the batching rule"


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


class Unpackable(Exception):
    """The members' models cannot be stacked (the reason is the message)."""


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
    seconds: float = 0.0  # its share of the packed work
    done: bool = False  # the row is final (ok, diverged, leaky or error)

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
        self.row["wall_seconds"] = self.seconds
        return {**self.row, **provenance.stamp(device)}


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
    start = time.perf_counter()
    task, long_task = run_tasks(members[0].spec)
    with phase("model build"):
        for m in members:
            m.model = seeded_model(m.spec, task, long_task, device)
            m.row["n_params"] = parameter_count(m.model)
        pack = _Pack([m.model for m in members], [m.lr for m in members], p)
    data = evaluation_data(members[0].spec, task, long_task, device)
    with phase("model build"):  # one member's batch, from the validation set (no RNG)
        probe = data.val.inputs[: p.batch_size], data.val.targets[: p.batch_size]
        pack.plan_passes(*probe)
    for m in members:
        start_curve(m.row)
    _share(members, time.perf_counter() - start)

    active = list(members)  # the pack's rows, in order
    # every member stops at its last step at the latest (a curve point): the pack empties
    for step in itertools.count():
        raise_pending()  # a Ctrl-C Python dropped (synthbench/core/interrupts.py)
        start = time.perf_counter()
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
                stops = curve_point(m.row, p, m.budget, step + 1, score)
                if not stops:  # at its schedule's end and still rising, it goes on
                    m.horizon.extend(step + 1, m.row["curve_val_token_acc"])
                if stops or step + 1 == m.horizon.last_step:
                    stopped.append(i)
        _share(active, time.perf_counter() - start)
        for i in stopped:
            _finish_member(active[i], pack, i, data, step + 1)
        keep = [i for i, m in enumerate(active) if not m.done]
        if not keep:
            return
        if len(keep) < len(active):
            pack.keep(keep)
            active = [active[i] for i in keep]


def _share(members: list[_Member], seconds: float) -> None:
    for m in members:
        m.seconds += seconds / len(members)


def _finish_member(m: _Member, pack: _Pack, index: int, data: RunData, steps_done: int) -> None:
    """``train.finish`` on the member's trained weights, in its own model."""
    start = time.perf_counter()
    pack.unstack_into(index, m.model)
    with failures_recorded(m.row):
        finish(m.spec, m.model, data, m.row, steps_done, m.recent, m.val_metrics)
    m.seconds += time.perf_counter() - start
    m.done, m.model = True, None


@contextmanager
def _quiet_vmap(device: torch.device) -> Iterator[None]:
    """vmap as a pack runs it. Off the CPU, scaled_dot_product_attention takes its math
    kernel: CUDA's fused kernels have no batching rule, and their backward fails on vmap's
    strides ("LSE is not correctly aligned", torch 2.11 on an H200)."""
    with warnings.catch_warnings(), ExitStack() as stack:
        warnings.filterwarnings("ignore", message=_SDPA_LOOP)
        if device.type != "cpu":
            stack.enter_context(sdpa_kernel(SDPBackend.MATH))
        yield


class _Pack:
    """The stacked weights, buffers and AdamW state of the members still training.

    Every parameter of every member lives in one (members, P) tensor ``weights``, in the
    model's parameter order, so the optimizer updates all of them in a handful of
    operations. A training pass runs ``per_pass`` members at a time (all of them unless
    their activations would pass ``activation_budget``): for each such slice of rows, each
    parameter is a view of its columns made a leaf that requires grad, so that autograd
    still tells which parameters received no gradient (torch's AdamW skips those, weight
    decay and step count included).
    """

    def __init__(self, models: list[Model], lrs: list[float], protocol) -> None:
        # the module functional_call runs with the stacked tensors: a copy, so that a member's
        # own model can be finished while the others train on
        self.base = copy.deepcopy(models[0])
        self.protocol = protocol
        self.lrs = list(lrs)
        named = [dict(m.named_parameters()) for m in models]
        self.names = list(named[0])
        _check_same(named, "parameters")
        buffers = [dict(m.named_buffers()) for m in models]
        _check_same(buffers, "buffers")
        _check_plain_tensors(models)
        dtypes = {t.dtype for t in named[0].values()}
        if len(dtypes) > 1:
            raise Unpackable(f"parameters of several dtypes ({', '.join(map(str, dtypes))})")
        self.shapes = [named[0][n].shape for n in self.names]
        self.sizes = [named[0][n].numel() for n in self.names]
        with torch.no_grad():
            self.weights = torch.stack(
                [torch.cat([d[n].reshape(-1) for n in self.names]) for d in named]
            )
            self.buffers = {n: torch.stack([d[n] for d in buffers]) for n in buffers[0]}
        self.exp_avg = torch.zeros_like(self.weights)
        self.exp_avg_sq = torch.zeros_like(self.weights)
        # AdamW's step count of each member's each parameter
        self.param_steps = [[0] * len(self.names) for _ in models]
        # weight decay per parameter: parameter_groups decides (a _no_weight_decay mark)
        decay_of = {
            id(t): group["weight_decay"]
            for group in parameter_groups(models[0], protocol.weight_decay)
            for t in group["params"]
        }
        self.decays = [decay_of[id(named[0][n])] for n in self.names]
        self.per_pass = len(models)

    def plan_passes(self, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        """Members per training pass: as many as ``activation_budget`` holds, from what one
        member's forward keeps for its backward (one member's batch, ``inputs`` and
        ``labels``, under vmap as the pack runs it: a mechanism may take another path
        there, SLAY's plain scores for its blocked ones), twice over for the backward's own
        tensors."""
        saved = 0

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            nonlocal saved
            saved += tensor.numel() * tensor.element_size()
            return tensor

        one = slice(0, 1)
        params = self.params(one, leaves=True)
        buffers = {n: b[one] for n, b in self.buffers.items()}
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with _quiet_vmap(self.weights.device):
                torch.vmap(self._loss)(params, buffers, inputs[None], labels[None])
        self.saved_per_member = saved
        budget = activation_budget(self.weights.device)
        self.per_pass = max(1, min(len(self.weights), budget // max(1, 2 * saved)))

    def keep(self, rows: list[int]) -> None:
        """Only the members at ``rows`` go on (the others have stopped)."""
        index = torch.tensor(rows, device=self.weights.device)
        with torch.no_grad():
            self.weights = self.weights[index]
            self.exp_avg, self.exp_avg_sq = self.exp_avg[index], self.exp_avg_sq[index]
            self.buffers = {n: b[index] for n, b in self.buffers.items()}
        self.lrs = [self.lrs[i] for i in rows]
        self.param_steps = [self.param_steps[i] for i in rows]

    def params(self, rows: slice = slice(None), leaves: bool = False) -> dict[str, torch.Tensor]:
        """Each parameter of the members at ``rows``: views of ``weights`` (as leaves that
        require grad with ``leaves``)."""
        views, start = {}, 0
        weights = self.weights[rows]
        for name, shape, size in zip(self.names, self.shapes, self.sizes, strict=True):
            view = weights[:, start : start + size].view(len(weights), *shape)
            views[name] = view.requires_grad_() if leaves else view
            start += size
        return views

    def _loss(self, params, buffers, inputs, labels) -> torch.Tensor:
        return training_loss(functional_call(self.base, (params, buffers), (inputs,)), labels)

    def _logits(self, params, buffers, inputs) -> torch.Tensor:
        return functional_call(self.base, (params, buffers), (inputs,))

    def forward_backward(
        self, inputs: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each member's training loss on its batch and its gradient norm, (members,) each;
        the gradients in ``self.grads`` (members, P), ``self.used`` whether each member's
        each parameter got one. A member whose loss is not finite gets a NaN norm."""
        members = len(self.weights)
        self.grads = torch.zeros_like(self.weights)
        self.used = []
        losses, grad_norms = [], []
        for start in range(0, members, self.per_pass):
            rows = slice(start, start + self.per_pass)
            params = self.params(rows, leaves=True)
            buffers = {n: b[rows] for n, b in self.buffers.items()}
            with _quiet_vmap(self.weights.device):
                loss = torch.vmap(self._loss)(params, buffers, inputs[rows], labels[rows])
                finite = torch.isfinite(loss)
                # a member whose loss is not finite stops: nothing of it is used
                torch.where(finite, loss, torch.zeros_like(loss)).sum().backward()
            grads = [params[n].grad for n in self.names]
            n = len(loss)
            self.grads[rows] = torch.cat(
                [
                    (g if g is not None else torch.zeros_like(params[name])).reshape(n, -1)
                    for name, g in zip(self.names, grads, strict=True)
                ],
                dim=1,
            )
            self.used += [[g is not None for g in grads]] * n
            # as torch.nn.utils.get_total_norm: the norm of the parameters' norms
            norms = [
                torch.linalg.vector_norm(g.reshape(n, -1), 2, dim=1) for g in grads if g is not None
            ]
            norm = (
                torch.linalg.vector_norm(torch.stack(norms, dim=1), 2, dim=1)
                if norms
                else torch.zeros(n, device=loss.device)
            )
            losses.append(loss.detach())
            grad_norms.append(torch.where(finite, norm, torch.full_like(norm, torch.nan)))
        return torch.cat(losses), torch.cat(grad_norms)

    @torch.no_grad()
    def step(self, factors: list[float], grad_norms: torch.Tensor) -> None:
        """Clip each member's gradients to the protocol's norm, then one AdamW step (torch's
        decoupled weight decay and bias correction) at each member's lr times its schedule's
        factor at this step (``factors``: each member has its own horizon), on the
        parameters that got a gradient. A member whose gradients are not finite leaves the
        pack after this step: its update is moot."""
        p = self.protocol
        grads = self.grads
        if p.grad_clip:  # as torch.nn.utils.clip_grads_with_norm_
            coef = (p.grad_clip / (grad_norms + CLIP_EPS)).clamp(max=1.0)
            grads = grads * coef.unsqueeze(1)
        # as LambdaLR: in Python floats
        lrs = [lr * factor for lr, factor in zip(self.lrs, factors, strict=True)]
        self.param_steps = [
            [n + used for n, used in zip(steps, member_used, strict=True)]
            for steps, member_used in zip(self.param_steps, self.used, strict=True)
        ]
        beta1, beta2 = p.betas
        # an unused parameter's count may be 0: its columns are kept below anyway
        steps = [[max(1, n) for n in member] for member in self.param_steps]
        # each member's scalars per parameter, in Python floats (double) as torch computes
        # them, then float32 (torch hands its kernel doubles it rounds likewise)
        decay = self._columns([[1 - lr * wd for wd in self.decays] for lr in lrs])
        step_size = self._columns(
            [[lr / (1 - beta1**n) for n in member] for lr, member in zip(lrs, steps, strict=True)]
        )
        bc2_sqrt = self._columns([[math.sqrt(1 - beta2**n) for n in member] for member in steps])

        every = all(all(member) for member in self.used)
        weights, exp_avg, exp_avg_sq = self.weights, self.exp_avg, self.exp_avg_sq
        if not every:  # update copies, then keep the columns of parameters without gradient
            weights, exp_avg, exp_avg_sq = weights.clone(), exp_avg.clone(), exp_avg_sq.clone()
        weights.mul_(decay)
        exp_avg.lerp_(grads, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grads, grads, value=1 - beta2)
        denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(ADAMW_EPS)
        weights.sub_((step_size * exp_avg) / denom)
        if not every:
            used = self._columns([[float(u) for u in member] for member in self.used]).bool()
            for old, new in (
                (self.weights, weights),
                (self.exp_avg, exp_avg),
                (self.exp_avg_sq, exp_avg_sq),
            ):
                old.copy_(torch.where(used, new, old))

    def _columns(self, rows: list[list[float]]) -> torch.Tensor:
        """Values per (member, parameter) -> a float32 tensor on the pack's device with a
        column per column of ``weights``, or a single column where each member's values are
        all equal (the usual case: one lr per member, one step count)."""
        if all(len(set(row)) == 1 for row in rows):
            values = torch.tensor([row[:1] for row in rows], dtype=torch.float64)
        else:
            sizes = torch.tensor(self.sizes)
            values = torch.tensor(rows, dtype=torch.float64).repeat_interleave(sizes, dim=1)
        return values.float().to(self.weights.device)

    @torch.no_grad()
    def evaluate(self, rows: list[int], data, batch_size: int) -> list[dict[str, float] | Diverged]:
        """``train.evaluate`` of the members at ``rows``: their metrics, or the Diverged of
        a member whose logits are not finite. A pass takes half of ``batch_size`` examples in
        all, split among the members: at most the memory of one separate evaluation's pass
        (vmap's batching rules copy some of its intermediates)."""
        index = torch.tensor(rows, device=self.weights.device)
        params = {n: t[index] for n, t in self.params().items()}
        buffers = {n: b[index] for n, b in self.buffers.items()}
        scores: list[list] = [[] for _ in rows]
        failed: list[Diverged | None] = [None] * len(rows)
        self.base.eval()
        with _quiet_vmap(self.weights.device):
            for inputs, targets in evaluation_batches(data, max(1, batch_size // (2 * len(rows)))):
                logits = torch.vmap(self._logits, in_dims=(0, 0, None))(params, buffers, inputs)
                for j in range(len(rows)):
                    if failed[j] is None:
                        try:
                            scores[j].append(teacher_forced_metrics(logits[j], targets))
                        except Diverged as exc:
                            failed[j] = exc
        self.base.train()
        return [f if f is not None else mean_scores(s) for f, s in zip(failed, scores, strict=True)]

    @torch.no_grad()
    def unstack_into(self, row: int, model: Model) -> None:
        """The member at ``row``'s weights and buffers, into its own ``model``."""
        params = self.params()
        for name, param in model.named_parameters():
            param.copy_(params[name][row])
        for name, buffer in model.named_buffers():
            buffer.copy_(self.buffers[name][row])


def activation_budget(device: torch.device) -> int:
    """Bytes of activations a training pass of a pack may hold: ``ACTIVATION_BYTES`` on a
    CPU (a packed quick training stays within 2 GiB), half the free memory of a GPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] // 2
    return ACTIVATION_BYTES


def _check_same(per_model: list[dict[str, torch.Tensor]], what: str) -> None:
    first = per_model[0]
    for other in per_model[1:]:
        if list(other) != list(first) or any(
            other[n].shape != first[n].shape or other[n].dtype != first[n].dtype for n in first
        ):
            raise Unpackable(f"its models' {what} differ between seeds")


def _check_plain_tensors(models: list[Model]) -> None:
    """A tensor a module keeps as a plain attribute (neither parameter nor buffer) is not
    stacked: functional_call would give every member the first one's. Packable only where
    they are equal for every member."""

    def plain(model: Model) -> dict[str, torch.Tensor]:
        return {
            f"{prefix}.{name}": value
            for prefix, module in model.named_modules()
            for name, value in vars(module).items()
            if isinstance(value, torch.Tensor)
        }

    first = plain(models[0])
    for model in models[1:]:
        other = plain(model)
        for name, value in first.items():
            if name not in other or not torch.equal(value, other[name]):
                raise Unpackable(
                    f"{name.lstrip('.')} is a tensor attribute, neither parameter nor buffer, "
                    "that differs between seeds"
                )
