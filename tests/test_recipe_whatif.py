"""benchmarks/recipe_whatif.py: a variant replayed from stored rows is what training under it
gives, checked against real trainings under the variant."""

import dataclasses
import math

import pandas as pd
import pytest
import torch
from clitools import load_script

from synthbench.run import train
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.runner import run_sweep
from synthbench.run.spec import RunSpec

whatif = load_script("recipe_whatif")
CPU = torch.device("cpu")

# smoke with recipe v2: 20 steps (a curve point every 2), going on 10 at a time while rising,
# up to 40; solved at 0.99; three lrs, a knife-edge refined once
RECIPE = dataclasses.replace(
    PROTOCOLS.get("smoke"),
    lrs=(1e-3, 1e-2, 3e-2),
    stop_at=0.99,
    max_steps=40,
    extend_steps=10,
    rise_margin=0.0,
    lr_refine=1,
)


def scripted(row, step):
    """A learning curve set by the lr (the training itself is real): fastest at 1e-2, where
    it solves in 20 steps; 3e-2 settles at 0.8 in an extension; 1e-3 still rises at 40 (far
    behind: a knife-edge, whose midpoint solves in an extension); the seed moves the pace."""
    pace = 0.05 * math.exp(-(math.log10(row["lr"] / 1e-2) ** 2) / 0.5) * (1 + 0.1 * row["seed"])
    return min(1.0 if row["lr"] < 2e-2 else 0.8, step * pace)


def sweep(protocol, seed):
    real = train.curve_point

    def curve_point(row, protocol, budget, step, val_metrics):
        val_metrics["token_acc"] = scripted(row, step)
        return real(row, protocol, budget, step, val_metrics)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train, "curve_point", curve_point)
        return run_sweep(RunSpec.resolve("kv_recall", "linear", protocol, seed), CPU)


def summary(rows):
    """What the replay claims exact: each lr's steps and validation score, and the selection."""
    return {
        round(r["lr"], 9): (r["status"], r["steps_done"], r["val_token_acc"], bool(r["selected"]))
        for r in rows
    }


@pytest.fixture(scope="module")
def stored(single_thread):
    return {seed: sweep(RECIPE, seed) for seed in (0, 1, 2)}


def test_the_stored_recipe_replays_to_its_own_rows(stored):
    for rows in stored.values():  # what the fixture exercises
        assert len(rows) == 4  # the grid and one midpoint, below the best
        steps = [r["steps_done"] for r in rows]
        assert min(steps) <= RECIPE.steps < max(steps) and RECIPE.max_steps in steps
    for rows in stored.values():
        assert summary(whatif.replay_run(rows, RECIPE)) == summary(rows)


@pytest.mark.parametrize(
    "changes",
    [{"max_steps": 30}, {"max_steps": 20}, {"rise_margin": 0.03}, {"lr_refine": 0}],
)
def test_a_variant_replays_to_what_training_under_it_gives(stored, changes):
    variant = dataclasses.replace(RECIPE, **changes)
    for seed, rows in list(stored.items())[:2]:
        trained = sweep(variant, seed)
        try:
            replayed = whatif.replay_run(rows, variant)
        except whatif.Unknown as unknown:  # then the variant did train an lr not stored
            lacking = {r["lr"] for r in trained} - {r["lr"] for r in rows}
            assert f"lr {min(lacking):g} was not trained" in str(unknown)
            continue
        assert summary(replayed) == summary(trained), (changes, seed)
        for row in replayed:  # cut short: no test score of its own, the validation's instead
            assert row["proxied"] == (row["steps_done"] < _stored(rows, row["lr"])["steps_done"])


def _stored(rows, lr):
    return next(r for r in rows if r["lr"] == lr)


def test_a_variant_that_trains_what_was_not_stored_is_unknown(stored):
    rows = [r for r in stored[0] if r["lr"] != 1e-2]
    with pytest.raises(whatif.Unknown, match="lr 0.01 was not trained"):
        whatif.replay_run(rows, RECIPE)
    # 1e-3 stored as if it had stopped at 20 steps, where it still rose: the recipe goes on
    slow = _stored(stored[0], 1e-3)
    cut = dict(slow, steps_done=20, curve_steps=slow["curve_steps"][:10])
    cut["curve_val_token_acc"] = slow["curve_val_token_acc"][:10]
    with pytest.raises(whatif.Unknown, match="past the stored training's end"):
        whatif.replay_training(cut, RECIPE, whatif.Budget())


def test_a_diverged_training_is_ok_where_a_variant_stops_it_sooner(stored):
    """Stored: 1e-3 diverged at step 23, in its first extension (its curve up to 22). A cap at
    20 stops it at 20, before the divergence: ok there. The recipe as stored trains on into
    the extension, to the same divergence."""
    slow = _stored(stored[0], 1e-3)
    points = slow["curve_steps"].index(22) + 1
    diverged = dict(slow, status="diverged", error="non-finite loss at step 23", steps_done=23)
    diverged["curve_steps"] = slow["curve_steps"][:points]
    diverged["curve_val_token_acc"] = slow["curve_val_token_acc"][:points]
    capped = whatif.replay_training(
        diverged, dataclasses.replace(RECIPE, max_steps=20), whatif.Budget()
    )
    assert (capped["status"], capped["steps_done"], capped["error"]) == ("ok", 20, None)
    assert capped["val_token_acc"] == slow["curve_val_token_acc"][9] and capped["proxied"]
    again = whatif.replay_training(diverged, RECIPE, whatif.Budget())
    assert again["status"] == "diverged" and again["steps_done"] == 23


def test_a_cell_grows_by_seeds_as_the_variant_would_grow_it(stored):
    """Seeds 0 to 2 of one cell: with a base of two seeds, the third is replayed only where
    the variant's spread rule adds it (synthbench/run/seeds.py)."""
    test_scores = {0: 0.2, 1: 0.9, 2: 0.5}  # seeds 0 and 1: 0.7 apart
    rows = pd.DataFrame(
        [dict(r, token_acc=test_scores[seed]) for seed in (0, 1, 2) for r in stored[seed]]
    )
    for spread, seeds in ((0.5, {0, 1, 2}), (0.8, {0, 1})):
        variant = dataclasses.replace(RECIPE, max_seeds=3, seed_spread=spread)
        replayed, unknown = whatif.replay(rows, variant, base_seeds=2)
        assert set(replayed["seed"]) == seeds and unknown == 0
    missing = rows[rows["seed"].lt(2)]
    variant = dataclasses.replace(RECIPE, max_seeds=3, seed_spread=0.5)
    replayed, unknown = whatif.replay(missing, variant, base_seeds=2)
    assert replayed.empty and unknown == 1  # the cell needs seed 2, not stored: left out


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("cheap:steps=500", "not one of"),
        ("long:max_steps=6000", "trains longer"),
        ("loose:rise_margin=0.0", "trains longer"),
        ("few:max_seeds=2", "below the seed count"),
        ("typo:lr_refine=one", "lr_refine='one' is not an integer"),
        ("short:max_steps=500", "must be >= steps"),
    ],
)
def test_a_variant_outside_what_can_be_replayed_is_refused(text, error, capsys):
    with pytest.raises(ValueError, match=error):
        whatif.parse_variant(text, PROTOCOLS.get("quick"))
    assert whatif.main(["nowhere", "--variant", text]) == 2
    assert error in capsys.readouterr().err


def test_results_without_a_complete_panel_run_are_said(tmp_path, capsys):
    assert whatif.main([str(tmp_path)]) == 2
    assert "no complete quick v" in capsys.readouterr().err
    assert whatif.main([str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_todays_code_replays_every_stored_panel_run_as_it_was_trained():
    """The committed panel's runs (benchmarks/runs/panel-v2) were trained under the quick
    protocol of their version: today's sweep and horizon rules, replayed on their curves,
    must train the same lrs for the same steps and select the same one. A change to those
    rules that fails here changes the recipe, and needs a new protocol version."""
    quick = PROTOCOLS.get("quick")
    rows = whatif.recipe_panel.load(whatif.recipe_panel.ROOT / "benchmarks" / "runs" / "panel-v2")
    rows = rows[rows["protocol"].eq("quick") & rows["protocol_version"].eq(quick.version)]
    if rows.empty:
        pytest.skip(f"no panel run of quick v{quick.version} committed")
    complete = whatif._complete(rows, quick)
    runs = list(complete.groupby(["task", "mechanism", "seed"]))
    assert len(runs) >= 10
    for key, part in runs:
        stored = part.to_dict("records")
        assert summary(whatif.replay_run(stored, quick)) == summary(stored), key


def test_a_variant_with_no_cell_replayable_has_no_figures(stored):
    rows = pd.DataFrame([r for r in stored[0] if r["lr"] != 1e-2])  # its grid lacks 1e-2
    result = whatif.compare(rows, pd.DataFrame(), RECIPE, RECIPE, {})
    assert result == {"unknown_runs": 1, "figures": {}}
