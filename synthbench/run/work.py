"""What an executor is handed: one training (``runner.Unit``) or a ``Pack`` of them trained
as one batched model (synthbench/run/packed.py), and how many a pack holds by default."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from synthbench.run import tracking
from synthbench.run.packed import train_packed
from synthbench.run.train import train_eval


@dataclass(frozen=True)
class Pack:
    """Trainings handed to an executor as one: ``units`` (``runner.Unit``: a spec, an lr,
    a budget) of runs that differ at most in their seed, trained by ``train_packed``."""

    units: tuple

    @property
    def key(self) -> tuple:
        return tuple(u.key for u in self.units)

    def label(self) -> str:
        return f"{len(self.units)} packed: " + ", ".join(u.label() for u in self.units)


def trainings_of(work) -> tuple:
    """The units of ``work``: a ``Pack``'s, or a single unit."""
    return work.units if isinstance(work, Pack) else (work,)


def train_work(
    work, device: torch.device, logs: tracking.Tracking | None = None
) -> list[dict[str, Any]]:
    """The rows of ``work`` (a unit or a ``Pack``), one per unit in order; never raises for
    a training (as ``train_eval``). ``logs``: where each training logs (``--log``)."""
    with tracking.logging_to(logs):
        if isinstance(work, Pack):
            members = [(u.spec, u.lr) for u in work.units]
            return train_packed(members, device, [u.budget for u in work.units])
        return [train_eval(work.spec, work.lr, device, work.budget, work.checkpoint)]


MAX_PACK = 64  # trainings in one pack, at most (--pack)
GPU_PACK = 16  # a GPU's default: a quick model uses a sliver of one


def default_pack(device: torch.device) -> int:
    """Trainings per pack where ``--pack`` is not given: packed on a GPU; one at a time on
    a CPU, where packing measured slower (docs/BENCHMARKS.md, "Packed training")."""
    return GPU_PACK if device.type == "cuda" else 1
