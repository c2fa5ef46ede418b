"""benchmarks/block_recall_ablation.py: each variant changes the block-track model as it says."""

import dataclasses

import pytest
import torch
from clitools import load_script

from synthbench.run import train
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.spec import RunSpec

ablation = load_script("block_recall_ablation")


def model(variant: str, protocol: str = "smoke-block", mech: str = "softmax") -> torch.nn.Module:
    # the block the diagnosis was written for (the block track's before recipe v2)
    plain = dataclasses.replace(PROTOCOLS.get(protocol), arch="block-plain")
    run = RunSpec.resolve("kv_recall", mech, plain, 0)
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


def test_decay_near_1_sets_every_decay_rate_and_nothing_else():
    as_is, near_1 = (
        dict(model(variant, "quick-block", "gated-deltanet").named_parameters())
        for variant in ("as-is", "decay-near-1")
    )
    rates = [name for name in as_is if name.endswith("A_log")]
    assert len(rates) == 2  # quick-block: two blocks, a Gated DeltaNet layer in each
    for name, value in near_1.items():
        if name in rates:
            assert torch.allclose(value, torch.full_like(value, -6.907755), atol=1e-6)
            assert not torch.allclose(as_is[name], value)
        else:
            assert torch.equal(as_is[name], value)


def test_flas_block_variants_undo_its_init_or_its_pre_norm():
    def fla(variant: str, mech: str = "gated-deltanet") -> torch.nn.Module:
        run = RunSpec.resolve("kv_recall", mech, PROTOCOLS.get("smoke-block"), 0)
        task, _ = train.run_tasks(run)
        built = train.seeded_model(run, task, None, torch.device("cpu"))
        ablation.change(variant, built)
        return built

    as_is, pytorch = fla("as-is"), fla("pytorch-init")
    assert as_is.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.2)
    assert pytorch.tok_emb.weight.std().item() == pytest.approx(1.0, rel=0.2)
    embeddings, linears = fla("pytorch-init-embeddings"), fla("pytorch-init-linears")
    assert embeddings.tok_emb.weight.std().item() == pytest.approx(1.0, rel=0.2)
    assert embeddings.head.weight.std().item() == pytest.approx(0.02, rel=0.2)
    assert linears.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.2)
    assert linears.head.weight.std().item() == pytest.approx(
        pytorch.head.weight.std().item(), rel=0.1
    )
    # fla's 0.02 at its 2,048 wide, scaled to this model's width (smoke's 32): 0.02 x 8
    width = fla("fla-init-width")
    assert width.tok_emb.embedding_dim == 32
    for module in (width.tok_emb, width.head, width.blocks[0].mlp.down_proj):
        assert module.weight.std().item() == pytest.approx(0.02 * (2048 / 32) ** 0.5, rel=0.2)
    # the layer's own parameters (its decay rates) are not the init's to draw
    torch.testing.assert_close(as_is.blocks[0].attn.A_log, pytorch.blocks[0].attn.A_log)
    assert isinstance(fla("no-pre-norm").blocks[0].norm1, torch.nn.Identity)
    assert not isinstance(as_is.blocks[0].norm1, torch.nn.Identity)
