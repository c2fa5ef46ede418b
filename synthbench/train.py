"""Train and evaluate one run: a (task, mechanism, protocol, seed) with every lr of the protocol.

A run is fully described by its :class:`RunSpec`; its ``run_id`` is a hash of the resolved
config, so the same config always maps to the same stored file (resume, no duplicates).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import synthbench
from synthbench.mechanism import MECHANISMS, mechanism_params
from synthbench.model import Model, check_position, make_rotation, position_params
from synthbench.protocols import Protocol
from synthbench.task import IGNORE, TASKS, Batch, Task

# Bump when a built-in task's generation changes, so stored rows are not reused for it.
SUITE_VERSION = 1
# Validation and test sets are drawn from these generator seeds, the same for every seed and
# mechanism; training seeds must stay below MAX_SEED so that they never coincide.
MAX_SEED = 1_000_000_000
VAL_SEED, TEST_SEED = MAX_SEED + 1, MAX_SEED + 2


@dataclass
class RunSpec:
    task: str
    mechanism: str
    protocol: Protocol
    seed: int
    task_params: dict[str, Any] = field(default_factory=dict)
    mechanism_params: dict[str, Any] = field(default_factory=dict)
    # also evaluate on the task with its length knob scaled by this (length generalisation)
    eval_length_mult: float | None = None
    # the complete parameters of protocol.pos: empty for learned, sinusoidal and none
    pos_params: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def resolve(
        cls,
        task: str,
        mechanism: str,
        protocol: Protocol,
        seed: int,
        task_overrides: dict[str, Any] | None = None,
        mechanism_overrides: dict[str, Any] | None = None,
        eval_length_mult: float | None = None,
        pos: str | None = None,
        pos_overrides: dict[str, Any] | None = None,
    ) -> RunSpec:
        """Canonical names and complete parameter sets (defaults filled in, validated).

        ``eval_length_mult`` is dropped for a task without a length knob. ``pos`` replaces
        the protocol's positional encoding (the protocol keeps its name and version; the
        change shows in its config), ``pos_overrides`` are the parameters of a rotation.
        """
        if not 0 <= seed < MAX_SEED:
            raise ValueError(f"seed must be in [0, {MAX_SEED}), got {seed}")
        if pos is not None:
            check_position(pos)
            protocol = dataclasses.replace(protocol, pos=pos)
        pos_params = position_params(protocol.pos, pos_overrides)
        # build the rotation once so that an invalid parameter fails here, before any run
        make_rotation(
            protocol.pos, protocol.d_model // protocol.n_heads, protocol.n_heads, pos_params
        )
        task_entry, mech_entry = TASKS.entry(task), MECHANISMS.entry(mechanism)
        task_obj = task_entry.obj(**(task_overrides or {}))
        task_params = task_obj.param_dict()
        if eval_length_mult is not None:
            if not eval_length_mult > 0:
                raise ValueError(f"the eval length multiplier must be > 0, got {eval_length_mult}")
            if task_obj.length_param is None:
                eval_length_mult = None
            else:
                try:
                    task_obj.at_length(eval_length_mult)
                except ValueError as exc:
                    raise ValueError(
                        f"task {task_entry.name} at {eval_length_mult:g}x length: {exc}"
                    ) from exc
        mech_params = mechanism_params(mech_entry.obj, mechanism_overrides)
        # build the mechanism once so that an invalid parameter fails here, before any run
        try:
            mech_entry.obj(protocol.d_model // protocol.n_heads, protocol.n_heads, **mech_params)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"mechanism {mech_entry.name}: {exc}") from exc
        return cls(
            task_entry.name,
            mech_entry.name,
            protocol,
            seed,
            task_params,
            mech_params,
            float(eval_length_mult) if eval_length_mult is not None else None,
            pos_params,
        )

    def config(self) -> dict[str, Any]:
        config = {
            "suite_version": SUITE_VERSION,
            "task": self.task,
            "task_params": self.task_params,
            "mechanism": self.mechanism,
            "mechanism_params": self.mechanism_params,
            "protocol": self.protocol.config(),
            "seed": self.seed,
        }
        if self.eval_length_mult is not None:  # absent otherwise: earlier run ids still hold
            config["eval_length_mult"] = self.eval_length_mult
        if self.pos_params:  # a rotation's; absolute positions have none: run ids unchanged
            config["pos_params"] = self.pos_params
        return config

    @functools.cached_property
    def run_id(self) -> str:
        canonical = json.dumps(self.config(), sort_keys=True, default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def label(self) -> str:
        return f"{self.task} / {self.mechanism} / seed {self.seed}"


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"unknown device {device!r} (auto, cpu, cuda)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but torch sees no CUDA device")
    return torch.device(device)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


@functools.cache
def git_commit() -> str:
    """The commit of the synthbench checkout (with '-dirty' for local changes), if any."""
    root = Path(synthbench.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
        if commit.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return commit.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def lr_schedule(protocol: Protocol):
    """Linear warm-up to 1, then cosine decay to ``min_lr_frac`` (a multiplier per step)."""
    warmup = int(protocol.warmup_frac * protocol.steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, protocol.steps - warmup)
        cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return protocol.min_lr_frac + (1.0 - protocol.min_lr_frac) * cosine

    return factor


def answer_metrics(
    logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per example: token accuracy over its answer positions, and exact match (all right)."""
    mask = targets != IGNORE
    correct = ((logits.argmax(dim=-1) == targets) & mask).sum(dim=1)
    n_answers = mask.sum(dim=1)
    return correct / n_answers.clamp(min=1), (correct == n_answers).float()


class Diverged(Exception):
    """Training produced a non-finite loss, gradient or logit."""


@torch.no_grad()
def evaluate(model: Model, data: Batch, batch_size: int) -> dict[str, float]:
    model.eval()
    token_acc, exact = [], []
    for start in range(0, data.inputs.shape[0], batch_size):
        logits = model(data.inputs[start : start + batch_size])
        if not torch.isfinite(logits).all():
            raise Diverged("non-finite logits at evaluation")
        acc, em = answer_metrics(logits, data.targets[start : start + batch_size])
        token_acc.append(acc)
        exact.append(em)
    model.train()
    return {
        "token_acc": torch.cat(token_acc).mean().item(),
        "exact_match": torch.cat(exact).mean().item(),
    }


def build_model(spec: RunSpec, *tasks: Task) -> Model:
    """The run's model, with vocabulary and positions for every one of ``tasks``."""
    p = spec.protocol
    mech_cls = MECHANISMS.get(spec.mechanism)
    head_dim = p.d_model // p.n_heads
    return Model(
        max(t.vocab_size for t in tasks),
        max(t.seq_len for t in tasks),
        lambda: mech_cls(head_dim, p.n_heads, **spec.mechanism_params),
        d_model=p.d_model,
        n_heads=p.n_heads,
        n_layers=p.n_layers,
        arch=p.arch,
        pos=p.pos,
        pos_params=spec.pos_params,
    )


def _train_and_evaluate(spec: RunSpec, lr: float, device: torch.device, row: dict) -> None:
    p = spec.protocol
    task = TASKS.get(spec.task)(**spec.task_params)
    long_task = task.at_length(spec.eval_length_mult) if spec.eval_length_mult else None
    torch.manual_seed(spec.seed)  # model init and any random features of the mechanism
    model = build_model(spec, task, *([long_task] if long_task else [])).to(device)
    row["n_params"] = sum(t.numel() for t in model.parameters())
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=lr, betas=p.betas, weight_decay=p.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(p))
    train_gen = torch.Generator().manual_seed(spec.seed)
    val = task.generate(p.val_examples, torch.Generator().manual_seed(VAL_SEED), device)
    test = task.generate(p.test_examples, torch.Generator().manual_seed(TEST_SEED), device)

    recent: list[float] = []
    for step in range(p.steps):
        batch = task.generate(p.batch_size, train_gen, device)
        logits = model(batch.inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten(), ignore_index=IGNORE)
        row["steps_done"] = step
        if not torch.isfinite(loss):
            raise Diverged(f"non-finite loss at step {step}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), p.grad_clip or math.inf)
        if not torch.isfinite(grad_norm):
            raise Diverged(f"non-finite gradient at step {step}")
        optimizer.step()
        scheduler.step()
        recent = (recent + [loss.item()])[-20:]
    row["steps_done"] = p.steps
    row["final_loss"] = sum(recent) / len(recent)

    val_metrics = evaluate(model, val, p.eval_batch_size)
    row.update(evaluate(model, test, p.eval_batch_size))
    row.update({f"val_{k}": v for k, v in val_metrics.items()})
    if long_task is not None:
        gen = torch.Generator().manual_seed(TEST_SEED)
        long_test = long_task.generate(p.test_examples, gen, device)
        long_metrics = evaluate(model, long_test, p.eval_batch_size)
        row.update({f"long_{k}": v for k, v in long_metrics.items()})
    row["status"] = "ok"


def train_eval(spec: RunSpec, lr: float, device: torch.device) -> dict[str, Any]:
    """One training run at one learning rate -> one results row (never raises on failure)."""
    row: dict[str, Any] = {
        "run_id": spec.run_id,
        "suite_version": SUITE_VERSION,
        "task": spec.task,
        "category": TASKS.entry(spec.task).metadata["category"],
        "task_params": json.dumps(spec.task_params, sort_keys=True),
        "mechanism": spec.mechanism,
        "mechanism_params": json.dumps(spec.mechanism_params, sort_keys=True, default=str),
        "protocol": spec.protocol.name,
        "protocol_version": spec.protocol.version,
        "config": json.dumps(spec.config(), sort_keys=True, default=str),
        "seed": spec.seed,
        "lr": lr,
        "steps": spec.protocol.steps,
        "eval_length_mult": spec.eval_length_mult,
        "steps_done": 0,
        "status": "error",
        "device": device_name(device),
        "torch_version": torch.__version__,
        "synthbench_version": synthbench.__version__,
        "git_commit": git_commit(),
    }
    start = time.perf_counter()
    try:
        _train_and_evaluate(spec, lr, device, row)
    except Diverged as exc:
        row.update(status="diverged", error=str(exc))
    except Exception as exc:  # stored as an error row; the suite goes on
        row.update(status="error", error=f"{type(exc).__name__}: {exc}")
    row["wall_seconds"] = time.perf_counter() - start
    row["created_at"] = datetime.now(timezone.utc)
    return row


def run(spec: RunSpec, device: torch.device) -> list[dict[str, Any]]:
    """Every lr of the protocol; the lr with the best validation metric is ``selected``."""
    rows = [train_eval(spec, lr, device) for lr in spec.protocol.lrs]
    metric = f"val_{spec.protocol.select_metric}"
    ok = [r for r in rows if r["status"] == "ok"]
    best = max(ok, key=lambda r: r[metric]) if ok else None
    for r in rows:
        r["selected"] = r is best
    return rows
