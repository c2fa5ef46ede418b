"""A fact: what a paper found, the runs that test it here, and the rule declared before them.

An ``Arm`` is one group of runs: a mechanism on a task (or several tasks, averaged per seed)
under a protocol, with parameters; a ``Fact`` names its arms and a rule
(synthbench/facts/rules.py) over the arms' per-seed values. Facts register in ``FACTS``,
like tasks and mechanisms (plugins through the entry-point group ``synthbench.facts`` or
``--plugin file.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from synthbench.core.layer import LAYER_ARCHS
from synthbench.core.registry import Registry
from synthbench.facts.rules import Given, Precondition, Rule
from synthbench.run.protocols import PROTOCOLS

TRACKS = ("core", "block")
# what an arm's per-seed value is: the target metric as it is, or normalised by chance
# ((value - chance) / (1 - chance): Grazzi et al.'s "scaled accuracy")
MEASURES = ("value", "score")
# the stored metrics of the test beyond the trained length (synthbench/run/train.py)
LONG_METRICS = ("long_token_acc", "long_exact_match")


@dataclass(frozen=True)
class Arm:
    """The runs of one mechanism on ``task`` (a name, or a tuple of names whose values are
    averaged per seed) under ``protocol``, with the given parameters (as ``synthbench run``'s
    ``--task-param``, ``--mech-param``, ``--protocol-param``, ``--pos``,
    ``--eval-length-mult``). ``task_params`` apply to every task; ``params_by_task`` (task
    name -> parameters) to one task only, on top of them. ``metric`` names a stored column
    to read instead of the task's target metric: ``long_token_acc`` or ``long_exact_match``,
    the test at ``eval_length_mult`` times the trained length (which the arm must set)."""

    mech: str
    task: str | tuple[str, ...]
    protocol: str = "quick"
    task_params: Mapping[str, Any] = field(default_factory=dict)
    mech_params: Mapping[str, Any] = field(default_factory=dict)
    protocol_params: Mapping[str, Any] = field(default_factory=dict)
    pos: str | None = None  # the positional encoding instead of the protocol's
    eval_length_mult: float | None = None
    # the stored metric a long-length arm reads (long_token_acc) instead of the target one
    metric: str | None = None
    params_by_task: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        strays = sorted(set(self.params_by_task) - set(self.tasks))
        if strays:
            raise ValueError(
                f"params_by_task names tasks the arm lacks: {', '.join(strays)} (its tasks: "
                f"{', '.join(self.tasks)})"
            )
        if self.metric in LONG_METRICS and not self.eval_length_mult:
            raise ValueError(f"an arm that reads {self.metric} needs an eval_length_mult")

    @property
    def tasks(self) -> tuple[str, ...]:
        return (self.task,) if isinstance(self.task, str) else tuple(self.task)

    def params_of(self, task: str) -> dict[str, Any]:
        """The task parameters of ``task``'s runs: ``task_params``, then its own."""
        return {**self.task_params, **self.params_by_task.get(task, {})}

    def describe(self) -> str:
        """The arm in words, e.g. ``deltanet on kv_recall (pairs=16, queries=0)``."""
        settings = [
            f"{k}={_text(v)}"
            for values in (self.task_params, self.mech_params, self.protocol_params)
            for k, v in values.items()
        ]
        if self.pos:
            settings.append(f"pos={self.pos}")
        if self.eval_length_mult:
            settings.append(f"tested at {self.eval_length_mult:g}x length")
        if self.metric:
            settings.append(f"reads {self.metric}")
        where = f" ({', '.join(settings)})" if settings else ""
        tasks = [
            f"{task} ({', '.join(f'{k}={_text(v)}' for k, v in own.items())})"
            if (own := self.params_by_task.get(task))
            else task
            for task in self.tasks
        ]
        return f"{self.mech} on {', '.join(tasks)}{where}"


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple | list):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


@dataclass(frozen=True)
class Fact:
    """``source`` (paper, table or figure), ``claim`` (one line), ``arms`` (label -> Arm),
    ``rule`` (declared before any run), ``track`` (core or block), ``seeds``, ``measure``
    (``value`` or ``score``), ``published`` (label -> the source's figure, printed beside
    ours), ``notes`` (how our setting differs from the source's, and the cost).

    ``precondition`` (a ``Precondition`` over the fact's arms, e.g. "S3 learned"): the rule
    decides only where it holds; else the fact is inconclusive, "precondition not met".
    ``sanity``: the fact can fail only through a bug (a 1-layer model has no induction head,
    a window cannot see past itself): reported, and counted apart from the findings."""

    source: str
    claim: str
    arms: Mapping[str, Arm]
    rule: Rule
    track: str = "core"
    seeds: int = 3
    measure: str = "value"
    published: Mapping[str, str] = field(default_factory=dict)
    notes: str = ""
    precondition: Precondition | None = None
    sanity: bool = False

    def __post_init__(self) -> None:
        if self.track not in TRACKS:
            raise ValueError(f"a fact's track is one of {', '.join(TRACKS)}, not {self.track!r}")
        if self.measure not in MEASURES:
            raise ValueError(f"a fact's measure is {' or '.join(MEASURES)}, not {self.measure!r}")
        if not 1 <= self.seeds <= 100:
            raise ValueError(f"a fact needs 1 to 100 seeds, not {self.seeds}")
        if self.precondition is not None and not isinstance(self.precondition, Precondition):
            raise ValueError("a fact's precondition is a Precondition(name, rule)")
        if not isinstance(self.sanity, bool):
            raise ValueError(f"a fact's sanity is true or false, not {self.sanity!r}")
        unknown = sorted(set(self.verdict_rule.arms()) - set(self.arms))
        if unknown:
            raise ValueError(f"the rule names arms the fact lacks: {', '.join(unknown)}")
        for label, arm in self.arms.items():
            if arm_track(arm) != self.track:
                raise ValueError(
                    f"arm {label!r} trains in the {arm_track(arm)} track, the fact is {self.track}"
                )
        for label in self.published:
            if label not in self.arms:
                raise ValueError(f"a published figure for an arm the fact lacks: {label}")

    @property
    def verdict_rule(self) -> Rule:
        """The rule that decides the fact: ``rule``, given the precondition where one is
        declared."""
        if self.precondition is None:
            return self.rule
        return Given(self.precondition.rule, self.rule, self.precondition.name)

    @property
    def kind(self) -> str:
        return "sanity" if self.sanity else "finding"


def arm_track(arm: Arm) -> str:
    """The track an arm's runs train in: its protocol's, or that of the arch it sets."""
    arch = arm.protocol_params.get("arch")
    if arch is not None:
        return "block" if arch in LAYER_ARCHS else "core"
    return PROTOCOLS.get(arm.protocol).track


FACTS: Registry[Fact] = Registry(
    "fact",
    entry_point_group="synthbench.facts",
    builtins="synthbench.facts.builtin",
    required=("paper",),
)
