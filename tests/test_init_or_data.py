"""benchmarks/init_or_data.py: a seed's model and a seed's batches, paired at will."""

import json

import torch
from clitools import load_script

from synthbench.run.protocols import PROTOCOLS
from synthbench.run.spec import RunSpec
from synthbench.run.train import train_eval

split = load_script("init_or_data")
CPU = torch.device("cpu")


def fields(row):
    return row["status"], row["steps_done"], row["curve_val_token_acc"], row["token_acc"]


def test_a_seed_paired_with_itself_is_the_run_and_a_crossed_pair_is_neither(single_thread):
    smoke = PROTOCOLS.get("smoke")
    runs = {
        seed: train_eval(RunSpec.resolve("kv_recall", "linear", smoke, seed), 1e-2, CPU)
        for seed in (0, 1)
    }
    for seed in (0, 1):
        same = split.crossed("kv_recall", "linear", 1e-2, seed, seed, "smoke")
        assert fields(same) == fields(runs[seed])
    mixed = split.crossed("kv_recall", "linear", 1e-2, 0, 1, "smoke")
    assert mixed["status"] == "ok"
    assert mixed["curve_val_token_acc"] not in [r["curve_val_token_acc"] for r in runs.values()]


def test_the_command_prints_a_line_per_training_and_refuses_an_unknown_name(capsys):
    args = ["--task", "kv_recall", "--mech", "linear", "--lr", "0.01", "--seeds", "0", "1"]
    assert split.main([*args, "--protocol", "smoke", "--diagonal"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["init_seed"], r["data_seed"]) for r in lines] == [(0, 1), (1, 0), (0, 0), (1, 1)]
    assert (
        split.main(["--task", "kv_recall", "--mech", "lineer", "--lr", "0.01", "--seeds", "0", "1"])
        == 2
    )
    assert "lineer" in capsys.readouterr().err


def test_a_bad_lr_or_seed_is_refused(capsys):
    base = ["--task", "kv_recall", "--mech", "linear", "--protocol", "smoke"]
    assert split.main([*base, "--lr", "-1", "--seeds", "0", "1"]) == 2
    assert "--lr must be a positive number" in capsys.readouterr().err
    assert split.main([*base, "--lr", "0.01", "--seeds", "-1", "1"]) == 2
    assert "seed" in capsys.readouterr().err


def test_a_schedule_spans_its_steps_from_the_first(single_thread):
    smoke = PROTOCOLS.get("smoke")  # no extension, no early stop: a training is its schedule
    plain = train_eval(RunSpec.resolve("kv_recall", "linear", smoke, 0), 1e-2, CPU)
    same = split.crossed("kv_recall", "linear", 1e-2, 0, 0, "smoke", schedule=smoke.steps)
    assert fields(same) == fields(plain)
    longer = split.crossed("kv_recall", "linear", 1e-2, 0, 0, "smoke", schedule=3 * smoke.steps)
    assert longer["steps_done"] == 3 * smoke.steps
    assert longer["curve_steps"][-1] == 3 * smoke.steps


def test_self_trains_each_seed_as_itself_and_a_bad_schedule_is_refused(capsys):
    base = ["--task", "kv_recall", "--mech", "linear", "--lr", "0.01", "--protocol", "smoke"]
    assert split.main([*base, "--self", "2", "0", "--schedule", "30"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["init_seed"], r["data_seed"], r["steps_done"]) for r in lines] == [
        (2, 2, 30),
        (0, 0, 30),
    ]
    assert all(len(r["curve"]) > 1 for r in lines)
    assert split.main([*base, "--self", "0", "--schedule", "0"]) == 2
    assert "--schedule must be a positive number of steps" in capsys.readouterr().err
