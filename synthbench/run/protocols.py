"""Protocols: named, versioned training and evaluation presets (documented in docs/PROTOCOLS.md).

A protocol fixes everything about a run except the task, the mechanism and the seed. Every
stored row carries the protocol's name, version and full resolved config. Bump ``version``
whenever a preset's values change, so old rows are never mistaken for new ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any

from synthbench.core.layer import LAYER_ARCHS
from synthbench.core.model import ARCHS, POSITIONS, TRACKS
from synthbench.core.registry import Registry
from synthbench.core.text import did_you_mean

CURVE_POINTS = 10  # validation evaluations along training (the learning curve)
# fields left out of a config while 0 (off), so run ids from before each field still hold
OFF_WHEN_ZERO = (
    "stop_at", "pace_margin", "lr_signal", "max_steps", "extend_steps", "rise_margin",
    "max_seeds", "seed_spread", "lr_refine",
)  # fmt: skip


def curve_points(
    steps: int, points: int = CURVE_POINTS, *, horizon: int | None = None
) -> list[int]:
    """The optimizer steps after which the learning curve is measured (and a training may
    stop early): ``points`` evenly spaced over ``steps``, the last one the end of the
    schedule. With a ``horizon`` past ``steps`` (a training extended because its curve still
    rose: synthbench/run/train.py), then the points at the same spacing before it, and the
    horizon itself: a training decides at its horizon's end whether to go on."""
    base = sorted({max(1, round(steps * k / points)) for k in range(1, points + 1)})
    if horizon is None or horizon <= steps or steps < 1:
        return base
    later, k = [], points + 1
    while (at := round(steps * k / points)) < horizon:
        if at > (later or base)[-1]:
            later.append(at)
        k += 1
    return base + later + [horizon]


@dataclass(frozen=True)
class Protocol:
    name: str
    version: int
    description: str
    # model
    arch: str = "attn-only"
    pos: str = "learned"  # an absolute embedding or a rotation of q and k (docs/POSITIONS.md)
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    # training: AdamW, linear warm-up then cosine decay to min_lr_frac * lr
    steps: int = 1000
    batch_size: int = 32
    lrs: tuple[float, ...] = (1e-3,)
    # at most this many lrs added past the grid's edges, one grid step at a time, while the
    # best lr on the validation set sits at an edge (synthbench/run/lr_selection.py)
    lr_extend: int = 0
    # stop a training once its validation select_metric, measured at the learning curve's
    # points, reaches this (0: never); every lr that reaches it counts as solving the task,
    # and the sweep prefers the one that got there in fewest steps (synthbench/run/lr_selection.py)
    stop_at: float = 0.0
    # an lr grown past an edge stops once, from half the schedule on, its validation token
    # accuracy trails the edge's at the same step by more than this (0: never; sweep.py)
    pace_margin: float = 0.0
    # recipe v2 (docs/PROTOCOLS.md, "Recipe v2"): the grid grows past an edge only on a
    # signal above noise: the edge lr beats the task's chance and every other lr by at least
    # this (0: any lead, as before; synthbench/run/lr_selection.py)
    lr_signal: float = 0.0
    # at most this many rounds of refinement: where the best lr beats a grid neighbour by
    # more than the knife-edge margin, the geometric midpoint between them trains too
    # (0: never; synthbench/run/lr_selection.py)
    lr_refine: int = 0
    # a training still rising at the end of its schedule continues, extend_steps more at a
    # time (0: steps // 2), the cosine stretched over the new end, up to max_steps in all
    # (0: never); "rising": its validation token accuracy gained at least rise_margin over
    # the last RISE_POINTS curve points (synthbench/run/train.py)
    max_steps: int = 0
    extend_steps: int = 0
    rise_margin: float = 0.0
    # a cell whose seeds disagree (selected scores more than seed_spread apart) gets more
    # seeds, up to max_seeds (0: never; synthbench/run/seeds.py)
    max_seeds: int = 0
    seed_spread: float = 0.0
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    warmup_frac: float = 0.1
    min_lr_frac: float = 0.1
    grad_clip: float = 1.0  # max gradient norm; 0 turns clipping off
    # evaluation: fixed sets, the same for every seed and mechanism
    val_examples: int = 256
    test_examples: int = 512
    eval_batch_size: int = 256
    select_metric: str = "token_acc"  # validation metric that picks the lr of a sweep
    seeds: int = 3  # default number of seeds for `synthbench run`
    # task parameters the protocol fixes, as ((task, ((param, value), ...)), ...) so that it
    # stays hashable; a run's own --task-param goes on top (see pinned_task_params)
    task_params: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()

    def __post_init__(self) -> None:
        problems = []
        if self.arch not in ARCHS:
            problems.append(f"arch must be one of {ARCHS}")
        if self.pos not in POSITIONS:
            problems.append(f"pos must be one of {POSITIONS}")
        if self.n_heads >= 1 and self.d_model % self.n_heads:
            problems.append("d_model must be divisible by n_heads")
        # every width, count and size (a model of width 0 would train, on nothing)
        sizes = ("d_model", "n_heads", "n_layers", "steps", "batch_size", "val_examples",
                 "test_examples", "eval_batch_size", "seeds")  # fmt: skip
        small = [name for name in sizes if getattr(self, name) < 1]
        if small:
            problems.append(f"sizes and counts must be >= 1: {', '.join(small)}")
        if not self.lrs or min(self.lrs) <= 0 or len(set(self.lrs)) < len(self.lrs):
            problems.append("lrs must be a non-empty list of distinct positive learning rates")
        if self.lr_extend < 0 or (self.lr_extend and len(self.lrs) < 2):
            problems.append("lr_extend must be >= 0, and needs at least 2 lrs (the grid step)")
        if self.lr_refine < 0 or (self.lr_refine and len(self.lrs) < 2):
            problems.append("lr_refine must be >= 0, and needs at least 2 lrs (a neighbour)")
        if not 0 <= self.stop_at <= 1:
            problems.append("stop_at must be in [0, 1] (0: never stop early)")
        if not 0 <= self.pace_margin <= 1:
            problems.append("pace_margin must be in [0, 1] (0: off)")
        if self.max_steps and self.max_steps < self.steps:
            problems.append(
                f"max_steps ({self.max_steps}) must be >= steps ({self.steps}) (the cap of a "
                "training still rising), or 0 to train exactly steps"
            )
        if self.extend_steps < 0 or self.max_steps < 0:
            problems.append("max_steps and extend_steps must be >= 0")
        if self.max_seeds < 0:  # below a run's seed count: `run` says so (cli/run.py)
            problems.append("max_seeds must be >= 0 (0: off)")
        for name in ("lr_signal", "rise_margin", "seed_spread"):
            if not 0 <= getattr(self, name) <= 1:
                problems.append(f"{name} must be in [0, 1]")
        if self.arch == "block-conv" and self.n_layers < 2:
            problems.append("arch block-conv needs n_layers >= 2 (even layers are BaseConv)")
        if self.grad_clip < 0 or self.weight_decay < 0:
            problems.append("grad_clip and weight_decay must be >= 0")
        if not 0 <= self.warmup_frac < 1 or not 0 <= self.min_lr_frac <= 1:
            problems.append("warmup_frac must be in [0, 1) and min_lr_frac in [0, 1]")
        if self.select_metric not in ("token_acc", "exact_match"):
            problems.append("select_metric must be token_acc or exact_match")
        if problems:
            raise ValueError(f"protocol {self.name!r}: " + "; ".join(problems))

    @property
    def track(self) -> str:
        """``block`` for the published layers' arch, ``core`` for every other (the rule alone,
        or the rule in one of the model's own blocks)."""
        return "block" if self.arch in LAYER_ARCHS else "core"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Protocol:
        """The protocol a stored run was trained under, from the ``config()`` its rows store
        (an older version's too): a field left out there was off (``OFF_WHEN_ZERO``) or does
        not change a run's outcome (the description, the seed counts, the task parameters,
        which the run's own resolved ones carry)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = dict.fromkeys(OFF_WHEN_ZERO, 0)
        for name, value in config.items():
            if name in names:
                values[name] = tuple(value) if isinstance(value, list) else value
        return cls(description="as stored", **values)

    def pinned_task_params(self, task: str) -> dict[str, Any]:
        """The parameters this protocol fixes for ``task`` (canonical name); none by default."""
        return dict(dict(self.task_params).get(task, ()))

    def config(self) -> dict:
        """Everything that determines a run's outcome (the seed counts do not: they say which
        runs a cell holds, not what one of them gives)."""
        config = asdict(self)
        for name in ("description", "seeds", "max_seeds", "seed_spread"):
            config.pop(name)
        config["lrs"] = list(self.lrs)
        config["betas"] = list(self.betas)
        config.pop("task_params")  # the run's resolved task parameters carry their effect
        for name in OFF_WHEN_ZERO:
            if name in config and not config[name]:
                config.pop(name)
        return config


PROTOCOLS: Registry[Protocol] = Registry("protocol")


def _add(protocol: Protocol) -> None:
    PROTOCOLS.add(protocol.name, protocol)


_add(
    Protocol(
        name="smoke",
        version=2,
        description="seconds per run, for tests and wiring checks; numbers mean nothing",
        d_model=32,
        n_heads=2,
        n_layers=1,
        steps=20,
        batch_size=16,
        val_examples=32,
        test_examples=64,
        seeds=1,
    )
)
# Recipe v2 (docs/PROTOCOLS.md): the settings quick and standard share on top of their sizes
RECIPE_V2 = {
    "lr_extend": 2,
    "lr_signal": 0.05,
    "lr_refine": 1,
    "stop_at": 0.99,
    "pace_margin": 0.1,
    "rise_margin": 0.02,
    "max_seeds": 5,
    "seed_spread": 0.5,
}
_add(
    Protocol(
        name="quick",
        version=7,
        description="the default, sized for a 2-core CPU: 1000 steps, longer (to 3000) while "
        "still rising, at each mechanism's own best lr (from 1e-3, 3e-3 and 1e-2, grown "
        "past an edge only on a lead above noise, refined around a lone winner), stopping a "
        "training once it has solved the task; seeds that disagree get more seeds (up to 5)",
        steps=1000,
        batch_size=32,
        lrs=(1e-3, 3e-3, 1e-2),
        max_steps=3000,
        extend_steps=500,
        **RECIPE_V2,
    )
)
_add(
    Protocol(
        name="standard",
        version=6,
        description="sized for one GPU: a larger model trained longer (to 12000 steps while "
        "still rising), with recipe v2's learning-rate sweep selected on the validation set",
        d_model=128,
        n_heads=4,
        n_layers=2,
        steps=4000,
        batch_size=64,
        lrs=(3e-4, 1e-3, 3e-3),
        max_steps=12000,
        extend_steps=2000,
        val_examples=1000,
        test_examples=2000,
        eval_batch_size=500,
        **RECIPE_V2,
    )
)
_add(
    Protocol(
        name="slay-paper",
        version=2,
        description="mirrors the setup behind the published SLAY tables: d 64, 4 heads, 2 "
        "layers, attention-only, learned positions, 200 steps of batch 32, AdamW lr 1e-3; "
        "suite v1's layouts of the tasks that suite v2 re-posed",
        steps=200,
        batch_size=32,
        lrs=(1e-3,),
        # torch's AdamW defaults at a constant lr, no clipping: all the paper states
        warmup_frac=0.0,
        min_lr_frac=1.0,
        betas=(0.9, 0.999),
        grad_clip=0.0,
        # the one-answer and v1 layouts the paper's tables were compared with (suite v2
        # re-posed these tasks: docs/TASKS.md), so `report --compare slay-paper` stays like
        # with like
        task_params=(
            ("addition", (("streamed", False),)),
            ("compression", (("k", 8), ("n", 32), ("vocab", 16), ("max_pad", 0))),
            ("counting", (("queries", 0), ("n", 32), ("vocab", 16))),
            ("distant_match", (("probes", 0), ("n", 128))),
            ("histogram", (("queries", 0), ("n", 16), ("vocab", 8))),
            ("induction", (("dense", False), ("n", 64))),
            (
                "kv_recall",
                (
                    ("queries", 0),
                    ("distinct_values", False),
                    ("pairs", 8),
                    ("keys", 32),
                    ("values", 32),
                ),
            ),
            ("majority", (("n", 32),)),
            ("modular", (("dense", False),)),
            ("multihop", (("walk", False), ("walks", 1))),
            ("noisy_copy", (("n", 32), ("rate", 0.25), ("vocab", 32))),
            ("parity", (("dense", False), ("n", 16))),
            (
                "pattern",
                (("n", 32), ("min_period", 2), ("max_period", 8), ("k", 8), ("vocab", 16)),
            ),
            ("retrieval", (("needles", 1), ("vocab", 32))),
            ("reverse", (("n", 32),)),
            ("selective_copy", (("length", 64), ("tail", 0), ("vocab", 16))),
            ("sort", (("vocab", 32),)),
            ("stack", (("every_pop", True), ("ops", 16), ("values", 16))),
        ),
    )
)


# The block track (synthbench/core/layer.py): each protocol's twin with every mechanism as its
# published layer in fla's block (synthbench/core/model.py); its own name and version, so its
# rows, tables and leaderboard never mix with the core track's.
for _core in ("smoke", "quick", "standard"):
    _base = PROTOCOLS.get(_core)
    _add(
        dataclasses.replace(
            _base,
            name=f"{_core}-block",
            # 2: no LayerNorm before the mixer or the head; 3: twice the core's steps: with an
            # MLP, softmax learned default kv_recall only after about 1,000-2,000 steps, where
            # attention alone does by 800 (docs/MECHANISMS.md, "The block track's budget");
            # 4: fla's block (its norms, gated MLP and initialisation) and recipe v2; 5: its
            # knife-edge refinement (lr_refine; off in smoke, whose twin stays at 4)
            version=5 if _base.lr_refine else 4,
            arch="block",
            steps=2 * _base.steps,
            max_steps=2 * _base.max_steps,
            extend_steps=2 * _base.extend_steps,
            description=f"the block track of {_core}: every mechanism as its published layer "
            "(its core for the attention family) in fla's block (an RMSNorm before the mixer "
            "and before the MLP, a final RMSNorm, fla's gated SwiGLU MLP, fla's N(0, 0.02) "
            "init; arch=block-plain keeps the older plain block), twice the core's steps",
        )
    )


def protocol_of_track(name: str, track: str | None) -> Protocol:
    """Protocol ``name``, or its twin in ``track`` (``core``: the protocol itself, ``block``:
    ``<name>-block``). An unknown track, or a protocol without a twin there, raises a one-line
    ValueError naming the close matches or the protocols that have one."""
    protocol = PROTOCOLS.get(name)
    if track is None or track == protocol.track:
        return protocol
    if track not in TRACKS:
        hint = did_you_mean(track, TRACKS, n=2)
        raise ValueError(f"unknown track '{track}'{hint} (known: {', '.join(TRACKS)})")
    base = protocol.name.removesuffix("-block")
    twin = base if track == "core" else f"{base}-block"
    if twin not in PROTOCOLS:
        have = [e.name for e in PROTOCOLS.entries() if e.obj.track == track]
        raise ValueError(
            f"protocol {protocol.name} has no {track} track (protocols of the {track} track: "
            f"{', '.join(have)})"
        )
    return PROTOCOLS.get(twin)


def markdown_table() -> str:
    """Every protocol's values side by side (docs/PROTOCOLS.md embeds this; a test checks it)."""
    protocols = [e.obj for e in PROTOCOLS.entries()]
    # every field, also those a config leaves out at their default (OFF_WHEN_ZERO)
    configs = [{**asdict(p), **p.config()} for p in protocols]
    lines = [
        "| field | " + " | ".join(p.name for p in protocols) + " |",
        "|---|" + "---|" * len(protocols),
    ]
    fields = protocols[0].config() | dict.fromkeys(OFF_WHEN_ZERO)
    for name in (f for f in fields if f not in ("name", "max_seeds", "seed_spread")):
        values = [
            ", ".join(f"{v:g}" for v in c[name]) if isinstance(c[name], list) else f"{c[name]}"
            for c in configs
        ]
        lines.append(f"| {name} | " + " | ".join(values) + " |")
    for name, label in (("seeds", "seeds (default)"), ("max_seeds", "max_seeds"),
                        ("seed_spread", "seed_spread")):  # fmt: skip
        lines.append(f"| {label} | " + " | ".join(f"{getattr(p, name)}" for p in protocols) + " |")
    return "\n".join(lines) + "\n"
