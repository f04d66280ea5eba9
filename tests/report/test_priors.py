"""The priors of decidability from stored runs (report.planning.priors): outliers, pairs, pooling and the fallbacks by
hand, then the real results database: the documented defaults are what it gives, and a plan's hypotheses
get the spread of similar configurations."""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, Decimal
from pathlib import Path

import pytest

from report.planning.block_planner import Spread
from report.planning.decidability import DEFAULT_SPREADS, DEFAULTS_UNTIL, default_prior
from report.planning.priors import (
    Blocks,
    Pooled,
    Stored,
    collect,
    defaults_table,
    kept,
    mode,
    outliers,
    pairs,
    pool_parts,
    read_priors,
    similar,
    similar_parts,
    to_prior,
)

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "results/h200"
needs_h200 = pytest.mark.skipif(not H200.exists(), reason="results/h200 is not here")


def test_outliers_by_tukeys_fences_on_the_log_scale() -> None:
    assert outliers([0.01, 0.02, 0.9]) == set()  # fewer than four: none
    assert outliers([0.01, 0.011, 0.012, 0.013, 0.5]) == {4}
    assert outliers([0.0001, 0.01, 0.011, 0.012, 0.013]) == {0}  # low ones too
    assert outliers([0.0, 0.01, 0.011, 0.012, 0.013]) == set()  # a floored 0 is kept
    assert outliers([0.01, 0.01, 0.01, 0.01, 0.02]) == {4}  # no spread among the rest: any other is out
    assert outliers([0.01, 0.012, 0.014, 0.016, 0.018]) == set()


def test_kept_drops_the_configuration_with_the_outlying_launch_spread() -> None:
    calm = [{"a": [0.0], "b": [0.01 * k]} for k in (1, 1.1, 1.2, 1.3)]
    wild = {"a": [0.0], "b": [1.0]}
    once = {"a": [0.0, 0.1]}  # one launch: no launch spread, never judged
    good, dropped = kept("m", [*calm, wild, once])
    assert dropped == 1 and wild not in good and once in good and len(good) == 5


def test_pairs_of_configurations_in_the_same_blocks() -> None:
    blocks: Blocks = {("m", "run", (1,)): {("x",): {1: [0.1], 2: [0.3], 3: [0.2, 0.4]},
                                   ("y",): {1: [0.0], 2: [0.1], 3: [0.0]},
                                   ("z",): {1: [0.0], 9: [0.0]}}}
    assert len(pairs(blocks)) == 1  # z shares one block with each: no pair
    (key, diffs), = pairs(blocks)
    assert key == ("m", "run", (1,), ("graphs",)) and diffs == pytest.approx([0.1, 0.2, 0.3])  # block 3: x's mean


GRAPHS, EAGER = ("h100", "0.26", ("--max-model-len", "4096")), ("h100", "0.26", ("--enforce-eager",))


def test_mode_reads_enforce_eager_in_the_argv() -> None:
    assert mode(GRAPHS) == "graphs" and mode(EAGER) == "eager"
    assert mode(("h100", "0.26", "--enforce-eager")) == "graphs"  # an argv is a tuple; a bare string is not one
    assert mode(()) == "graphs"
    blocks: Blocks = {("m", "run", (1,)): {GRAPHS: {1: [0.0], 2: [0.0]}, EAGER: {1: [0.5], 2: [0.9]}}}
    (key, _), = pairs(blocks)
    assert key[3] == ("eager", "graphs")


def test_an_eager_configurations_spread_does_not_reach_a_graphed_comparison() -> None:
    stored = Stored()
    shape = (128, 1024, 0, "reset", 1, None, "k")
    other = ("h100", "0.26", ("--max-model-len", "8192"))
    for launch, (g, o, e) in enumerate([(100.0, 200.0, 40.0), (100.2, 200.2, 60.0), (100.1, 200.3, 50.0)], 1):
        stored.add("output_throughput", GRAPHS, shape, "r", f"L{launch}", launch, g)
        stored.add("output_throughput", other, shape, "r", f"L{launch}", launch, o)
        stored.add("output_throughput", EAGER, shape, "r", f"L{launch}", launch, e)
    parts = similar_parts(stored)
    similar_shape = similar(shape)
    graphs = parts[("output_throughput", (("graphs",), *similar_shape))]
    assert len(graphs[1]) == 2 and len(graphs[2]) == 1  # two graphed configurations, their one pair
    mixed = parts[("output_throughput", (("eager", "graphs"), *similar_shape))]
    assert len(mixed[1]) == 3 and len(mixed[2]) == 2  # every configuration; the two eager-graphs pairs
    assert len(parts[("output_throughput", (("eager",), *similar_shape))][2]) == 0
    tight = to_prior("output_throughput", pool_parts("output_throughput", [graphs]), Path("x.duckdb"))
    wide = to_prior("output_throughput", pool_parts("output_throughput", [mixed]), Path("x.duckdb"))
    assert tight.pair_sd is not None and wide.pair_sd is not None and tight.pair_sd < 0.01 < wide.pair_sd
    assert tight.launch_sd is not None and wide.launch_sd is not None and tight.launch_sd < 0.01 < wide.launch_sd
    stored.add("kv_capacity_tokens", EAGER, (), "r", "s1", 1, 5.0)
    assert similar_parts(stored)[("kv_capacity_tokens", ())][1]  # a server metric: every configuration


def test_similar_keeps_lengths_and_load() -> None:
    assert similar((128, 256, 0, "reset", 8, None, "k")) == (128, 256, 0, 8, None)
    assert similar(()) == ()


def test_stored_add_keeps_positive_numbers_of_known_metrics() -> None:
    stored = Stored()
    stored.add("output_throughput", ("gpu",), (1,), "r", "L1", 1, 100.0)
    stored.add("output_throughput", ("gpu",), (1,), "r", "L1", None, 110.0)  # no block: launches only
    for bad in (0.0, -1.0, True, None, "x"):
        stored.add("output_throughput", ("gpu",), (1,), "r", "L2", 2, bad)
    stored.add("requests_ok", ("gpu",), (1,), "r", "L1", 1, 5)  # not a metric
    assert stored.launches == {("output_throughput", ("gpu", 1)): {"r|L1": [math.log(100.0), math.log(110.0)]}}
    assert stored.blocks == {("output_throughput", "r", (1,)): {("gpu",): {1: [math.log(100.0)]}}}


def test_a_prior_falls_back_part_by_part() -> None:
    db = Path("x.duckdb")
    bare = to_prior("output_throughput", Pooled(Spread("m", None, 0, 0.02, 3), 1, 0), db)
    fallback = default_prior("output_throughput")
    assert (bare.launch_sd, bare.within_sd, bare.df) == (fallback.launch_sd, 0.02, fallback.df)
    assert (bare.pair_sd, bare.pair_df) == (fallback.pair_sd, fallback.pair_df)
    assert bare.source == ("x.duckdb: 1 configuration(s) (0 dropped as outliers), 0 pair(s) (0 dropped); launch part "
                           "default for throughput metrics; paired part default for throughput metrics")
    full = to_prior("output_throughput", Pooled(Spread("m", 0.01, 4, None, 0), 3, 1, Spread("m", None, 0, 0.005, 9),
                                                2, 1), db, " (similar configurations)")
    assert (full.launch_sd, full.within_sd, full.df, full.pair_sd, full.pair_df) == (
        0.01, fallback.within_sd, 4.0, 0.005, 9.0)
    assert full.source == "x.duckdb (similar configurations): 3 configuration(s) (1 dropped as outliers), 2 pair(s) (1 dropped)"


def _up(x: float | None) -> float:
    """Rounded up to two significant digits, as the defaults are written."""
    if not x:
        return 0.0
    d = Decimal(repr(x))
    return float(d.quantize(Decimal(1).scaleb(d.adjusted() - 1), rounding=ROUND_CEILING))


@needs_h200
def test_the_defaults_are_what_the_results_database_gives() -> None:
    rows = {row[0]: row for row in defaults_table(H200, DEFAULTS_UNTIL)}
    assert set(rows) == set(DEFAULT_SPREADS) - {"capacity"}  # no search stores a point summary
    assert rows["share"][1] == 0.0  # prefix_hit_rate only, without spread: share borrows throughput's
    for fam, (_, launch, within, df, pair, pair_df, _, _) in rows.items():
        if fam == "share":
            continue
        assert DEFAULT_SPREADS[fam] == (_up(launch), _up(within), df, _up(pair), pair_df), fam


@needs_h200
def test_collect_until_leaves_out_later_runs() -> None:
    everything, early = collect(H200), collect(H200, DEFAULTS_UNTIL.replace(day=1))
    assert len(early.launches) < len(everything.launches)


@needs_h200
def test_priors_from_the_results_database() -> None:
    priors = read_priors(H200)
    assert priors.by_metric["output_throughput"].source.startswith("h200: ")
    c8 = priors.prior("output_throughput", (("graphs",), 128, 256, 0, 8, None))  # fp8-kv's decode shape at c8
    assert "similar configurations" in c8.source and c8.pair_sd is not None and c8.pair_sd < 0.02
    assert priors.prior("kv_capacity_tokens", ()).pair_sd is not None


@needs_h200
def test_graphed_batch_one_decode_is_not_judged_by_eagers_spread() -> None:
    """roofline-h100's eager arm against its graphs at 128 in / 1,024 out, batch 1: a pair whose block SD is
    about 15%, where every graphed pair's is under 1.2%: it once made the A/A design of roofline-h100-method
    look undecidable at three launches (a block SD of 6.4%), which then decided within 0.4%."""
    priors = read_priors(H200)
    graphs = priors.prior("output_throughput", (("graphs",), 128, 1024, 0, 1, None))
    mixed = priors.prior("output_throughput", (("eager", "graphs"), 128, 1024, 0, 1, None))
    assert graphs.pair_sd is not None and mixed.pair_sd is not None
    assert graphs.pair_sd < 0.01 < 0.1 < mixed.pair_sd
