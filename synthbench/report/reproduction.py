"""Whether a reference run made again reproduces it (``synthbench reproduce``).

- ``spec_of`` rebuilds a stored run's ``RunSpec`` (``StaleReference`` when today's run id
  differs);
- ``compare`` tells whether a run made again reproduces the reference's: identical on the
  same torch build, thread count, device type and CPU (``setting_difference``), else within
  ``tolerance``: ``SPREAD`` standard deviations of the reference's values over the seeds of
  the run's cell (``cell_key``: the runs that differ only in their seed), pooled over the
  protocol's cells where its own has one seed (``pooled_std``).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from synthbench.core.text import plural

# the tolerance of a run made on another torch build, thread count or device type:
# max(SPREAD x the std over the reference's seeds of its cell, 1 / test examples) (tolerance)
SPREAD = 3


class StaleReference(ValueError):
    """A reference run that today's synthbench resolves to another run id (or protocol
    version): the reference was made by another version of the code; rebuild it."""


def spec_of(row: dict[str, Any] | pd.Series, threads: int | None = None):
    """The ``RunSpec`` of a stored run (one of its rows), resolved today from what the row
    says; ``StaleReference`` when its protocol version or run id differs from the stored
    one. ``threads``: resolve it at another thread count instead (another run id)."""
    from synthbench.run.protocols import PROTOCOLS
    from synthbench.run.spec import RunSpec

    label = f"{row['task']} / {row['mechanism']} / seed {row['seed']}"
    name, version = str(row["protocol"]), int(row["protocol_version"])
    if name not in PROTOCOLS or PROTOCOLS.get(name).version != version:
        here = f"v{PROTOCOLS.get(name).version}" if name in PROTOCOLS else "unknown"
        raise StaleReference(
            f"the reference is stale: {label} is of protocol {name} v{version}, this "
            f"synthbench's is {here}; rebuild it (benchmarks/build_reference.py)"
        )
    protocol = PROTOCOLS.get(name)
    config = json.loads(row["config"]) if isinstance(row.get("config"), str) else {}
    pos = config.get("protocol", {}).get("pos")
    mult = row.get("eval_length_mult")
    mult = None if mult is None or (isinstance(mult, float) and math.isnan(mult)) else float(mult)
    stored_threads = int(row["threads"]) if pd.notna(row.get("threads")) else 1
    try:

        def resolve(at_threads: int):
            return RunSpec.resolve(
                str(row["task"]), str(row["mechanism"]), protocol, int(row["seed"]),
                json.loads(row["task_params"] or "{}"), json.loads(row["mechanism_params"] or "{}"),
                mult, pos if pos not in (None, protocol.pos) else None,
                config.get("pos_params"), at_threads,
            )  # fmt: skip

        spec = resolve(stored_threads)
    except (ValueError, TypeError, KeyError) as exc:  # KeyError: a name unknown here
        raise StaleReference(
            f"the reference is stale: {label} cannot be resolved today ({exc}); rebuild it "
            "(benchmarks/build_reference.py)"
        ) from None
    if spec.run_id != row["run_id"]:
        raise StaleReference(
            f"the reference is stale: {label} resolves to run id {spec.run_id} today, the "
            f"reference stores {row['run_id']} (its config changed since it was made); rebuild "
            "it (benchmarks/build_reference.py)"
        )
    if threads is not None and threads != spec.threads:
        spec = resolve(threads)
    return spec


# the columns a run made again must give bit for bit where identical is expected
IDENTICAL_COLUMNS = (
    "status", "selected", "lr_edge", "steps_done", "token_acc", "exact_match", "val_token_acc",
    "val_exact_match", "free_token_acc", "token_acc_se", "exact_match_se", "free_token_acc_se",
    "curve_steps", "curve_val_token_acc", "long_token_acc", "long_exact_match", "final_loss",
    "n_params",
)  # fmt: skip


@dataclass(frozen=True)
class Verdict:
    verdict: str  # IDENTICAL, WITHIN or NOT_REPRODUCED
    reference: float | None  # the selected target metric (None: no successful lr)
    reproduced: float | None
    identical_expected: bool  # same torch build, thread count, device type and CPU
    tolerance: float | None = None  # where not identical_expected
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict != NOT_REPRODUCED


IDENTICAL, WITHIN, NOT_REPRODUCED = "identical", "within", "NOT reproduced"


def _scored(values: Iterable[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and not math.isnan(float(v))]


def tolerance(
    seed_values: Sequence[float], test_examples: int, pooled: float | None = None
) -> float:
    """How far a run made on another torch build, thread count or device may land from the
    reference: ``SPREAD`` (3) times the standard deviation (ddof 1) of the reference's
    selected target metric over the seeds of the run's cell (its runs that differ only in
    their seed: ``cell_key``), at least one test example's worth (1 / test_examples). A cell
    of fewer than two scored seeds (a ladder's level at the suite's default seeds) has no
    spread of its own: ``pooled`` (``pooled_std`` of its protocol's cells) stands in, where
    given."""
    values = _scored(seed_values)
    if len(values) > 1:
        std = float(np.std(values, ddof=1))
    else:
        std = pooled or 0.0
    return max(SPREAD * std, 1.0 / max(1, int(test_examples)))


def pooled_std(cells: Iterable[Sequence[float]]) -> tuple[float, int] | None:
    """The pooled standard deviation over cells of seeds, sqrt(sum (n_i - 1) s_i^2 / sum
    (n_i - 1)), of the cells with at least two scored values, and how many cells it pools;
    None where no cell has two."""
    squares, freedom, pooled = 0.0, 0, 0
    for cell in cells:
        values = _scored(cell)
        if len(values) > 1:
            squares += float(np.var(values, ddof=1)) * (len(values) - 1)
            freedom += len(values) - 1
            pooled += 1
    return (math.sqrt(squares / freedom), pooled) if freedom else None


def cell_key(row: dict[str, Any]) -> str:
    """What a reference run shares with the runs of its cell, those that differ from it only
    in their seed: its stored config without the seed (``RunSpec.config``; the run id hashes
    the whole of it). A laddered task's levels are cells of their own."""
    config = json.loads(row["config"])
    config.pop("seed", None)
    return json.dumps(config, sort_keys=True)


def selected_value(rows: Sequence[dict[str, Any]]) -> float | None:
    """A run's result: the target metric of its selected, successful lr (None: none)."""
    for row in rows:
        if row.get("selected") and row.get("status") == "ok":
            value = row.get(row.get("target_metric") or "token_acc")
            return None if _missing(value) else float(value)
    return None


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def device_type(device) -> str:
    """``cuda:1`` -> ``cuda``: the kind of device a row trained on, not which one."""
    return str(device).split(":", 1)[0]


def setting_difference(reference: dict[str, Any], here: dict[str, Any]) -> str | None:
    """Why a run made ``here`` need not give the ``reference`` row's numbers bit for bit
    (another torch build, thread count, device type, a GPU, or on a CPU another vector
    instruction set or CPU model, or one the reference does not record), or None where it
    must."""

    def known(row, column: str) -> str | None:
        value = row.get(column)
        return None if _missing(value) or value == "unknown" else str(value)

    if str(reference.get("torch_version")) != str(here.get("torch_version")):
        return f"torch {reference.get('torch_version')} made it, {here.get('torch_version')} here"
    made_threads, threads = int(reference.get("threads") or 1), int(here.get("threads") or 1)
    if made_threads != threads:
        return f"{plural(made_threads, 'thread')} made it, {threads} here"
    if device_type(reference.get("device")) != device_type(here.get("device")):
        return f"made on {reference.get('device')}, here on {here.get('device')}"
    if device_type(here.get("device")) != "cpu":
        # torch's deterministic mode is not set, and a GPU packs trainings (math attention)
        return f"on {device_type(here.get('device'))}, kernels need not repeat bit for bit"
    # on a CPU, float32 sums follow the vector width, and the kernels the math libraries
    # pick for the microarchitecture (two AVX512 machines have differed)
    made, now = known(reference, "cpu_isa"), known(here, "cpu_isa")
    if made is None:
        return "the reference does not record its CPU's instruction set"
    if made != now:
        return f"made on a CPU with {made}, here {now or 'unknown'}"
    made, now = known(reference, "cpu_model"), known(here, "cpu_model")
    if made is None:
        return "the reference does not record its CPU model"
    if made != now:
        return f"made on {made}, here on {now or 'an unknown CPU'}"
    return None


def _bits(value) -> Any:
    """A value in a form that compares bit for bit: floats by their bytes (NaN and None
    alike, for a missing value), lists element-wise."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return tuple(_bits(v) for v in value)
    if _missing(value):
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, float, np.integer, np.floating)):  # an int read back as a float
        return struct.pack("<d", float(value))
    return value


def _first_difference(reference: Sequence[dict], reproduced: Sequence[dict]) -> str | None:
    """Where two runs' rows differ in a result column, or None when bit-identical."""
    from synthbench.run.schema import lr_key

    ref = {lr_key(r["lr"]): r for r in reference}
    new = {lr_key(r["lr"]): r for r in reproduced}
    if set(ref) != set(new):
        only = lambda lrs: ", ".join(f"{lr:g}" for lr in sorted(lrs)) or "none"  # noqa: E731
        return f"lrs trained differ (reference {only(ref)}; now {only(new)})"
    for lr in sorted(ref):
        for column in IDENTICAL_COLUMNS:
            if _bits(ref[lr].get(column)) != _bits(new[lr].get(column)):
                then, now = ref[lr].get(column), new[lr].get(column)
                return f"{column} at lr {lr:g}: {then!r} in the reference, {now!r} now"
    return None


def compare(
    reference: Sequence[dict[str, Any]],
    reproduced: Sequence[dict[str, Any]],
    seed_values: Sequence[float],
    test_examples: int,
    pooled: float | None = None,
) -> Verdict:
    """Whether ``reproduced`` (the rows of a run made again) reproduces ``reference`` (its
    stored rows). Bit-identical results (the same selected lr and every result column of
    every lr, ``IDENTICAL_COLUMNS``) always do; where both were made in the same setting
    (``setting_difference``: torch build, thread count, device type, CPU instruction set)
    only they do. Elsewhere the selected target metric must lie within
    ``tolerance(seed_values, test_examples, pooled)`` of the reference's, ``seed_values``
    being the reference's results over the seeds of the run's cell (``pooled``: the spread
    that stands in where the cell has one seed), and the verdict says why bit-identity could
    not be asked for."""
    before, now = selected_value(reference), selected_value(reproduced)
    difference = _first_difference(reference, reproduced) if reference and reproduced else ""
    if difference is None:
        return Verdict(IDENTICAL, before, now, True)
    why = setting_difference(reference[0], reproduced[0]) if difference else "no rows"
    if why is None:
        return Verdict(NOT_REPRODUCED, before, now, True, reason=f"not identical: {difference}")
    limit = tolerance(seed_values, test_examples, pooled)
    if before is None or now is None:
        if before is None and now is None:  # neither has a result: both failed alike
            reason = f"no successful lr, as the reference ({why})"
            return Verdict(WITHIN, before, now, False, limit, reason)
        reason = (
            "no successful lr now, the reference has one"
            if now is None
            else "a successful lr now, the reference has none"
        )
        return Verdict(NOT_REPRODUCED, before, now, False, limit, reason)
    off = abs(now - before)
    if off <= limit:
        return Verdict(WITHIN, before, now, False, limit, f"not bit-identical: {why}")
    reason = f"off by {off:.4f} > {limit:.4f} ({why})"
    return Verdict(NOT_REPRODUCED, before, now, False, limit, reason)
