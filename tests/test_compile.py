"""`run --compile`: a training with torch.compile is the eager training's function, rounded
differently, so it keeps the run id and says so in its rows; compiled against eager forward
and backward (slow: each model compiles for seconds)."""

from __future__ import annotations

import pytest
import torch
from clitools import ENV
from typer.testing import CliRunner

from synthbench.cli import app
from synthbench.core.task import IGNORE
from synthbench.run import train
from synthbench.run.protocols import PROTOCOLS, protocol_of_track
from synthbench.run.spec import RunSpec
from synthbench.run.store import ResultStore

SMOKE = PROTOCOLS.get("smoke")


def run_compiled(results, *options: str):
    """`synthbench run --compile` of smoke's copy on linear attention, into ``results``."""
    command = ["run", "--task", "copy", "--mech", "linear", "--protocol", "smoke", "--compile"]
    return CliRunner().invoke(app, [*command, *options, "--results", str(results)], env=ENV)


def test_compiled_keeps_the_run_id_and_the_rows_say_so():
    eager = RunSpec.resolve("copy", "linear", SMOKE, 0)
    compiled = RunSpec.resolve("copy", "linear", SMOKE, 0, compiled=True)
    assert compiled.run_id == eager.run_id
    assert compiled.row_fields()["compiled"] is True
    assert eager.row_fields()["compiled"] is False
    assert all(s.compiled for s in compiled.with_seeds([1, 2]))
    assert compiled.with_seed(3).compiled


def test_compile_with_a_pack_is_refused_in_one_line(tmp_path):
    result = run_compiled(tmp_path, "--pack", "2")
    assert result.exit_code == 2
    assert "--compile trains one training at a time" in result.output
    assert "--pack 2" in result.output
    assert not list(tmp_path.rglob("*.parquet"))


def test_compiling_leaves_room_for_every_mechanism_of_a_worker():
    """torch.compile's default of 8 graphs per function would leave a worker's later
    mechanisms (each with its training and evaluation shapes) eager without a word."""
    model = torch.nn.Linear(2, 2)
    train.compile_in_place(model)
    assert torch._dynamo.config.recompile_limit >= train.COMPILED_GRAPHS
    assert torch._dynamo.config.accumulated_recompile_limit >= train.COMPILED_GRAPHS
    assert model.state_dict().keys() == {"weight", "bias"}  # in place: the module's own


def _loss_and_gradients(model: torch.nn.Module, batch) -> tuple[torch.Tensor, list]:
    model.zero_grad(set_to_none=True)
    logits = model(batch.inputs)
    loss = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), batch.training_targets.flatten(), ignore_index=IGNORE
    )
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.slow
@pytest.mark.parametrize(
    "mechanism, track",
    [("softmax", "core"), ("linear", "core"), ("gla", "core"), ("mamba2", "core"),
     ("gated-deltanet", "block")],
)  # fmt: skip
def test_compiled_model_is_the_eager_model(mechanism, track):
    """The quick model compiled in place (as `--compile` trains it) against the same model
    eager, from the same seed: the loss and every gradient agree to float32 rounding."""
    torch.set_num_threads(1)
    spec = RunSpec.resolve("kv_recall", mechanism, protocol_of_track("quick", track), 0)
    task = spec.make_task()
    batch = task.generate(8, torch.Generator().manual_seed(1))
    eager = train.seeded_model(spec, task, None, torch.device("cpu"))
    compiled = train.seeded_model(spec, task, None, torch.device("cpu"))
    train.compile_in_place(compiled)
    loss, grads = _loss_and_gradients(eager, batch)
    compiled_loss, compiled_grads = _loss_and_gradients(compiled, batch)
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-5, atol=1e-6)
    assert len(compiled_grads) == len(grads)
    for got, want in zip(compiled_grads, grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-5)


@pytest.mark.slow
def test_a_compiled_run_trains_and_stores_compiled_rows(tmp_path):
    result = run_compiled(tmp_path, "--jobs", "1")
    assert result.exit_code == 0, result.output
    rows = ResultStore(tmp_path).load(warn=False).rows
    assert len(rows) == len(SMOKE.lrs)
    assert rows["compiled"].tolist() == [True] * len(rows)
    assert (rows["status"] == "ok").all()
    assert (rows["steps_done"] == SMOKE.steps).all()
