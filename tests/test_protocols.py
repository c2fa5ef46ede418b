"""Protocol presets: valid, documented, and their config is what run_id hashes."""

import dataclasses
from pathlib import Path

import pytest
import torch

from synthbench.run.protocols import PROTOCOLS, Protocol, markdown_table
from synthbench.run.spec import RunSpec

DOC = Path(__file__).resolve().parent.parent / "docs" / "PROTOCOLS.md"


def test_the_presets_exist_the_core_track_and_its_block_twins():
    assert PROTOCOLS.names() == [
        "smoke", "quick", "standard", "slay-paper", "smoke-block", "quick-block", "standard-block"
    ]  # fmt: skip


def test_docs_table_matches_the_code():
    assert markdown_table() in DOC.read_text(), "regenerate docs/PROTOCOLS.md's table"


def test_slay_paper_mirrors_the_published_setup():
    p = PROTOCOLS.get("slay-paper")
    assert (p.d_model, p.n_heads, p.n_layers, p.arch, p.pos) == (64, 4, 2, "attn-only", "learned")
    assert (p.steps, p.batch_size, p.lrs, p.seeds) == (200, 32, (1e-3,), 3)


def test_slay_paper_runs_suite_v1_layouts_under_the_users_own_params():
    paper, quick = PROTOCOLS.get("slay-paper"), PROTOCOLS.get("quick")
    assert paper.pinned_task_params("induction") == {"dense": False, "n": 64}
    # suite v1's lengths, whatever the current defaults are (suite v2 enlarged both tasks)
    assert RunSpec.resolve("induction", "softmax", paper, 0).make_task().seq_len == 64
    assert RunSpec.resolve("kv_recall", "softmax", paper, 0).make_task().seq_len == 32
    assert RunSpec.resolve("counting", "softmax", paper, 0).make_task().seq_len == 34
    assert RunSpec.resolve("compression", "softmax", paper, 0).make_task().seq_len == 40
    assert RunSpec.resolve("noisy_copy", "softmax", paper, 0).make_task().seq_len == 72
    assert RunSpec.resolve("parity", "softmax", paper, 0).make_task().seq_len == 17
    assert RunSpec.resolve("distant_match", "softmax", paper, 0).make_task().seq_len == 129
    assert RunSpec.resolve("reverse", "softmax", paper, 0).make_task().seq_len == 64
    assert RunSpec.resolve("selective_copy", "softmax", paper, 0).make_task().seq_len == 72
    assert RunSpec.resolve("histogram", "softmax", paper, 0).task_params == {
        "n": 16, "vocab": 8, "queries": 0
    }  # fmt: skip
    assert RunSpec.resolve("pattern", "softmax", paper, 0).task_params == {
        "n": 32, "min_period": 2, "max_period": 8, "k": 8, "vocab": 16
    }  # fmt: skip
    assert RunSpec.resolve("retrieval", "softmax", paper, 0).task_params == {
        "n": 64, "vocab": 32, "needles": 1, "gap": 0  # gap: suite v4's, 0 its earlier layout
    }  # fmt: skip
    assert paper.pinned_task_params("copy") == quick.pinned_task_params("induction") == {}
    spec = RunSpec.resolve("multihop", "softmax", paper, 0)
    assert (spec.task_params["walk"], spec.task_params["walks"]) == (False, 1)
    assert spec.make_task().seq_len == 34  # suite v1's one-answer layout
    mine = RunSpec.resolve("multihop", "softmax", paper, 0, task_overrides={"walks": 2})
    assert (mine.task_params["walk"], mine.task_params["walks"]) == (False, 2)
    assert RunSpec.resolve("multihop", "softmax", quick, 0).task_params["walk"] is True
    with pytest.raises(ValueError, match="multihop"):  # a pinned name is still checked
        RunSpec.resolve("multihop", "softmax", paper, 0, task_overrides={"walks": 99})


# every task slay-paper pins, read from the protocol so that a new pin is covered too
@pytest.mark.parametrize("name", [task for task, _ in PROTOCOLS.get("slay-paper").task_params])
def test_every_pinned_layout_builds_and_generates(name):
    spec = RunSpec.resolve(name, "softmax", PROTOCOLS.get("slay-paper"), 0)
    task = spec.make_task()
    batch = task.generate(16, torch.Generator().manual_seed(0))
    assert torch.equal(task.solve(batch.inputs), batch.targets)


def test_standard_sweeps_learning_rates():
    assert len(PROTOCOLS.get("standard").lrs) > 1


@pytest.mark.parametrize(
    "change",
    [
        {"arch": "rnn"},
        {"pos": "rotary"},
        {"d_model": 30, "n_heads": 4},
        {"steps": 0},
        {"lrs": ()},
        {"lrs": (-1.0,)},
        {"warmup_frac": 1.0},
        {"select_metric": "loss"},
        {"grad_clip": -1.0},
    ],
)
def test_invalid_values_are_refused(change):
    with pytest.raises(ValueError, match="protocol 'quick'"):
        dataclasses.replace(PROTOCOLS.get("quick"), **change)


def test_config_leaves_out_what_does_not_change_results():
    config = PROTOCOLS.get("quick").config()
    assert "description" not in config and "seeds" not in config
    assert config["name"] == "quick" and config["version"] == PROTOCOLS.get("quick").version
    assert isinstance(Protocol.__dataclass_fields__["lrs"].default, tuple)


@pytest.mark.parametrize("name", PROTOCOLS.names())
def test_a_stored_config_gives_its_protocol_back(name):
    protocol = PROTOCOLS.get(name)
    assert Protocol.from_config(protocol.config()).config() == protocol.config()


def test_a_field_an_older_version_stored_without_was_off():
    """quick v6's rows store no lr_refine (it did not exist): read back, it is off."""
    older = {k: v for k, v in PROTOCOLS.get("quick").config().items() if k != "lr_refine"}
    older["version"] = 6
    protocol = Protocol.from_config(older)
    assert protocol.version == 6 and protocol.lr_refine == 0 and protocol.lrs == (1e-3, 3e-3, 1e-2)


@pytest.mark.parametrize("field", ["d_model", "n_heads", "n_layers"])
@pytest.mark.parametrize("value", [0, -4])
def test_every_model_dimension_is_checked_before_anything_trains(field, value):
    """d_model=0 trained a model of width 0 and stored it as ok (issue 32); n_heads=0 was a
    ZeroDivisionError."""
    with pytest.raises(ValueError, match=f"sizes and counts must be >= 1: {field}"):
        dataclasses.replace(PROTOCOLS.get("quick"), **{field: value})


# The data of every task under slay-paper, as suite v2 generated it (seed 5, 64 examples):
# suite v3 re-posed layouts behind knobs that slay-paper pins, so its runs stay comparable
# with the published tables. A change here changes what slay-paper measures.
SLAY_PAPER_DATA = {
    "addition": "7f50edd865", "bigram": "c05a8d0e65", "compression": "e32631f603",
    "copy": "30a8efe8fc", "counting": "5efa666335", "distant_match": "3f5bc1f519",
    "first_token": "1941591ee9", "histogram": "a0b4575e74", "induction": "714c78cd70",
    "kv_recall": "fd164ea614", "long_copy": "4df1fd3aa2", "majority": "e8fa07e2a7",
    "modular": "48ba2bd942", "multihop": "218afeb214", "noisy_copy": "c09cb4fda4",
    "parity": "f0648c68e0", "pattern": "04d49bd150", "retrieval": "772fd3327b",
    "reverse": "43d90b8a59", "selective_copy": "83b481df58", "sort": "c75c5a2f84",
    "stack": "23e8ed4d99",
}  # fmt: skip


def test_slay_paper_generates_the_data_it_always_did():
    import hashlib

    paper = PROTOCOLS.get("slay-paper")
    for task, expected in SLAY_PAPER_DATA.items():
        batch = (
            RunSpec.resolve(task, "softmax", paper, 0)
            .make_task()
            .generate(64, torch.Generator().manual_seed(5))
        )
        data = batch.inputs.numpy().tobytes() + batch.targets.numpy().tobytes()
        assert hashlib.sha1(data).hexdigest()[:10] == expected, task
