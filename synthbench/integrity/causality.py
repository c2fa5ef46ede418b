"""Causality: a mechanism's outputs at a position depend on no later position and on no
other sequence of the batch; the checks that prove it, and the one of a trained model.

A benchmark whose users bring their own mechanisms must refuse one that lets a position see
later positions (or other sequences of the batch): such a mechanism solves copy or induction
by reading the answer and would top the leaderboard. ``run`` checks every mechanism before it
trains (``check_leaks``, through synthbench/integrity/guard.py) and every trained model after
(``check_model_causality``: a leak can be switched on by a learned parameter); ``synthbench
check`` runs these and the rest of the contract (synthbench/integrity/contract.py).

- **causality** (proved, by autograd, in float64): at each probed cut c the gradient of the
  outputs at positions <= c (a random weighting of all of them) with respect to q, k and v
  at every later position is exactly 0, and so is the gradient of each batch item's outputs
  with respect to every other item. Batch 2, random inputs, training and evaluation mode,
  at every length given. Every cut up to length ``FULL_COVERAGE_UP_TO``; beyond it
  ``LONG_CUTS`` cuts (the first and last two, the rest evenly spaced): a probe costs one
  backward pass at the full length, so probing all L cuts of a quadratic mechanism costs
  O(L^3) and minutes at the suite's longest lengths. A leak across any probed cut is caught,
  whichever positions it joins.
- **causality-forward**: the same cuts, by perturbation in float32 (the dtype the suite trains
  in): the outputs at positions <= c do not change when q, k and v after c, or another batch
  item, change; in training mode with autograd on and in evaluation mode under no_grad, as
  ``evaluate`` runs. It sees what gradients cannot: a leak through ``detach``, an argsort or
  integer indexing, or one only under no_grad or in float32.
- **layout**: the output is a tensor of exactly the input's shape (batch, heads, length,
  head_dim), device and dtype. Output of the (batch, length, heads, head_dim) layout reshaped
  to the right number of elements passes this and is caught by causality (it mixes positions).

A mechanism's extra inputs (a gate, a decay: ``Mechanism.extra_inputs``) are inputs like q, k
and v in every check: standard normal, and a leak through them is a leak.

Every check leaves torch's global random state as it found it.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from synthbench.core.interrupts import caught
from synthbench.core.mechanism import MECHANISMS, extra_inputs, has_recurrent_form
from synthbench.core.model import prepared_mechanism

BATCH = 2  # sequences per call: enough to see one leak into another
SEED = 0  # of the inputs, of construction and of every call
# every cut probed up to this length (past the linear core's first chunk boundary, at 64)
FULL_COVERAGE_UP_TO = 72
LONG_CUTS = 8  # cuts probed beyond it: the first two, the last two, 4 evenly spaced between
FORWARD_TOLERANCE = 1e-5  # of the output's scale: float32 rounding, far below any real leak
MODES = ("train", "eval")
INPUT_NAMES = ("q", "k", "v")


class Leaky(Exception):
    """A trained model whose outputs depend on later positions or on other sequences of its
    batch; ``train_eval`` stores the training with status ``leaky``."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    detail: str  # one line
    # failed because the mechanism raised: a FAIL of `synthbench check`, but no proof of a
    # leak, so `run` does not refuse it for that (its training raises and says so)
    raised: bool = False

    @property
    def leaks(self) -> bool:
        """Failed by what the mechanism computed, not by an exception."""
        return not self.passed and not self.raised

    def line(self, mechanism: str = "") -> str:
        who = f"{mechanism}  " if mechanism else ""
        return f"{'PASS' if self.passed else 'FAIL'}  {who}{self.name:<17}  {self.detail}"


@dataclass(frozen=True)
class Subject:
    """A mechanism as the protocol's model builds it for one layer: registry name, complete
    parameters (``mechanism_params``), head size and count. ``max_len`` is what the model
    tells it (``set_max_len``); None: the length of each call, as a model built for that
    length would."""

    name: str
    params: dict[str, Any]
    head_dim: int
    n_heads: int
    max_len: int | None = None
    device: torch.device = torch.device("cpu")

    def build(self, length: int) -> nn.Module:
        """A new instance, its random draws from ``SEED``."""
        cls = MECHANISMS.get(self.name)
        seed_torch(SEED)
        make = functools.partial(cls, self.head_dim, self.n_heads, **self.params)
        return prepared_mechanism(make, self.max_len or length).to(self.device)

    def has_recurrent_form(self) -> bool:
        with own_random_state(self.device):
            return has_recurrent_form(self.build(1))

    def extra_widths(self) -> dict[str, int]:
        """The extra per-token inputs of the mechanism (Mechanism.extra_inputs)."""
        with own_random_state(self.device):
            return extra_inputs(self.build(1))

    def input_names(self) -> tuple[str, ...]:
        return (*INPUT_NAMES, *self.extra_widths())

    def inputs(self, length: int, dtype: torch.dtype, scale: float = 1.0):
        """q, k, v: (BATCH, heads, length, head_dim), then each extra input (BATCH, heads,
        length, its width): standard normal times ``scale``."""
        generator = torch.Generator().manual_seed(SEED)
        widths = [self.head_dim] * len(INPUT_NAMES) + list(self.extra_widths().values())
        return [
            (
                torch.randn(
                    (BATCH, self.n_heads, length, width), generator=generator, dtype=torch.float64
                )
                * scale
            ).to(self.device, dtype)
            for width in widths
        ]


def float64_device(device: torch.device) -> torch.device:
    """Where the float64 checks run: ``device``, or the CPU for a device without float64
    (MPS)."""
    return torch.device("cpu") if device.type == "mps" else device


def cuts(length: int) -> list[int]:
    """The cuts c probed at ``length``: outputs at positions <= c must not depend on inputs
    after c. Every one up to FULL_COVERAGE_UP_TO, else LONG_CUTS of them (module docstring)."""
    if length <= FULL_COVERAGE_UP_TO:
        return list(range(length - 1))
    last = length - 2
    between = torch.linspace(2, last - 2, LONG_CUTS - 4).round().long().tolist()
    return sorted({0, 1, *between, last - 1, last})


def describe_lengths(lengths: Sequence[int]) -> str:
    if len(lengths) == 1:
        return f"length {lengths[0]}"
    return f"{len(lengths)} lengths {min(lengths)}..{max(lengths)}"


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


@contextmanager
def own_random_state(device: torch.device) -> Iterator[None]:
    """The checks seed torch's global generator; the caller's state comes back after."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        yield


def seed_torch(seed: int) -> None:
    """``torch.manual_seed`` for the checks, whose draws happen on the CPU or on a device
    already in use: torch's own also queues the seed for each device type not yet started,
    formatting the caller's stack for each (milliseconds a call deep in a run, a tenth of a
    smoke run's time), which those draws never read."""
    if torch.cuda.is_initialized() or torch.backends.mps.is_available() or torch.xpu.is_available():
        torch.manual_seed(seed)
    else:
        torch.random.default_generator.manual_seed(seed)


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one intra-op thread while the checks run (restored after): their tensors are
    small, and threads mostly wait for each other on them (on a busy 2-core machine
    `synthbench check softmax` took 40 s on two threads, 3 s on one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def set_mode(module: nn.Module, mode: str) -> nn.Module:
    return module.train() if mode == "train" else module.eval()


def call(mechanism: nn.Module, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """The mechanism on q, k, v and its extra inputs (``Subject.inputs``' order)."""
    seed_torch(SEED)  # a mechanism that draws at each call draws the same each time
    q, k, v, *rest = inputs
    return mechanism(q, k, v, causal=True, **dict(zip(extra_inputs(mechanism), rest, strict=True)))


def layout_problem(out: Any, like: torch.Tensor) -> str | None:
    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}, not a tensor"
    if tuple(out.shape) != tuple(like.shape):
        return (
            f"output of shape {tuple(out.shape)} for inputs of shape {tuple(like.shape)} "
            "(batch, heads, length, head_dim)"
        )
    if out.device != like.device:
        return f"output on {out.device} for inputs on {like.device}"
    if out.dtype != like.dtype:
        return f"output of dtype {out.dtype} for inputs of {like.dtype}"
    return None


def _gradient_leak(
    out: torch.Tensor,
    inputs: Sequence[torch.Tensor],
    names: Sequence[str],
    position_dim: int,
    generator: torch.Generator,
) -> str | None:
    """Where the gradient of ``out`` reaches an input it must not (module docstring,
    causality), or None. Batch is dim 0 of every tensor, position ``position_dim``.

    One backward pass per probe, the graph kept: measured on a CPU, a loop over the probes
    beats one batched backward (``is_grads_batched``) for every built-in, and it works for
    mechanisms that vmap cannot run (the linear core's own backward). Nor does one backward
    over a copy of the inputs per cut pay: it needs a forward pass per copy, where the loop
    reuses one (measured: 1.1-1.2x the loop's time on a slay-paper model at lengths 64-130)."""
    _require_finite(out)
    if not out.requires_grad:
        return None  # nothing differentiable reaches the output: no gradient can leak
    length = out.shape[position_dim]
    weights = torch.randn(out.shape, generator=generator, dtype=torch.float64)
    weights = weights.to(out.device, out.dtype)
    shape = [1] * out.dim()
    shape[position_dim] = length
    position = torch.arange(length, device=out.device).view(shape)
    item = torch.arange(out.shape[0], device=out.device).view(-1, *[1] * (out.dim() - 1))

    def backward(probe: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(
            out, inputs, probe, retain_graph=True, allow_unused=True, materialize_grads=True
        )

    for b in range(out.shape[0]):
        for name, grad in zip(names, backward(weights * (item == b)), strict=True):
            others = torch.cat([grad[:b], grad[b + 1 :]])
            if (others != 0).any():
                other = int((others != 0).flatten(1).any(1).nonzero()[0])
                other += other >= b
                return f"batch item {b}'s outputs depend on {name} of batch item {other}"
    for cut in cuts(length):
        for name, grad in zip(names, backward(weights * (position <= cut)), strict=True):
            later = grad.narrow(position_dim, cut + 1, length - cut - 1)
            nonzero = (later != 0).movedim(position_dim, 0).flatten(1).any(1)
            if nonzero.any():
                where = cut + 1 + int(nonzero.nonzero()[0])
                size = float(later.abs().max())
                return (
                    f"outputs at positions <= {cut} depend on {name} at position {where}: "
                    f"gradient {size:.2g}, not 0"
                )
    return None


def _forward_leak(
    run: Callable[[list[torch.Tensor]], torch.Tensor],
    inputs: list[torch.Tensor],
    redraw: Callable[[torch.Tensor, torch.Generator], torch.Tensor],
    what: str,
    position_dim: int,
) -> str | None:
    """Where changing the inputs (``what``) changes an output it must not (module docstring,
    causality-forward), or None. ``redraw(x, generator)`` gives fresh values shaped as x."""
    generator = torch.Generator().manual_seed(SEED + 1)
    base = _require_finite(run(inputs).detach().float())
    length = base.shape[position_dim]
    scale = float(base.abs().max()) if base.numel() else 0.0
    limit = FORWARD_TOLERANCE * scale

    def changed(out: torch.Tensor, reference: torch.Tensor) -> float:
        diff = (out.detach().float() - reference).abs()
        return float(diff.max()) if diff.numel() else 0.0

    for b in range(base.shape[0]):  # every other item replaced: item b must not move
        other = [x.clone() for x in inputs]
        for x in other:
            keep = x[b].clone()
            x.copy_(redraw(x, generator))
            x[b] = keep
        if not changed(run(other)[b], base[b]) <= limit:  # a NaN is a change too
            return f"batch item {b}'s outputs change when the other items do"
    probed, variants = cuts(length), []
    for cut in probed:  # every input redrawn after the cut at once: one variant a cut
        other = [x.clone() for x in inputs]
        for x in other:
            tail = x.narrow(position_dim, cut + 1, length - cut - 1)
            tail.copy_(redraw(tail, generator))
        variants.append(other)
    if _variants_pass_at_once(run, variants, base, probed, position_dim, limit, changed):
        return None
    for cut, other in zip(probed, variants, strict=True):  # one call a cut: this decides
        out = run(other).narrow(position_dim, 0, cut + 1)
        size = changed(out, base.narrow(position_dim, 0, cut + 1))
        if not size <= limit:
            return (
                f"outputs at positions <= {cut} change by {size:.2g} (output scale "
                f"{scale:.2g}) when {what} after position {cut} change"
            )
    return None


def _variants_pass_at_once(
    run: Callable[[list[torch.Tensor]], torch.Tensor],
    variants: list[list[torch.Tensor]],
    base: torch.Tensor,
    probed: Sequence[int],
    position_dim: int,
    limit: float,
    changed: Callable[[torch.Tensor, torch.Tensor], float],
) -> bool:
    """Every cut's variant in one call, each a batch of its own along dim 0: True only when
    no variant's outputs up to its cut moved. A leak moves its own variant's outputs, so
    False means "not shown at once", never a verdict (a mechanism drawing noise per item, say,
    draws other noise in a larger batch; one may raise on it): the variants then run one by
    one, which decides. One call instead of one a cut: measured 0.56-0.9x the time of the
    after-training check on slay-paper models at lengths 33 and 64."""
    batch = base.shape[0]
    try:
        stacked = [torch.cat(parts) for parts in zip(*variants, strict=True)]
        out = run(stacked)
        if out.shape[0] != batch * len(variants):
            return False
        for j, cut in enumerate(probed):
            mine = out[j * batch : (j + 1) * batch].narrow(position_dim, 0, cut + 1)
            if not changed(mine, base.narrow(position_dim, 0, cut + 1)) <= limit:
                return False
    except Exception:  # the one-by-one calls raise it again, and report it
        return False
    return True


def _require_finite(out: torch.Tensor) -> torch.Tensor:
    """A non-finite output for standard normal inputs: no verdict on causality (an exception,
    which the check reports as raised), never taken for a leak."""
    if not torch.isfinite(out).all():
        raise ValueError("non-finite output for standard normal inputs")
    return out


def _randn_like(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    fresh = torch.randn(x.shape, generator=generator, dtype=torch.float64)
    return fresh.to(x.device, x.dtype)


# -- the checks ---------------------------------------------------------------------------


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def failure(name: str, exc: BaseException, where: str) -> CheckResult:
    return CheckResult(name, False, f"raised {one_line(exc)} ({where})", raised=True)


def first_failure(
    name: str, cases: Iterable[tuple[str, Callable[[], str | None]]]
) -> CheckResult | None:
    """The check ``name`` failed at the first case whose probe raises or names a problem;
    None when every case passes. A case is (where, probe): where says which case it is."""
    for where, probe in cases:
        try:
            problem = probe()
        except BaseException as exc:  # sys.exit in plugin code too
            return failure(name, caught(exc), where)
        if problem:
            return CheckResult(name, False, f"{problem} ({where})")
    return None


def check_layout(subject: Subject, lengths: Sequence[int]) -> CheckResult:
    def probe(length: int, dtype: torch.dtype) -> str | None:
        mechanism = subject.build(length).to(dtype)
        inputs = subject.inputs(length, dtype)
        with torch.no_grad():
            return layout_problem(call(mechanism, inputs), inputs[0])

    cases = (
        (f"{dtype_name(dtype)}, length {length}", functools.partial(probe, length, dtype))
        for length in lengths
        for dtype in (torch.float64, torch.float32)
    )
    return first_failure("layout", cases) or CheckResult(
        "layout", True, f"(batch, heads, length, head_dim), device and dtype of the input "
        f"(float64, float32; {describe_lengths(lengths)})"
    )  # fmt: skip


def check_causality(subject: Subject, lengths: Sequence[int]) -> CheckResult:
    def probe(length: int, mode: str) -> str | None:
        mechanism = set_mode(subject.build(length).to(torch.float64), mode)
        inputs = [x.requires_grad_() for x in subject.inputs(length, torch.float64)]
        out = call(mechanism, inputs)
        problem = layout_problem(out, inputs[0])
        if problem is None:
            generator = torch.Generator().manual_seed(SEED)
            problem = _gradient_leak(out, inputs, subject.input_names(), 2, generator)
        return problem

    cases = (
        (f"float64, {mode} mode, length {length}", functools.partial(probe, length, mode))
        for length in lengths
        for mode in MODES
    )
    # the input names build the mechanism: only after the probes, which catch what it raises
    return first_failure("causality", cases) or CheckResult(
        "causality", True, f"gradient exactly 0 w.r.t. {', '.join(subject.input_names())} "
        "after each cut and other batch items (float64, train and eval; "
        f"{describe_lengths(lengths)}; {_coverage(lengths)})"
    )  # fmt: skip


def _coverage(lengths: Sequence[int]) -> str:
    if max(lengths) <= FULL_COVERAGE_UP_TO:
        return "every position"
    return f"every position up to length {FULL_COVERAGE_UP_TO}, {LONG_CUTS} cuts beyond"


def check_forward_causality(subject: Subject, lengths: Sequence[int]) -> CheckResult:
    def probe(length: int, mode: str) -> str | None:
        mechanism = set_mode(subject.build(length), mode)
        with torch.set_grad_enabled(mode == "train"):
            return _forward_leak(
                lambda qkv: call(mechanism, qkv),
                subject.inputs(length, torch.float32),
                _randn_like,
                ", ".join(subject.input_names()),  # built here: what it raises is caught
                2,
            )

    cases = (
        (
            f"float32, {mode} mode{'' if mode == 'train' else ' under no_grad'}, length {length}",
            functools.partial(probe, length, mode),
        )
        for length in lengths
        for mode in MODES
    )
    return first_failure("causality-forward", cases) or CheckResult(
        "causality-forward", True, "outputs up to each cut unchanged when "
        f"{', '.join(subject.input_names())} after it or other batch items change (float32, "
        f"train, eval under no_grad; {describe_lengths(lengths)})"
    )  # fmt: skip


def check_leaks(subject: Subject, lengths: Sequence[int]) -> list[CheckResult]:
    """What ``run`` checks before training: layout and both causality checks."""
    lengths = sorted(set(lengths))
    with own_random_state(subject.device):
        return [
            check_layout(subject, lengths),
            check_causality(subject, lengths),
            check_forward_causality(subject, lengths),
        ]


# -- the trained model ----------------------------------------------------------------------


def check_model_causality(model: nn.Module, tokens: torch.Tensor) -> CheckResult:
    """The model's logits at positions <= c do not depend on its input at later positions nor
    on other sequences of the batch, ``tokens`` (batch, length): by autograd in float64 on a
    deep copy, the gradient with respect to what enters the first block (``Model.embed``) is
    exactly 0, in training and evaluation mode; by perturbation of the tokens, in the model's
    own dtype, the logits do not move, in training mode and in evaluation mode under no_grad
    (as ``evaluate`` runs). ``model`` itself is left as it is. Where the float64 part raises
    (a mechanism without float64) the perturbation still decides; the result says it raised."""
    name = "model-causality"
    raised = None
    length = tokens.shape[1]
    device = float64_device(tokens.device)
    vocab = model.tok_emb.num_embeddings

    def redraw(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        fresh = torch.randint(vocab, x.shape, generator=generator)
        return fresh.to(x.device)

    with own_random_state(tokens.device):
        for mode in MODES:
            where = f"float64, {mode} mode, length {length}"
            try:
                twin = set_mode(copy.deepcopy(model).to(device, torch.float64), mode)
                x = twin.embed(tokens.to(device)).detach().requires_grad_()

                seed_torch(SEED)
                logits = twin.from_embeddings(x)
                generator = torch.Generator().manual_seed(SEED)
                problem = _gradient_leak(logits, [x], ["the input"], 1, generator)
            except BaseException as exc:  # sys.exit in plugin code too
                raised = raised or failure(name, caught(exc), where)
                continue
            if problem:
                return CheckResult(name, False, f"{problem} ({where})")
        for mode in MODES:
            where = f"{mode} mode{'' if mode == 'train' else ' under no_grad'}, length {length}"
            try:
                twin = set_mode(copy.deepcopy(model), mode)

                def run(inputs: list[torch.Tensor], twin: nn.Module = twin) -> torch.Tensor:
                    seed_torch(SEED)
                    return twin(inputs[0])

                with torch.set_grad_enabled(mode == "train"):
                    problem = _forward_leak(run, [tokens.clone()], redraw, "the tokens", 1)
            except BaseException as exc:  # sys.exit in plugin code too
                return failure(name, caught(exc), where)
            if problem:
                return CheckResult(name, False, f"{problem} ({where})")
    if raised:
        return raised
    return CheckResult(
        name, True, f"logits up to each cut independent of later inputs and other batch items "
        f"(length {length})"
    )  # fmt: skip
