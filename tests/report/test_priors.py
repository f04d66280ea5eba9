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
    outliers,
    pairs,
    read_priors,
    similar,
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
    assert key == ("m", "run", (1,)) and diffs == pytest.approx([0.1, 0.2, 0.3])  # block 3: mean of x's two


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
    c8 = priors.prior("output_throughput", (128, 256, 0, 8, None))  # fp8-kv's decode shape at c8
    assert "similar configurations" in c8.source and c8.pair_sd is not None and c8.pair_sd < 0.02
    assert priors.prior("kv_capacity_tokens", ()).pair_sd is not None
