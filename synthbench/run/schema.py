"""The results row: its columns, their types, and the statuses a training ends with.

One row per training (a run at one learning rate); the store (synthbench/run/store.py) keeps
a run's rows in one Parquet file. ``SCHEMA`` is what a file holds; the partition columns
(``PARTITIONS``) live in its path, the Hive convention, so every reader sees the tree as one
table (``DATASET_SCHEMA``). A schema version only ever adds columns (``ADDED_IN``); version 6
also moved ``protocol`` from the file into the path.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

SCHEMA_VERSION = 11
# Columns each schema version added; a file of an older version is read with them null.
ADDED_IN = {
    2: ("eval_length_mult", "long_token_acc", "long_exact_match"),
    3: ("threads",),
    4: ("free_token_acc", "curve_steps", "curve_val_token_acc"),
    5: (
        "lr_edge",
        "target_metric",
        "chance_token_acc",
        "chance_exact_match",
        "token_acc_se",
        "exact_match_se",
        "free_token_acc_se",
    ),
    6: ("cpu_isa",),
    7: ("cpu_model",),
    8: ("lr_robustness", "lr_gap"),
    9: ("state_size",),
    10: ("cpu_seconds",),
    11: ("compiled",),
}
# The levels of a results path, outermost first: <root>/protocol=.../task=.../mechanism=...
PARTITIONS = ("protocol", "task", "mechanism")
# Files of schema < 6 lie at <root>/task=.../mechanism=... and hold the protocol themselves
# (ResultStore reads both, and `synthbench migrate` moves them under their protocol)
LEGACY_PARTITIONS = ("task", "mechanism")
# Statuses that are a training's result; any other (error, ...) is a failure, which never
# replaces a stored result (ResultStore.save)
RESULT_STATUSES = frozenset({"ok", "diverged"})
# leaky (synthbench/integrity/causality.py): the mechanism sees later positions. A failure that does
# replace a stored result, which it shows was never one.
LEAKY = "leaky"
STATUSES = (*sorted(RESULT_STATUSES), "error", LEAKY)  # every status a training stores

# Columns stored in each file (the partition columns are added back from the path).
SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("schema_version", pa.int32()),
        ("suite_version", pa.int32()),
        ("category", pa.string()),
        ("task_params", pa.string()),  # JSON
        ("mechanism_params", pa.string()),  # JSON
        ("protocol_version", pa.int32()),
        ("config", pa.string()),  # JSON of the whole resolved config that run_id hashes
        ("seed", pa.int64()),
        ("lr", pa.float64()),
        ("selected", pa.bool_()),  # the lr the validation set picked
        # the picked lr is alone at an edge of the grid: the optimum may lie beyond it
        ("lr_edge", pa.bool_()),
        # how robust the run's verdict is to its lr (synthbench/run/lr_selection.py): the lrs
        # within 0.05 of the best score, and the best score's lead over the next lr
        ("lr_robustness", pa.int64()),
        ("lr_gap", pa.float64()),
        ("steps", pa.int64()),
        ("steps_done", pa.int64()),
        ("status", pa.string()),  # ok | diverged | error | leaky (integrity/causality.py)
        ("error", pa.string()),
        ("token_acc", pa.float64()),
        ("exact_match", pa.float64()),
        ("val_token_acc", pa.float64()),
        ("val_exact_match", pa.float64()),
        # the test answers generated free-running: each answer fed back as the model made it
        ("free_token_acc", pa.float64()),
        # the metric the task is scored by (free_token_acc for a chain of steps)
        ("target_metric", pa.string()),
        # the best constant answer per position (synthbench/integrity/audit.py): what
        # learning nothing scores; reports normalise by it
        ("chance_token_acc", pa.float64()),
        ("chance_exact_match", pa.float64()),
        # standard errors of the test metrics over the test examples
        ("token_acc_se", pa.float64()),
        ("exact_match_se", pa.float64()),
        ("free_token_acc_se", pa.float64()),
        # learning curve: validation token accuracy after these optimizer steps
        ("curve_steps", pa.list_(pa.int64())),
        ("curve_val_token_acc", pa.list_(pa.float64())),
        # length generalisation: the test set of the task with its length knob scaled
        ("eval_length_mult", pa.float64()),
        ("long_token_acc", pa.float64()),
        ("long_exact_match", pa.float64()),
        ("final_loss", pa.float64()),
        ("n_params", pa.int64()),
        # the numbers one model layer of the run's mechanism carries from one token to the
        # next, at length STATE_LENGTH (1024, synthbench/core/mechanism.py) with the run's
        # parameters and its protocol's sizes: its declared state_size (a published layer's
        # whole state; a core's per head times the heads), as `synthbench check` measures it;
        # null where the mechanism declares none or it raised. The leaderboard's state column
        ("state_size", pa.int64()),
        ("wall_seconds", pa.float64()),
        # the CPU time its process spent meanwhile, every thread (synthbench/run/clock.py):
        # what the training cost, which a loaded machine does not inflate; null where unknown
        ("cpu_seconds", pa.float64()),
        ("threads", pa.int64()),  # torch's intra-op threads of the training (in the run id)
        # trained with torch.compile (`run --compile`; not in the run id: the same function,
        # rounded differently); null in files before schema 11, which were all eager
        ("compiled", pa.bool_()),
        # provenance (synthbench/provenance.py)
        ("device", pa.string()),
        # torch's CPU capability (DEFAULT, AVX2, AVX512, ...): the vector instruction set its
        # CPU kernels run with, which can change floating-point sums across machines
        ("cpu_isa", pa.string()),
        # the CPU's vendor, family/model/stepping and name: the same instruction set on
        # another microarchitecture can round differently too
        ("cpu_model", pa.string()),
        ("torch_version", pa.string()),
        ("synthbench_version", pa.string()),
        ("git_commit", pa.string()),
        ("created_at", pa.timestamp("us", tz="UTC")),
    ],
    metadata={"synthbench_schema_version": str(SCHEMA_VERSION)},
)
COLUMNS = [*PARTITIONS, *SCHEMA.names]
# The whole tree as one table: every column of every schema version (a file of an older one
# lacks some), the partition columns first. What pandas, pyarrow and Polars read it with.
DATASET_SCHEMA = pa.schema(
    [*(pa.field(p, pa.string()) for p in PARTITIONS), *SCHEMA],
    metadata=SCHEMA.metadata,
)
# What a row handed to ``write`` holds: every column but the version, which the store adds.
ROW_COLUMNS = frozenset(COLUMNS) - {"schema_version"}
# The columns a training fills with its results; null when it fails.
RESULT_METRICS = (
    "token_acc",
    "exact_match",
    "val_token_acc",
    "val_exact_match",
    "free_token_acc",
    "chance_token_acc",
    "chance_exact_match",
    "token_acc_se",
    "exact_match_se",
    "free_token_acc_se",
    "curve_steps",
    "curve_val_token_acc",
    "long_token_acc",
    "long_exact_match",
    "final_loss",
    "n_params",
)


def has_curve(curve_steps) -> bool:
    """Whether a row stores a learning curve (rows of schema < 4 have none: null, or NaN in a
    built frame)."""
    return curve_steps is not None and not isinstance(curve_steps, float) and len(curve_steps) > 0


def lr_key(lr: float) -> float:
    """An lr rounded to 6 significant digits: a training's key within its run, so that grid
    steps computed by division compare equal to the same lr read back from a file."""
    return float(f"{lr:.6g}")


def schema_of(columns: list[str]) -> pa.Schema:
    """The Arrow schema of ``columns`` (partition columns are strings)."""
    fields = {f.name: f for f in SCHEMA} | {p: pa.field(p, pa.string()) for p in PARTITIONS}
    return pa.schema([fields[c] for c in columns])


class SchemaError(ValueError):
    """A row that does not hold exactly the columns of the schema (a programming error)."""


def check_row(row: dict[str, Any]) -> None:
    """Raise SchemaError unless ``row`` holds exactly the columns of the current schema."""
    missing, unknown = ROW_COLUMNS - set(row), set(row) - ROW_COLUMNS
    if missing or unknown:
        problems = [f"{what} {', '.join(sorted(cols))}" for what, cols in
                    (("missing", missing), ("unknown", unknown)) if cols]  # fmt: skip
        raise SchemaError(f"a results row of schema {SCHEMA_VERSION}: " + "; ".join(problems))
