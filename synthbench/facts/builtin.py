"""The built-in facts: published findings about these mechanisms, each with the runs that
test it under quick (or quick-block) and its rule, declared before any of them ran.

Figures quoted under ``published`` are the source's own, as the facts issue cites them;
where a source states a finding without a number for our setting, the entry says what it
shows ("Fig. 2: ..."), never an invented number. Notes say how our setting differs.

A fact marked ``sanity=True`` can fail only through a bug (issue 70): what it claims follows
from the construction (a state too small for the pairs, a window shorter than the distance,
one layer without a previous-token head), so its reproduction checks the code, not the
literature, and the report counts it apart from the findings.
"""

from __future__ import annotations

from synthbench.facts.fact import FACTS, Arm, Fact
from synthbench.facts.rules import All, AtLeast, AtMost, Better, Close, Precondition

# Multi-query associative recall in the layout of the block-track check: 16 pairs, every
# key queried once (queries=0), 64 tokens
MQAR16 = {"pairs": 16, "queries": 0}
ZOOLOGY = "Arora et al. 2023, Zoology (arXiv 2312.04927)"
HEDGEHOG = "Zhang et al. 2024, The Hedgehog & the Porcupine (arXiv 2402.04347)"
DELTANET = (
    "Yang et al. 2024, Parallelizing Linear Transformers with the Delta Rule (arXiv 2406.06484)"
)
GRAZZI = "Grazzi et al. 2024, Unlocking State-Tracking in Linear RNNs (arXiv 2411.12537)"


def fact(name: str, paper: str, **fields) -> None:
    FACTS.add(name, Fact(**fields), paper=paper)


fact(
    "zoology-attention-flat",
    ZOOLOGY,
    source=f"{ZOOLOGY}, Fig. 2 (MQAR)",
    claim="attention recalls as well at 32 key-value pairs as at 8",
    arms={
        "softmax@8": Arm("softmax", "kv_recall", task_params={"pairs": 8, "queries": 0}),
        "softmax@32": Arm("softmax", "kv_recall", task_params={"pairs": 32, "queries": 0}),
    },
    rule=Close("softmax@8", "softmax@32", 0.05),
    published={"softmax@8": "Fig. 2: near 1.0", "softmax@32": "Fig. 2: near 1.0"},
    notes="Zoology pairs every mixer with a short convolution; the core track has none.",
)
fact(
    "zoology-fixed-state-falls",
    ZOOLOGY,
    source=f"{ZOOLOGY}, Fig. 2 (MQAR)",
    claim="a fixed-state recurrence (linear attention) recalls less as the pairs grow",
    arms={
        "linear@8": Arm("linear", "kv_recall", task_params={"pairs": 8, "queries": 0}),
        "linear@32": Arm("linear", "kv_recall", task_params={"pairs": 32, "queries": 0}),
    },
    rule=Better("linear@8", "linear@32", 0.2),
    published={"linear@8": "Fig. 2: falls with pairs", "linear@32": "Fig. 2: falls with pairs"},
    sanity=True,  # 32 pairs in a 16 x 16 state: the fall follows from the state's size
)
fact(
    "zoology-state-frontier",
    ZOOLOGY,
    source=f"{ZOOLOGY}, Fig. 2 (MQAR, model dimension)",
    claim="a wider model (a larger recurrent state) recalls more pairs",
    arms={
        "linear d128": Arm(
            "linear",
            "kv_recall",
            task_params={"pairs": 32, "queries": 0},
            protocol_params={"d_model": 128},
        ),  # fmt: skip
        "linear d64": Arm("linear", "kv_recall", task_params={"pairs": 32, "queries": 0}),
    },
    rule=Better("linear d128", "linear d64", 0.1),
    published={"linear d128": "Fig. 2: rises with width", "linear d64": "Fig. 2"},
    notes="d_model 128 with 4 heads: head states of 32 x 32 against 16 x 16. Added after "
    "the first runs: the wider model recalls 32 pairs on one seed of three (0.99; 0.13 on "
    "the others): within quick's budget recall at 32 pairs is learned or not per seed, "
    "which the rule calls inconclusive.",
)
fact(
    "hedgehog-linear-maps-fail-recall",
    HEDGEHOG,
    source=f"{HEDGEHOG}, Table 2 (associative recall, trained from scratch)",
    claim="softmax solves associative recall; 1+ELU, Performer and cosFormer do not",
    arms={m: Arm(m, "kv_recall") for m in ("softmax", "linear", "performer", "cosformer")},
    rule=All(tuple(Better("softmax", m, 0.3) for m in ("linear", "performer", "cosformer"))),
    published={"softmax": "100", "linear": "17.0", "performer": "17.0", "cosformer": "17.0"},
    notes="kv_recall at its defaults (24 pairs, beyond a 16-dim head state).",
    sanity=True,  # 24 pairs beyond every feature map's state here, in softmax's reach
)
fact(
    "hedgehog-taylor-recalls",
    HEDGEHOG,
    source=f"{HEDGEHOG}, Table 2 (associative recall, trained from scratch)",
    claim="the Taylor feature map recalls where 1+ELU does not",
    arms={"based": Arm("based", "kv_recall"), "linear": Arm("linear", "kv_recall")},
    rule=Better("based", "linear", 0.3),
    published={"based": "100 (Taylor map)", "linear": "17.0"},
    notes="our based core is the Taylor map with Based's sliding-window heads beside it.",
)
fact(
    "deltanet-mqar-without-conv",
    DELTANET,
    source=f"{DELTANET}, Sec. 3 / Fig. 2 (MQAR)",
    claim="the delta rule solves MQAR even without a short convolution",
    arms={"deltanet": Arm("deltanet", "kv_recall", task_params=MQAR16)},
    rule=AtLeast("deltanet", 0.9),
    published={"deltanet": "MQAR solved without convolution"},
    notes="core track: the delta rule alone, no convolution, no MLP. Added after the runs: "
    "DeltaNet's published layer without its convolution, in the block track (the block's "
    "MLP and norms, twice the steps), scores 0.207 as well (0.205-0.208, fact "
    "deltanet-conv-helps-recall), and 0.995 with it; so the core's missing MLP and norms "
    "are not the cause. Whether far more training (Zoology's MQAR budget) would close the "
    "gap, the runs do not say. Where 0.207 comes from (added after the runs): every key is "
    "queried once and each answer enters the stream, so a model that knows which values the "
    "context holds and which it has already answered, but not which key each belongs to, "
    "scores H_16 / 16 = 0.211 by guessing among the values left (tests/test_facts.py "
    "measures it on the task's examples). Without the convolution deltanet sits at that "
    "level on every seed in both tracks: it learns the values and the exclusion, not the "
    "binding, which the convolution supplies by mixing each key's token into its value's "
    "position.",
)
fact(
    "deltanet-beats-linear-recall",
    DELTANET,
    source=f"{DELTANET}, Sec. 3 (MQAR) and Table 1 (recall tasks)",
    claim="the delta rule recalls better than linear attention at equal state",
    arms={
        "deltanet": Arm("deltanet", "kv_recall", task_params=MQAR16),
        "linear": Arm("linear", "kv_recall", task_params=MQAR16),
    },
    rule=Better("deltanet", "linear", 0.1),
    published={"deltanet": "above linear attention", "linear": "below"},
    notes="Added after the runs: deltanet's 0.205-0.210 is the level of guessing among the "
    "values not yet answered (0.211, see deltanet-mqar-without-conv); linear attention "
    "binds keys to values on one seed of three (0.983; 0.171 and 0.066 on the others).",
)
fact(
    "deltanet-conv-helps-recall",
    DELTANET,
    source=f"{DELTANET}, Table 1 (DeltaNet without short convolution, 340M)",
    claim="removing DeltaNet's short convolution costs recall",
    track="block",
    arms={
        "deltanet": Arm("deltanet", "kv_recall", "quick-block", task_params=MQAR16),
        "deltanet no conv": Arm(
            "deltanet",
            "kv_recall",
            "quick-block",
            task_params=MQAR16,
            mech_params={"use_short_conv": False},
        ),  # fmt: skip
    },
    rule=Better("deltanet", "deltanet no conv", 0.05),
    published={"deltanet": "recall avg about 4 points higher", "deltanet no conv": "lower"},
)
fact(
    "based-conv-helps-recall",
    "Arora et al. 2024, Based (arXiv 2402.18668)",
    source="Arora et al. 2024, Based (arXiv 2402.18668), Table 6 (ablations)",
    claim="removing Based's short convolutions costs recall far more than quality",
    track="block",
    arms={
        "based": Arm("based", "kv_recall", "quick-block", task_params=MQAR16),
        "based no conv": Arm(
            "based",
            "kv_recall",
            "quick-block",
            task_params=MQAR16,
            mech_params={"use_conv": False},
        ),  # fmt: skip
    },
    rule=Better("based", "based no conv", 0.05),
    published={"based": "FDA 11.7", "based no conv": "FDA 2.4"},
    notes="Added after the runs: these sequences are 64 tokens and Based's window heads see "
    "the last 64 positions, so without its convolutions the layer still holds exact softmax "
    "attention over the whole sequence. Seed 2 learned the recall without them (0.993); "
    "seeds 0 and 1 did not within the budget (0.213, 0.216, at 3 lrs each: the level of "
    "guessing among the values not yet answered, 0.211, see deltanet-mqar-without-conv). "
    "Here the convolutions make recall learnable reliably in quick's budget; the runs do "
    "not show them holding what the window cannot.",
)
fact(
    "mad-ordering",
    DELTANET,
    source=f"{DELTANET}, Fig. 3 (MAD benchmark averages)",
    claim="on MAD-style tasks: Transformer > DeltaNet > Mamba > GLA",
    track="block",
    arms={
        m: Arm(m, ("kv_recall", "selective_copy", "compression"), "quick-block")
        for m in ("softmax", "deltanet", "mamba2", "gla")
    },
    rule=All(
        (
            Better("softmax", "deltanet", 0.02),
            Better("deltanet", "mamba2", 0.02),
            Better("mamba2", "gla", 0.02),
        )
    ),
    published={"softmax": "74.5", "deltanet": "71.8", "mamba2": "69.3 (Mamba)", "gla": "60.0"},
    notes="our three MAD-like tasks (in-context recall, selective copying, compression), "
    "mean per seed; Mamba-2 stands for the paper's Mamba; GLA ran without convolution there "
    "and here. 36 runs: the most expensive fact. Added after the runs: the four come out in "
    "the published order, but softmax leads deltanet by 0.016, under the declared 0.02, "
    "with both near the ceiling of all three tasks in quick-block's budget; the rule stands.",
)
fact(
    "mamba2-state-size-recall",
    "Dao & Gu 2024, Mamba-2 (arXiv 2405.21060)",
    source="Dao & Gu 2024, Mamba-2 (arXiv 2405.21060), Fig. 8 (MQAR)",
    claim="a larger state size improves Mamba-2's recall",
    track="block",
    arms={
        f"mamba2 N={n}": Arm("mamba2", "kv_recall", "quick-block", mech_params={"d_state": n})
        for n in (64, 8)
    },
    rule=Better("mamba2 N=64", "mamba2 N=8", 0.1),
    published={"mamba2 N=64": "Fig. 8: higher", "mamba2 N=8": "Fig. 8: lower"},
)
fact(
    "mamba-selective-copy",
    "Gu & Dao 2023, Mamba (arXiv 2312.00752)",
    source="Gu & Dao 2023, Mamba (arXiv 2312.00752), Table 1 (selective copying)",
    claim="selective copying needs input-dependent gates, not a fixed (LTI) decay",
    arms={"mamba2": Arm("mamba2", "selective_copy"), "s4d": Arm("s4d", "selective_copy")},
    rule=Better("mamba2", "s4d", 0.2),
    published={"mamba2": "selective (S6): solved", "s4d": "LTI (S4): fails"},
    notes="S4D (mechanisms/s4d.py: A, B, C, Delta learned and independent of the input) "
    "stands for the source's LTI S4; Mamba-2's core for S6. Until issue 70 the LTI arm was "
    "RetNet, whose fixed decay is time-invariant but which reads its state with "
    "content-based q.k, so it can select by itself; S4D's readout is a fixed kernel.",
)
# induction trained at its default length (112 tokens), also tested at 4x (448): each arm's runs
# give both values (the target metric at the trained length, long_token_acc at 4x)
LONG = 4.0
MAMBA = "Gu & Dao 2023, Mamba (arXiv 2312.00752)"


def induction_arm(mech: str, pos: str, metric: str | None = None) -> Arm:
    return Arm(
        mech,
        "induction",
        "quick-block",
        pos=pos,
        eval_length_mult=LONG,
        metric=metric,
    )


fact(
    "mamba-induction-extrapolates",
    MAMBA,
    source=f"{MAMBA}, Table 2 (induction heads extrapolation)",
    claim="Mamba's induction heads hold at 4x the trained length; attention's (RoPE) do not",
    track="block",
    arms={
        "mamba2": induction_arm("mamba2", "none"),
        "softmax (RoPE)": induction_arm("softmax", "rope"),
        "mamba2 at 4x": induction_arm("mamba2", "none", "long_token_acc"),
        "softmax (RoPE) at 4x": induction_arm("softmax", "rope", "long_token_acc"),
    },
    precondition=Precondition(
        "both learned induction at the trained length",
        All((AtLeast("mamba2", 0.9), AtLeast("softmax (RoPE)", 0.9))),
    ),
    rule=Better("mamba2 at 4x", "softmax (RoPE) at 4x", 0.2),
    published={
        "mamba2 at 4x": "100% at every length to 2^20 (trained at 256)",
        "softmax (RoPE) at 4x": "falls off beyond the trained length",
    },
    notes="Mamba-2's layer, with no positional encoding (its convolution and recurrence give "
    "order), stands for Mamba; attention gets rotary positions, the variant that extrapolates "
    "best in the source. Both must first learn induction at the trained length (0.9), else "
    "the test at 4x says nothing about extrapolation. 6 runs, each also evaluated at 448 tokens.",
)
fact(
    "olsson-induction-needs-two-layers",
    "Olsson et al. 2022, In-context Learning and Induction Heads (arXiv 2209.11895)",
    source="Olsson et al. 2022, In-context Learning and Induction Heads (arXiv 2209.11895)",
    claim="a 2-layer attention-only model forms induction heads; a 1-layer one does not",
    arms={
        "softmax 2 layers": Arm("softmax", "induction"),
        "softmax 1 layer": Arm("softmax", "induction", protocol_params={"n_layers": 1}),
    },
    rule=Better("softmax 2 layers", "softmax 1 layer", 0.3),
    published={"softmax 2 layers": "induction heads form", "softmax 1 layer": "they do not"},
    sanity=True,  # one attention-only layer cannot compose a previous-token and a match head
)
fact(
    "grazzi-parity-negative-eigenvalues",
    GRAZZI,
    source=f"{GRAZZI}, Table 3 (parity)",
    claim="DeltaNet solves parity with eigenvalues in [-1, 1], not in [0, 1]; a Transformer "
    "does not",
    track="block",
    measure="score",
    arms={
        "deltanet [-1,1]": Arm(
            "deltanet",
            "mod_counting",
            "quick-block",
            task_params={"m": 2},
            mech_params={"allow_neg_eigval": True},
        ),  # fmt: skip
        "deltanet [0,1]": Arm("deltanet", "mod_counting", "quick-block", task_params={"m": 2}),
        "softmax": Arm("softmax", "mod_counting", "quick-block", task_params={"m": 2}),
    },
    rule=All((Better("deltanet [-1,1]", "deltanet [0,1]", 0.3), AtMost("softmax", 0.2))),
    published={"deltanet [-1,1]": "1.00", "deltanet [0,1]": "0.00-0.02", "softmax": "0.02"},
    notes="scaled accuracy at the trained length; Grazzi et al. score at longer test lengths. "
    "Added after the runs: at the trained length (32 tokens) deltanet with eigenvalues in "
    "[0, 1] learns parity too (0.983-0.991 on 3 seeds, against 0.990-0.999 in [-1, 1]), in "
    "the block with its convolution and MLP; the gap the paper reports lies in testing on "
    "sequences longer than those trained on, which this fact does not do.",
)
fact(
    "grazzi-modular-negative-eigenvalues",
    GRAZZI,
    source=f"{GRAZZI}, Table 3 (modular arithmetic without brackets)",
    claim="eigenvalues in [-1, 1] help DeltaNet with modular arithmetic",
    track="block",
    measure="score",
    arms={
        "deltanet [-1,1]": Arm(
            "deltanet",
            "mod_counting",
            "quick-block",
            task_params={"m": 5},
            mech_params={"allow_neg_eigval": True},
        ),  # fmt: skip
        "deltanet [0,1]": Arm("deltanet", "mod_counting", "quick-block", task_params={"m": 5}),
    },
    rule=Better("deltanet [-1,1]", "deltanet [0,1]", 0.2),
    published={"deltanet [-1,1]": "0.97", "deltanet [0,1]": "0.31"},
    notes="our stand-in is a running sum mod 5 (no operators, no brackets).",
)
# "S3 learned": attention's chance-normalised score on S3 at the trained length, the level
# mamba-induction-extrapolates asks of its arms before it reads their test beyond training
S3_LEARNED = 0.9
fact(
    "merrill-s5-harder-than-s3",
    "Merrill, Petty & Sabharwal 2024, The Illusion of State (arXiv 2404.08819)",
    source="Merrill, Petty & Sabharwal 2024, The Illusion of State (arXiv 2404.08819), Fig. 1",
    claim="attention and diagonal SSMs track S3 but not the non-solvable S5",
    measure="score",
    arms={
        f"{m} {g}": Arm(m, "permutation", task_params={"group": g})
        for m in ("softmax", "mamba2")
        for g in ("S3", "S5")
    },
    precondition=Precondition("S3 learned", AtLeast("softmax S3", S3_LEARNED)),
    rule=All((Better("softmax S3", "softmax S5", 0.2), Better("mamba2 S3", "mamba2 S5", 0.2))),
    published={"softmax S5": "fails as length grows", "mamba2 S5": "fails as length grows"},
    notes="chance-normalised token accuracy of the running product (1/6 and 1/120 chance). "
    "Added after the first runs: at quick's budget neither model tracks even S3 (softmax "
    "0.11 of the way from chance), so the gap the claim needs cannot show; the runs point "
    "to a budget too small for S3 here, not to S3 and S5 being equally hard. Hence the "
    "precondition (issue 70): attention must first learn S3 at the trained length "
    f"({S3_LEARNED:g} of the way from chance), else the fact is inconclusive.",
)
fact(
    "sliding-window-beyond-window",
    ZOOLOGY,
    source=f"{ZOOLOGY}, Sec. 3 (sliding-window attention and recall distance)",
    claim="sliding-window attention fails recall beyond its window",
    arms={
        "window 64": Arm("sliding-window", "kv_recall", task_params=MQAR16),
        "window 16": Arm(
            "sliding-window", "kv_recall", task_params=MQAR16, mech_params={"window": 16}
        ),
    },
    rule=Better("window 64", "window 16", 0.3),
    published={"window 64": "recalls within its window", "window 16": "fails beyond it"},
    notes="kv_recall with 16 pairs is 64 tokens: most queries lie more than 16 tokens after "
    "their key, all within 64.",
    sanity=True,  # a window of 16 cannot see a key 17 or more tokens back
)
