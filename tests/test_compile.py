"""`run --compile`: a training with torch.compile is the eager training's function, rounded
differently, so it keeps the run id and says so in its rows; a torch.compile that cannot
build here is said in one line before anything trains. Compiled against eager forward and
backward, and a compiled run, are slow (each model compiles for seconds) and run in a fresh
interpreter: what an earlier test imported (pip, which disables setuptools' loader) would
otherwise decide whether inductor can build."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from clitools import ENV, SUBPROCESS_ENV, command_line
from typer.testing import CliRunner

from synthbench.cli import app
from synthbench.run import train
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.spec import RunSpec
from synthbench.run.store import ResultStore

SMOKE = PROTOCOLS.get("smoke")
RUN_COMPILED = ["run", "--task", "copy", "--mech", "linear", "--protocol", "smoke", "--compile"]


def test_compiled_keeps_the_run_id_and_the_rows_say_so():
    eager = RunSpec.resolve("copy", "linear", SMOKE, 0)
    compiled = RunSpec.resolve("copy", "linear", SMOKE, 0, compiled=True)
    assert compiled.run_id == eager.run_id
    assert compiled.row_fields()["compiled"] is True
    assert eager.row_fields()["compiled"] is False
    assert all(s.compiled for s in compiled.with_seeds([1, 2]))
    assert compiled.with_seed(3).compiled


def test_compile_with_a_pack_is_refused_in_one_line(tmp_path):
    result = CliRunner().invoke(app, [*RUN_COMPILED, "--pack", "2", "--results", tmp_path], env=ENV)
    assert result.exit_code == 2
    assert "--compile trains one training at a time" in result.output
    assert "--pack 2" in result.output
    assert not list(tmp_path.rglob("*.parquet"))


class _BuildFailed(Exception):
    """As torch's BackendCompilerFailed: a message of many lines, the cause inside."""

    def __init__(self) -> None:
        super().__init__("backend='inductor' raised:\nOSError: no C++ compiler\n\nSet VERBOSE")
        self.inner_exception = OSError("no C++ compiler\nsee the log")


def test_a_compiler_that_cannot_build_is_said_in_one_line_before_training(tmp_path, monkeypatch):
    def fails(fn):
        def call(*args):
            raise _BuildFailed

        return call

    monkeypatch.setattr(torch, "compile", fails)
    with pytest.raises(
        ValueError, match=r"^torch.compile cannot build on cpu here \(OSError: no C"
    ):
        train.check_compiler(torch.device("cpu"))
    result = CliRunner().invoke(app, [*RUN_COMPILED, "--results", tmp_path], env=ENV)
    assert result.exit_code == 2
    said = [line for line in result.output.splitlines() if line.startswith("error")]
    assert said == [
        "error: --compile: torch.compile cannot build on cpu here (OSError: no C++ compiler)"
    ]
    assert not list(tmp_path.rglob("*.parquet"))


def test_compiling_leaves_room_for_every_mechanism_of_a_worker():
    """torch.compile's default of 8 graphs per function would leave a worker's later
    mechanisms (each with its training and evaluation shapes) eager without a word."""
    model = torch.nn.Linear(2, 2)
    train.compile_in_place(model)
    assert torch._dynamo.config.recompile_limit >= train.COMPILED_GRAPHS
    assert torch._dynamo.config.accumulated_recompile_limit >= train.COMPILED_GRAPHS
    assert model.state_dict().keys() == {"weight", "bias"}  # in place: the module's own


# the quick model compiled in place (as `--compile` trains it) against the same model eager,
# from the same seed: the loss and every gradient agree to float32 rounding
SAME_MODEL = """
import torch
from synthbench.core.task import IGNORE
from synthbench.run import train
from synthbench.run.protocols import protocol_of_track
from synthbench.run.spec import RunSpec

torch.set_num_threads(1)
spec = RunSpec.resolve("kv_recall", MECHANISM, protocol_of_track("quick", TRACK), 0)
task = spec.make_task()
batch = task.generate(8, torch.Generator().manual_seed(1))

def loss_and_gradients(model):
    loss = torch.nn.functional.cross_entropy(
        model(batch.inputs).flatten(0, 1), batch.training_targets.flatten(), ignore_index=IGNORE
    )
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters() if p.grad is not None]

eager = train.seeded_model(spec, task, None, torch.device("cpu"))
compiled = train.seeded_model(spec, task, None, torch.device("cpu"))
train.compile_in_place(compiled)
loss, grads = loss_and_gradients(eager)
compiled_loss, compiled_grads = loss_and_gradients(compiled)
torch.testing.assert_close(compiled_loss, loss, rtol=1e-5, atol=1e-6)
assert len(compiled_grads) == len(grads) > 0
for got, want in zip(compiled_grads, grads, strict=True):
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-5)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "mechanism, track",
    [("softmax", "core"), ("linear", "core"), ("gla", "core"), ("mamba2", "core"),
     ("gated-deltanet", "block")],
)  # fmt: skip
def test_compiled_model_is_the_eager_model(mechanism, track):
    code = f"MECHANISM, TRACK = {mechanism!r}, {track!r}\n" + textwrap.dedent(SAME_MODEL)
    done = subprocess.run([sys.executable, "-c", code], env=SUBPROCESS_ENV, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_a_compiled_run_trains_and_stores_compiled_rows(tmp_path):
    command = command_line(*RUN_COMPILED, "--jobs", "1", "--results", tmp_path)
    done = subprocess.run(command, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = ResultStore(tmp_path).load(warn=False).rows
    assert len(rows) == len(SMOKE.lrs)
    assert rows["compiled"].tolist() == [True] * len(rows)
    assert (rows["status"] == "ok").all()
    assert (rows["steps_done"] == SMOKE.steps).all()
