"""Planning a huge grid costs microseconds a run (issue 73: 572,000 runs printed nothing but
"planning" for 100 s): what every seed of a cell shares is computed once per cell, and a
dry run asks nothing of the filesystem per run. Counted here, not timed: the counts hold on
any machine (docs/CLI.md gives the times measured)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from clitools import invoke

from synthbench.run import planning, spec
from synthbench.run.protocols import PROTOCOLS, Protocol
from synthbench.run.spec import RunSpec
from synthbench.run.store import ResultStore

SMOKE = PROTOCOLS.get("smoke")


@pytest.mark.parametrize(
    "task, mechanism, options",
    [
        ("copy", "softmax", {}),
        ("kv_recall", "linear", {"eval_length_mult": 2.0, "pos": "rope"}),
        ("multihop", "slay", {"task_overrides": {"hops": 3}}),
        ("parity", "performer", {"mechanism_overrides": {"nb_features": 8}, "threads": 2}),
    ],
)
def test_with_seeds_gives_each_seed_the_run_with_seed_gives(task, mechanism, options):
    first = RunSpec.resolve(task, mechanism, SMOKE, 0, **options)
    seeds = [0, 1, 7, 999, 123_456_789]
    for fast in first.with_seeds(seeds):
        slow = dataclasses.replace(first, seed=fast.seed)
        assert fast == slow and fast.run_id == slow.run_id
        assert json.loads(fast.row_fields()["config"])["seed"] == fast.seed
    with pytest.raises(ValueError, match="seed must be an integer"):
        first.with_seeds([-1])


def test_planning_serialises_each_cell_once_not_each_seed(monkeypatch):
    calls = {"config": 0, "build": 0}
    config, build = Protocol.config, spec.build_mixer_once

    def counted_config(self):
        calls["config"] += 1
        return config(self)

    def counted_build(*args):
        calls["build"] += 1
        return build(*args)

    monkeypatch.setattr(Protocol, "config", counted_config)
    monkeypatch.setattr(spec, "build_mixer_once", counted_build)
    monkeypatch.setattr(spec, "_BUILT", set())
    tasks, mechanisms = ["copy", "sort", "parity"], ["softmax", "linear"]
    specs = planning.plan(tasks, mechanisms, SMOKE, 100)
    assert len(specs) == 600 and len({s.run_id for s in specs}) == 600
    cells = len(tasks) * len(mechanisms)
    assert calls["config"] <= 2 * cells  # was once a run: a protocol's config per run id
    assert calls["build"] == len(mechanisms)  # was once a cell: a mechanism, once per size


def test_a_dry_run_asks_the_store_nothing_per_run(results, monkeypatch):
    """The store is read once (its files listed); a run whose file is not there is refused
    by none, so nothing asks for its path."""
    asked = []
    refusal = ResultStore.refusal

    def counted(self, *key):
        asked.append(key)
        return refusal(self, *key)

    monkeypatch.setattr(ResultStore, "refusal", counted)
    args = ["run", "--task", "copy,sort", "--mech", "softmax,linear", "--protocol", "smoke"]
    result = invoke(*args, "--seeds", 50, "--results", results, "--dry-run")
    assert result.exit_code == 0, result.output
    assert "200 runs" in result.stdout and "2 already stored, 198 to run" in result.stdout
    assert asked == []  # was once a run: two paths built and looked up for each
