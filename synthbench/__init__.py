"""synthbench: a synthetic-task benchmark suite and leaderboard for attention mechanisms."""

from synthbench.mechanism import MECHANISMS, FeatureMapMechanism, Mechanism
from synthbench.registry import Registry
from synthbench.task import TASKS, Batch, Task, teacher_forced

__version__ = "0.1.0"
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
