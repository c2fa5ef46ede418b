"""``synthbench bench decode``: per-token decoding latency and state memory of every mechanism
with a recurrent form (``initial_state``/``step``, synthbench/core/mechanism.py), softmax's KV
cache among them.

For every (mechanism, context length L) point: the mechanism at its default parameters (seed
0, told the longest sequence it will see: max L + tokens, as a model would), in evaluation
mode, float32, under ``torch.no_grad()``; random N(0, 1) q, k, v of (batch, heads, head_dim)
per token, and N(0, 1) extra inputs of the widths the mechanism declares (``extra_inputs``).

1. prefill: the state after L tokens, through L calls of ``step``, or through the
   mechanism's ``prefill(q, k, v, **extra)`` where it has one (softmax: the cache is its k
   and v, without L growing copies; a test proves it gives the state the steps give);
2. state memory: the sum of ``nbytes`` of the tensors in that state (measured, not
   declared), beside the declared ``state_size(L)`` x heads numbers;
3. latency: ``tokens`` further ``step`` calls from a copy of that state, timed together (the
   wall clock on a CPU, CUDA events on a GPU) and divided by ``tokens``.

Timing is paired, as this project compares timings: every round times every point once,
the order reversed from one round to the next (drift on a shared machine falls on all of
them alike); after ``warmup`` untimed rounds, ``repeats`` timed ones give each point its
median per-token latency and its median ratio to the reference mechanism (softmax where it
is measured, else the first) at the same L in the same round.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import torch
from torch import nn

from synthbench.bench.common import params_json, sync, timed_ms
from synthbench.core.mechanism import MECHANISMS, extra_inputs, has_recurrent_form, mechanism_params
from synthbench.core.model import prepared_mechanism
from synthbench.core.text import plural

KIND = "decode"
DEFAULT_LENGTHS = (256, 1024, 4096)
DTYPE = torch.float32
REFERENCE = "softmax"  # the ratios' reference where it is measured

METRICS = [
    ("complexity", pa.string()),
    ("head_dim", pa.int64()),
    ("heads", pa.int64()),
    ("batch", pa.int64()),
    ("tokens", pa.int64()),  # steps timed after the prefill
    ("us_per_token", pa.float64()),  # median over the rounds of the microseconds per step
    ("ratio", pa.float64()),  # median over the rounds of us_per_token / the reference's
    ("reference", pa.string()),  # the mechanism of the ratio (same L, same round)
    ("state_bytes", pa.int64()),  # measured: sum of nbytes of the state's tensors after L
    ("declared_state", pa.int64()),  # state_size(L) x heads: numbers per sequence
    ("declared_bytes", pa.int64()),  # declared_state x batch x the dtype's bytes
    ("prefill", pa.string()),  # how the state was filled: "step" or "prefill"
    ("dtype", pa.string()),
    ("repeats", pa.int64()),
    ("warmup", pa.int64()),
    ("threads", pa.int64()),
]


@dataclass(frozen=True)
class DecodeSetup:
    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    tokens: int = 64
    batch: int = 1
    head_dim: int = 16
    heads: int = 4
    repeats: int = 11
    warmup: int = 1
    threads: int = 1
    device: str = "cpu"

    def __post_init__(self) -> None:
        problems = []
        if not self.lengths:
            problems.append("--lengths names no length")
        elif min(self.lengths) < 1:
            problems.append(f"--lengths must be >= 1, got {min(self.lengths)}")
        at_least_one = {
            "--tokens": self.tokens,
            "--batch": self.batch,
            "--head-dim": self.head_dim,
            "--heads": self.heads,
            "--repeats": self.repeats,
            "--threads": self.threads,
        }
        for option, value in at_least_one.items():
            if value < 1:
                problems.append(f"{option} must be >= 1, got {value}")
        if self.warmup < 0:
            problems.append(f"--warmup must be >= 0, got {self.warmup}")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def max_len(self) -> int:
        """The longest sequence a mechanism sees: the longest prefill and the timed steps."""
        return max(self.lengths) + self.tokens


def parse_lengths(value: str) -> tuple[int, ...]:
    """'256,1024,4096' -> (256, 1024, 4096), sorted, each once; a ValueError names a bad one."""
    lengths = []
    for part in (p.strip() for p in value.split(",") if p.strip()):
        try:
            length = int(part)
        except ValueError:
            raise ValueError(
                f"--lengths takes comma-separated integers >= 1, got {part!r} in {value!r}"
            ) from None
        if length < 1:
            raise ValueError(f"--lengths must be >= 1, got {length}")
        lengths.append(length)
    if not lengths:
        raise ValueError(f"--lengths names no length: {value!r}")
    return tuple(sorted(set(lengths)))


# -- the mechanisms -------------------------------------------------------------------------


def build(name: str, setup: DecodeSetup) -> nn.Module:
    """Mechanism ``name`` at its defaults, seed 0, told the longest sequence, in evaluation
    mode on the device; a ValueError names it if it cannot be built."""
    cls = MECHANISMS.get(name)
    torch.manual_seed(0)
    try:
        mechanism = prepared_mechanism(lambda: cls(setup.head_dim, setup.heads), setup.max_len)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"mechanism {name}: {exc}") from exc
    return mechanism.to(setup.device).eval()


def recurrent_names(names: Sequence[str], setup: DecodeSetup) -> tuple[list[str], list[str]]:
    """(those of ``names`` with a recurrent form, those without)."""
    with_form, without = [], []
    for name in names:
        (with_form if has_recurrent_form(build(name, setup)) else without).append(name)
    return with_form, without


def select(names: Sequence[str], setup: DecodeSetup, explicit: bool) -> tuple[list[str], list[str]]:
    """The mechanisms to measure and those skipped. Named explicitly, one without a
    recurrent form is a ValueError; out of 'all', it is skipped."""
    chosen, skipped = recurrent_names(names, setup)
    if skipped and explicit:
        known = recurrent_names(MECHANISMS.names(), setup)[0]
        verb = "has" if len(skipped) == 1 else "have"
        raise ValueError(
            f"{', '.join(skipped)} {verb} no recurrent form (initial_state and step), so cannot "
            f"decode token by token; mechanisms with one: {', '.join(known) or 'none'}"
        )
    if not chosen:
        raise ValueError("no selected mechanism has a recurrent form (initial_state and step)")
    return chosen, skipped


# -- states ---------------------------------------------------------------------------------


def state_tensors(state: Any) -> list[torch.Tensor]:
    """The tensors in a state (a tensor, or tuples, lists and dicts of them and of other
    values, such as a position)."""
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        state = list(state.values())
    if isinstance(state, list | tuple):
        return [t for part in state for t in state_tensors(part)]
    return []


def state_bytes(state: Any) -> int:
    """Bytes of the tensors in a state: the sum of their ``nbytes``."""
    return sum(t.nbytes for t in state_tensors(state))


def copy_state(state: Any) -> Any:
    """A deep copy of the tensors of a state (a step may update its state in place)."""
    if isinstance(state, torch.Tensor):
        return state.clone()
    if isinstance(state, dict):
        return {key: copy_state(value) for key, value in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(copy_state(part) for part in state)
    return state


@dataclass
class Tokens:
    """q, k, v (batch, heads, length, head_dim) and the extra inputs, random N(0, 1)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    extra: dict[str, torch.Tensor]

    @classmethod
    def draw(cls, mechanism: nn.Module, length: int, setup: DecodeSetup, seed: int) -> Tokens:
        generator = torch.Generator().manual_seed(seed)

        def normal(width: int) -> torch.Tensor:
            shape = (setup.batch, setup.heads, length, width)
            x = torch.randn(shape, generator=generator, dtype=DTYPE)
            return x.to(setup.device)

        q, k, v = (normal(setup.head_dim) for _ in range(3))
        extra = {name: normal(width) for name, width in extra_inputs(mechanism).items()}
        return cls(q, k, v, extra)

    def at(self, t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """The inputs of position t, contiguous (batch, heads, width)."""
        q, k, v = (x[..., t, :].contiguous() for x in (self.q, self.k, self.v))
        return q, k, v, {name: x[..., t, :].contiguous() for name, x in self.extra.items()}


def prefill(mechanism: nn.Module, tokens: Tokens, setup: DecodeSetup) -> tuple[Any, str]:
    """(the state after the tokens, how it was made: "prefill" or "step")."""
    with torch.no_grad():
        if callable(getattr(mechanism, "prefill", None)):
            return mechanism.prefill(tokens.q, tokens.k, tokens.v, **tokens.extra), "prefill"
        state = mechanism.initial_state(setup.batch, torch.device(setup.device), DTYPE)
        for t in range(tokens.q.shape[-2]):
            q, k, v, extra = tokens.at(t)
            _, state = mechanism.step(state, q, k, v, **extra)
        return state, "step"


# -- the measurement ------------------------------------------------------------------------


@dataclass
class Point:
    name: str
    seq_len: int
    mechanism: nn.Module
    state: Any = None
    steps: list[tuple] = field(default_factory=list)  # the timed tokens' inputs
    how: str | None = None
    status: str = "ok"
    error: str | None = None
    times: dict[int, float] = field(default_factory=dict)  # round -> microseconds per token

    def decode(self, state: Any) -> torch.Tensor:
        out = None
        for q, k, v, extra in self.steps:
            out, state = self.mechanism.step(state, q, k, v, **extra)
        return out

    def fail(self, status: str, exc: BaseException | str) -> None:
        message = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        self.status, self.error = status, " ".join(message.split())[:500]


def prepare(names: Sequence[str], setup: DecodeSetup) -> list[Point]:
    """A point per (mechanism, length), its state prefilled; a mechanism that raises there
    gets an ``error`` point and the others go on."""
    points = []
    for name in names:
        mechanism = build(name, setup)
        for seq_len in setup.lengths:
            point = Point(name, seq_len, mechanism)
            try:
                point.state, point.how = prefill(
                    mechanism, Tokens.draw(mechanism, seq_len, setup, seed=seq_len), setup
                )
                timed = Tokens.draw(mechanism, setup.tokens, setup, seed=seq_len + 1)
                point.steps = [timed.at(t) for t in range(setup.tokens)]
            except Exception as exc:  # a mechanism's bug: stored, not fatal
                point.fail("error", exc)
            points.append(point)
    return points


def measure(names: Sequence[str], setup: DecodeSetup) -> list[dict[str, Any]]:
    """Every (mechanism, length) point, timed in interleaved rounds; one row each."""
    previous = torch.get_num_threads()
    torch.set_num_threads(setup.threads)
    try:
        with torch.no_grad():
            points = prepare(names, setup)
            rounds = setup.warmup + setup.repeats
            for r in range(rounds):
                order = points if r % 2 == 0 else points[::-1]
                for point in order:
                    if point.status == "ok":
                        _time_once(point, setup, r)
    finally:
        torch.set_num_threads(previous)
    return rows_of(points, setup)


def _time_once(point: Point, setup: DecodeSetup, round_: int) -> None:
    """Time the point's steps from a copy of its state; keep the time after the warm-up."""
    device = torch.device(setup.device)
    state = copy_state(point.state)
    sync(device)
    result = []
    try:
        ms = timed_ms(lambda: result.append(point.decode(state)), device)
    except Exception as exc:
        point.fail("error", exc)
        return
    if round_ == 0 and not bool(torch.isfinite(result[0]).all()):
        point.fail("nonfinite", "a decoded output is not finite")
    elif round_ >= setup.warmup:
        point.times[round_] = ms * 1e3 / setup.tokens


def rows_of(points: list[Point], setup: DecodeSetup) -> list[dict[str, Any]]:
    names = list(dict.fromkeys(p.name for p in points))
    reference = REFERENCE if REFERENCE in names else names[0]
    by = {(p.name, p.seq_len): p for p in points}
    element = torch.empty((), dtype=DTYPE).element_size()
    rows = []
    for p in points:
        ref = by[(reference, p.seq_len)]
        ratios = [t / ref.times[r] for r, t in p.times.items() if ref.times.get(r, 0) > 0]
        declared = p.mechanism.state_size(p.seq_len) * setup.heads
        entry = MECHANISMS.entry(p.name)
        rows.append(
            {
                "mechanism": p.name,
                "label": p.name,
                "params": params_json(mechanism_params(entry.obj)),
                "seq_len": p.seq_len,
                "status": p.status,
                "error": p.error,
                "complexity": entry.metadata["complexity"],
                "head_dim": setup.head_dim,
                "heads": setup.heads,
                "batch": setup.batch,
                "tokens": setup.tokens,
                "us_per_token": statistics.median(p.times.values()) if p.status == "ok" else None,
                "ratio": statistics.median(ratios) if p.status == "ok" and ratios else None,
                "reference": reference,
                "state_bytes": state_bytes(p.state) if p.state is not None else None,
                "declared_state": declared,
                "declared_bytes": declared * setup.batch * element,
                "prefill": p.how,
                "dtype": str(DTYPE).removeprefix("torch."),
                "repeats": setup.repeats,
                "warmup": setup.warmup,
                "threads": setup.threads,
            }
        )
    return rows


# -- printing -------------------------------------------------------------------------------


def size(n: float) -> str:
    """Bytes, readable: 512 B, 12.0 KiB, 2.00 MiB."""
    if n < 1024:
        return f"{n:.0f} B"
    if n < 2**20:
        return f"{n / 1024:.1f} KiB"
    if n < 2**30:
        return f"{n / 2**20:.2f} MiB"
    return f"{n / 2**30:.2f} GiB"


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    reference = rows[0]["reference"] if rows else REFERENCE
    width = max([len("mechanism"), *(len(r["mechanism"]) for r in rows)])
    lines = [
        f"{'mechanism':<{width}} {'L':>7} {'us/token':>9} {'x ' + reference:>12} "
        f"{'state (measured)':>16} {'declared x heads':>16} {'measured/declared':>17}"
    ]
    for r in rows:
        head = f"{r['mechanism']:<{width}} {r['seq_len']:>7}"
        if r["status"] != "ok":
            lines.append(f"{head}  {r['status']}: {r['error']}")
            continue
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        declared = f"{r['declared_state']:,}"
        match = r["state_bytes"] / r["declared_bytes"] if r["declared_bytes"] else None
        lines.append(
            f"{head} {r['us_per_token']:>9.1f} {ratio:>12} {size(r['state_bytes']):>16} "
            f"{declared:>16} {'-' if match is None else f'{match:.2f}':>17}"
        )
    return lines


def growth_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per mechanism whose measured state grows with L (softmax's KV cache): its bytes at
    each L and the bytes added per token."""
    lines = []
    for name in dict.fromkeys(r["mechanism"] for r in rows):
        points = sorted(
            (r["seq_len"], r["state_bytes"])
            for r in rows
            if r["mechanism"] == name and r["state_bytes"] is not None
        )
        if len(points) < 2 or points[0][1] == points[-1][1]:
            continue
        (l0, b0), (l1, b1) = points[0], points[-1]
        at = ", ".join(f"L {n}: {size(b)}" for n, b in points)
        lines.append(f"{name} state grows with L: {at} (+{(b1 - b0) / (l1 - l0):,.0f} B per token)")
    return lines


def note(setup: DecodeSetup, device: str, reference: str) -> str:
    return (
        f"measured: {plural(setup.batch, 'sequence')}, {plural(setup.heads, 'head')} of "
        f"{setup.head_dim}, float32, {plural(setup.threads, 'torch thread')}, {device}, no "
        f"grad; the state prefilled "
        f"with L tokens, then {setup.tokens} further steps timed; per-token median of "
        f"{setup.repeats} rounds after {setup.warmup} warm-up, every point once per round "
        f"(interleaved); x {reference}: median of the per-round ratios at the same L; state: "
        f"sum of nbytes of the state's tensors after L tokens; declared: state_size(L) x "
        f"heads numbers (x 4 bytes x batch for measured/declared)"
    )
