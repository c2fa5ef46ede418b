"""Packed training (synthbench/run/packed.py): the trainings of one run that differ in seed
and lr, trained as one batched model, give the rows separate trainings (train_eval) give.

Every column is compared: the floats within float32 tolerance, the rest (status, error,
steps_done, curve_steps, n_params, ...) exactly. Each comparison packs three members,
different seeds and lrs: one trains the whole schedule, one stops early (a step budget),
one diverges (an absurd lr), so the members that go on must be unaffected by those that
stopped. The mechanisms that cannot be packed are listed with their reason: a packable
mechanism that starts falling back fails here, and so does one listed that starts packing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from clitools import BENCHMARKS

import synthbench.mechanisms  # noqa: F401  (the built-ins registered)
from synthbench.core.mechanism import MECHANISMS
from synthbench.core.registry import _loaded_files, load_plugin_file
from synthbench.run import clock, packed, stacked_models, train
from synthbench.run.lr_selection import Budget
from synthbench.run.packed import NotPacked, train_packed
from synthbench.run.protocols import PROTOCOLS, curve_points
from synthbench.run.spec import RunSpec
from synthbench.run.train import train_eval

pytestmark = pytest.mark.usefixtures("single_thread")

SMOKE = PROTOCOLS.get("smoke")
CPU = torch.device("cpu")
BENCHMARK = BENCHMARKS / "packed_throughput.py"
DIVERGES = 1e30  # an lr whose first step sends every weight past float32's range

# Mechanisms whose trainings fall back to one at a time on a CPU, and the reason the note
# gives: the linear-attention core's CPU scan (synthbench/core/linear_attention.py,
# _CausalScan) is an autograd.Function without setup_context or a vmap rule. (On a GPU the
# core takes its "prefix" strategy, plain tensor operations, and these pack. The other
# feature maps, based's Taylor heads among them, take the core only past their feature
# count: on copy's 64 positions they take the scores, and pack; on longer tasks they fall
# back too.)
NO_VMAP_RULE = "autograd.Function"
FALLBACK = dict.fromkeys(("cosformer", "linear", "slay-laplace", "slay-hadamard"), NO_VMAP_RULE)
# Mechanisms whose float32 training is ill-conditioned: signed random features under the
# guarded denominator, logits in the thousands at initialisation. A separate training
# itself moves by far more than float32 tolerance when only the rounding changes (torch's
# foreach AdamW for its fused one: slay-maclaurin's final loss 9.5 -> 5.5 over smoke's 20
# steps; test_ill_conditioned_trainings_move_with_their_rounding). They are compared over
# 2 steps at small lrs, where the rounding has not yet grown: at the usual tolerance, but
# slay-maclaurin, whose logits already differ in their 4th digit at initialisation.
ILL_CONDITIONED = {"rff": 1e-5, "slay-tensorsketch": 1e-5, "slay-maclaurin": 1e-3}
# the fast tier packs one mechanism of each kind of forward (torch's attention, a shared
# feature-map core, a delta rule, a scan); the slow tier every built-in one, and with it
# checks which fall back, and why, for each
FAST = {"softmax", "linear", "deltanet", "mamba2"}
NOT_COMPARED = {*clock.COLUMNS, "created_at"}


def builtin_mechanisms() -> list[str]:
    return sorted(e.name for e in MECHANISMS.entries() if e.source == "builtin")


def assert_rows_match(separate: dict, together: dict, rel: float = 1e-5, abs_: float = 1e-6):
    """Every column of two rows: floats (and lists of floats) within tolerance, the rest
    exactly."""
    assert set(separate) == set(together)
    for key in sorted(set(separate) - NOT_COMPARED):
        a, b = separate[key], together[key]
        if isinstance(a, float) and isinstance(b, float):
            assert b == pytest.approx(a, rel=rel, abs=abs_, nan_ok=True), key
        elif isinstance(a, list) and a and isinstance(a[0], float):
            assert b == pytest.approx(a, rel=rel, abs=abs_), key
        else:
            assert a == b, (key, a, b)


def packed_and_separate(members, budgets=None):
    """Both ways; the NotPacked notes of the packed one."""
    budgets = budgets or [None] * len(members)
    separate = [
        train_eval(spec, lr, CPU, budget)
        for (spec, lr), budget in zip(members, budgets, strict=True)
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        packed = train_packed(members, CPU, budgets)
    notes = [w.message for w in caught if issubclass(w.category, NotPacked)]
    return separate, packed, notes


# smoke's whole schedule, its evaluation cut to 16 + 16 examples: every column is still
# compared, at 10-40% less of the cost (evaluation's share of a comparison; gla's 40%)
COMPARED = dataclasses.replace(SMOKE, val_examples=16, test_examples=16)


def three_members(mechanism: str, task: str = "copy", protocol=COMPARED):
    """Seeds 0, 1, 2 at three lrs: the whole schedule, a step budget that ends between two
    curve points, an lr that diverges at once."""
    ill = mechanism in ILL_CONDITIONED
    protocol = dataclasses.replace(protocol, steps=2) if ill else protocol
    lrs = (1e-4, 3e-4) if ill else (1e-3, 3e-3)
    members = [
        (RunSpec.resolve(task, mechanism, protocol, seed), lr)
        for seed, lr in zip((0, 1, 2), (*lrs, DIVERGES), strict=True)
    ]
    return members, [None, Budget(steps=1 if ill else 7), None]


def check_three(mechanism: str, fallback: str | None, rel: float = 1e-5):
    members, budgets = three_members(mechanism)
    separate, packed, notes = packed_and_separate(members, budgets)
    for a, b in zip(separate, packed, strict=True):
        assert_rows_match(a, b, rel=rel)
    if fallback is None:
        assert notes == []
    else:
        assert len(notes) == 1 and mechanism in str(notes[0]) and fallback in notes[0].reason
    full, budgeted, diverged = packed
    assert full["status"] == budgeted["status"] == "ok"
    assert full["steps_done"] == members[0][0].protocol.steps
    assert budgeted["steps_done"] == budgets[1].steps
    assert diverged["status"] == "diverged" and diverged["steps_done"] <= 2


@pytest.mark.parametrize(
    "mechanism",
    [
        pytest.param(name, marks=() if name in FAST else pytest.mark.slow)
        for name in builtin_mechanisms()
    ],
)
def test_packed_rows_equal_separate_rows(mechanism):
    check_three(mechanism, FALLBACK.get(mechanism), rel=ILL_CONDITIONED.get(mechanism, 1e-5))


def test_every_mechanism_listed_apart_is_a_builtin_one():
    """FALLBACK and ILL_CONDITIONED name built-ins (the comparisons above cover the rest: a
    built-in packs unless FALLBACK gives its reason)."""
    assert set(FALLBACK) | set(ILL_CONDITIONED) <= set(builtin_mechanisms())


def test_ill_conditioned_trainings_move_with_their_rounding(monkeypatch):
    """Why ILL_CONDITIONED is compared over 2 steps: the separate training alone, with
    torch's foreach AdamW for its fused one (the same formula, rounded otherwise), moves
    by more than the tolerance of the other mechanisms."""
    spec = RunSpec.resolve("copy", "slay-maclaurin", SMOKE, 0)
    fused = train_eval(spec, 1e-3, CPU)
    monkeypatch.setattr(train, "FUSED_ADAMW_DEVICES", ())
    foreach = train_eval(spec, 1e-3, CPU)
    assert not math.isclose(fused["final_loss"], foreach["final_loss"], rel_tol=1e-3)


def test_early_stops_leave_the_others_unchanged():
    """stop_at (solved), a pace it falls behind (from half the schedule) and the whole
    schedule, in one pack: each member as trained alone."""
    protocol = dataclasses.replace(SMOKE, steps=40, stop_at=0.042, pace_margin=0.1)
    ahead = tuple((step, 1.0) for step in curve_points(protocol.steps))
    members = [
        (RunSpec.resolve("copy", "softmax", protocol, 3), 3e-2),  # "solves" at step 28
        (RunSpec.resolve("copy", "softmax", protocol, 0), 1e-4),  # falls behind at 20
        (RunSpec.resolve("copy", "softmax", protocol, 1), 1e-4),  # trains all 40 (0.04199)
    ]
    budgets = [None, Budget(pace=ahead), None]
    separate, packed, notes = packed_and_separate(members, budgets)
    for a, b in zip(separate, packed, strict=True):
        assert_rows_match(a, b)
    assert [r["steps_done"] for r in packed] == [28, 20, 40] and notes == []


def test_each_member_extends_on_its_own_curve_as_alone(monkeypatch):
    """Recipe v2 in one pack: each member's curve (scripted by its seed, the trainings real)
    decides its own extensions, its own lr schedule stretched to its own end, as alone."""
    curves = {
        0: lambda step: step / 100,  # rising: 20 -> 30 -> 40, the cap
        1: lambda step: 0.3,  # flat: stops at the schedule's end
        2: lambda step: min(step, 24) / 100,  # rose, then settled by 30
        3: lambda step: step / 100,  # rising, but a budget below the schedule
    }
    real = train.curve_point

    def scripted(row, protocol, budget, step, val_metrics):
        val_metrics["token_acc"] = curves[row["seed"]](step)
        return real(row, protocol, budget, step, val_metrics)

    monkeypatch.setattr(train, "curve_point", scripted)
    monkeypatch.setattr(packed, "curve_point", scripted)
    protocol = dataclasses.replace(SMOKE, max_steps=40, rise_margin=0.01)
    members = [
        (RunSpec.resolve("copy", "softmax", protocol, seed), lr)
        for seed, lr in zip(curves, (1e-3, 3e-3, 1e-2, 3e-3), strict=True)
    ]
    budgets = [None, None, None, Budget(steps=14)]
    separate, packed_rows, notes = packed_and_separate(members, budgets)
    for a, b in zip(separate, packed_rows, strict=True):
        assert_rows_match(a, b)
    assert [r["steps_done"] for r in packed_rows] == [40, 20, 30, 14] and notes == []
    assert packed_rows[0]["curve_steps"] == curve_points(20, horizon=40)


def test_passes_split_by_the_activation_budget(monkeypatch):
    """Members whose activations together pass the budget train a few per pass (here one):
    the same rows, parameters without gradient ('none' ignores q and k) included."""
    per_pass = []
    plan = stacked_models.StackedModels.plan_passes

    def recorded(self, *args):
        plan(self, *args)
        per_pass.append(self.per_pass)

    monkeypatch.setattr(stacked_models, "ACTIVATION_BYTES", 1)
    monkeypatch.setattr(stacked_models.StackedModels, "plan_passes", recorded)
    for mechanism in ("none", "mamba2"):
        members, budgets = three_members(mechanism)
        separate, packed_rows, notes = packed_and_separate(members, budgets)
        for a, b in zip(separate, packed_rows, strict=True):
            assert_rows_match(a, b)
        assert notes == []
    assert per_pass == [1, 1]


def test_the_budget_is_planned_on_the_path_vmap_takes(monkeypatch):
    """SLAY's blocked short path keeps almost nothing for its backward, but under vmap it
    takes the plain (L x L) scores: the pass plan measures what the packed forward keeps,
    at least what the plain path keeps outside vmap."""
    spec = RunSpec.resolve("copy", "slay", SMOKE, 0)
    task = spec.make_task()
    models = [packed.seeded_model(spec.with_seed(s), task, None, CPU) for s in (0, 1)]
    pack = stacked_models.StackedModels(models, [1e-3, 1e-3], SMOKE)
    batch = task.generate(SMOKE.batch_size, torch.Generator().manual_seed(0), CPU)
    pack.plan_passes(batch.inputs, batch.training_targets)

    def kept(model) -> int:
        saved = 0

        def count(tensor):
            nonlocal saved
            saved += tensor.numel() * tensor.element_size()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
            train.training_loss(model(batch.inputs), batch.training_targets)
        return saved

    blocked = kept(models[0])
    monkeypatch.setattr(MECHANISMS.get("slay"), "factored", False)
    plain = kept(models[0])
    assert plain > 2 * blocked  # the two paths differ: the test can tell them apart
    assert pack.saved_per_member >= 0.9 * plain


def test_a_row_per_member_in_order_across_runs():
    """Members of different runs (task, protocol) are packed apart; rows come back in the
    members' order; a run alone is simply train_eval."""
    kv = {"pairs": 4, "queries": 2}
    members = [
        (RunSpec.resolve("kv_recall", "none", SMOKE, 0, kv), 1e-3),
        (RunSpec.resolve("copy", "none", SMOKE, 0), 1e-3),
        (RunSpec.resolve("kv_recall", "none", SMOKE, 1, kv), 3e-3),
        (RunSpec.resolve("copy", "retnet", SMOKE, 5), 1e-3),
    ]
    separate, packed, notes = packed_and_separate(members)
    for a, b in zip(separate, packed, strict=True):
        assert_rows_match(a, b)
    assert [(r["task"], r["seed"]) for r in packed] == [
        ("kv_recall", 0), ("copy", 0), ("kv_recall", 1), ("copy", 5),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="budgets"):
        train_packed(members, CPU, [None])


def test_long_evaluation_and_threads_as_train_eval():
    members = [
        (RunSpec.resolve("copy", "mamba2", SMOKE, seed, eval_length_mult=2.0), lr)
        for seed, lr in ((0, 1e-3), (1, 1e-2))
    ]
    separate, packed, _ = packed_and_separate(members)
    for a, b in zip(separate, packed, strict=True):
        assert_rows_match(a, b)
        assert b["long_token_acc"] is not None
    assert torch.get_num_threads() == 1


# -- plugins ------------------------------------------------------------------------------

PLUGIN = '''
import math
import torch
import torch.nn.functional as F
from torch import nn
from synthbench import MECHANISMS, Mechanism


@MECHANISMS.register("packtest-temperature", complexity="quadratic", family="softmax",
                     reference="test")
class Temperature(Mechanism):
    """Softmax with a learned temperature per head and a random key rotation drawn at
    init from the global RNG (different for every seed): a parameter and a buffer."""

    def __init__(self, head_dim, n_heads):
        super().__init__(head_dim, n_heads)
        self.log_temperature = nn.Parameter(torch.zeros(n_heads, 1, 1))
        self.register_buffer("mix", torch.linalg.qr(torch.randn(head_dim, head_dim))[0])

    def forward(self, q, k, v, causal=True):
        scores = (q @ (k @ self.mix).mT) * self.log_temperature.exp() / math.sqrt(self.head_dim)
        if causal:
            L = q.shape[-2]
            mask = torch.ones(L, L, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        return F.softmax(scores, dim=-1) @ v


@MECHANISMS.register("packtest-declined", complexity="quadratic", family="softmax",
                     reference="test")
class Declined(Mechanism):
    packable = False

    def forward(self, q, k, v, causal=True):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


@MECHANISMS.register("packtest-item", complexity="quadratic", family="softmax",
                     reference="test")
class DataDependent(Mechanism):
    """Python control flow on a tensor's value: vmap cannot batch it."""

    def forward(self, q, k, v, causal=True):
        if float(q.detach().abs().max()) > 1e6:
            q = q / 2
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


@MECHANISMS.register("packtest-nan-at-eval", complexity="quadratic", family="test",
                     reference="test")
class NaNAtEval(Mechanism):
    def forward(self, q, k, v, causal=True):
        return v if self.training else v * float("nan")


@MECHANISMS.register("packtest-kaboom", complexity="quadratic", family="test",
                     reference="test")
class Kaboom(Mechanism):
    def forward(self, q, k, v, causal=True):
        raise RuntimeError("kaboom")
'''


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """The mechanisms of PLUGIN, loaded as a --plugin file is; removed afterwards."""
    path = tmp_path_factory.mktemp("plugin") / "packtest_plugin.py"
    path.write_text(textwrap.dedent(PLUGIN))
    entries = load_plugin_file(path, [MECHANISMS])
    yield {e.name: e for e in entries}
    for entry in entries:
        MECHANISMS._remove(entry.name)
    for module, added in list(_loaded_files.items()):
        if added == entries:
            del _loaded_files[module]
    assert not any(n.startswith("packtest-") for n in MECHANISMS.names())


def test_a_plugin_mechanism_packs(plugin):
    assert plugin["packtest-temperature"].code_hash  # a plugin's, in its run ids
    check_three("packtest-temperature", None)


@pytest.mark.parametrize(
    "mechanism,reason",
    [("packtest-declined", "packable = False"), ("packtest-item", "Error")],
)
def test_a_plugin_that_cannot_pack_trains_one_by_one(plugin, mechanism, reason):
    members = [
        (RunSpec.resolve("copy", mechanism, SMOKE, s), lr) for s, lr in ((0, 1e-3), (1, 1e-2))
    ]
    separate, packed, notes = packed_and_separate(members)
    for a, b in zip(separate, packed, strict=True):
        assert_rows_match(a, b, rel=0, abs_=0)  # the same trainings: identical
    (note,) = notes
    assert reason in note.reason and "\n" not in str(note)
    assert str(note).startswith(f"packed training: {mechanism} cannot be packed")


def test_failures_are_rows_as_in_train_eval(plugin):
    """A mechanism that raises: error rows (after the pack falls back, with its note); one
    whose evaluation is not finite: diverged at the first curve point, the others too."""
    p = dataclasses.replace(SMOKE, steps=3)
    for mechanism, status in (("packtest-kaboom", "error"), ("packtest-nan-at-eval", "diverged")):
        members = [(RunSpec.resolve("copy", mechanism, p, s), 1e-3) for s in (0, 1)]
        separate, packed, notes = packed_and_separate(members)
        for a, b in zip(separate, packed, strict=True):
            assert_rows_match(a, b)
            assert b["status"] == status, b["error"]
        assert len(notes) == (status == "error")
        expected = (
            "RuntimeError: kaboom" if status == "error" else "non-finite logits at evaluation"
        )
        assert all(r["error"] == expected for r in packed)


# -- the throughput benchmark -------------------------------------------------------------


@pytest.mark.slow
def test_the_throughput_benchmark_runs(tmp_path):
    out = tmp_path / "packed.json"
    command = [sys.executable, str(BENCHMARK), "--protocol", "smoke", "--tasks", "copy",
               "--mechs", "none", "--members", "2", "--steps", "4", "--repeats", "2",
               "--device", "cpu", "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["members"] == 2 and report["repeats"] == 2
    (case,) = report["cases"]
    assert case["task"] == "copy" and case["mechanism"] == "none" and case["packed"]
    assert len(case["packed_seconds"]) == len(case["unpacked_seconds"]) == 2
    assert case["packed_runs_per_hour"] > 0 and case["unpacked_runs_per_hour"] > 0
    assert case["ratio"] == pytest.approx(
        case["packed_runs_per_hour"] / case["unpacked_runs_per_hour"]
    )
    assert report["peak_rss_mib"]["packed"] > 0
    assert "ratio" in done.stdout


def test_packs_off_the_cpu_take_the_math_attention_kernel():
    # CUDA's fused attention kernels fail under vmap in the backward; the CPU keeps its own
    with stacked_models._quiet_vmap(torch.device("cuda")):
        assert torch.backends.cuda.math_sdp_enabled()
        assert not torch.backends.cuda.flash_sdp_enabled()
        assert not torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled()
    with stacked_models._quiet_vmap(torch.device("cpu")):
        assert torch.backends.cuda.flash_sdp_enabled()
