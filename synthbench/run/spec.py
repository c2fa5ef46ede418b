"""What one run is: a (task, mechanism, protocol, seed) with every name and parameter resolved.

A :class:`RunSpec` is built once, by :meth:`RunSpec.resolve`, from what the user typed:
aliases become canonical names, parameters get their defaults and are checked, and the task's
category is looked up. Everything downstream (runner, workers, training) reads the spec and
never resolves a name again. ``run_id`` is a hash of the resolved config, so the same config
always maps to the same stored file (resume, no duplicates).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from synthbench.core.interrupts import caught, describe
from synthbench.core.mechanism import (
    MECHANISMS,
    STATE_LENGTH,
    build_mixer_once,
    layer_state,
    mixer,
)
from synthbench.core.model import check_position, make_rotation, position_params
from synthbench.core.params import check_int
from synthbench.core.task import TASKS, Task
from synthbench.run.protocols import Protocol

# Bump when a built-in task's generation changes, so stored rows are not reused for it.
# 4: the layouts docs/TASKS.md calls suite v3 (five tasks and distant_match re-posed).
# 5: suite v4: difficulty ladders, recall gaps, windows at the suite's scale (docs/TASKS.md).
SUITE_VERSION = 5
# Validation and test sets are drawn from these generator seeds, the same for every seed and
# mechanism; training seeds must stay below MAX_SEED so that they never coincide.
MAX_SEED = 1_000_000_000
VAL_SEED, TEST_SEED = MAX_SEED + 1, MAX_SEED + 2
MAX_THREADS = 1024
# the mixers (class, sizes, parameters) built once in this process by ``resolve``: checked
_BUILT: set[tuple[type, tuple[int, int], str]] = set()


@dataclass(frozen=True)
class RunSpec:
    task: str  # canonical names
    mechanism: str
    protocol: Protocol
    seed: int
    task_params: dict[str, Any] = field(default_factory=dict)  # complete: defaults filled in
    mechanism_params: dict[str, Any] = field(default_factory=dict)
    # also evaluate on the task with its length knob scaled by this (length generalisation)
    eval_length_mult: float | None = None
    # the complete parameters of protocol.pos: empty for learned, sinusoidal and none
    pos_params: dict[str, Any] = field(default_factory=dict)
    # torch's intra-op threads: they change the floating-point sums, so they are in the run id
    threads: int = 1
    category: str = ""  # the task's, from its registry entry
    # train with torch.compile (``run --compile``): the same function as eager, rounded
    # differently, as on another device; so not in the run id, and each row says which
    compiled: bool = False
    # {"task"/"mechanism": Entry.code_hash} for those that come from a plugin, hashed here in
    # the driver (workers load the plugin again, Ray's from a copy): edited code, new run id
    plugin_code: dict[str, str] = field(default_factory=dict)

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
        threads: int = 1,
        compiled: bool = False,
    ) -> RunSpec:
        """Canonical names and complete parameter sets (defaults filled in, validated).

        ``eval_length_mult`` is dropped for a task without a length knob. ``pos`` replaces
        the protocol's positional encoding (the protocol keeps its name and version; the
        change shows in its config), ``pos_overrides`` are the parameters of a rotation.
        """
        check_seed(seed)
        check_int("threads", threads, 1, MAX_THREADS)
        if pos is not None:
            check_position(pos)
            protocol = dataclasses.replace(protocol, pos=pos)
        pos_params = position_params(protocol.pos, pos_overrides)
        # build the rotation once so that an invalid parameter fails here, before any run
        make_rotation(
            protocol.pos, protocol.d_model // protocol.n_heads, protocol.n_heads, pos_params
        )
        task_entry, mech_entry = TASKS.entry(task), MECHANISMS.entry(mechanism)
        # the protocol's own task parameters, under the run's
        task_params = {**protocol.pinned_task_params(task_entry.name), **(task_overrides or {})}
        try:
            task_obj = task_entry.obj(**task_params)
        except ValueError:  # the parameters' own checks, naming them
            raise
        except BaseException as exc:  # a plugin task whose construction raises (or exits)
            raise ValueError(
                f"task {task_entry.name} cannot be built: {describe(caught(exc))}"
            ) from exc
        if eval_length_mult is not None:
            if not (math.isfinite(eval_length_mult) and eval_length_mult > 0):
                raise ValueError(
                    f"the eval length multiplier must be > 0 and finite, got {eval_length_mult}"
                )
            if task_obj.length_param is None:
                eval_length_mult = None
            else:
                try:
                    task_obj.at_length(eval_length_mult)
                except (ValueError, OverflowError) as exc:  # overflow: a length past any int
                    raise ValueError(
                        f"task {task_entry.name} at {eval_length_mult:g}x length: {exc}"
                    ) from exc
        # the core, or in the block track the published layer: its options are the params
        built = mixer(mech_entry.name, protocol.d_model, protocol.n_heads, protocol.arch)
        mech_params = built.params(mechanism_overrides)
        built_before = (built.cls, built.sizes, _canonical(mech_params))
        if built_before not in _BUILT:  # the same class, sizes and parameters build the same
            build_mixer_once(built, mech_params)  # (a grid's tasks share its mechanisms)
            _BUILT.add(built_before)
        return cls(
            task=task_entry.name,
            mechanism=mech_entry.name,
            protocol=protocol,
            seed=seed,
            task_params=task_obj.param_dict(),
            mechanism_params=mech_params,
            eval_length_mult=float(eval_length_mult) if eval_length_mult is not None else None,
            pos_params=pos_params,
            threads=threads,
            compiled=bool(compiled),
            category=task_entry.metadata["category"],
            plugin_code={
                kind: entry.code_hash
                for kind, entry in (("task", task_entry), ("mechanism", mech_entry))
                if entry.code_hash is not None
            },
        )

    def with_seed(self, seed: int) -> RunSpec:
        """The same run at another seed (everything else is already resolved)."""
        check_seed(seed)
        return dataclasses.replace(self, seed=seed)

    def with_seeds(self, seeds: Iterable[int]) -> list[RunSpec]:
        """The same run at each of ``seeds``, as ``with_seed`` gives them, but their run ids
        hashed from one serialisation of the config they share: planning 1,000 seeds of a
        cell serialises it once, not 1,000 times (``run_id`` is unchanged)."""
        config = self.config()
        # json.dumps(sort_keys=True) writes the keys in order: what sorts before "seed", the
        # seed, what sorts after; the two parts are the same text for every seed
        before = _canonical({k: v for k, v in config.items() if k < "seed"})
        after = _canonical({k: v for k, v in config.items() if k > "seed"})
        shared = {k: v for k, v in self.__dict__.items() if k not in ("seed", "run_id")}
        specs = []
        for seed in seeds:
            check_seed(seed)
            canonical = f'{before[:-1]}, "seed": {int(seed)}, {after[1:]}'
            spec = object.__new__(RunSpec)  # dataclasses.replace, without its per-call cost
            spec.__dict__.update(shared, seed=seed, run_id=_hash(canonical))
            specs.append(spec)
        return specs

    def config(self) -> dict[str, Any]:
        config = {
            "suite_version": SUITE_VERSION,
            "task": self.task,
            "task_params": self.task_params,
            "mechanism": self.mechanism,
            "mechanism_params": self.mechanism_params,
            "protocol": self.protocol.config(),
            "seed": self.seed,
            "threads": self.threads,
        }
        if self.eval_length_mult is not None:  # absent otherwise: earlier run ids still hold
            config["eval_length_mult"] = self.eval_length_mult
        if self.pos_params:  # a rotation's; absolute positions have none: run ids unchanged
            config["pos_params"] = self.pos_params
        if self.plugin_code:  # built-ins have none (SUITE_VERSION): their run ids unchanged
            config["plugin_code"] = self.plugin_code
        return config

    @functools.cached_property
    def run_id(self) -> str:
        return _hash(_canonical(self.config()))

    def make_task(self) -> Task:
        return TASKS.get(self.task)(**self.task_params)

    def make_mechanism(self):
        """A new instance of the mechanism for one layer of the protocol's model: its core,
        or in the block track its published layer (``mixer``)."""
        p = self.protocol
        return mixer(self.mechanism, p.d_model, p.n_heads, p.arch).build(self.mechanism_params)

    def row_fields(self) -> dict[str, Any]:
        """What every results row of this run says about the run."""
        return {
            "run_id": self.run_id,
            "suite_version": SUITE_VERSION,
            "task": self.task,
            "category": self.category,
            "task_params": json.dumps(self.task_params, sort_keys=True),
            "mechanism": self.mechanism,
            "mechanism_params": json.dumps(self.mechanism_params, sort_keys=True, default=str),
            "protocol": self.protocol.name,
            "protocol_version": self.protocol.version,
            "config": json.dumps(self.config(), sort_keys=True, default=str),
            "seed": self.seed,
            "steps": self.protocol.steps,
            "target_metric": self._target_metric(),
            "eval_length_mult": self.eval_length_mult,
            "threads": self.threads,
            "compiled": self.compiled,
            "state_size": self.state_size(),
        }

    def state_size(self) -> int | None:
        """What one layer of the run's model carries from one token to the next at length
        STATE_LENGTH, with the run's parameters and sizes (``layer_state``: what `synthbench
        check` measures); None where the mechanism declares no state_size, or where its code
        raises (even sys.exit) here."""
        p = self.protocol
        return _layer_state(self.mechanism, p.d_model, p.n_heads, p.arch, self.mechanism_params)

    def _target_metric(self) -> str | None:
        """The task's target metric; None where a plugin task's code raises (even sys.exit)
        here: its training raises it again, inside the handler that stores the failure."""
        try:
            return self.make_task().target_metric
        except BaseException as exc:
            caught(exc)  # the user's Ctrl-C goes on
            return None

    def label(self) -> str:
        return f"{self.task} / {self.mechanism} / seed {self.seed}"


# (mechanism, d_model, n_heads, arch, parameters as JSON) -> ``RunSpec.state_size``
_STATES: dict[tuple[str, int, int, str, str], int | None] = {}


def _layer_state(
    name: str, d_model: int, n_heads: int, arch: str, params: dict[str, Any]
) -> int | None:
    """``layer_state`` at STATE_LENGTH, once per mechanism, sizes and parameters in a process
    (every seed and lr of a run shares it), the global RNG left as it was (a build draws)."""
    key = (name, d_model, n_heads, arch, _canonical(params))
    if key not in _STATES:
        import torch  # loaded wherever a spec trains; here to keep planning's import light

        try:
            with torch.random.fork_rng(devices=[]):
                size = layer_state(name, d_model, n_heads, arch, params, STATE_LENGTH)
            _STATES[key] = size if size >= 0 else None
        except BaseException as exc:  # no state_size, or a plugin's code raises or exits
            caught(exc)  # the user's Ctrl-C goes on
            _STATES[key] = None
    return _STATES[key]


def _canonical(config: dict[str, Any]) -> str:
    """The text a run id hashes: the config as sorted JSON."""
    return json.dumps(config, sort_keys=True, default=str)


def _hash(canonical: str) -> str:
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < MAX_SEED:
        raise ValueError(f"seed must be an integer in [0, {MAX_SEED}), got {seed!r}")
