"""benchmarks/block_recall_ablation.py: each variant changes the block-track model as it says."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from synthbench.run import train
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.spec import RunSpec

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "block_recall_ablation.py"
spec = importlib.util.spec_from_file_location("block_recall_ablation", SCRIPT)
ablation = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = ablation
spec.loader.exec_module(ablation)


def model(variant: str, protocol: str = "smoke-block") -> torch.nn.Module:
    run = RunSpec.resolve("kv_recall", "softmax", PROTOCOLS.get(protocol), 0)
    task, _ = train.run_tasks(run)
    built = train.seeded_model(run, task, None, torch.device("cpu"))
    ablation.change(variant, built)
    return built.eval()


def test_a_zero_mlp_output_starts_as_the_model_without_mlps():
    tokens = torch.randint(0, 40, (2, 24))
    as_is, zero, none = model("as-is")(tokens), model("zero-fc2")(tokens), model("no-mlp")(tokens)
    assert torch.equal(zero, none) and not torch.allclose(as_is, none)


def test_variants_touch_only_what_they_name():
    def dropped(variant: str) -> list[bool]:  # per block (quick-block has 2): MLP dropped?
        built = model(variant, "quick-block")
        return [isinstance(m.mlp, ablation.Zero) for m in built.modules()
                if isinstance(m, ablation.Block)]  # fmt: skip

    assert dropped("mlp-first") == [False, True] and dropped("mlp-last") == [True, False]
    assert dropped("no-mlp") == [True, True] and dropped("as-is") == [False, False]
    zoology = model("zoology-init")
    assert zoology.head.weight.std().item() == pytest.approx(0.02, rel=0.2)
    with pytest.raises(SystemExit, match="unknown variant"):
        ablation.change("no-such-variant", model("as-is"))
