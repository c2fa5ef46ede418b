"""`synthbench bench decode`: per-token decoding latency and state memory of the mechanisms with
a recurrent form, at tiny sizes; the recurrent forms it relies on (softmax's KV cache and its
prefill, the feature-map state, cosformer's position); its one-line errors."""

from __future__ import annotations

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

import synthbench.run.provenance
from synthbench.bench import decode
from synthbench.bench.common import META, bench_files
from synthbench.cli import app
from synthbench.core.mechanism import MECHANISMS, has_recurrent_form, recurrent_forward

pytestmark = pytest.mark.usefixtures("single_thread")

ENV = {"COLUMNS": "250"}  # no wrapping of the printed lines
HEAD_DIM, HEADS, BATCH = 4, 2, 2
LENGTHS = (8, 16, 32)
TINY = [
    "--lengths", ",".join(map(str, LENGTHS)), "--tokens", "3", "--repeats", "2", "--warmup", "0",
    "--head-dim", HEAD_DIM, "--heads", HEADS, "--batch", BATCH, "--device", "cpu",
]  # fmt: skip
TOY, BROKEN = "toy-decay", "toy-broken"
TOY_PLUGIN = f"""
import torch

from synthbench.core.mechanism import MECHANISMS, Mechanism, recurrent_forward


@MECHANISMS.register("{TOY}", complexity="linear", family="test", reference="none")
class ToyDecay(Mechanism):
    '''A running sum of v, decayed by sigmoid(gate) (an extra input of width 1) per token.'''

    def __init__(self, head_dim, n_heads):
        super().__init__(head_dim, n_heads)
        self.extra_inputs = {{"gate": 1}}

    def forward(self, q, k, v, causal=True, gate=None):
        return recurrent_forward(self, q, k, v, gate=gate)

    def initial_state(self, batch, device, dtype):
        return torch.zeros(batch, self.n_heads, self.head_dim, device=device, dtype=dtype)

    def step(self, state, q, k, v, gate=None):
        assert gate.shape == (*v.shape[:-1], 1), gate.shape  # the declared width
        state = torch.sigmoid(gate) * state + v
        return state, state

    def state_size(self, seq_len):
        return self.head_dim


@MECHANISMS.register("{BROKEN}", complexity="linear", family="test", reference="none")
class Broken(ToyDecay):
    def step(self, state, q, k, v, gate=None):
        raise RuntimeError("no step today")
"""


@pytest.fixture(scope="module", autouse=True)
def no_git():
    """The rows' commit without running git (another session works in this checkout)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(synthbench.run.provenance, "git_commit", lambda: "test")
        yield


def invoke(*args):
    result = CliRunner().invoke(app, ["bench", *map(str, args)], env=ENV)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


@pytest.fixture(scope="module")
def decode_run(tmp_path_factory):
    """softmax, linear and the toy (through --plugin), once for the tests below."""
    root = tmp_path_factory.mktemp("decode")
    plugin = root / "toy_plugin.py"
    plugin.write_text(TOY_PLUGIN)
    try:
        result = invoke(
            "decode", "--mech", f"softmax,linear,{TOY},{BROKEN}", *TINY, "--plugin", plugin,
            "--bench-results", root / "bench-results",
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        (file,) = bench_files(root / "bench-results", "decode")
        yield file, result
    finally:
        for name in (TOY, BROKEN):
            if name in MECHANISMS:
                MECHANISMS._remove(name)


def test_decode_stores_a_row_per_mechanism_and_length(decode_run):
    file, _ = decode_run
    schema = pq.read_schema(file)
    assert schema.names == [name for name, _ in META + decode.METRICS]
    assert schema.metadata[b"synthbench_bench_kind"] == b"decode"
    rows = pd.read_parquet(file)
    assert list(dict.fromkeys(rows["mechanism"])) == ["softmax", "linear", TOY, BROKEN]
    broken = rows[rows["mechanism"] == BROKEN]  # stored as such; the others still measured
    assert (broken["status"] == "error").all() and broken["us_per_token"].isna().all()
    assert (broken["error"] == "RuntimeError: no step today").all()
    rows = rows[rows["mechanism"] != BROKEN]
    assert (rows["status"] == "ok").all(), rows[["mechanism", "error"]]
    assert (rows.groupby("mechanism")["seq_len"].apply(list) == [list(LENGTHS)] * 3).all()
    assert (rows["us_per_token"] > 0).all() and (rows["ratio"] > 0).all()
    assert (rows["reference"] == "softmax").all()
    assert (rows.loc[rows["mechanism"] == "softmax", "ratio"] == 1).all()
    assert set(rows["tokens"]) == {3} and set(rows["threads"]) == {1}
    assert rows.set_index("mechanism")["prefill"].to_dict() == {
        "softmax": "prefill", "linear": "step", TOY: "step"
    }  # fmt: skip


def test_softmax_state_grows_linearly_with_the_length_and_linear_s_does_not(decode_run):
    """Measured bytes: softmax's KV cache is 2 x L x head_dim float32 per head and sequence;
    linear's (features x (head_dim + 1)) and the toy's (head_dim) do not depend on L. Each
    equals what the mechanism declares (state_size x heads, 4 bytes a number)."""
    rows = pd.read_parquet(decode_run[0]).query("status == 'ok'")
    rows = rows.set_index(["mechanism", "seq_len"])
    for length in LENGTHS:
        assert rows.loc[("softmax", length), "state_bytes"] == (
            2 * length * HEAD_DIM * HEADS * BATCH * 4
        )
    linear = rows.loc["linear", "state_bytes"]
    assert linear.nunique() == 1 and linear.iloc[0] == HEAD_DIM * (HEAD_DIM + 1) * HEADS * BATCH * 4
    assert (rows.loc[TOY, "state_bytes"] == HEAD_DIM * HEADS * BATCH * 4).all()
    assert (rows["state_bytes"] == rows["declared_bytes"]).all()
    assert rows.loc[("softmax", 32), "declared_state"] == 2 * 32 * HEAD_DIM * HEADS


def test_decode_prints_the_table_the_growth_and_how_it_measured(decode_run):
    stdout = decode_run[1].stdout
    assert "us/token" in stdout and "x softmax" in stdout and "state (measured)" in stdout
    per_token = 2 * HEAD_DIM * HEADS * BATCH * 4
    assert per_token == 128
    assert "softmax state grows with L: L 8: 1.0 KiB, L 16: 2.0 KiB, L 32: 4.0 KiB " in stdout
    assert "(+128 B per token)" in stdout
    assert "linear state grows" not in stdout
    assert f"{BROKEN:<10}       8  error: RuntimeError: no step today" in stdout
    assert stdout.strip().splitlines()[-1].startswith("measured: 2 sequences, 2 heads of 4")


def test_all_measures_only_the_mechanisms_with_a_recurrent_form(tmp_path):
    result = invoke(
        "decode", "--mech", "all", "--lengths", "4", "--tokens", "1", "--repeats", "1",
        "--warmup", "0", "--head-dim", HEAD_DIM, "--heads", HEADS, "--device", "cpu",
        "--bench-results", tmp_path,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = pd.read_parquet(bench_files(tmp_path, "decode")[0])
    assert {"softmax", "linear", "performer", "cosformer"} <= set(rows["mechanism"])
    assert not {"yat", "none"} & set(rows["mechanism"])
    assert "no recurrent form: " in result.stdout.splitlines()[0]


# -- the recurrent forms it decodes with ----------------------------------------------------------


def test_softmax_prefill_leaves_the_state_the_steps_leave():
    mechanism = MECHANISMS.get("softmax")(HEAD_DIM, HEADS)
    q, k, v = torch.randn(3, BATCH, HEADS, 10, HEAD_DIM)
    state = mechanism.initial_state(BATCH, q.device, q.dtype)
    for t in range(10):
        _, state = mechanism.step(state, q[..., t, :], k[..., t, :], v[..., t, :])
    filled = mechanism.prefill(q, k, v)
    assert len(filled) == len(state)
    for got, want in zip(filled, state, strict=True):
        assert torch.equal(got, want) and got.is_contiguous()


def test_feature_map_state_is_the_running_sums():
    """(S, z) = (sum phi(k)^T v, sum phi(k)): the numbers state_size declares."""
    mechanism = MECHANISMS.get("performer")(HEAD_DIM, HEADS)
    q, k, v = torch.randn(3, BATCH, HEADS, 6, HEAD_DIM)
    state = mechanism.initial_state(BATCH, q.device, q.dtype)
    for t in range(6):
        _, state = mechanism.step(state, q[..., t, :], k[..., t, :], v[..., t, :])
    phi_k = mechanism.feature_map(k, is_query=False)
    torch.testing.assert_close(state[0], phi_k.mT @ v)
    torch.testing.assert_close(state[1], phi_k.sum(-2))
    assert sum(t.numel() for t in state) == BATCH * HEADS * mechanism.state_size(6)


def test_cosformer_decodes_only_with_a_fixed_horizon():
    """Without one its horizon is the length of each call: no recurrent form. With one the
    position rides in the state, and a step past the horizon is refused as forward is."""
    cosformer = MECHANISMS.get("cosformer")
    assert not has_recurrent_form(cosformer(HEAD_DIM, HEADS))
    told = cosformer(HEAD_DIM, HEADS)
    told.set_max_len(12)
    assert has_recurrent_form(told) and has_recurrent_form(cosformer(HEAD_DIM, HEADS, horizon=5))
    q, k, v = torch.randn(3, 1, HEADS, 12, HEAD_DIM, dtype=torch.float64)
    torch.testing.assert_close(recurrent_forward(told, q, k, v), told(q, k, v))
    with pytest.raises(ValueError, match="sequence length 6 exceeds horizon=5"):
        recurrent_forward(cosformer(HEAD_DIM, HEADS, horizon=5), q[..., :6, :], k, v)


def test_a_feature_map_mechanism_can_switch_its_recurrent_form_off():
    class SequenceNormalised(MECHANISMS.get("linear")):
        recurrent = False

    assert has_recurrent_form(MECHANISMS.get("linear")(HEAD_DIM, HEADS))
    assert not has_recurrent_form(SequenceNormalised(HEAD_DIM, HEADS))


# -- user errors ------------------------------------------------------------------------------

BAD = {
    "unknown": (["--mech", "linaer"], "did you mean linear"),
    "not-recurrent": (["--mech", "softmax,yat"], "yat has no recurrent form"),
    "zero-length": (["--lengths", "0,16"], "--lengths must be >= 1, got 0"),
    "not-a-length": (["--lengths", "256,1k"], "--lengths takes comma-separated integers"),
    "no-length": (["--lengths", " , "], "--lengths names no length"),
    "tokens": (["--tokens", "0"], "--tokens must be >= 1"),
    "warmup": (["--warmup", "-1"], "--warmup must be >= 0"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_user_errors_exit_2_with_one_line(case, tmp_path):
    args, culprit = BAD[case]
    result = invoke("decode", *args, "--bench-results", tmp_path / "bench-results")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert culprit in lines[0], lines[0]
    assert list(tmp_path.iterdir()) == []
