"""The literature's findings as pre-declared checks (``synthbench facts``): a registry of
facts (fact.py), the rules that decide them (rules.py), their runs and verdicts from stored
rows (evaluate.py) and the report (report.py). The built-in facts are in builtin.py."""

from synthbench.facts.fact import FACTS, Arm, Fact
from synthbench.facts.rules import All, AtLeast, AtMost, Better, Close, Given, Precondition

__all__ = [
    "FACTS",
    "All",
    "Arm",
    "AtLeast",
    "AtMost",
    "Better",
    "Close",
    "Fact",
    "Given",
    "Precondition",
]
