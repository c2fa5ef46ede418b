"""The rest of a mechanism's contract (``synthbench check``): what a fair comparison needs
beyond causality (synthbench/integrity/causality.py), which ``check_mechanism`` runs first.

- **dtypes**: float32 and bfloat16 inputs (the parameters as built) give an output of the
  input's dtype, finite: the model's output projection takes it as it is, and every built-in
  computes in at least float32 inside and hands back the input's dtype (``compute_dtype``).
- **large-inputs**: outputs and gradients (q, k, v and parameters) finite in float32 for inputs
  scaled by ``LARGE_INPUT_SCALE`` (every built-in survives x1000).
- **determinism**: torch.manual_seed before construction and before the call gives a
  bit-identical output twice, in training and evaluation mode.
- **state-size** (optional member): ``state_size(L)`` is an int >= 0 that never shrinks as L
  grows, and does not grow at all for a mechanism registered with ``complexity="linear"``.
  A mechanism without it passes, and reports show its state as unknown.
- **recurrent** (only for a mechanism with a recurrent form, ``step``:
  synthbench/core/mechanism.py): token by token it gives the causal ``forward``'s outputs, in
  float64, within ``RECURRENT_TOLERANCE`` of the output's scale, at ``RECURRENT_LENGTHS`` and
  the shortest length given.

Every check leaves torch's global random state as it found it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from synthbench.core.interrupts import caught, describe
from synthbench.core.mechanism import MECHANISMS, extra_inputs, recurrent_forward
from synthbench.core.task import TASKS
from synthbench.integrity.causality import (
    MODES,
    SEED,
    CheckResult,
    Subject,
    call,
    check_causality,
    check_forward_causality,
    check_layout,
    dtype_name,
    failure,
    first_failure,
    layout_problem,
    own_random_state,
    seed_torch,
    set_mode,
)
from synthbench.run.protocols import PROTOCOLS

LARGE_INPUT_SCALE = 100.0
RECURRENT_LENGTHS = (1, 5, 37)  # with the shortest suite length: several chunk remainders
RECURRENT_TOLERANCE = 1e-9  # of the output's scale, in float64


def suite_lengths() -> list[int]:
    """Every sequence length a registered task has at one of its presets, or with the task
    parameters a protocol pins: the lengths the suite trains and evaluates at. A task whose
    code raises (a plugin's, even sys.exit) is a one-line ValueError naming it."""
    lengths = set()
    for name in TASKS.names():
        try:
            lengths |= _task_lengths(name)
        except BaseException as exc:  # a plugin task's code, sys.exit too: named, not an exit
            raise ValueError(
                f"task {name} cannot give its sequence lengths: {describe(caught(exc))} "
                "(--length sets the lengths to check at instead)"
            ) from exc
    return sorted(lengths)


def _task_lengths(name: str) -> set[int]:
    cls = TASKS.get(name)
    lengths = {cls.from_difficulty(preset).seq_len for preset in cls.presets()}
    for protocol in PROTOCOLS.names():
        pinned = PROTOCOLS.get(protocol).pinned_task_params(name)
        if pinned:
            lengths.add(cls(**pinned).seq_len)
    return lengths


def check_dtypes(subject: Subject, length: int) -> CheckResult:
    def probe(dtype: torch.dtype) -> str | None:
        inputs = subject.inputs(length, dtype)
        with torch.no_grad():
            out = call(subject.build(length), inputs)
        problem = layout_problem(out, inputs[0])
        if problem is None and not torch.isfinite(out).all():
            problem = "non-finite output"
        return problem

    cases = (
        (f"{dtype_name(dtype)}, length {length}", functools.partial(probe, dtype))
        for dtype in (torch.float32, torch.bfloat16)
    )
    return first_failure("dtypes", cases) or CheckResult(
        "dtypes", True, f"float32 -> float32, bfloat16 -> bfloat16, finite (length {length})"
    )


def check_large_inputs(subject: Subject, length: int) -> CheckResult:
    name = "large-inputs"
    where = f"float32, inputs x{LARGE_INPUT_SCALE:g}, length {length}"
    try:
        mechanism = subject.build(length)
        inputs = [
            x.requires_grad_()
            for x in subject.inputs(length, torch.float32, scale=LARGE_INPUT_SCALE)
        ]
        out = call(mechanism, inputs)
        if not torch.isfinite(out).all():
            return CheckResult(name, False, f"non-finite output ({where})")
        wrt = [*inputs, *(p for p in mechanism.parameters() if p.requires_grad)]
        if out.requires_grad:
            probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(SEED))
            grads = torch.autograd.grad(
                out, wrt, probe.to(out), allow_unused=True, materialize_grads=True
            )
            if not all(torch.isfinite(g).all() for g in grads):
                return CheckResult(name, False, f"non-finite gradient ({where})")
    except BaseException as exc:  # sys.exit in plugin code too
        return failure(name, caught(exc), where)
    return CheckResult(name, True, f"finite outputs and gradients ({where})")


def check_determinism(subject: Subject, length: int) -> CheckResult:
    name = "determinism"
    for mode in MODES:
        where = f"float32, {mode} mode, length {length}"
        try:
            outs = []
            for _ in range(2):
                mechanism = set_mode(subject.build(length), mode)
                with torch.no_grad():
                    outs.append(call(mechanism, subject.inputs(length, torch.float32)))
            first, second = outs
            if not _bit_identical(first, second):
                return CheckResult(name, False, f"two calls from one seed differ ({where})")
        except BaseException as exc:  # sys.exit in plugin code too
            return failure(name, caught(exc), where)
    return CheckResult(name, True, f"bit-identical twice from one seed (train and eval, "
                                   f"length {length})")  # fmt: skip


def _bit_identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))


def check_state_size(subject: Subject, lengths: Sequence[int]) -> CheckResult:
    """At the given lengths and twice the longest (so that one length still shows growth)."""
    name = "state-size"
    points = sorted({*lengths, 2 * max(lengths)})
    complexity = MECHANISMS.entry(subject.name).metadata["complexity"]
    try:
        mechanism = subject.build(points[-1])
        if not callable(getattr(mechanism, "state_size", None)):
            return CheckResult(name, True, "not declared (optional: reports show the state "
                                           "as unknown)")  # fmt: skip
        sizes = [mechanism.state_size(length) for length in points]
    except BaseException as exc:  # sys.exit in plugin code too
        return failure(name, caught(exc), "state_size")
    for length, size in zip(points, sizes, strict=True):
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            return CheckResult(name, False, f"state_size({length}) = {size!r}, not an int >= 0")
    if any(b < a for a, b in zip(sizes, sizes[1:], strict=False)):
        return CheckResult(name, False, f"state_size shrinks as the length grows: {sizes}")
    span = f"L {points[0]}..{points[-1]}"
    if sizes[0] == sizes[-1]:
        return CheckResult(name, True, f"{sizes[0]:,} numbers per head at every L ({span})")
    if complexity == "linear":
        return CheckResult(
            name, False, f"registered complexity linear, but state_size grows from "
            f"{sizes[0]:,} to {sizes[-1]:,} ({span})"
        )  # fmt: skip
    return CheckResult(name, True, f"{sizes[0]:,} to {sizes[-1]:,} numbers per head ({span}; "
                                   f"complexity {complexity})")  # fmt: skip


# every check of ``check_mechanism``, in its order: one at a time (``run_check``), a command
# that runs them in a child process can say which one ended it (integrity/isolation.py)
CHECKS = ("layout", "causality", "causality-forward", "dtypes", "large-inputs", "determinism",
          "state-size", "recurrent")  # fmt: skip


def check_mechanism(subject: Subject, lengths: Sequence[int]) -> list[CheckResult]:
    """Every check (``synthbench check``); the single-length ones at the longest length."""
    return [result for name in CHECKS for result in run_check(name, subject, lengths)]


def run_check(name: str, subject: Subject, lengths: Sequence[int]) -> list[CheckResult]:
    """The check ``name`` of ``CHECKS`` (none for ``recurrent`` where the mechanism has no
    recurrent form), leaving torch's random state as it found it; single-length checks at the
    longest of ``lengths``."""
    lengths = sorted(set(lengths))
    longest = lengths[-1]
    checks = {
        "layout": lambda: [check_layout(subject, lengths)],
        "causality": lambda: [check_causality(subject, lengths)],
        "causality-forward": lambda: [check_forward_causality(subject, lengths)],
        "dtypes": lambda: [check_dtypes(subject, longest)],
        "large-inputs": lambda: [check_large_inputs(subject, longest)],
        "determinism": lambda: [check_determinism(subject, longest)],
        "state-size": lambda: [check_state_size(subject, lengths)],
        "recurrent": lambda: _recurrent_if_any(subject, lengths),
    }
    with own_random_state(subject.device):
        return checks[name]()


def _recurrent_if_any(subject: Subject, lengths: Sequence[int]) -> list[CheckResult]:
    """The recurrent check of a mechanism with a recurrent form; none without one. Telling
    which builds the mechanism: what that raises is the check's failure."""
    try:
        recurrent = subject.has_recurrent_form()
    except BaseException as exc:  # sys.exit in plugin code too
        return [failure("recurrent", caught(exc), "built at length 1")]
    return [check_recurrent(subject, lengths)] if recurrent else []


def check_recurrent(subject: Subject, lengths: Sequence[int]) -> CheckResult:
    """A mechanism with a recurrent form (``step``): token by token it gives the causal
    ``forward``'s outputs, in float64, in evaluation mode."""
    name = "recurrent"
    checked = sorted({*RECURRENT_LENGTHS, min(lengths)})

    def probe(length: int) -> str | None:
        mechanism = subject.build(length).to(torch.float64).eval()
        inputs = subject.inputs(length, torch.float64)
        with torch.no_grad():
            parallel = call(mechanism, inputs)
            seed_torch(SEED)
            q, k, v, *rest = inputs
            stepped = recurrent_forward(
                mechanism, q, k, v, **dict(zip(extra_inputs(mechanism), rest, strict=True))
            )
        scale = max(float(parallel.abs().max()), 1.0)
        error = float((stepped - parallel).abs().max())
        if not error <= RECURRENT_TOLERANCE * scale:  # a NaN fails too
            return f"step by step differs from forward by {error:.2g} (output scale {scale:.2g})"
        return None

    cases = ((f"float64, length {n}", functools.partial(probe, n)) for n in checked)
    return first_failure(name, cases) or CheckResult(
        name, True, f"step-by-step outputs equal forward's (float64; lengths "
        f"{', '.join(map(str, checked))})"
    )  # fmt: skip
