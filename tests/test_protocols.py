"""Protocol presets: valid, documented, and their config is what run_id hashes."""

import dataclasses
from pathlib import Path

import pytest

from synthbench.protocols import PROTOCOLS, Protocol, markdown_table

DOC = Path(__file__).resolve().parent.parent / "docs" / "PROTOCOLS.md"


def test_the_four_presets_exist():
    assert PROTOCOLS.names() == ["smoke", "quick", "standard", "slay-paper"]


def test_docs_table_matches_the_code():
    assert markdown_table() in DOC.read_text(), "regenerate docs/PROTOCOLS.md's table"


def test_slay_paper_mirrors_the_published_setup():
    p = PROTOCOLS.get("slay-paper")
    assert (p.d_model, p.n_heads, p.n_layers, p.arch, p.pos) == (64, 4, 2, "attn-only", "learned")
    assert (p.steps, p.batch_size, p.lrs, p.seeds) == (200, 32, (1e-3,), 3)


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
