"""The members of a pack as one model: what ``packed.train_packed`` trains each step.

Every member's parameters live in one (members, P) tensor, its buffers stacked beside them,
and each step is one ``torch.vmap`` of ``torch.func.functional_call`` over the member
dimension: the forward and backward run in as many passes as ``activation_budget`` allows
(planned from what one member's forward keeps), the gradient clipping and AdamW update are
done by hand on the stacked tensors (torch's formulas, each member's lr a column), the curve
points' evaluations are vmapped likewise, and a stopped member's weights are unstacked into
its own ``Model``. It is apart from packed.py because it is the tensor mechanics alone:
packed.py decides which trainings share a pack, when each member stops, extends or fails, and
what row it gets; this module only knows stacked weights, the optimizer state and vmap's
quirks (which models can be stacked at all: ``Unpackable``).
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import torch
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

from synthbench.core.model import Model
from synthbench.run.evaluation import (
    Diverged,
    evaluation_batches,
    mean_scores,
    teacher_forced_metrics,
)
from synthbench.run.train import parameter_groups, training_loss

ADAMW_EPS = 1e-8  # torch.optim.AdamW's default, which train_eval uses
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grads_with_norm_'s
ACTIVATION_BYTES = 2**30  # what a pack's training pass may hold on a CPU (activation_budget)
# torch has no batching rule for the CPU flash attention kernel yet: it loops over the
# members, correctly; the warning says nothing a run can act on
_SDPA_LOOP = "There is a performance drop because we have not yet implemented the batching rule"


class Unpackable(Exception):
    """The members' models cannot be stacked (the reason is the message)."""


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


class StackedModels:
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
        """``evaluation.evaluate`` of the members at ``rows``: their metrics, or the Diverged of
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
