"""Built-in task generators; importing this package registers them in TASKS."""

from . import copy, kv_recall  # noqa: F401
