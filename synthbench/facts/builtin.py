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
    "not show them holding what the window cannot. Suite v5 scales Based's window to 4 "
    "(its 64 of 2,048 at the suite's lengths), so the next runs test the convolutions where "
    "the window no longer covers the sequence; the figures above are of the 64-token window.",
)
# mad-ordering's level (issue 70): at the tasks' defaults softmax and deltanet both sit at the
# ceiling of selective copying and compression (0.99 each), so their 0.02 could not show.
# Declared before any run at it: each task's "hard" preset as it stood then, pinned here so
# that a later change of the presets does not move the fact: more pairs than one delta-rule
# head's 16 key dimensions hold apart; 16 tokens to copy from 256; 32 runs over 128 tokens.
MAD_LEVEL = {
    "kv_recall": {"pairs": 32, "queries": 16, "keys": 64, "values": 64, "distinct_values": True},
    "selective_copy": {"length": 256, "k": 16, "tail": 16, "vocab": 32},
    "compression": {"k": 32, "n": 128, "vocab": 64, "max_pad": 32},
}


def mad_arm(mech: str) -> Arm:
    """One mechanism on the three MAD-like tasks, each at its MAD_LEVEL, averaged per seed."""
    return Arm(mech, tuple(MAD_LEVEL), "quick-block", params_by_task=MAD_LEVEL)


fact(
    "mad-ordering",
    DELTANET,
    source=f"{DELTANET}, Fig. 3 (MAD benchmark averages)",
    claim="on MAD-style tasks: Transformer > DeltaNet > Mamba > GLA",
    track="block",
    arms={m: mad_arm(m) for m in ("softmax", "deltanet", "mamba2", "gla")},
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
    "and here. 36 runs: the most expensive fact, on sequences of 96, 272 and 160 tokens (72, 56 "
    "and 80 at the defaults: 2.5x the tokens). Issue 70 moved it to the tasks' "
    "hard presets (MAD_LEVEL): at the defaults the four came out in the published order, but "
    "softmax led deltanet by 0.016, under the declared 0.02, with both near the ceiling of "
    "all three tasks in quick-block's budget (softmax 0.991, 0.991, 0.994; deltanet 0.941, "
    "0.994, 0.992); the rule stands.",
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
# Grazzi et al. train on sequences of up to 40 tokens and test on 40 to 256 (Fig. 1, Table 3):
# the claim is about lengths beyond training. Here: trained at n 32 (every prefix an answer, so
# every length up to 32 is trained), tested at 8x, 256 tokens, the longest they test. Positions
# that extrapolate: none for DeltaNet (fla's layer takes no positional encoding: its recurrence
# and short convolution order the tokens), rotations for attention (relative, defined at any
# length); a learned table has no trained entry past 32.
GRAZZI_TRAINED = 32
GRAZZI_LONG = 8.0
GRAZZI_LEARNED = 0.9  # chance-normalised score at the trained length that counts as learned


def grazzi_arms(label: str, mech: str, m: int, pos: str, **mech_params) -> dict[str, Arm]:
    """Two arms that read the same runs: the score at the trained length (``label``) and at
    GRAZZI_LONG times it (``label at 256``)."""
    at = f"{label} at {round(GRAZZI_TRAINED * GRAZZI_LONG)}"
    return {
        name: Arm(
            mech,
            "mod_counting",
            "quick-block",
            task_params={"m": m, "n": GRAZZI_TRAINED},
            mech_params=mech_params,
            pos=pos,
            eval_length_mult=GRAZZI_LONG,
            metric=metric,
        )
        for name, metric in ((label, None), (at, "long_token_acc"))
    }


GRAZZI_NOTES = (
    f"trained at {GRAZZI_TRAINED} tokens, scored at 256 (8x), as Grazzi et al. test up to 256 "
    "after training up to 40; scaled accuracy at 256 normalised by the chance of the task at "
    "256. Positions: none for DeltaNet, rotary for attention (docs/FACTS.md, 'Facts in "
    "their own regime'). The trained-length arms are shown beside; the claim is read at 256 "
    "only, and only where DeltaNet [-1,1] learned the task at the trained length. Until issue "
    "70 this fact was scored at the trained length (learned positions), "
)
fact(
    "grazzi-parity-negative-eigenvalues",
    GRAZZI,
    source=f"{GRAZZI}, Table 3 (parity)",
    claim="beyond the trained length, DeltaNet keeps parity with eigenvalues in [-1, 1], not "
    "in [0, 1]; a Transformer does not",
    track="block",
    measure="score",
    arms={
        **grazzi_arms("deltanet [-1,1]", "deltanet", 2, "none", allow_neg_eigval=True),
        **grazzi_arms("deltanet [0,1]", "deltanet", 2, "none"),
        **grazzi_arms("softmax", "softmax", 2, "rope"),
    },
    precondition=Precondition(
        "DeltaNet [-1,1] learned parity at the trained length",
        AtLeast("deltanet [-1,1]", GRAZZI_LEARNED),
    ),
    rule=All(
        (
            Better("deltanet [-1,1] at 256", "deltanet [0,1] at 256", 0.3),
            AtMost("softmax at 256", 0.2),
        )
    ),
    published={
        "deltanet [-1,1] at 256": "1.00",
        "deltanet [0,1] at 256": "0.00-0.02",
        "softmax at 256": "0.02",
    },
    notes=GRAZZI_NOTES + "where DeltaNet with eigenvalues in [0, 1] learned parity too "
    "(0.983-0.991 on 3 seeds; 0.990-0.999 in [-1, 1]).",
)
fact(
    "grazzi-modular-negative-eigenvalues",
    GRAZZI,
    source=f"{GRAZZI}, Table 3 (modular arithmetic without brackets)",
    claim="beyond the trained length, eigenvalues in [-1, 1] help DeltaNet with modular arithmetic",
    track="block",
    measure="score",
    arms={
        **grazzi_arms("deltanet [-1,1]", "deltanet", 5, "none", allow_neg_eigval=True),
        **grazzi_arms("deltanet [0,1]", "deltanet", 5, "none"),
    },
    precondition=Precondition(
        "DeltaNet [-1,1] learned the sum mod 5 at the trained length",
        AtLeast("deltanet [-1,1]", GRAZZI_LEARNED),
    ),
    rule=Better("deltanet [-1,1] at 256", "deltanet [0,1] at 256", 0.2),
    published={"deltanet [-1,1] at 256": "0.97", "deltanet [0,1] at 256": "0.31"},
    notes="our stand-in is a running sum mod 5 (no operators, no brackets); "
    + GRAZZI_NOTES
    + "where the token accuracies were 0.983 in [-1, 1] and 0.746 in [0, 1] (3 seeds).",
)
# "S3 learned": attention's chance-normalised score on S3 at the trained length, the level
# mamba-induction-extrapolates asks of its arms before it reads their test beyond training
S3_LEARNED = 0.9
# The word length and model at which attention learns S3 under quick (issue 70's calibration,
# docs/FACTS.md "merrill-s5's calibration"; softmax on S3 only, never the S5 arms): with an MLP
# (arch=transformer, as Merrill et al.'s models have; an attention-only model has no solution,
# tasks/permutation.py) at n 4; at n 5 and beyond not within quick's budget.
MERRILL = {"n": 4}
MERRILL_MODEL = {"arch": "transformer"}
fact(
    "merrill-s5-harder-than-s3",
    "Merrill, Petty & Sabharwal 2024, The Illusion of State (arXiv 2404.08819)",
    source="Merrill, Petty & Sabharwal 2024, The Illusion of State (arXiv 2404.08819), Fig. 1",
    claim="attention and diagonal SSMs track S3 but not the non-solvable S5",
    measure="score",
    arms={
        f"{m} {g}": Arm(
            m, "permutation", task_params={"group": g, **MERRILL}, protocol_params=MERRILL_MODEL
        )
        for m in ("softmax", "mamba2")
        for g in ("S3", "S5")
    },
    precondition=Precondition("S3 learned", AtLeast("softmax S3", S3_LEARNED)),
    rule=All((Better("softmax S3", "softmax S5", 0.2), Better("mamba2 S3", "mamba2 S5", 0.2))),
    published={"softmax S5": "fails as length grows", "mamba2 S5": "fails as length grows"},
    notes="chance-normalised token accuracy of the running product (1/6 and 1/120 chance), "
    "2 layers with an MLP each (arch=transformer), words of 4 elements. Until issue 70: "
    "attention-only words of 32, where softmax tracked S3 only 0.11 of the way from chance, "
    "so the gap the claim needs could not show. Issue 70 calibrated the word length on "
    "softmax S3 alone (quick, with the MLP: 0.998 and 0.978 of the way from chance at 4 "
    "elements, seeds 0 and 1; seed 0: 0.83 at 5, 0.65 at 6, 0.53 at 8, 0.27 at 16, 0.11 at "
    "32); the precondition still asks it "
    f"of this fact's own runs ({S3_LEARNED:g} of the way from chance). Caveat: Merrill et "
    "al.'s separation grows with the length, and 4 elements is the shortest word with a "
    "product of more than two; at this length a gap between S3 and S5 may come from S5's "
    "larger table (120 elements against 6) as much as from its non-solvability.",
)
fact(
    "sliding-window-beyond-window",
    ZOOLOGY,
    source=f"{ZOOLOGY}, Sec. 3 (sliding-window attention and recall distance)",
    claim="sliding-window attention fails recall beyond its window",
    arms={
        # the window pinned: the mechanism's default is not this fact's to follow
        "window 64": Arm(
            "sliding-window", "kv_recall", task_params=MQAR16, mech_params={"window": 64}
        ),
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

# -- issue 70's new facts: each setting declared from the paper and the state sizes, before any
# of its runs (docs/FACTS.md, "Facts in their own regime") ---------------------------------

JELASSI = "Jelassi et al. 2024, Repeat After Me (arXiv 2402.01032)"
# copy's string: 16 tokens, as many as one core head's 16 x 16 state holds keys apart; 128,
# eight times that and twice what the layer's four heads hold (mamba2's core: B and C are the
# head's k and q, so its state k^T v is 16 x 16 a head)
COPY_WITHIN, COPY_PAST = 16, 128
fact(
    "jelassi-copy-past-the-state",
    JELASSI,
    source=f"{JELASSI}, string copying (the fixed-state bound and the copy experiments)",
    claim="a fixed-state model copies less than attention once the string outgrows its state",
    arms={
        f"{m} n={n}": Arm(m, "copy", task_params={"n": n, "vocab": 32})
        for m in ("softmax", "mamba2")
        for n in (COPY_WITHIN, COPY_PAST)
    },
    precondition=Precondition(
        "both copy a string their state holds",
        All((AtLeast(f"softmax n={COPY_WITHIN}", 0.9), AtLeast(f"mamba2 n={COPY_WITHIN}", 0.9))),
    ),
    rule=Better(f"softmax n={COPY_PAST}", f"mamba2 n={COPY_PAST}", 0.3),
    published={
        f"softmax n={COPY_PAST}": "copies long strings",
        f"mamba2 n={COPY_PAST}": "fails as the string outgrows its state (Mamba)",
    },
    notes="Mamba-2's core (the rule alone: a 16 x 16 state per head, 1,024 numbers a layer) "
    "stands for the paper's Mamba; attention keeps every token. Strings of 16 (within "
    "what one head holds apart) and 128 tokens (8x that) of 32 symbols, x SEP x, trained at "
    "each length; the source trains on shorter strings and tests longer ones too, this fact "
    "trains at the length it tests. A 1,024-number state could in principle encode 128 "
    "five-bit tokens, so the gap is a finding, not a consequence of the construction.",
)
BASED = "Arora et al. 2024, Based (arXiv 2402.18668)"
# Based's Taylor map of the first f coordinates of q and k has 1 + f + f^2 features; the state
# per head is features x (head_dim + 1). f 4: 21 features, fewer than kv_recall's 24 pairs;
# f 16: 273, ample. The window heads are off, so that the state is the Taylor map's alone.
BASED_RECALL = {"pairs": 24, "queries": 12, "keys": 64, "values": 64, "distinct_values": True}
fact(
    "based-recall-state-tradeoff",
    BASED,
    source=f"{BASED}, the recall-memory tradeoff (MQAR accuracy against recurrent state size)",
    claim="recall rises with the recurrent state: Based with a larger feature dimension "
    "recalls more",
    arms={
        f"based f={f}": Arm(
            "based",
            "kv_recall",
            task_params=BASED_RECALL,
            mech_params={"feature_dim": f, "window_heads": 0},
        )
        for f in (16, 4)
    },
    rule=Better("based f=16", "based f=4", 0.1),
    published={
        "based f=16": "more state, higher recall",
        "based f=4": "less state, lower recall",
    },
    notes="Based's linear (Taylor) attention alone on every head (window_heads 0), so that the "
    "state is what the feature dimension sets: 21 x 17 = 357 numbers a head at f 4, 273 x 17 "
    "= 4,641 at f 16. kv_recall at 24 pairs and 12 queries (72 tokens): more pairs than f 4's "
    "21 features, far fewer than f 16's 273. The paper also moves the window size along the "
    "frontier; here the window is off.",
)
# H3 as Zoology's MQAR runs build it (Fig. 2 configs: head_dim 2, d_state = the sequence
# length), against attention, both in the core track (Zoology's models there have no MLP).
MQAR16_TOKENS = 64  # kv_recall with 16 pairs, every key queried once
fact(
    "zoology-gated-conv-fails-mqar",
    ZOOLOGY,
    source=f"{ZOOLOGY}, Fig. 2 (MQAR, gated convolutions against attention)",
    claim="a time-invariant gated convolution (H3) fails multi-query recall where attention "
    "does not",
    arms={
        "softmax": Arm("softmax", "kv_recall", task_params=MQAR16),
        "h3": Arm(
            "h3",
            "kv_recall",
            task_params=MQAR16,
            mech_params={"group_size": 2, "d_state": MQAR16_TOKENS},
        ),
    },
    precondition=Precondition("attention recalls", AtLeast("softmax", 0.9)),
    rule=Better("softmax", "h3", 0.3),
    published={
        "softmax": "Fig. 2: solves MQAR at every width",
        "h3": "Fig. 2: below attention at small widths, more so on longer sequences",
    },
    notes="mechanisms/h3.py: q times an S4D convolution of (an N-tap filter of k) times v, per "
    "group of 2 channels; no filter depends on the input. 16 pairs, Zoology's count at its "
    "longest sequences (256 tokens, 16 pairs), at d_model 64, the narrowest width of its Fig. "
    "2; our sequence is 64 tokens. Zoology's analysis: a gated convolution needs a width that "
    "grows with the sequence to recall, attention does not. Not a consequence of the "
    "construction: two layers of H3 could in principle bind keys to values.",
)
