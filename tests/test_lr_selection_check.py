"""benchmarks/lr_selection_check.py: the replay of a cheaper lr selection on the shipped
reference, which the cost issue's pre-declared check is run with."""

import pandas as pd
import pytest
from clitools import load_script

check = load_script("lr_selection_check")


@pytest.fixture(scope="module")
def reference():
    rows = check.of_protocol(pd.read_parquet(check.REFERENCE / "quick.parquet"), "quick")
    return rows, check.stored_protocol(rows)


@pytest.mark.slow
def test_replaying_the_shipped_selection_gives_the_stored_rows_back(reference):
    rows, protocol = reference
    before = check.separated(rows)  # seconds: the fast tier's tests here need only the rest
    result = check.check(rows, protocol, "reference", before)
    assert result["passes"] and result["unverifiable"] == 0 and result["same_lr"] == 1.0
    assert result["cost_all"] == pytest.approx(1.0)


@pytest.mark.slow
def test_reusing_seed_zeros_lr_trains_one_lr_per_other_seed(reference):
    rows, protocol = reference
    replayed = check.replay(protocol, rows, "seed0")
    known = replayed[replayed["unverifiable"].isna()]
    for record in known.itertuples():
        lrs = {lr for lr, _ in record.choices.values()}
        assert len(lrs) == 1  # one lr for every seed of the pair
        pair = rows[(rows["task"] == record.task) & (rows["mechanism"] == record.mechanism)]
        first = pair[pair["seed"] == 0]["wall_seconds"].sum()
        others = pair[(pair["seed"] > 0) & (pair["lr"].map(check.lr_key) == lrs.pop())]
        assert record.seconds == pytest.approx(first + others["wall_seconds"].sum())


def _row(lr, curve, steps_done, val):
    points = [100 * (k + 1) for k in range(len(curve))]
    return pd.Series(
        {"lr": lr, "curve_steps": points, "curve_val_token_acc": curve, "steps_done": steps_done,
         "val_token_acc": val, "val_exact_match": val, "wall_seconds": steps_done / 100.0,
         "status": "ok"}
    )  # fmt: skip


def test_halving_continues_the_best_at_the_rung_and_charges_the_rest_to_it(reference):
    protocol = reference[1]
    rows = {  # 3e-3 leads at step 300 (inside the grid, grown down once) but 1e-2 wins in
        # the end: halving keeps 3e-3 alone
        0.0009: _row(0.0009, [0.1] * 10, 1000, 0.1),
        0.003: _row(0.003, [0.3, 0.5, 0.6] + [0.7] * 7, 1000, 0.7),
        0.01: _row(0.01, [0.2, 0.3, 0.4] + [0.9] * 7, 1000, 0.9),
    }
    one = check.halving(300, 1)(protocol, rows)
    assert (one.lr, one.edge) == (0.003, False)
    assert one.seconds == pytest.approx(10.0 + 3.0 + 3.0)  # 3e-3 whole, the others 300 steps
    both = check.halving(300, 2)(protocol, rows)
    assert both.lr == 0.01 and both.seconds == pytest.approx(10.0 + 10.0 + 3.0)


def test_halving_needs_an_lr_the_reference_never_trained_and_says_so(reference):
    protocol = reference[1]
    rows = {  # 1e-2 alone best at the rung, at the grid's top: the grid grows to 3.3e-2
        0.003: _row(0.003, [0.1, 0.2, 0.3] + [0.95] * 7, 1000, 0.95),
        0.01: _row(0.01, [0.2, 0.4, 0.6] + [0.9] * 7, 1000, 0.9),
    }
    with pytest.raises(check.Unverifiable):
        check.halving(300, 2)(protocol, rows)


def test_the_replay_takes_one_protocol_of_the_reference_and_names_what_it_holds():
    rows = pd.DataFrame({"protocol": ["quick", "quick-block", "quick"], "seed": [0, 0, 1]})
    assert list(check.of_protocol(rows, "quick")["seed"]) == [0, 1]
    with pytest.raises(SystemExit, match="no 'standard' runs \\(it holds: quick, quick-block\\)"):
        check.of_protocol(rows, "standard")
