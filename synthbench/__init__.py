"""synthbench: a synthetic-task benchmark suite and leaderboard for attention mechanisms."""

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"
# The public names, each imported from its module on first use (PEP 562): importing the
# command line must not load torch before it can turn a Ctrl-C into one line.
_PUBLIC = {
    "MECHANISMS": "synthbench.mechanism",
    "FeatureMapMechanism": "synthbench.mechanism",
    "Mechanism": "synthbench.mechanism",
    "Registry": "synthbench.registry",
    "TASKS": "synthbench.task",
    "Batch": "synthbench.task",
    "Task": "synthbench.task",
    "teacher_forced": "synthbench.task",
}
__all__ = [
    "MECHANISMS",
    "TASKS",
    "Batch",
    "FeatureMapMechanism",
    "Mechanism",
    "Registry",
    "Task",
    "teacher_forced",
]

if TYPE_CHECKING:  # what type checkers and editors see
    from synthbench.mechanism import MECHANISMS, FeatureMapMechanism, Mechanism
    from synthbench.registry import Registry
    from synthbench.task import TASKS, Batch, Task, teacher_forced


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'synthbench' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # once: later lookups find it here
    return value
