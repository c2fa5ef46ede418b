"""A quick-protocol training step of one mechanism against one of another, task by task, and
against the same mechanism as a git revision wrote it (a same-day speed-up).

    python benchmarks/step_speedup.py [--mech slay] [--ref softmax] [--track core|block] \\
        [--tasks copy,reverse] [--rounds 7] [--steps 3] [--base HEAD] [--no-base] \\
        [--no-check] [--clock cpu|wall]

For each task at its defaults it builds the model of a training under quick (``--track
core``: d_model 64, 4 heads, 2 layers, attn-only, learned positions) or quick-block
(``--track block``: the mechanism's published layer in the standard block), through
``synthbench.run.train.build_model``, for ``--ref``, for ``--mech`` and, unless ``--no-base``,
for ``--mech`` as revision ``--base`` wrote it: the mechanism's own module (mechanisms/X.py),
synthbench/core/mechanism.py and synthbench/core/linear_attention.py read with ``git show``
and loaded beside the installed ones (every other module is today's: a change elsewhere,
e.g. in synthbench/core/layer.py, is on both sides). In the block track the base side is the
revision's published layer class, so ``--mech`` must have one (``Mechanism.layer``). All
start from torch.manual_seed(0), as a training seeds them, so the two sides of ``--mech``
hold the same weights and random features; unless ``--no-check`` the script checks, in
float64, that their losses and gradients agree on the first batch. A step is what a training
times (synthbench/run/train.py): the forward, the cross-entropy, the backward, the gradient
norm and its clipping, fused AdamW and the lr schedule, on pre-generated batches of 32
(making them is not timed), one torch thread. The sides alternate (A B C A B C ...),
``--steps`` steps each, ``--rounds`` rounds after a warm-up, so that a busy machine slows
every side alike; a task's figure is the median over the rounds of the mean step. The clock
is this thread's CPU time by default (``--clock cpu``: other processes of a shared machine
do not count, page faults do), or elapsed time (``--clock wall``).

Prints per task the milliseconds of each side, new / ref and, with a base, base / ref and
base / new; then the suite's ratios, each task weighted by the shipped reference's steps of
the track's protocol (synthbench/data/reference/quick.parquet: per task the sum of
steps_done over a mechanism's rows; every task alike where it has none): at ref's steps,
sum_t w_t new_t / sum_t w_t ref_t (the cost of new's steps where ref trains), and with new
at its own steps (what the suite would cost if each trained as long as it did there). The
reference's steps are weights, not a prediction: it may be of older task layouts.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from synthbench.core.mechanism import MECHANISMS  # noqa: E402
from synthbench.core.task import IGNORE, TASKS  # noqa: E402
from synthbench.run.protocols import protocol_of_track  # noqa: E402
from synthbench.run.spec import RunSpec  # noqa: E402
from synthbench.run.train import build_model, lr_schedule  # noqa: E402

REFERENCE = ROOT / "synthbench" / "data" / "reference" / "quick.parquet"
SHARED_FILES = {  # module name in the base copy -> path in the repository
    "_base_linear_attention": "synthbench/core/linear_attention.py",
    "_base_mechanism": "synthbench/core/mechanism.py",
}
BASE_MODULE = "_base_module"  # the timed mechanism's own module, in the base copy
BATCHES = 4  # distinct pre-generated batches, cycled


class _NoRegistry:
    """Stands in for MECHANISMS in the base copy: its classes are registered nowhere."""

    def register(self, *args, **kwargs):
        return lambda cls: cls


def module_path(mechanism: str) -> str:
    """The repository path of a built-in mechanism's module: synthbench.mechanisms.X is
    mechanisms/X.py (pyproject.toml's package-dir)."""
    module = MECHANISMS.get(mechanism).__module__
    if not module.startswith("synthbench.mechanisms."):
        raise SystemExit(f"error: {mechanism} is not a built-in mechanism (its module: {module})")
    return "mechanisms/" + module.removeprefix("synthbench.mechanisms.") + ".py"


def load_base(revision: str, mechanism: str) -> types.ModuleType:
    """The mechanism's module at ``revision``, on its own revision's mechanism.py and core."""
    files = {**SHARED_FILES, BASE_MODULE: module_path(mechanism)}
    modules = {}
    for name, path in files.items():
        source = subprocess.run(
            ["git", "show", f"{revision}:{path}"], cwd=ROOT, capture_output=True, text=True
        )
        if source.returncode:
            raise SystemExit(f"error: git show {revision}:{path}: {source.stderr.strip()}")
        text = source.stdout
        for other, other_path in SHARED_FILES.items():
            dotted = other_path.removesuffix(".py").replace("/", ".")
            text = text.replace(f"from {dotted} import", f"from {other} import")
        spec = importlib.util.spec_from_loader(name, loader=None)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        if name == BASE_MODULE:  # its classes go to no registry
            modules["_base_mechanism"].MECHANISMS = _NoRegistry()
        exec(compile(text, f"{revision}:{path}", "exec"), module.__dict__)  # noqa: S102
        modules[name] = module
    return modules[BASE_MODULE]


def base_class(module: types.ModuleType, mechanism: str, track: str) -> type:
    """The base copy's class of ``mechanism`` (a name or alias of the installed registry):
    its core, or in the block track its published layer."""
    installed = MECHANISMS.get(mechanism)
    if track == "block":
        layer = getattr(installed, "layer", None)
        if layer is None:
            raise SystemExit(
                f"error: {mechanism} has no published layer of its own; --track core "
                "compares its core"
            )
        return getattr(module, layer.__name__)
    return getattr(module, installed.__name__)


def reference_steps(protocol: str) -> dict[str, dict[str, int]]:
    """{mechanism: {task: sum of steps_done}} over the reference's rows of ``protocol``."""
    import pandas as pd

    rows = pd.read_parquet(REFERENCE, columns=["protocol", "task", "mechanism", "steps_done"])
    rows = rows[rows["protocol"] == protocol]
    if rows.empty:
        return {}
    sums = rows.groupby(["mechanism", "task"])["steps_done"].sum()
    return {m: {t: int(sums[m][t]) for t in sums[m].index} for m in sums.index.levels[0]}


class Side:
    """One model, its optimizer and its batches: ``step()`` is one training step."""

    def __init__(self, spec: RunSpec, mechanism_class: type | None = None, track: str = "core"):
        protocol = spec.protocol
        task = spec.make_task()
        if mechanism_class is not None:  # a core takes head_dim, a published layer d_model
            width = protocol.d_model // protocol.n_heads if track == "core" else protocol.d_model
            spec = _SpecWith(spec, lambda: mechanism_class(width, protocol.n_heads))
        torch.manual_seed(0)  # as a training seeds the model and the random features
        self.model = build_model(spec, task)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=protocol.lrs[0],
            betas=protocol.betas,
            weight_decay=protocol.weight_decay,
            fused=True,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_schedule(protocol))
        self.clip = protocol.grad_clip
        generator = torch.Generator().manual_seed(1)
        self.batches = [task.generate(protocol.batch_size, generator) for _ in range(BATCHES)]
        self.count = 0

    def loss(self, batch) -> torch.Tensor:
        logits = self.model(batch.inputs)
        labels = batch.training_targets.flatten()
        return F.cross_entropy(logits.flatten(0, 1), labels, ignore_index=IGNORE)

    def step(self) -> None:
        batch = self.batches[self.count % BATCHES]
        self.count += 1
        loss = self.loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads)
        if self.clip:
            torch.nn.utils.clip_grads_with_norm_(self.model.parameters(), self.clip, norm)
        self.optimizer.step()
        self.scheduler.step()
        loss.item()

    def gradients(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The loss and the gradients on the first batch, float64 model, no step taken."""
        model = self.model
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        model.double()
        model.zero_grad(set_to_none=True)
        loss = self.loss(self.batches[0])
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        model.float()
        model.load_state_dict(saved)
        return loss.detach(), grads


class _SpecWith:
    """A RunSpec whose make_mechanism builds another class (for build_model)."""

    def __init__(self, spec: RunSpec, make):
        self.protocol, self.pos_params, self.make_mechanism = spec.protocol, spec.pos_params, make


def check_same(new: Side, base: Side, task: str) -> None:
    loss_new, grads_new = new.gradients()
    loss_base, grads_base = base.gradients()
    torch.testing.assert_close(loss_new, loss_base, rtol=1e-9, atol=1e-12)
    for a, b in zip(grads_new, grads_base, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-10, msg=f"{task}: gradients differ")


CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def ms_per_step(side: Side, steps: int, clock=time.thread_time) -> float:
    start = clock()
    for _ in range(steps):
        side.step()
    return (clock() - start) / steps * 1e3


def weighted(times: dict[str, float], weights: dict[str, int]) -> float:
    return sum(weights.get(t, 0) * ms for t, ms in times.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="all", help="comma-separated (default: all 22)")
    parser.add_argument("--mech", default="slay", help="the mechanism timed (default slay)")
    parser.add_argument("--ref", default="softmax", help="what it is divided by")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3, help="steps per side and round")
    parser.add_argument("--track", choices=("core", "block"), default="core")
    parser.add_argument("--base", default="HEAD", help="git revision of the base --mech")
    parser.add_argument("--no-base", action="store_true", help="time no base --mech")
    parser.add_argument("--no-check", action="store_true", help="skip the gradient check")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="cpu",
        help="cpu: this thread's CPU time (default; a busy machine's other processes do not "
        "count); wall: elapsed time",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    protocol = protocol_of_track("quick", args.track)
    names = [e.name for e in TASKS.entries()]
    tasks = names if args.tasks == "all" else [TASKS.entry(t).name for t in args.tasks.split(",")]
    base = None if args.no_base else load_base(args.base, args.mech)
    base_cls = base_class(base, args.mech, args.track) if base else None
    steps = reference_steps(protocol.name)
    ref_steps, mech_steps = steps.get(args.ref, {}), steps.get(args.mech, {})
    if not ref_steps:
        print(f"(the reference has no {protocol.name} rows of {args.ref}: every task alike)")
        ref_steps = dict.fromkeys(tasks, 1)

    columns = [args.ref, args.mech] + (["base"] if base else [])
    header = f"{'task':<15} {'L':>4} " + " ".join(f"{c + ' ms':>12}" for c in columns)
    header += f" {'new/ref':>8}" + (f" {'base/ref':>8} {'base/new':>8}" if base else "")
    header += f" {'ref steps':>9} {'own steps':>9}"
    print(header)
    medians: dict[str, dict[str, float]] = {c: {} for c in columns}
    for task in tasks:
        specs = {c: RunSpec.resolve(task, args.ref if c == args.ref else args.mech, protocol, 0)
                 for c in columns}  # fmt: skip
        sides = {c: Side(specs[c], base_cls if c == "base" else None, args.track)
                 for c in columns}  # fmt: skip
        if base and not args.no_check:
            check_same(sides[args.mech], sides["base"], task)
        clock = CLOCKS[args.clock]
        for side in sides.values():  # warm-up
            ms_per_step(side, 2, clock)
        samples: dict[str, list[float]] = {c: [] for c in columns}
        for _ in range(args.rounds):
            for c in columns:
                samples[c].append(ms_per_step(sides[c], args.steps, clock))
        for c in columns:
            medians[c][task] = statistics.median(samples[c])
        m = {c: medians[c][task] for c in columns}
        line = f"{task:<15} {sides[args.ref].batches[0].inputs.shape[1]:>4} "
        line += " ".join(f"{m[c]:>12.2f}" for c in columns)
        line += f" {m[args.mech] / m[args.ref]:>8.2f}"
        if base:
            line += f" {m['base'] / m[args.ref]:>8.2f} {m['base'] / m[args.mech]:>8.2f}"
        line += f" {ref_steps.get(task, 0):>9} {mech_steps.get(task, 0):>9}"
        print(line, flush=True)

    ref_total = weighted(medians[args.ref], ref_steps)
    total = sum(ref_steps.get(t, 0) for t in tasks)
    print(f"\nsuite, every side at {args.ref}'s reference steps ({total}):")
    for c in columns[1:]:
        print(f"  {c} / {args.ref}: {weighted(medians[c], ref_steps) / ref_total:.2f}")
    if mech_steps:
        total = sum(mech_steps.get(t, 0) for t in tasks)
        print(f"suite, {args.mech} at its own reference steps ({total}), {args.ref} at its own:")
        for c in columns[1:]:
            print(f"  {c} / {args.ref}: {weighted(medians[c], mech_steps) / ref_total:.2f}")
    if base:
        speedup = weighted(medians["base"], ref_steps) / weighted(medians[args.mech], ref_steps)
        print(f"suite speed-up, base / {args.mech} at {args.ref}'s steps: {speedup:.2f}")


if __name__ == "__main__":
    main()
