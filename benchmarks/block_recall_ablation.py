"""Which part of a block keeps softmax attention (or ``--mech``) from learning kv_recall?
Written for the block track's first block (``arch=block-plain`` since recipe v2, the
default here); ``--protocol-param arch=block`` asks it of fla's block, the block track's:

    python benchmarks/block_recall_ablation.py --protocol-param arch=block steps=2000 \
        --variants as-is,pytorch-init,no-pre-norm,no-mlp --lr 0.003 --task-param pairs=16 queries=0

    python benchmarks/block_recall_ablation.py --variants as-is,no-mlp,zero-fc2 --lr 0.01
    python benchmarks/block_recall_ablation.py --variants as-is --lr 0.003 \
        --protocol-param steps=3000
    python benchmarks/block_recall_ablation.py --variants as-is --task-param pairs=16 queries=0
    python benchmarks/block_recall_ablation.py --variants as-is --task noisy_copy \
        --mech deltanet --mech-param use_short_conv=false
    python benchmarks/block_recall_ablation.py --variants as-is,decay-near-1 \
        --mech gated-deltanet --mech-param head_dim=16 expand_v=1 use_gate=false --lr 0.003

Trains softmax (or ``--mech``, with ``--mech-param`` options of its layer) on kv_recall (or
``--task``) under quick-block (one lr, one seed, no lr sweep) with one part of the block
changed after the model is built, and prints per variant the test token accuracy, the step
the training stopped at and the validation curve. The variants:

- ``as-is``: the block before recipe v2 (synthbench/core/model.py, ``block-plain``);
- ``no-mlp``: every block without its MLP: the attention-only model of the core track;
- ``mlp-first`` / ``mlp-last``: the MLP in the first / last block only;
- ``zero-fc2``: the MLP's output layer starts at zero (the block starts as the core's model);
- ``gpt2-scaled``: PyTorch's init, the residual outputs (attention and MLP) divided by
  sqrt(2 n_layers) as GPT-2;
- ``zoology-init``: Zoology's ``_init_weights`` (every Linear and Embedding N(0, 0.02), the
  residual outputs N(0, 0.02 / sqrt(2 n_layers)));
- ``mlp-no-ln``: the MLP without its LayerNorm;
- ``no-pre-norm``: no norm before the mixer (fla's block has one, ``block-plain`` none);
- ``pytorch-init``: every Linear, Conv1d and Embedding drawn again with PyTorch's defaults
  (undoing fla's N(0, 0.02) in ``arch=block``);
- ``pytorch-init-embeddings`` / ``pytorch-init-linears``: the same for the Embeddings alone
  (N(0, 1)) / for the Linear and Conv1d weights alone, the rest as fla draws it;
- ``fla-init``: fla's initialisation (synthbench/core/model.py, ``fla_init``) in any arch,
  say the core's attention-only model;
- ``fla-init-width``: fla's initialisation with its std scaled to this model's width as
  fla's is to its own: N(0, 0.02 sqrt(2048 / d_model)) (fla's configurations pair
  ``initializer_range=0.02`` with ``hidden_size=2048``), 0.11 at d_model 64;
- ``decay-near-1``: every ``A_log`` (the decay rate of Gated DeltaNet and Mamba-2, drawn as
  log(uniform(0, 16)) and log(uniform(1, 16))) set to log(1e-3), so that every head starts
  out nearly without forgetting; still learned.

``--protocol-param`` changes the protocol (steps=3000, grad_clip=0; arch=block for fla's
block, the block track's since recipe v2, arch=attn-only for the core's model) and ``--pos`` its
positional encoding (rope), as ``synthbench run``'s options do. One thread, as the project
measures. The rows are not stored: this is a diagnosis, not a run.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch import nn

from synthbench.core.model import FLA_INIT_STD, Block, fla_init
from synthbench.core.params import parse_assignments
from synthbench.run import train
from synthbench.run.grid import protocol_points
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.spec import RunSpec

# the width fla's configurations pair with initializer_range=0.02
# (fla/models/gated_deltanet/configuration_gated_deltanet.py: hidden_size=2048)
FLA_HIDDEN_SIZE = 2048


class Zero(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


def _drop_mlps(blocks: list[Block]) -> None:
    for block in blocks:
        block.mlp = Zero()


def _zero_fc2(blocks: list[Block]) -> None:
    for block in blocks:
        nn.init.zeros_(block.mlp[2].weight)
        nn.init.zeros_(block.mlp[2].bias)


def _gpt2_scaled(blocks: list[Block]) -> None:
    with torch.no_grad():
        for block in blocks:
            for out in (block.mlp[2], block.attn.out):
                out.weight /= math.sqrt(2 * len(blocks))


def _zoology_init(model: nn.Module, blocks: list[Block]) -> None:
    for module in model.modules():
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
    for block in blocks:
        for out in (block.mlp[2], block.attn.out):
            nn.init.normal_(out.weight, std=0.02 / math.sqrt(2 * len(blocks)))


def _decay_near_1(model: nn.Module) -> None:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("A_log"):
                param.fill_(math.log(1e-3))


def _pytorch_init(
    model: nn.Module, kinds: tuple[type, ...] = (nn.Linear, nn.Conv1d, nn.Embedding)
) -> None:
    for module in model.modules():
        if isinstance(module, kinds):
            module.reset_parameters()


def change(variant: str, model: nn.Module) -> None:
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    if variant == "as-is":
        return
    if variant == "no-mlp":
        _drop_mlps(blocks)
    elif variant == "mlp-first":
        _drop_mlps(blocks[1:])
    elif variant == "mlp-last":
        _drop_mlps(blocks[:-1])
    elif variant == "zero-fc2":
        _zero_fc2(blocks)
    elif variant == "gpt2-scaled":
        _gpt2_scaled(blocks)
    elif variant == "zoology-init":
        _zoology_init(model, blocks)
    elif variant == "decay-near-1":
        _decay_near_1(model)
    elif variant == "mlp-no-ln":
        for block in blocks:
            block.norm2 = nn.Identity()
    elif variant == "no-pre-norm":
        for block in blocks:
            block.norm1 = nn.Identity()
    elif variant == "pytorch-init":
        _pytorch_init(model)
    elif variant == "pytorch-init-embeddings":
        _pytorch_init(model, (nn.Embedding,))
    elif variant == "pytorch-init-linears":
        _pytorch_init(model, (nn.Linear, nn.Conv1d))
    elif variant == "fla-init":
        fla_init(model)
    elif variant == "fla-init-width":
        fla_init(model, std=FLA_INIT_STD * math.sqrt(FLA_HIDDEN_SIZE / model.tok_emb.embedding_dim))
    else:
        raise SystemExit(f"unknown variant {variant!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="as-is,no-mlp")
    parser.add_argument("--task", default="kv_recall")
    parser.add_argument("--mech", default="softmax")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--task-param", nargs="*", default=[])
    parser.add_argument("--mech-param", nargs="*", default=[])
    parser.add_argument("--protocol-param", nargs="*", default=[])
    parser.add_argument("--pos", default=None, help="positional encoding, e.g. rope")
    args = parser.parse_args()

    try:  # the options are checked as synthbench run checks them: a one-line error
        # the block this diagnosis was written for, unless --protocol-param arch=... says
        overrides = {"arch": "block-plain", **parse_assignments(args.protocol_param)}
        points = protocol_points(PROTOCOLS.get("quick-block"), overrides)
        if len(points) != 1:
            raise ValueError("one value per --protocol-param: this script trains one protocol")
        tasks = parse_assignments(args.task_param) or None
        layer = parse_assignments(args.mech_param) or None
        spec = RunSpec.resolve(
            args.task, args.mech, points[0], args.seed, tasks, layer, pos=args.pos
        )
    except (KeyError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None

    built = train.seeded_model
    print("variant        token_acc  steps  seconds  validation curve")
    try:
        for variant in args.variants.split(","):

            def seeded_model(*a, variant=variant, **k):
                model = built(*a, **k)
                change(variant, model)
                return model

            train.seeded_model = seeded_model
            start = time.perf_counter()
            row = train.train_eval(spec, args.lr, torch.device("cpu"))
            seconds = time.perf_counter() - start
            if row["status"] != "ok":
                print(f"{variant:14} {row['status']}: {row['error']}")
                continue
            curve = " ".join(f"{v:.2f}" for v in row["curve_val_token_acc"])
            acc, steps = row["token_acc"], row["steps_done"]
            print(f"{variant:14} {acc:9.3f}  {steps:5d}  {seconds:7.0f}  {curve}")
    finally:
        train.seeded_model = built


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
