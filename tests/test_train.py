"""Training and evaluation of one run: RunSpec, metrics, lr schedule, run(), failures."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

from synthbench.core.mechanism import MECHANISMS, Mechanism
from synthbench.core.task import IGNORE, TASKS, Batch
from synthbench.integrity import audit
from synthbench.run import train
from synthbench.run.evaluation import answer_metrics, evaluate, held_out_metrics
from synthbench.run.lr_selection import Budget
from synthbench.run.protocols import PROTOCOLS, curve_points
from synthbench.run.runner import run_sweep as run
from synthbench.run.spec import MAX_SEED, TEST_SEED, VAL_SEED, RunSpec
from synthbench.run.train import build_model, lr_schedule, train_eval

pytestmark = pytest.mark.usefixtures("single_thread")

SMOKE = PROTOCOLS.get("smoke")
CPU = torch.device("cpu")
# kv_recall at its smallest sensible size keeps every run well under a second
SMALL_KV = {"pairs": 4, "queries": 2}


def spec(task="kv_recall", mech="linear", protocol=SMOKE, seed=0, task_params=None):
    overrides = SMALL_KV if task_params is None and task == "kv_recall" else task_params
    return RunSpec.resolve(task, mech, protocol, seed, overrides)


# -- RunSpec ------------------------------------------------------------------------------


def test_resolve_canonicalises_aliases_and_fills_defaults():
    s = RunSpec.resolve("mqar", "elu", SMOKE, 0)
    assert (s.task, s.mechanism) == ("kv_recall", "linear")
    assert s.task_params == {
        "pairs": 24,
        "queries": 12,
        "keys": 64,
        "values": 64,
        "distinct_values": True,
        "gap": 0,
    }
    assert s.mechanism_params == {"eps": 1e-6, "chunk_size": 64}
    assert s.run_id == RunSpec.resolve("kv_recall", "linear", SMOKE, 0).run_id
    # an override equal to the default is the same run
    same = RunSpec.resolve("kv_recall", "linear", SMOKE, 0, {"pairs": 24}, {"eps": 1e-6})
    assert same.run_id == s.run_id


def test_run_id_is_stable():
    a = RunSpec.resolve("copy", "softmax", SMOKE, 3)
    b = RunSpec.resolve("copy", "softmax", SMOKE, 3)
    assert a.run_id == a.run_id == b.run_id
    assert len(a.run_id) == 16 and int(a.run_id, 16) >= 0


def _protocol_variants():
    """Each config-relevant protocol field changed to another valid value."""
    changed = {
        "name": "smoke-2",
        "version": SMOKE.version + 1,
        "arch": "transformer",
        "pos": "sinusoidal",
        "d_model": 64,
        "n_heads": 4,
        "n_layers": 2,
        "steps": 21,
        "batch_size": 8,
        "lrs": (3e-3, 1e-2),
        "lr_extend": 1,
        "weight_decay": 0.0,
        "betas": (0.9, 0.999),
        "warmup_frac": 0.2,
        "min_lr_frac": 0.5,
        "grad_clip": 0.5,
        "val_examples": 16,
        "test_examples": 32,
        "eval_batch_size": 16,
        "select_metric": "exact_match",
        "stop_at": 0.99,
        "pace_margin": 0.1,
        "lr_signal": 0.05,
        "max_steps": 40,
        "extend_steps": 5,
        "rise_margin": 0.01,
        "lr_refine": 1,
        "task_params": (("copy", (("n", 8),)),),  # through the run's resolved task params
    }
    seed_counts = {"seeds", "max_seeds", "seed_spread"}  # which runs a cell holds, not a run's
    fields = {f.name for f in dataclasses.fields(SMOKE)} - {"description", *seed_counts}
    assert fields == set(changed), "a new protocol field needs a variant here"
    return sorted(changed.items())


@pytest.mark.parametrize("field,value", _protocol_variants())
def test_run_id_changes_with_every_protocol_field(field, value):
    sweep = dataclasses.replace(SMOKE, lrs=(1e-3, 3e-3))  # lr_extend needs a grid step
    base = RunSpec.resolve("copy", "softmax", sweep, 0)
    other = RunSpec.resolve("copy", "softmax", dataclasses.replace(sweep, **{field: value}), 0)
    assert other.run_id != base.run_id


def test_run_id_ignores_description_and_default_seed_count():
    base = RunSpec.resolve("copy", "softmax", SMOKE, 0)
    p = dataclasses.replace(SMOKE, description="other words", seeds=5)
    assert RunSpec.resolve("copy", "softmax", p, 0).run_id == base.run_id
    more_seeds = dataclasses.replace(SMOKE, max_seeds=5, seed_spread=0.1)
    assert RunSpec.resolve("copy", "softmax", more_seeds, 0).run_id == base.run_id


def test_run_id_changes_with_seed_task_and_mechanism_params():
    base = RunSpec.resolve("kv_recall", "linear", SMOKE, 0)
    variants = [
        RunSpec.resolve("kv_recall", "linear", SMOKE, 1),
        RunSpec.resolve("kv_recall", "linear", SMOKE, 0, threads=2),
        RunSpec.resolve("kv_recall", "linear", SMOKE, 0, {"pairs": 4, "queries": 2}),
        RunSpec.resolve("kv_recall", "linear", SMOKE, 0, {"queries": 2}),
        RunSpec.resolve("kv_recall", "linear", SMOKE, 0, None, {"eps": 1e-5}),
        RunSpec.resolve("kv_recall", "linear", SMOKE, 0, None, {"chunk_size": 16}),
        RunSpec.resolve("kv_recall", "softmax", SMOKE, 0),
        RunSpec.resolve("copy", "linear", SMOKE, 0),
    ]
    ids = [base.run_id, *(v.run_id for v in variants)]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("seed", [-1, MAX_SEED, MAX_SEED + 1, VAL_SEED, TEST_SEED])
def test_seed_out_of_range_raises(seed):
    with pytest.raises(ValueError, match="seed"):
        RunSpec.resolve("copy", "softmax", SMOKE, seed)


def test_largest_seed_is_accepted():
    assert RunSpec.resolve("copy", "softmax", SMOKE, MAX_SEED - 1).seed == MAX_SEED - 1


def test_resolve_rejects_unknown_parameters():
    with pytest.raises(ValueError, match="nope"):
        RunSpec.resolve("copy", "softmax", SMOKE, 0, {"nope": 1})
    with pytest.raises(ValueError, match="nope"):
        RunSpec.resolve("copy", "linear", SMOKE, 0, None, {"nope": 1})


# -- metrics ------------------------------------------------------------------------------


def one_hot_logits(predictions: list[list[int]], vocab: int = 5) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(predictions), vocab).float()


def test_answer_metrics_per_example_then_averaged():
    I = IGNORE  # noqa: E741
    targets = torch.tensor(
        [
            [I, 1, 2, 3, I],  # 3 answers, 1 right
            [4, I, I, I, I],  # 1 answer, right
            [I, 0, 0, I, I],  # 2 answers, both right
        ]
    )
    predictions = [
        [1, 1, 0, 0, 4],  # answers at 1..3: 1 ok, 0 != 2, 0 != 3 (ignored positions wrong)
        [4, 0, 0, 0, 0],
        [3, 0, 0, 3, 3],
    ]
    acc, exact = answer_metrics(one_hot_logits(predictions), targets)
    torch.testing.assert_close(acc, torch.tensor([1 / 3, 1.0, 1.0]))
    torch.testing.assert_close(exact, torch.tensor([0.0, 1.0, 1.0]))
    # averaged per example (7/9), not pooled over tokens (4/6)
    assert acc.mean().item() == pytest.approx(7 / 9)


def test_answer_metrics_ignore_positions_do_not_count():
    targets = torch.tensor([[IGNORE, 2, IGNORE]])
    right = answer_metrics(one_hot_logits([[0, 2, 0]]), targets)
    also_right = answer_metrics(one_hot_logits([[4, 2, 1]]), targets)
    wrong = answer_metrics(one_hot_logits([[2, 3, 2]]), targets)
    assert [t.item() for t in right] == [t.item() for t in also_right] == [1.0, 1.0]
    assert [t.item() for t in wrong] == [0.0, 0.0]


def test_evaluate_does_not_depend_on_eval_batch_size():
    s = spec()
    task = TASKS.get(s.task)(**s.task_params)
    torch.manual_seed(0)
    model = build_model(s, task)
    data = task.generate(50, torch.Generator().manual_seed(1), "cpu")
    whole = evaluate(model, data, 64)
    for batch_size in (1, 7, 50):
        parts = evaluate(model, data, batch_size)
        assert parts == pytest.approx(whole, abs=1e-6)
    logits = model(data.inputs)
    acc, exact = answer_metrics(logits, data.targets)
    assert whole["token_acc"] == pytest.approx(acc.mean().item())
    assert whole["exact_match"] == pytest.approx(exact.mean().item())
    assert model.training  # evaluate hands the model back in training mode


@torch.no_grad()
def free_running_reference(model, inputs, targets):
    """Greedy generation position by position: the prefix up to i, the prediction at i, and
    where i is an answer the prediction written into position i + 1. Per-example accuracy."""
    x = inputs.clone()
    answer = targets != IGNORE
    predicted = torch.empty_like(targets)
    for i in range(x.shape[1]):
        predicted[:, i] = model(x[:, : i + 1])[:, -1].argmax(dim=-1)
        if i + 1 < x.shape[1]:
            x[:, i + 1] = torch.where(answer[:, i], predicted[:, i], x[:, i + 1])
    return ((predicted == targets) & answer).sum(dim=1) / answer.sum(dim=1)


@pytest.mark.parametrize(
    ("task_name", "params", "fed_back_matters"),
    [
        ("copy", {"n": 6}, True),
        ("sort", {"n": 6, "vocab": 48}, True),
        ("stack", {"ops": 16, "values": 8}, False),
    ],
)
def test_free_running_matches_greedy_generation_one_position_at_a_time(
    task_name, params, fed_back_matters
):
    """Against the plain reference, on half-trained models (some answers right, some wrong,
    so both the agreeing and the repeated passes run); copy's and sort's answers are a block
    after SEP, stack's are interleaved with given tokens."""
    s = spec(task=task_name, mech="softmax", task_params=params)
    task = TASKS.get(task_name)(**params)
    torch.manual_seed(0)
    model = build_model(s, task).eval()
    train = task.generate(256, torch.Generator().manual_seed(3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = task.generate(40, torch.Generator().manual_seed(4))
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(
            model(train.inputs).flatten(0, 1), train.targets.flatten(), ignore_index=IGNORE
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    expected = free_running_reference(model, data.inputs, data.targets)
    teacher_forced, all_right = answer_metrics(model(data.inputs), data.targets)
    assert 0.05 < expected.mean().item() < 0.95
    if fed_back_matters:  # some examples generate differently from their teacher-forced run
        assert (expected != teacher_forced).any()
    for batch_size in (7, 64):
        got = held_out_metrics(model, data, batch_size)
        assert got["free_token_acc"] == pytest.approx(expected.mean().item(), abs=1e-6)
        se = expected.std().item() / len(expected) ** 0.5
        assert got["free_token_acc_se"] == pytest.approx(se, rel=1e-5)
        # its first pass is the teacher-forced one: evaluate's metrics, and their errors
        plain = evaluate(model, data, batch_size)
        for metric, per_example in (("token_acc", teacher_forced), ("exact_match", all_right)):
            assert got[metric] == pytest.approx(plain[metric], abs=1e-6)
            se = per_example.std().item() / len(per_example) ** 0.5
            assert got[f"{metric}_se"] == pytest.approx(se, rel=1e-5)
    # an example all right free-running is all right teacher-forced, and the other way round
    assert torch.equal(all_right.bool(), expected == 1.0)


class _Successor(torch.nn.Module):
    """A causal stand-in for a model: at each position it predicts the sum of the tokens so
    far plus one, mod the vocabulary, so every free-running answer hangs on all before it
    (the longest chain the parallel generation can meet). Counts its passes."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.passes = vocab, 0

    def forward(self, x):
        self.passes += 1
        return torch.nn.functional.one_hot((x.cumsum(dim=1) + 1) % self.vocab, self.vocab).float()


def test_free_running_takes_one_pass_per_answer_at_most_on_a_chain():
    vocab, length, n_answers = 11, 12, 7
    g = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, vocab, (9, length), generator=g)
    targets = torch.full_like(inputs, IGNORE)
    targets[:, length - n_answers :] = torch.randint(0, vocab, (9, n_answers), generator=g)
    targets[0, length - n_answers :] = 0  # one example answered wrong everywhere, free-running
    data = Batch(inputs, targets)
    model = _Successor(vocab)
    expected = free_running_reference(model, inputs, targets)
    model.passes = 0
    got = held_out_metrics(model, data, batch_size=64)
    assert got["free_token_acc"] == pytest.approx(expected.mean().item(), abs=1e-6)
    assert model.passes <= n_answers + 1


def test_curve_points_are_even_and_end_at_the_last_step():
    assert curve_points(1000) == list(range(100, 1001, 100))
    assert curve_points(25) == [2, 5, 8, 10, 12, 15, 18, 20, 22, 25]
    assert curve_points(3) == [1, 2, 3]


def test_curve_points_go_on_at_the_same_spacing_up_to_a_later_horizon():
    assert curve_points(1000, horizon=1000) == curve_points(1000)
    assert curve_points(1000, horizon=1500) == list(range(100, 1501, 100))
    # a horizon off the spacing is a point itself: a training decides there to go on or not
    assert curve_points(1000, horizon=1130) == [*range(100, 1101, 100), 1130]
    assert curve_points(25, horizon=30) == [2, 5, 8, 10, 12, 15, 18, 20, 22, 25, 28, 30]
    assert curve_points(3, horizon=5) == [1, 2, 3, 4, 5]


# -- lr schedule --------------------------------------------------------------------------


def test_lr_schedule_warmup_peak_and_end():
    p = dataclasses.replace(SMOKE, steps=100, warmup_frac=0.1, min_lr_frac=0.1)
    f = lr_schedule(p)
    warm = [f(s) for s in range(10)]
    assert warm == pytest.approx([(s + 1) / 10 for s in range(10)])  # linear ramp
    diffs = [b - a for a, b in itertools.pairwise(warm)]
    assert diffs == pytest.approx([0.1] * 9)
    assert f(9) == pytest.approx(1.0) and f(10) == pytest.approx(1.0)  # peak 1
    assert max(f(s) for s in range(101)) == pytest.approx(1.0)
    decay = [f(s) for s in range(10, 101)]
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(decay))  # monotone decay
    assert f(100) == pytest.approx(0.1)  # ends at min_lr_frac
    assert f(55) == pytest.approx(0.1 + 0.9 * 0.5)  # cosine midpoint
    assert f(99) == pytest.approx(0.1, abs=1e-3)


def test_lr_schedule_constant():
    p = dataclasses.replace(SMOKE, steps=50, warmup_frac=0.0, min_lr_frac=1.0)
    f = lr_schedule(p)
    assert [f(s) for s in range(51)] == pytest.approx([1.0] * 51)


def test_lr_schedule_no_warmup_starts_at_peak():
    f = lr_schedule(dataclasses.replace(SMOKE, steps=40, warmup_frac=0.0, min_lr_frac=0.0))
    assert f(0) == pytest.approx(1.0)
    assert f(40) == pytest.approx(0.0)


def test_lr_schedule_stretched_to_a_later_horizon():
    """The warm-up of the protocol's steps, then the cosine over (step - warm-up) /
    (horizon - warm-up): back up at the old end, min_lr_frac at the new one."""
    p = dataclasses.replace(SMOKE, steps=100, warmup_frac=0.1, min_lr_frac=0.1)
    f, stretched = lr_schedule(p), lr_schedule(p, 150)
    assert [stretched(s) for s in range(10)] == [f(s) for s in range(10)]  # the same warm-up
    assert stretched(100) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 90 / 140)))
    assert stretched(100) > f(99) and f(100) == pytest.approx(0.1)
    assert stretched(80) == pytest.approx(0.1 + 0.9 * 0.5)  # the new midpoint
    assert stretched(150) == pytest.approx(0.1) and stretched(200) == pytest.approx(0.1)
    assert lr_schedule(p, 100)(55) == f(55)  # the protocol's own end: the same schedule


# -- run() --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smoke_rows(single_thread):
    return run(spec(), CPU)


def test_run_smoke(smoke_rows):
    s = spec()
    assert len(smoke_rows) == 1
    row = smoke_rows[0]
    assert row["status"] == "ok", row.get("error")
    assert row.get("error") is None
    assert row["run_id"] == s.run_id
    assert (row["task"], row["mechanism"], row["category"]) == ("kv_recall", "linear", "Memory")
    assert row["protocol"] == "smoke" and row["seed"] == 0 and row["lr"] == SMOKE.lrs[0]
    for key in ("token_acc", "exact_match", "val_token_acc", "val_exact_match"):
        assert 0.0 <= row[key] <= 1.0, key
    assert row["steps_done"] == row["steps"] == SMOKE.steps
    assert 0.0 <= row["free_token_acc"] <= 1.0
    assert row["curve_steps"] == curve_points(SMOKE.steps)
    assert len(row["curve_val_token_acc"]) == len(row["curve_steps"])
    assert row["curve_val_token_acc"][-1] == row["val_token_acc"]  # the last point: the end
    assert row["n_params"] > 0
    assert math.isfinite(row["final_loss"]) and row["final_loss"] > 0
    assert row["wall_seconds"] > 0
    assert row["selected"] is True
    assert sum(r["selected"] for r in smoke_rows) == 1


def test_run_n_params_counts_the_model(smoke_rows):
    s = spec()
    model = build_model(s, TASKS.get(s.task)(**s.task_params))
    assert smoke_rows[0]["n_params"] == sum(p.numel() for p in model.parameters())


def test_lr_sweep_selects_best_validation_row():
    p = dataclasses.replace(SMOKE, lrs=(1e-3, 3e-3))
    rows = run(spec(protocol=p), CPU)
    assert [r["lr"] for r in rows] == [1e-3, 3e-3]
    assert all(r["status"] == "ok" for r in rows)
    assert len({r["run_id"] for r in rows}) == 1
    selected = [r for r in rows if r["selected"]]
    assert len(selected) == 1
    assert selected[0]["val_token_acc"] == max(r["val_token_acc"] for r in rows)


def test_lr_sweep_selects_on_the_protocols_metric(monkeypatch):
    """Pick by val_exact_match when the protocol says so, even when val token_acc disagrees."""
    fake = {
        1e-3: {"val_token_acc": 0.9, "val_exact_match": 0.1},
        3e-3: {"val_token_acc": 0.5, "val_exact_match": 0.4},
    }

    def fake_train_eval(spec, lr, device, budget=None, saved=None):
        return {"status": "ok", "lr": lr, **fake[lr]}

    monkeypatch.setattr("synthbench.run.work.train_eval", fake_train_eval)
    for metric, best in (("token_acc", 1e-3), ("exact_match", 3e-3)):
        p = dataclasses.replace(SMOKE, lrs=(1e-3, 3e-3), select_metric=metric)
        rows = run(spec(protocol=p), CPU)
        assert [r["lr"] for r in rows if r["selected"]] == [best]


def test_a_step_budget_stops_the_training_there_on_the_same_schedule():
    full = train_eval(spec(), 3e-3, CPU)
    cut = train_eval(spec(), 3e-3, CPU, Budget(steps=10))
    assert (full["steps_done"], cut["steps_done"]) == (SMOKE.steps, 10)
    # the same first 10 steps (the lr schedule still spans the protocol's steps)
    assert cut["curve_steps"] == [s for s in full["curve_steps"] if s <= 10]
    assert cut["curve_val_token_acc"] == full["curve_val_token_acc"][: len(cut["curve_steps"])]
    assert cut["status"] == "ok" and cut["val_token_acc"] == cut["curve_val_token_acc"][-1]


def test_the_sweep_hands_its_step_budget_to_the_training(monkeypatch):
    """An lr added above an edge that solved trains up to the curve point before its steps."""
    solved_at = {1e-3: None, 3e-3: 60}  # 3e-3 alone solves: the grid grows above it
    budgets = {}

    def fake_train_eval(spec, lr, device, budget=None, saved=None):
        budgets[lr] = budget.steps
        steps = solved_at.get(lr) or budget.steps or 100
        acc = 1.0 if solved_at.get(lr) else 0.5
        return {"status": "ok", "lr": lr, "steps_done": steps, "val_token_acc": acc}

    monkeypatch.setattr("synthbench.run.work.train_eval", fake_train_eval)
    p = dataclasses.replace(SMOKE, steps=100, lrs=(1e-3, 3e-3), lr_extend=1, stop_at=0.99)
    rows = run(spec(protocol=p), CPU)
    assert budgets == {1e-3: None, 3e-3: None, 9e-3: 50}
    assert [r["lr"] for r in rows if r["selected"]] == [3e-3]


def test_run_is_deterministic(smoke_rows):
    again = run(spec(), CPU)[0]
    first = smoke_rows[0]
    for key in ("token_acc", "exact_match", "val_token_acc", "final_loss", "n_params"):
        assert again[key] == first[key], key


def test_seed_changes_the_run(smoke_rows):
    other = run(spec(seed=1), CPU)[0]
    assert other["final_loss"] != smoke_rows[0]["final_loss"]


def test_run_does_not_depend_on_global_rng(smoke_rows):
    torch.manual_seed(12345)
    torch.rand(100)
    again = run(spec(), CPU)[0]
    assert again["final_loss"] == smoke_rows[0]["final_loss"]


def test_train_batches_are_fresh_and_eval_sets_fixed(monkeypatch):
    """Every step draws a new batch from the run's generator; validation and test sets come
    from VAL_SEED and TEST_SEED, so they are identical for every seed."""
    task_cls = TASKS.get("kv_recall")
    original = task_cls.generate
    calls: list[tuple[int, int, torch.Tensor]] = []

    def recording_generate(self, n, generator, device="cpu"):
        seed = generator.initial_seed()
        batch = original(self, n, generator, device)
        calls.append((seed, n, batch.inputs.clone()))
        return batch

    monkeypatch.setattr(task_cls, "generate", recording_generate)
    p = dataclasses.replace(SMOKE, steps=5)
    by_seed = {}
    for seed in (0, 1):
        calls.clear()
        run(spec(protocol=p, seed=seed), CPU)
        by_seed[seed] = list(calls)

    for seed, seed_calls in by_seed.items():
        train = [c for c in seed_calls if c[0] == seed]
        assert len(train) == p.steps
        assert all(n == p.batch_size for _, n, _ in train)
        inputs = [x for _, _, x in train]
        assert all(not torch.equal(a, b) for a, b in itertools.combinations(inputs, 2))
        # and the audit's own data streams, for the task's chance (synthbench/integrity/audit.py)
        audit_seeds = {audit.TRAIN_SEED, audit.TEST_SEED}
        assert {c[0] for c in seed_calls} - audit_seeds == {seed, VAL_SEED, TEST_SEED}

    def eval_set(seed, which):
        (x,) = [x for s, _, x in by_seed[seed] if s == which]
        return x

    for which, n in ((VAL_SEED, p.val_examples), (TEST_SEED, p.test_examples)):
        assert eval_set(0, which).shape[0] == n
        assert torch.equal(eval_set(0, which), eval_set(1, which))
    assert not torch.equal(eval_set(0, VAL_SEED)[:16], eval_set(0, TEST_SEED)[:16])
    # different seeds train on different data
    assert not torch.equal(by_seed[0][2][2], by_seed[1][2][2])


# -- failures -----------------------------------------------------------------------------


class NaNAttention(Mechanism):
    def forward(self, q, k, v, causal=True):
        return v * float("nan")


class InfAttention(Mechanism):
    def forward(self, q, k, v, causal=True):
        return v + float("inf")


class NaNAtEvalAttention(Mechanism):
    """Trains fine, blows up only in eval mode: caught at evaluation."""

    def forward(self, q, k, v, causal=True):
        return v if self.training else v * float("nan")


class KaboomAttention(Mechanism):
    def forward(self, q, k, v, causal=True):
        raise RuntimeError("kaboom")


@pytest.fixture
def register_mechanism():
    """Register test mechanisms under unique names; removed again afterwards."""
    added: list[str] = []

    def add(cls: type) -> str:
        name = f"test-{cls.__name__.lower()}-{len(added)}"
        MECHANISMS.add(name, cls, complexity="quadratic", family="test", reference="none")
        added.append(name)
        return name

    yield add
    for name in added:
        MECHANISMS._entries.pop(name, None)
        for alias in [a for a, target in MECHANISMS._aliases.items() if target == name]:
            del MECHANISMS._aliases[alias]
    assert not any(n.startswith("test-") for n in MECHANISMS.names())


@pytest.mark.parametrize(
    "cls,where",
    [(NaNAttention, "loss"), (InfAttention, "loss"), (NaNAtEvalAttention, "evaluation")],
)
def test_diverged_run_is_stored_as_diverged_never_zero(register_mechanism, cls, where):
    name = register_mechanism(cls)
    p = dataclasses.replace(SMOKE, steps=3)
    rows = run(spec(mech=name, protocol=p), CPU)
    assert len(rows) == 1
    row = rows[0]
    assert row["status"] == "diverged"
    assert "non-finite" in row["error"] and where in row["error"]
    for key in ("token_acc", "exact_match", "val_token_acc", "val_exact_match"):
        assert row.get(key) is None, key
    assert row["selected"] is False
    assert row["n_params"] > 0


def test_erroring_run_is_stored_as_error(register_mechanism):
    name = register_mechanism(KaboomAttention)
    p = dataclasses.replace(SMOKE, lrs=(1e-3, 3e-3))
    rows = run(spec(mech=name, protocol=p), CPU)
    assert len(rows) == 2
    for row in rows:
        assert row["status"] == "error"
        assert "RuntimeError: kaboom" in row["error"]
        assert row.get("token_acc") is None and row.get("exact_match") is None
        assert row["selected"] is False
        assert row["steps_done"] == 0


def test_registered_test_mechanisms_do_not_leak():
    assert not any(n.startswith("test-") for n in MECHANISMS.names())
    assert not any(a.startswith("test-") for a in MECHANISMS._aliases)


def test_a_training_that_falls_behind_its_pace_stops_from_half_the_schedule():
    paced = dataclasses.replace(SMOKE, pace_margin=0.1)
    ahead = tuple((step, 1.0) for step in curve_points(SMOKE.steps))  # always ahead by > 0.1
    row = train_eval(spec(protocol=paced), 3e-3, CPU, Budget(pace=ahead))
    assert row["status"] == "ok" and row["steps_done"] == SMOKE.steps // 2
    assert row["curve_steps"] == [s for s in curve_points(SMOKE.steps) if s <= SMOKE.steps // 2]
    behind = tuple((step, 0.0) for step in curve_points(SMOKE.steps))  # never behind
    kept_up = train_eval(spec(protocol=paced), 3e-3, CPU, Budget(pace=behind))
    assert kept_up["steps_done"] == SMOKE.steps


def test_a_parameter_marked_no_weight_decay_gets_none():
    """Mamba-2 marks A_log and dt_bias (as its own code does); every other parameter, and
    every parameter of a model without marks, keeps the protocol's weight decay in one group
    in the model's order (the optimiser of the runs stored before the marks existed)."""
    from synthbench.core.mechanism import MECHANISMS
    from synthbench.core.model import MultiHeadAttention
    from synthbench.run.train import parameter_groups

    layer = MultiHeadAttention(16, 2, MECHANISMS.get("mamba2")(8, 2))
    groups = parameter_groups(layer, 0.01)
    assert [g["weight_decay"] for g in groups] == [0.01, 0.0]
    assert {id(p) for p in groups[1]["params"]} == {
        id(layer.mechanism.A_log),
        id(layer.mechanism.dt_bias),
    }
    plain = MultiHeadAttention(16, 2, MECHANISMS.get("linear")(8, 2))
    (group,) = parameter_groups(plain, 0.01)
    assert group["params"] == list(plain.parameters()) and group["weight_decay"] == 0.01


# -- recipe v2: a training still rising at its schedule's end goes on ---------------------

# smoke (20 steps, a curve point every 2) that may go on 10 steps at a time (steps // 2) up
# to 50, while its curve gains at least 0.01 over RISE_POINTS points
EXTENDING = dataclasses.replace(SMOKE, max_steps=50, rise_margin=0.01)


def rising(row, step):
    return step / 100  # +0.04 over 2 points of 2 steps


def scripted_curve(monkeypatch, accuracy):
    """Each curve point's validation token accuracy set to ``accuracy(row, step)``, the
    training itself real: the rule under test sees a curve that rises or settles as the test
    says, whatever a few steps of smoke learn."""
    real = train.curve_point

    def scripted(row, protocol, budget, step, val_metrics):
        val_metrics["token_acc"] = accuracy(row, step)
        return real(row, protocol, budget, step, val_metrics)

    monkeypatch.setattr(train, "curve_point", scripted)


def test_a_rising_training_goes_on_in_chunks_up_to_max_steps(monkeypatch):
    scripted_curve(monkeypatch, rising)
    row = train_eval(spec(protocol=EXTENDING), 3e-3, CPU)
    assert row["status"] == "ok", row["error"]
    assert (row["steps"], row["steps_done"]) == (20, 50)  # 20 -> 30 -> 40 -> 50, the cap
    assert row["curve_steps"] == curve_points(20, horizon=50) == list(range(2, 51, 2))
    assert row["val_token_acc"] == row["curve_val_token_acc"][-1] == 0.5
    # extend_steps sets the chunk; the last one is cut at the cap: 20 -> 27 -> 32
    odd = dataclasses.replace(EXTENDING, extend_steps=7, max_steps=32)
    row = train_eval(spec(protocol=odd), 3e-3, CPU)
    assert row["steps_done"] == 32
    assert row["curve_steps"] == [*range(2, 21, 2), 22, 24, 26, 27, 28, 30, 32]
    # max_steps 0 (every preset): the schedule's end is the end, rising or not
    assert train_eval(spec(), 3e-3, CPU)["steps_done"] == SMOKE.steps


@pytest.mark.parametrize(
    ("accuracy", "rise_margin", "steps_done"),
    [
        (lambda row, step: 0.3, 0.01, 20),  # flat
        (lambda row, step: 0.3, 0.0, 20),  # flat: no gain is no rise, even with no margin
        (lambda row, step: step / 1000, 0.01, 20),  # +0.004: below the margin
        (lambda row, step: 0.5 - step / 100, 0.0, 20),  # falling
        (lambda row, step: min(step, 24) / 100, 0.01, 30),  # rose, then settled by 30
    ],
)
def test_a_settled_training_stops_at_its_horizon(monkeypatch, accuracy, rise_margin, steps_done):
    scripted_curve(monkeypatch, accuracy)
    protocol = dataclasses.replace(EXTENDING, rise_margin=rise_margin)
    row = train_eval(spec(protocol=protocol), 3e-3, CPU)
    assert row["status"] == "ok" and row["steps_done"] == steps_done
    assert row["curve_steps"] == curve_points(20, horizon=steps_done)


def test_a_solved_training_stops_early_in_an_extension_too(monkeypatch):
    scripted_curve(monkeypatch, rising)
    for stop_at, steps_done in ((0.1, 10), (0.25, 26)):  # in the schedule, in the extension
        solving = dataclasses.replace(EXTENDING, stop_at=stop_at)
        row = train_eval(spec(protocol=solving), 3e-3, CPU)
        assert row["steps_done"] == steps_done and row["curve_steps"][-1] == steps_done


def test_the_pace_rule_applies_in_an_extension(monkeypatch):
    """An lr grown past an edge stops once it trails the edge's curve by the margin: here
    from step 26, in the first extension."""
    scripted_curve(monkeypatch, rising)
    paced = dataclasses.replace(EXTENDING, pace_margin=0.1)
    edge = tuple((at, at / 100 + (0.2 if at >= 26 else 0)) for at in curve_points(20, horizon=50))
    row = train_eval(spec(protocol=paced), 3e-3, CPU, Budget(pace=edge))
    assert row["steps_done"] == 26


def test_a_step_budget_bounds_the_extensions(monkeypatch):
    """A budget below the schedule (an lr grown past an edge that solved sooner) never
    extends; one past it (the edge solved in an extension) extends, and stops at it."""
    scripted_curve(monkeypatch, rising)
    for limit, steps_done in ((14, 14), (20, 20), (33, 33)):
        row = train_eval(spec(protocol=EXTENDING), 3e-3, CPU, Budget(steps=limit))
        assert row["steps_done"] == steps_done
    assert row["curve_steps"] == [*range(2, 33, 2), 33]  # horizons 20, 30, then 40: cut at 33


def test_after_an_extension_the_lr_decays_again_to_the_new_end(monkeypatch):
    """The lr of every step: the protocol's schedule up to its end, then back up, the
    cosine stretched to the new end (20 -> 30, the cap)."""
    scripted_curve(monkeypatch, rising)
    lrs = []

    class Recorded(torch.optim.AdamW):
        def step(self, closure=None):
            lrs.append(self.param_groups[0]["lr"])
            return super().step(closure)

    monkeypatch.setattr(torch.optim, "AdamW", Recorded)
    p = dataclasses.replace(EXTENDING, max_steps=30, warmup_frac=0.1, min_lr_frac=0.1)
    lr = 3e-3
    row = train_eval(spec(protocol=p), lr, CPU)
    assert row["steps_done"] == len(lrs) == 30
    first, stretched = lr_schedule(p), lr_schedule(p, 30)
    assert lrs[:20] == [lr * first(s) for s in range(20)]
    assert lrs[20:] == [lr * stretched(s) for s in range(20, 30)]

    def by_hand(step: int) -> float:  # a warm-up of 2 steps (0.1 x 20), then 28 of cosine
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - 2) / 28)))

    assert lrs[20] == pytest.approx(by_hand(20)) and lrs[29] == pytest.approx(by_hand(29))
    assert lrs[20] > lrs[19]  # back up at the old end
