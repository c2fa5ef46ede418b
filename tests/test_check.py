"""synthbench/integrity/ (causality, contract, guard) and ``synthbench check``: every
built-in passes every check; leaky mechanisms of many kinds, written here as a plugin would
write them, are caught (by the check before training, or by the check of the trained model);
``run`` refuses them and stores them as ``leaky``, which no report ranks. The gradient
probes are compared with the full Jacobian, computed independently."""

from __future__ import annotations

import inspect
import random
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from typer.testing import CliRunner

from synthbench.cli import app
from synthbench.core.mechanism import MECHANISMS, Mechanism, mechanism_params
from synthbench.core.model import Model
from synthbench.core.registry import load_plugin_file
from synthbench.core.task import TASKS
from synthbench.integrity import causality as check
from synthbench.integrity.causality import (
    FULL_COVERAGE_UP_TO,
    CheckResult,
    Subject,
    check_leaks,
    check_model_causality,
    cuts,
    seed_torch,
)
from synthbench.integrity.contract import check_mechanism, suite_lengths
from synthbench.integrity.guard import leak_guard
from synthbench.run.lr_selection import run_status, sweep_state
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.runner import plan
from synthbench.run.spec import RunSpec
from synthbench.run.store import ResultStore
from synthbench.run.train import failed_row

pytestmark = pytest.mark.usefixtures("single_thread")

HEAD_DIM, N_HEADS = 8, 2  # small: the checks' cost grows with both
LENGTHS = (1, 7, 33, 64, 130)  # one position; within, at and past the linear core's chunk
SMOKE = PROTOCOLS.get("smoke")
ENV = {"COLUMNS": "250"}  # rich never wraps a line


# -- leaky mechanisms, as a plugin would write them -----------------------------------------


def attend(q, k, v, causal=True):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


class IgnoresCausalFlag(Mechanism):
    def forward(self, q, k, v, causal=True):
        return attend(q, k, v, causal=False)


class AddsNextValue(Mechanism):
    def forward(self, q, k, v, causal=True):
        return attend(q, k, v) + F.pad(v[:, :, 1:], (0, 0, 0, 1))


class RollsOneAhead(Mechanism):
    def forward(self, q, k, v, causal=True):
        return attend(q, k.roll(-1, dims=2), v.roll(-1, dims=2))


class MixesTheBatch(Mechanism):
    def forward(self, q, k, v, causal=True):
        return attend(q, k, v) + v.mean(dim=0, keepdim=True)


class WrongLayout(Mechanism):
    """(batch, length, heads, head_dim) data reshaped to the input's shape: right shape."""

    def forward(self, q, k, v, causal=True):
        return attend(q, k, v).transpose(1, 2).reshape(q.shape)


class LeaksInEvalOnly(Mechanism):
    def forward(self, q, k, v, causal=True):
        return attend(q, k, v, causal=self.training)


class LeaksInTrainingOnly(Mechanism):
    def forward(self, q, k, v, causal=True):
        return attend(q, k, v, causal=not self.training)


class LeaksBeyond64(Mechanism):
    def forward(self, q, k, v, causal=True):
        return attend(q, k, v, causal=q.shape[2] <= 64)


class NormalisesBySequence(Mechanism):
    def forward(self, q, k, v, causal=True):
        return attend(q, k, v) / (1 + k.abs().mean(dim=2, keepdim=True))


class FirstTokenSeesAll(Mechanism):
    def forward(self, q, k, v, causal=True):
        out = attend(q, k, v)
        return torch.cat([v.mean(dim=2, keepdim=True), out[:, :, 1:]], dim=2)


class DetachedLookAhead(Mechanism):
    """Leaks through a path without gradient: only the perturbation check sees it."""

    def forward(self, q, k, v, causal=True):
        return attend(q, k, v) + v.roll(-1, dims=2).detach()


class SortsByLaterKeys(Mechanism):
    def forward(self, q, k, v, causal=True):
        order = k.sum(-1, keepdim=True).argsort(dim=2).expand_as(v)
        return attend(q, k, v) + 0.1 * v.detach().gather(2, order)


class LeaksUnderNoGrad(Mechanism):
    """Causal while gradients are on (training, the gradient check), not in evaluation."""

    def forward(self, q, k, v, causal=True):
        return attend(q, k, v, causal=torch.is_grad_enabled())


class LeaksInFloat32Only(Mechanism):
    """Causal in float64, where the gradient check runs; not in float32, where training does."""

    def forward(self, q, k, v, causal=True):
        return attend(q, k, v, causal=q.dtype == torch.float64)


class LearnedGate(Mechanism):
    """Causal as built (the gate starts at 0); training opens a one-token look-ahead."""

    def __init__(self, head_dim, n_heads):
        super().__init__(head_dim, n_heads)
        self.gate = nn.Parameter(torch.zeros(()))

    def forward(self, q, k, v, causal=True):
        return attend(q, k, v) + self.gate * v.roll(-1, dims=2)


class LeaksOnePair(Mechanism):
    """Output position ``u`` reads ``v`` at position ``s`` (> u): one entry of the Jacobian."""

    def __init__(self, head_dim, n_heads, u: int = 3, s: int = 5):
        super().__init__(head_dim, n_heads)
        self.u, self.s = u, s

    def forward(self, q, k, v, causal=True):
        out = attend(q, k, v)
        if q.shape[2] <= self.s:
            return out
        extra = torch.zeros_like(out)
        extra[:, :, self.u] = v[:, :, self.s]
        return out + extra


BOTH = {"causality", "causality-forward"}
# class -> (the checks it fails, a word the first failure's detail names)
LEAKS = {
    IgnoresCausalFlag: (BOTH, "position"),
    AddsNextValue: (BOTH, "position 1"),
    RollsOneAhead: (BOTH, "position 1"),
    MixesTheBatch: (BOTH, "batch item"),
    WrongLayout: (BOTH, "position"),
    LeaksInEvalOnly: (BOTH, "eval mode"),
    LeaksInTrainingOnly: (BOTH, "train mode"),
    LeaksBeyond64: (BOTH, "length 130"),
    NormalisesBySequence: (BOTH, "position 1"),
    FirstTokenSeesAll: (BOTH, "positions <= 0"),
    DetachedLookAhead: ({"causality-forward"}, "position"),
    SortsByLaterKeys: ({"causality-forward"}, "position"),
    LeaksUnderNoGrad: ({"causality-forward"}, "under no_grad"),
    LeaksInFloat32Only: ({"causality-forward"}, "float32"),
}


def mechanism_name(cls: type) -> str:
    return f"leak-{cls.__name__.lower()}"


def plugin_source(*classes: type) -> str:
    """A plugin file that registers ``classes`` under ``mechanism_name``."""
    lines = [
        "import torch",
        "import torch.nn.functional as F",
        "from torch import nn",
        "from synthbench.core.mechanism import MECHANISMS, Mechanism",
        "",
        inspect.getsource(attend),
    ]
    for cls in classes:
        lines += [
            inspect.getsource(cls),
            f"MECHANISMS.add({mechanism_name(cls)!r}, {cls.__name__}, complexity='quadratic', "
            "family='test', reference='none')",
            "",
        ]
    return "\n".join(lines)


def _unregister(source: str) -> None:
    for entry in list(MECHANISMS.entries()):
        if source in entry.source:
            MECHANISMS._remove(entry.name)


@pytest.fixture(scope="module")
def leaky(tmp_path_factory) -> Path:
    """Every leaky class registered from one plugin file; removed again afterwards."""
    path = tmp_path_factory.mktemp("plugin") / "leaky_mechanisms.py"
    path.write_text(plugin_source(*LEAKS, LearnedGate, LeaksOnePair))
    load_plugin_file(path, [TASKS, MECHANISMS])  # a command given --plugin path reuses it
    yield path
    _unregister(str(path))
    for name in [m for m, module in sys.modules.items() if module and "leaky_mechanisms" in m]:
        del sys.modules[name]
    assert not any(n.startswith("leak-") for n in MECHANISMS.names())


def invoke(*args):
    result = CliRunner().invoke(app, [str(a) for a in args], env=ENV)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def subject(name: str, **params) -> Subject:
    cls = MECHANISMS.get(name)
    return Subject(name, mechanism_params(cls, params), HEAD_DIM, N_HEADS)


def failures(results: list[CheckResult]) -> dict[str, str]:
    return {r.name: r.detail for r in results if not r.passed}


def test_the_checks_seed_draws_what_torchs_own_seed_draws():
    """seed_torch is torch.manual_seed without its queue for devices not started."""
    seed_torch(7)
    ours = (torch.randn(5), torch.rand(3), torch.randint(10, (4,)))
    torch.manual_seed(7)
    torchs = (torch.randn(5), torch.rand(3), torch.randint(10, (4,)))
    for a, b in zip(ours, torchs, strict=True):
        assert torch.equal(a, b)


# -- the built-ins --------------------------------------------------------------------------


BUILTINS = [e.name for e in MECHANISMS.entries() if e.source == "builtin"]


@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_passes_every_check(name):
    results = check_mechanism(subject(name), LENGTHS)
    recurrent = ["recurrent"] if subject(name).has_recurrent_form() else []
    assert [r.name for r in results] == [
        "layout", "causality", "causality-forward", "dtypes", "large-inputs", "determinism",
        "state-size", *recurrent,
    ]  # fmt: skip
    assert failures(results) == {}, "\n".join(r.line(name) for r in results)


@pytest.mark.parametrize("name", ["softmax", "linear"])
def test_builtins_pass_at_the_suites_longest_length_with_the_quick_model(name):
    """The linear core at many chunks, softmax at its longest, with quick's heads."""
    quick = PROTOCOLS.get("quick")
    longest = max(suite_lengths())
    params = mechanism_params(MECHANISMS.get(name))
    s = Subject(name, params, quick.d_model // quick.n_heads, quick.n_heads)
    assert failures(check_leaks(s, [longest])) == {}


def test_suite_lengths_hold_every_length_a_run_trains_at():
    """Every registered task, at each preset and under each protocol's pinned parameters,
    as the runner resolves them."""
    lengths = set(suite_lengths())
    for task in TASKS.names():
        cls = TASKS.get(task)
        for preset in cls.presets():
            assert cls.from_difficulty(preset).seq_len in lengths, (task, preset)
        for protocol in PROTOCOLS.names():
            spec = RunSpec.resolve(task, "softmax", PROTOCOLS.get(protocol), 0)
            assert spec.make_task().seq_len in lengths, (task, protocol)


# -- leaks are caught -------------------------------------------------------------------------


@pytest.mark.parametrize("cls", list(LEAKS), ids=lambda c: c.__name__)
def test_a_leaky_mechanism_fails_causality(leaky, cls):
    fails, named = LEAKS[cls]
    results = check_leaks(subject(mechanism_name(cls)), LENGTHS)
    assert set(failures(results)) == fails, "\n".join(r.line() for r in results)
    assert named in failures(results)[min(fails)]  # causality first where both fail


def test_a_wrong_layout_has_the_right_shape_and_is_caught_by_causality(leaky):
    results = {r.name: r for r in check_leaks(subject(mechanism_name(WrongLayout)), [7])}
    assert results["layout"].passed
    assert not results["causality"].passed


def test_a_leak_beyond_64_passes_up_to_64(leaky):
    name = mechanism_name(LeaksBeyond64)
    assert failures(check_leaks(subject(name), [7, 33, 64])) == {}
    assert set(failures(check_leaks(subject(name), [65]))) == BOTH


def test_a_learned_gate_passes_as_built_and_fails_once_opened(leaky):
    """The check before training cannot see it; the check of the trained model does."""
    assert failures(check_leaks(subject(mechanism_name(LearnedGate)), LENGTHS)) == {}
    torch.manual_seed(0)
    model = Model(12, 40, lambda: LearnedGate(HEAD_DIM, N_HEADS), d_model=16, n_heads=N_HEADS)
    tokens = torch.randint(12, (2, 40), generator=torch.Generator().manual_seed(0))
    assert check_model_causality(model, tokens).passed
    with torch.no_grad():
        model.blocks[1].attn.mechanism.gate.fill_(1e-3)  # as a few optimizer steps would
    verdict = check_model_causality(model, tokens)
    assert not verdict.passed and "position 1" in verdict.detail
    assert model.blocks[1].attn.mechanism.gate.item() == pytest.approx(1e-3)  # left as it was
    assert model.training  # and in the mode it was in


def upper_triangle_reference(out_of, length: int) -> tuple[int, int] | None:
    """From the full Jacobian (torch.autograd.functional.jacobian): the first cut c with an
    output at <= c depending on an input after c, and the first such input position."""
    g = torch.Generator().manual_seed(1)
    # small heads: one backward pass per output number
    inputs = tuple(torch.randn(2, 1, length, 2, generator=g, dtype=torch.float64) for _ in "qkv")
    jacobians = torch.autograd.functional.jacobian(out_of, inputs)
    # (B, H, L, D, B, H, L', D) -> (L, L'): any dependence of output position on input position
    depends = sum(j.ne(0).permute(2, 6, 0, 1, 3, 4, 5, 7).flatten(2).any(2) for j in jacobians)
    for cut in range(length - 1):
        later = depends[: cut + 1, cut + 1 :].any(0).nonzero()
        if len(later):
            return cut, cut + 1 + int(later[0])
    return None


@pytest.mark.parametrize("u,s", [(0, 1), (3, 5), (10, 40), (62, 63)])
def test_gradient_probes_find_what_the_full_jacobian_shows(leaky, u, s):
    name = mechanism_name(LeaksOnePair)
    mechanism = MECHANISMS.get(name)(HEAD_DIM, N_HEADS, u=u, s=s).double()
    expected = upper_triangle_reference(lambda q, k, v: mechanism(q, k, v), 64)
    assert expected == (u, s)
    detail = failures(check_leaks(subject(name, u=u, s=s), [64]))["causality"]
    assert f"positions <= {u} depend on v at position {s}:" in detail


def test_a_causal_mechanism_has_a_lower_triangular_jacobian_and_passes():
    mechanism = MECHANISMS.get("linear")(HEAD_DIM, N_HEADS, chunk_size=4).double()
    assert upper_triangle_reference(lambda q, k, v: mechanism(q, k, v), 11) is None
    assert failures(check_leaks(subject("linear", chunk_size=4), [11])) == {}


def test_cuts_cover_every_position_up_to_the_threshold_and_both_ends_beyond():
    assert cuts(1) == []
    assert cuts(FULL_COVERAGE_UP_TO) == list(range(FULL_COVERAGE_UP_TO - 1))
    for length in (FULL_COVERAGE_UP_TO + 1, 544):
        probed = cuts(length)
        assert probed == sorted(set(probed)) and len(probed) == check.LONG_CUTS
        assert probed[:2] == [0, 1] and probed[-2:] == [length - 3, length - 2]


class CountsCalls(Mechanism):
    """Causal; counts its calls and the largest batch it was called with."""

    calls, largest = 0, 0

    def forward(self, q, k, v, causal=True):
        CountsCalls.calls += 1
        CountsCalls.largest = max(CountsCalls.largest, q.shape[0])
        return attend(q, k, v)


class NoisePerItem(Mechanism):
    """Causal, with noise drawn per item at each call (as attention dropout would): a larger
    batch draws other noise for the same items, so the at-once probes cannot pass it."""

    def forward(self, q, k, v, causal=True):
        return attend(q, k, v) * (1 + 0.1 * torch.rand(q.shape, dtype=q.dtype))


class NoisePerItemLeaks(NoisePerItem):
    def forward(self, q, k, v, causal=True):
        return super().forward(q, k, v) + 1e-3 * v.roll(-1, dims=2)


def test_the_cuts_of_a_causal_mechanism_are_probed_at_once(register):
    name = register(CountsCalls)
    CountsCalls.calls = CountsCalls.largest = 0
    assert failures(check_leaks(subject(name), [20])) == {}
    # per mode: one call for the gradient probes (its backward passes reuse it) and one for
    # all the forward probes, besides the base and batch-item calls; one by one, each of the
    # 19 cuts would be a call
    assert CountsCalls.largest == 2 * 19
    assert CountsCalls.calls < 19


def test_a_mechanism_the_at_once_probes_cannot_pass_is_decided_one_cut_at_a_time(register):
    assert failures(check_leaks(subject(register(NoisePerItem)), [7, 20])) == {}
    caught = failures(check_leaks(subject(register(NoisePerItemLeaks)), [7, 20]))
    assert set(caught) == BOTH
    assert "depend on v at position 1" in caught["causality"]


def test_the_model_check_after_training_finds_a_gate_opened_in_the_first_block(leaky):
    """As the learned gate above, opened in the first block: still found and named."""
    torch.manual_seed(0)
    model = Model(12, 40, lambda: LearnedGate(HEAD_DIM, N_HEADS), d_model=16, n_heads=N_HEADS)
    tokens = torch.randint(12, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.blocks[0].attn.mechanism.gate.fill_(1e-3)
    verdict = check_model_causality(model, tokens)
    assert not verdict.passed and "position 1" in verdict.detail


def test_the_checks_leave_the_global_random_state_alone():
    before = torch.random.get_rng_state()
    check_mechanism(subject("performer"), [7])
    assert torch.equal(torch.random.get_rng_state(), before)


# -- the other checks fail where they should ------------------------------------------------


class ReturnsFloat64(Mechanism):
    def forward(self, q, k, v, causal=True):
        return attend(q, k, v).double()


class NaiveExponent(Mechanism):
    """exp of the scores without subtracting their maximum: overflows at large inputs."""

    def forward(self, q, k, v, causal=True):
        mask = torch.ones(q.shape[2], q.shape[2], dtype=torch.bool, device=q.device).tril()
        weights = (q @ k.mT).exp() * mask
        return (weights @ v) / weights.sum(-1, keepdim=True)


class RandomNoise(Mechanism):
    def forward(self, q, k, v, causal=True):
        return attend(q, k, v) + random.random()


class GrowingLinearState(Mechanism):
    def forward(self, q, k, v, causal=True):
        return attend(q, k, v)

    def state_size(self, seq_len):
        return seq_len


class RefusesFloat64(Mechanism):
    def forward(self, q, k, v, causal=True):
        if q.dtype == torch.float64:
            raise TypeError("float64 is not supported")
        return attend(q, k, v)


class ReturnsNaN(Mechanism):
    def forward(self, q, k, v, causal=True):
        return attend(q, k, v) * float("nan")


class RefusesFloat64AndLeaks(Mechanism):
    def forward(self, q, k, v, causal=True):
        if q.dtype == torch.float64:
            raise TypeError("float64 is not supported")
        return attend(q, k, v, causal=False)


@pytest.fixture
def register():
    added = []

    def add(cls, complexity="quadratic") -> str:
        name = mechanism_name(cls)
        MECHANISMS.add(name, cls, complexity=complexity, family="test", reference="none")
        added.append(name)
        return name

    yield add
    for name in added:
        MECHANISMS._remove(name)


@pytest.mark.parametrize(
    "cls,complexity,failed,named",
    [
        (ReturnsFloat64, "quadratic", {"layout", "dtypes"}, "dtype torch.float64"),
        (NaiveExponent, "quadratic", {"large-inputs"}, "non-finite"),
        (RandomNoise, "quadratic", {"causality-forward", "determinism"}, "change"),
        (GrowingLinearState, "linear", {"state-size"}, "complexity linear"),
        (RefusesFloat64, "quadratic", {"layout", "causality"}, "float64 is not supported"),
        (
            ReturnsNaN,
            "quadratic",
            {"causality", "causality-forward", "dtypes", "large-inputs"},
            "raised ValueError: non-finite output",
        ),
    ],
    ids=lambda x: getattr(x, "__name__", None),
)
def test_each_check_fails_a_mechanism_that_breaks_it(register, cls, complexity, failed, named):
    name = register(cls, complexity)
    results = failures(check_mechanism(subject(name), [7, 20]))
    assert set(results) == failed, results
    assert named in results[min(failed)]


# -- run refuses, the store and the report -----------------------------------------------------


def test_leak_guard_stores_leaky_rows_over_an_old_result(leaky, tmp_path):
    """A result stored before the check existed does not survive the verdict."""
    name = mechanism_name(AddsNextValue)
    specs = plan(["kv_recall"], [name, "softmax"], SMOKE, 1)
    store = ResultStore(tmp_path)
    old = failed_row(specs[0], SMOKE.lrs[0], torch.device("cpu"), "")
    store.write([{**old, "status": "ok", "error": None, "token_acc": 1.0, "selected": True}])
    refusal = leak_guard(specs, store, None).refusal
    assert refusal.startswith(f"refused: mechanism {name} is not causal (causality:")
    assert "\n" not in refusal
    rows = store.load(warn=False).rows
    assert rows["mechanism"].tolist() == [name] * len(SMOKE.lrs)  # softmax: nothing stored
    assert set(rows["status"]) == {"leaky"} and not rows["selected"].any()


def test_leak_guard_refuses_a_proven_leak_not_a_mechanism_that_raises(register, tmp_path):
    """One that raises, or returns NaN, is no proof of a leak: its trainings raise (or
    diverge) and are stored so."""
    store = ResultStore(tmp_path)
    for cls in (RefusesFloat64, ReturnsNaN):
        guarded = leak_guard(plan(["kv_recall"], [register(cls)], SMOKE, 1), store, None)
        assert guarded.refusal is None and not guarded.ended
    leaks = plan(["kv_recall"], [register(RefusesFloat64AndLeaks)], SMOKE, 1)
    refusal = leak_guard(leaks, store, None).refusal
    assert "(causality-forward: outputs at positions <= 0" in refusal


def test_a_leaky_training_ends_its_sweep_without_a_result():
    spec = RunSpec.resolve("kv_recall", "softmax", PROTOCOLS.get("quick"), 0)
    *low, high = spec.protocol.lrs
    rows = [
        {"lr": lr, "status": "ok", "val_token_acc": 0.9, "selected": False, "steps_done": 9}
        for lr in low
    ] + [{"lr": high, "status": "leaky", "val_token_acc": None, "selected": False}]
    assert sweep_state(spec.protocol, rows[:-1]).complete is False
    state = sweep_state(spec.protocol, rows)
    assert state.complete and state.selected is None
    assert run_status(rows)["status"] == "leaky"


def leaderboard_rank(reports: Path, mechanism: str) -> str:
    """The rank cell of ``mechanism``'s row in the Markdown leaderboard (its columns found
    by the header's names)."""
    column = None
    for line in (reports / "leaderboard.md").read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if "mechanism" in cells:
            column = cells.index("mechanism")
        elif column is not None and len(cells) > column and cells[column] == mechanism:
            return cells[1]
    raise AssertionError(f"{mechanism} is not listed")


def test_run_refuses_a_leaky_plugin_and_report_never_ranks_it(leaky, tmp_path):
    name = mechanism_name(RollsOneAhead)
    results = tmp_path / "results"
    args = ["run", "--task", "kv_recall", "--mech", f"{name},softmax", "--protocol", "smoke"]
    args += ["--seeds", 2, "--jobs", 1, "--plugin", leaky, "--results", results]
    result = invoke(*args)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: refused: mechanism {name}")
    assert f"synthbench check {name} --plugin {leaky} runs every check" in lines[0]
    rows = ResultStore(results).load(warn=False).rows
    assert sorted(rows["seed"]) == [0, 1] and set(rows["mechanism"]) == {name}  # none trained
    assert set(rows["status"]) == {"leaky"} and rows["token_acc"].isna().all()
    assert rows["error"].str.startswith("leaky: causality check failed").all()
    reports = tmp_path / "reports"
    report = invoke("report", "--results", results, "--out", reports, "--format", "md,html")
    assert report.exit_code == 0, report.output
    assert leaderboard_rank(reports, name) == ""
    assert "2 leaky: not causal" in (reports / "smoke" / "target" / "full.md").read_text()
    # every leaderboard says why it has no task: refused as leaky, not merely failed
    board = (reports / "leaderboard.md").read_text()
    (line,) = [li for li in board.splitlines() if f"| {name}" in li]
    assert "| 0/1, 1 leaky |" in re.sub(" +", " ", line)
    assert "- Leaky: tasks on which the mechanism's runs were refused" in board
    page = (reports / "leaderboard.html").read_text()
    assert '"leaky_tasks": 1' in page and '<li id="note-leaky" hidden>Leaky: tasks' in page


def test_run_stores_a_leak_opened_in_training_as_leaky_and_does_not_retrain_it(leaky, tmp_path):
    name = mechanism_name(LearnedGate)
    results = tmp_path / "results"
    args = ["run", "--task", "kv_recall", "--mech", name, "--protocol", "smoke", "--seeds", 1]
    args += ["--jobs", 1, "--plugin", leaky, "--results", results]
    result = invoke(*args)
    assert result.exit_code == 1, result.output
    assert "1 run not causal after training" in result.stderr
    rows = ResultStore(results).load(warn=False).rows
    assert rows["status"].tolist() == ["leaky"]
    assert rows["error"].iloc[0].startswith("not causal after training: ")
    assert rows[["token_acc", "exact_match", "val_token_acc"]].isna().all().all()
    again = invoke(*args)  # never retrained, and still said: a stored leak is not a pass
    assert "1 already stored, 0 to run" in again.stdout, again.output
    assert again.exit_code == 1 and "1 run not causal after training" in again.stderr


def test_report_counts_leaky_runs_apart():
    from synthbench.report.aggregate import aggregate

    spec = RunSpec.resolve("kv_recall", "softmax", SMOKE, 0)
    row = {**failed_row(spec, 1e-3, torch.device("cpu"), "leaky: ..."), "status": "leaky"}
    table = aggregate(pd.DataFrame([row]).assign(schema_version=5))
    assert table[["count", "diverged", "error", "leaky"]].values.tolist() == [[0, 0, 0, 1]]


# -- synthbench check -------------------------------------------------------------------------


def test_check_command_passes_softmax():
    result = invoke("check", "softmax", "--length", 7, "--length", 33)
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    # softmax decodes through a KV cache: its recurrent form is checked too
    assert len(lines) == 8 and all(line.startswith("PASS  softmax  ") for line in lines)
    assert "recurrent" in lines[-1]


def test_check_command_fails_a_leaky_plugin_with_one_fail_line(leaky):
    name = mechanism_name(DetachedLookAhead)
    result = invoke("check", name, "--plugin", leaky, "--length", 7)
    assert result.exit_code == 1, result.output
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1 and f"{name}  causality-forward" in failed[0]


def test_check_command_unknown_name_is_a_usage_error():
    result = invoke("check", "sofmax")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "did you mean softmax" in lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args,message",
    [
        (["softmax", "--length", 0], "--length must be in [1, "),
        (["linear", "--mech-param", "eps=-1"], "mechanism linear: eps must be >= 0"),
        (["linear", "--mech-param", "nope=1"], "nope"),
    ],
)
def test_check_command_bad_options_exit_2(args, message):
    result = invoke("check", *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


BARE_PLUGIN = '''
import torch.nn.functional as F
from torch import nn

from synthbench import MECHANISMS


@MECHANISMS.register("bare-softmax", complexity="quadratic", family="softmax", reference="x")
class Bare(nn.Module):
    """Only the required members: no base class, no state_size, no set_max_len."""

    def __init__(self, head_dim, n_heads):
        super().__init__()

    def forward(self, q, k, v, causal=True):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
'''


def test_check_and_run_agree_on_a_mechanism_with_only_the_required_members(tmp_path):
    """A mechanism written to the required contract alone (docs/PLUGINS.md): check passes it,
    its state as not declared (optional), and run trains it."""
    plugin = tmp_path / "bare_plugin.py"
    plugin.write_text(BARE_PLUGIN)
    try:
        result = invoke("check", "bare-softmax", "--plugin", plugin, "--length", 9)
        assert result.exit_code == 0, result.output
        lines = result.stdout.strip().splitlines()
        assert all(line.startswith("PASS  bare-softmax  ") for line in lines), lines
        (state,) = [line for line in lines if "state-size" in line]
        assert "not declared (optional" in state
        results = tmp_path / "results"
        args = ["--mech", "bare-softmax", "--task", "copy", "--protocol", "smoke", "--seeds", 1]
        run = invoke("run", "--plugin", plugin, *args, "--jobs", 1, "--results", results)
        assert run.exit_code == 0, run.output
        assert ResultStore(results).load(warn=False).rows["status"].tolist() == ["ok"]
    finally:
        _unregister(str(plugin))
