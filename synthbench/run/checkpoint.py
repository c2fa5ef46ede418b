"""Checkpoints of a training in progress: a training that is killed (a session's end, a
preempted machine, Ctrl-C) resumes from its last checkpoint instead of from step 0, and
ends with the row it would have had uninterrupted.

A training (``train.train_eval``) handed a checkpoint path writes, every
``CHECKPOINT_SECONDS`` of training and after a whole step, everything its remaining steps
depend on: the model, the optimizer and the lr schedule, the generator of its training
batches, torch's global generator, the learning curve so far, the recent losses and where
the lr schedule ends now (``horizon``: past the protocol's steps once a training still
rising was extended, train.Horizon). The runner puts the file under the results tree
(``<results>/.checkpoints/<run id>-lr<lr>.pt``: a hidden folder, which the store and the
readers skip) and deletes it once the training's row is stored. A checkpoint is only taken
up by the same training: the same run id, lr and budget, and the same torch build, device
type and CPU instruction set, whose arithmetic it continues (``identity``); any other file
there, or one that cannot be read, is ignored and replaced.
tests/test_checkpoint.py checks that a training interrupted and resumed stores the same row,
every metric equal, as one that never stopped.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import torch

from synthbench.core.atomic import write_atomically
from synthbench.run.provenance import cpu_isa, cpu_model
from synthbench.run.schema import lr_key

CHECKPOINT_SECONDS = 120.0  # training time between two checkpoints (a save takes milliseconds)
FOLDER = ".checkpoints"  # under the results root


def path_for(root: Path, run_id: str, lr: float) -> Path:
    """Where the training of ``run_id`` at ``lr`` keeps its checkpoint under ``root``."""
    return Path(file_for(root, run_id, lr))


def file_for(root: Path | str, run_id: str, lr: float) -> str:
    """``path_for`` as text, without pathlib's parsing: planned once per training."""
    return os.path.join(root, FOLDER, f"{run_id}-lr{lr_key(lr)!r}.pt")


def identity(run_id: str, lr: float, budget: Any, device: torch.device) -> dict[str, str]:
    """What a checkpoint must have been written by to be resumed: the training (run id, lr,
    budget) and the arithmetic it continues (torch build, device type and, on a CPU, its
    instruction set and model, which `synthbench reproduce` counts as part of a row's
    setting too: a results tree on shared storage may be resumed by another machine)."""
    return {
        "run_id": run_id,
        "lr": repr(lr_key(lr)),
        "budget": repr(budget),
        "torch": str(torch.__version__),
        "device": device.type,
        "cpu_isa": cpu_isa() if device.type == "cpu" else "",
        "cpu_model": cpu_model() if device.type == "cpu" else "",
    }


def capture(model, optimizer, scheduler, batches: torch.Generator) -> dict[str, Any]:
    """What a training's arithmetic continues from: the model, the optimizer and the lr
    schedule, the generator of its training batches and torch's global generator (nothing
    draws from it after the model is built, but a mechanism might)."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "batches": batches.get_state(),
        "torch_rng": torch.get_rng_state(),
    }


def restore(state: dict[str, Any], model, optimizer, scheduler, batches: torch.Generator) -> None:
    """Put what ``capture`` took back into a training built as the original was."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    batches.set_state(state["batches"])
    torch.set_rng_state(state["torch_rng"])


def save(path: Path, ident: dict[str, str], state: dict[str, Any]) -> bool:
    """Write ``state`` (tensors, numbers, strings, lists and dicts of them) with ``ident``,
    atomically: a kill while writing leaves the previous checkpoint as it was. False when it
    could not be written (a full disk, a folder this machine cannot write: a Ray worker's,
    say): the training goes on without checkpoints, its result unchanged."""
    buffer = io.BytesIO()
    torch.save({"identity": ident, **state}, buffer)
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_atomically(Path(path), buffer.getvalue())
    except OSError:
        return False
    return True


def load(path: Path, ident: dict[str, str]) -> dict[str, Any] | None:
    """The state saved at ``path`` by the training ``ident`` names, on the CPU; None when
    there is none, or the file is another training's or cannot be read (it is replaced at
    the next save)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - a torn or foreign file: start over, never fail
        return None
    if not isinstance(state, dict) or state.get("identity") != ident:
        return None
    return state


def discard(path: Path) -> None:
    """Delete a checkpoint whose training is over (a missing one is fine)."""
    path.unlink(missing_ok=True)
