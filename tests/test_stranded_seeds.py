"""benchmarks/stranded_seeds.py: which seeds a sweep left at chance while another seed of
the same cell learned at an lr their sweep never trained."""

import pandas as pd
from clitools import load_script

stranded_seeds = load_script("stranded_seeds")


def rows(*trainings):
    """(mechanism, seed, lr, val_token_acc, selected) -> rows of one task, chance 0.03."""
    return pd.DataFrame(
        [
            {
                "protocol": "quick",
                "mechanism": mech,
                "task": "first_token",
                "seed": seed,
                "lr": lr,
                "val_token_acc": acc,
                "selected": selected,
                "chance_token_acc": 0.03,
                "status": "ok",
            }
            for mech, seed, lr, acc, selected in trainings
        ]
    )


def test_a_seed_at_chance_that_never_tried_the_lr_another_seed_learned_at_is_listed():
    table = stranded_seeds.stranded(
        rows(
            ("a", 0, 3e-3, 0.04, False),
            ("a", 0, 9e-4, 1.0, True),
            ("a", 1, 3e-3, 0.02, False),
            ("a", 1, 1e-2, 0.035, True),
            ("a", 1, 3.3e-2, 0.02, False),
        ),
        margin=0.02,
        gap=0.15,
    )
    assert table[["mechanism", "seed", "better_seed", "its_lr"]].values.tolist() == [
        ["a", 1, 0, "0.0009"]
    ]
    assert table["lrs_tried"].tolist() == ["0.003 0.01 0.033"]


def test_a_seed_that_tried_that_lr_or_learned_something_is_not_listed():
    tried_it = rows(
        ("a", 0, 3e-3, 1.0, True),
        ("a", 1, 3e-3, 0.03, False), ("a", 1, 1e-2, 0.04, True),
    )  # fmt: skip
    above_chance = rows(
        ("a", 0, 9e-4, 1.0, True),
        ("a", 1, 3e-3, 0.3, True), ("a", 1, 1e-2, 0.04, False),
    )  # fmt: skip
    close = rows(("a", 0, 9e-4, 0.1, True), ("a", 1, 1e-2, 0.04, True))  # within the gap
    alone = rows(("a", 0, 1e-2, 0.04, True))  # one seed: nothing to compare with
    for case in (tried_it, above_chance, close, alone):
        assert stranded_seeds.stranded(case, margin=0.02, gap=0.15).empty
