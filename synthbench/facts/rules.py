"""The rules that decide a fact: reproduced, not reproduced or inconclusive.

A rule is declared with the fact, before any run: which arms it compares, the effect size,
the threshold. It reads each arm's per-seed values (``ArmResult``) and decides. An arm whose
runs are missing, failed (diverged at every lr, raised, leaked) or lack seeds makes the rule
inconclusive with that reason, never a verdict.

``Better(a, b, effect)`` is stricter than the separation rule (synthbench/report/
separation.py): the claim "a beats b" is reproduced when every seed both have clears the
effect (a - b >= ``effect`` on each, not only on the mean) and each seed's difference is
beyond two standard errors of the test sets; it is not reproduced when the mean difference is
below ``effect``; anything else (a seed below the effect, seeds that disagree, a difference
within the test noise, a selected lr alone at the edge of its grid, seeds missing) is
inconclusive.

A fact may also declare a precondition (``Precondition``: a name and a rule, e.g. "S3
learned"): ``Given`` decides the claim only where the precondition is reproduced; where it is
not, the fact is inconclusive, "precondition not met", with the figures of both.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from synthbench.report.separation import MIN_SEEDS, NOISE_SES, TOLERANCE

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
NOT_RUN = "not run"  # a fact none of whose runs is stored yet
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_RUN)


@dataclass(frozen=True)
class ArmResult:
    """One arm's runs: ``values`` and ``se`` indexed by seed, ``lr_edge`` (a seed's selected
    lr alone at an edge of its grid), ``problem`` (why the arm has no usable value: missing
    or failed runs), ``missing`` (none of its runs stored)."""

    values: pd.Series
    se: pd.Series
    lr_edge: bool = False
    problem: str | None = None
    missing: bool = False

    @property
    def mean(self) -> float:
        return float(self.values.mean()) if len(self.values) else math.nan

    def text(self) -> str:
        if not len(self.values):
            return "-"
        if len(self.values) == 1:
            return f"{self.mean:.3f}"
        return f"{self.mean:.3f} ({self.values.min():.3f}-{self.values.max():.3f})"


@dataclass(frozen=True)
class Decision:
    verdict: str
    figures: str  # what the rule compared, with our numbers
    reason: str | None = None  # why it is inconclusive or not reproduced


class Rule(ABC):
    @abstractmethod
    def arms(self) -> tuple[str, ...]:
        """The labels of the arms the rule reads."""

    @abstractmethod
    def declaration(self) -> str:
        """The rule in words, as declared."""

    @abstractmethod
    def decide(self, results: Mapping[str, ArmResult]) -> Decision: ...

    def _unusable(self, results: Mapping[str, ArmResult]) -> Decision | None:
        """Inconclusive where an arm the rule reads has a problem (no values to show)."""
        for label in self.arms():
            result = results[label]
            if result.problem:
                return Decision(INCONCLUSIVE, "", f"{label}: {result.problem}")
        return None

    def _edge(self, results: Mapping[str, ArmResult], figures: str) -> Decision | None:
        """Inconclusive where a seed's selected lr is alone at an edge of its grid: the arm
        may do better beyond it (as the separation rule)."""
        edge = [label for label in self.arms() if results[label].lr_edge]
        if edge:
            reason = f"{', '.join(edge)}: a seed's selected lr is alone at an edge of its grid"
            return Decision(INCONCLUSIVE, figures, reason)
        return None


def _differences(a: ArmResult, b: ArmResult) -> tuple[pd.Series, pd.Series]:
    """Per common seed: a - b, and two standard errors of that difference (NaN: unknown)."""
    common = a.values.index.intersection(b.values.index)
    differences = a.values[common] - b.values[common]
    noise = NOISE_SES * (a.se.reindex(common) ** 2 + b.se.reindex(common) ** 2) ** 0.5
    return differences, noise


def _compare(rule: Rule, results: Mapping[str, ArmResult], a: str, b: str):
    """What a rule over the pair (a, b) reads: a Decision already reached (an arm unusable,
    too few common seeds, an lr at the edge) or None, then the per-seed differences a - b,
    their noise, the mean difference and the figures text."""
    unusable = rule._unusable(results)
    if unusable:
        return unusable, None, None, math.nan, ""
    differences, noise = _differences(results[a], results[b])
    mean = float(differences.mean()) if len(differences) else math.nan
    figures = (
        f"{a} {results[a].text()} vs {b} {results[b].text()}: "
        f"{mean:+.3f} over {len(differences)} seeds"
    )
    if len(differences) < MIN_SEEDS:
        early = Decision(INCONCLUSIVE, figures, f"fewer than {MIN_SEEDS} common seeds")
        return early, differences, noise, mean, figures
    return rule._edge(results, figures), differences, noise, mean, figures


@dataclass(frozen=True)
class Better(Rule):
    """Arm ``a`` beats arm ``b`` by at least ``effect`` (module docstring)."""

    a: str
    b: str
    effect: float = 0.1

    def arms(self) -> tuple[str, ...]:
        return (self.a, self.b)

    def declaration(self) -> str:
        return (
            f"{self.a} - {self.b} >= {self.effect:g} on every one of >= {MIN_SEEDS} common "
            f"seeds, each beyond {NOISE_SES} SE"
        )

    def decide(self, results: Mapping[str, ArmResult]) -> Decision:
        early, differences, noise, mean, figures = _compare(self, results, self.a, self.b)
        if early:
            return early
        if mean < self.effect - TOLERANCE:
            return Decision(NOT_REPRODUCED, figures, f"the difference is below {self.effect:g}")
        if (differences <= 0).any():
            return Decision(INCONCLUSIVE, figures, "the seeds' differences disagree in sign")
        short = differences[differences < self.effect - TOLERANCE]
        if len(short):  # the mean clears the effect, a seed does not: not every seed shows it
            seeds = ", ".join(f"seed {seed} {d:+.3f}" for seed, d in short.items())
            why = f"a seed's difference is below {self.effect:g} ({seeds})"
            return Decision(INCONCLUSIVE, figures, why)
        if not noise.isna().all() and not (differences > noise.fillna(0)).all():
            return Decision(INCONCLUSIVE, figures, f"a seed's difference is within {NOISE_SES} SE")
        return Decision(REPRODUCED, figures)


@dataclass(frozen=True)
class Close(Rule):
    """Arms ``a`` and ``b`` within ``tolerance`` of each other on the mean over the common
    seeds (reproduced); a gap beyond it that every seed shows, beyond the test noise, is not
    reproduced; a gap some seeds do not show is inconclusive."""

    a: str
    b: str
    tolerance: float = 0.05

    def arms(self) -> tuple[str, ...]:
        return (self.a, self.b)

    def declaration(self) -> str:
        return f"|{self.a} - {self.b}| <= {self.tolerance:g} on the mean over common seeds"

    def decide(self, results: Mapping[str, ArmResult]) -> Decision:
        early, differences, noise, mean, figures = _compare(self, results, self.a, self.b)
        if early:
            return early
        if abs(mean) <= self.tolerance + TOLERANCE:
            return Decision(REPRODUCED, figures)
        same_sign = (differences > 0).all() or (differences < 0).all()
        beyond = noise.isna().all() or (differences.abs() > noise.fillna(0)).all()
        if same_sign and beyond:
            return Decision(NOT_REPRODUCED, figures, f"a gap beyond {self.tolerance:g}")
        return Decision(INCONCLUSIVE, figures, "the gap is not shown by every seed")


@dataclass(frozen=True)
class AtLeast(Rule):
    """Arm ``a``'s mean over its seeds is at least ``threshold``."""

    a: str
    threshold: float

    def arms(self) -> tuple[str, ...]:
        return (self.a,)

    def declaration(self) -> str:
        return f"{self.a} >= {self.threshold:g} on the mean over seeds"

    def decide(self, results: Mapping[str, ArmResult]) -> Decision:
        return _threshold(self, results, self.a, lambda mean: mean >= self.threshold - TOLERANCE)


@dataclass(frozen=True)
class AtMost(Rule):
    """Arm ``a``'s mean over its seeds is at most ``threshold``."""

    a: str
    threshold: float

    def arms(self) -> tuple[str, ...]:
        return (self.a,)

    def declaration(self) -> str:
        return f"{self.a} <= {self.threshold:g} on the mean over seeds"

    def decide(self, results: Mapping[str, ArmResult]) -> Decision:
        return _threshold(self, results, self.a, lambda mean: mean <= self.threshold + TOLERANCE)


def _threshold(rule: Rule, results: Mapping[str, ArmResult], label: str, holds) -> Decision:
    unusable = rule._unusable(results)
    if unusable:
        return unusable
    result = results[label]
    figures = f"{label} {result.text()} over {len(result.values)} seeds"
    if len(result.values) < MIN_SEEDS:
        return Decision(INCONCLUSIVE, figures, f"fewer than {MIN_SEEDS} seeds")
    edge = rule._edge(results, figures)
    if edge:
        return edge
    if holds(result.mean):
        return Decision(REPRODUCED, figures)
    return Decision(NOT_REPRODUCED, figures, rule.declaration() + " does not hold")


@dataclass(frozen=True)
class All(Rule):
    """Every part holds: reproduced when all are; not reproduced when any part is not
    reproduced; inconclusive otherwise."""

    parts: tuple[Rule, ...]

    def arms(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(label for part in self.parts for label in part.arms()))

    def declaration(self) -> str:
        return "; and ".join(part.declaration() for part in self.parts)

    def decide(self, results: Mapping[str, ArmResult]) -> Decision:
        decisions = [part.decide(results) for part in self.parts]
        figures = "; ".join(d.figures for d in decisions if d.figures)
        failed = [d for d in decisions if d.verdict == NOT_REPRODUCED]
        if failed:
            return Decision(NOT_REPRODUCED, figures, "; ".join(d.reason or "" for d in failed))
        unsure = [d for d in decisions if d.verdict != REPRODUCED]
        if unsure:
            return Decision(INCONCLUSIVE, figures, "; ".join(d.reason or "" for d in unsure))
        return Decision(REPRODUCED, figures)


@dataclass(frozen=True)
class Given(Rule):
    """``rule`` decides only where ``precondition`` holds: a claim about what a model does
    beyond its training (a longer test, say) says nothing where the arms never learned the
    task at all. Inconclusive where it does not hold ("precondition not met", named by
    ``name``) or is not established (its runs missing), with the figures of both."""

    precondition: Rule
    rule: Rule
    name: str = ""  # the precondition in words ("S3 learned"); its rule's declaration if empty

    def arms(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.precondition.arms() + self.rule.arms()))

    def declaration(self) -> str:
        condition = self.precondition.declaration()
        if self.name:
            condition = f"{self.name} ({condition})"
        return f"given {condition}: {self.rule.declaration()}"

    def decide(self, results: Mapping[str, ArmResult]) -> Decision:
        given = self.precondition.decide(results)
        decision = self.rule.decide(results)
        figures = "; ".join(f for f in (given.figures, decision.figures) if f)
        if given.verdict != REPRODUCED:
            state = "not met" if given.verdict == NOT_REPRODUCED else "not established"
            what = self.name or self.precondition.declaration()
            detail = given.reason or given.verdict
            return Decision(INCONCLUSIVE, figures, f"precondition {state}: {what} ({detail})")
        return Decision(decision.verdict, figures, decision.reason)


@dataclass(frozen=True)
class Precondition:
    """What must hold before a fact's claim means anything (``Fact.precondition``): ``name``
    in words ("S3 learned") and the ``rule`` that decides it, over the fact's arms."""

    name: str
    rule: Rule
