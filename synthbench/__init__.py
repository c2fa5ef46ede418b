"""synthbench: a synthetic-task benchmark suite and leaderboard for attention mechanisms."""

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"
# The public names, each imported from its module on first use (PEP 562): importing the
# command line must not load torch before it can turn a Ctrl-C into one line.
_PUBLIC = {
    "DATASET_SCHEMA": "synthbench.run.schema",
    "MECHANISMS": "synthbench.core.mechanism",
    "FeatureMapMechanism": "synthbench.core.mechanism",
    "Mechanism": "synthbench.core.mechanism",
    "Registry": "synthbench.core.registry",
    "ResultStore": "synthbench.run.store",
    "TASKS": "synthbench.core.task",
    "Batch": "synthbench.core.task",
    "Task": "synthbench.core.task",
    "teacher_forced": "synthbench.core.task",
}
__all__ = [
    "DATASET_SCHEMA",
    "MECHANISMS",
    "TASKS",
    "Batch",
    "FeatureMapMechanism",
    "Mechanism",
    "Registry",
    "ResultStore",
    "Task",
    "teacher_forced",
]

if TYPE_CHECKING:  # what type checkers and editors see
    from synthbench.core.mechanism import MECHANISMS, FeatureMapMechanism, Mechanism
    from synthbench.core.registry import Registry
    from synthbench.core.task import TASKS, Batch, Task, teacher_forced
    from synthbench.run.schema import DATASET_SCHEMA
    from synthbench.run.store import ResultStore


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'synthbench' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # once: later lookups find it here
    return value
