"""Decidability before the run (report.planning.decidability): every branch of the pure logic, the distances checked
against report.stats.power's own arithmetic, and committed studies' plans judged at the default priors."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from compiler.load import load_study
from compiler.plan_compile import compile_study
from report.planning.decidability import (
    DEFAULT_SPREADS,
    NO,
    POWER,
    YES,
    Decidability,
    Prior,
    Priors,
    band_width,
    decide,
    default_prior,
    end_critical,
    family,
    inconclusive_reason,
    percent,
    plan_decidability,
    shape_of,
    smallest,
    step_modes,
)
from report.stats.intervals import fixed_critical
from report.stats.power import power_inside, power_to_clear, sd_upper
from report.stats.sequential import look_critical
from tests.variants import ONE_LAUNCH, study_variant

ROOT = Path(__file__).resolve().parents[2]
FLAT = Prior("output_throughput", 0.02, 0.01, None, "test")  # SD taken as known: sd_upper leaves it


@pytest.mark.parametrize(("metric", "expected"), [
    ("capacity", "capacity"), ("startup_s", "startup"), ("kv_capacity_tokens", "server"), ("ridge_point", "server"),
    ("ttft_p50_s", "first token"), ("ttft_p99_s", "first token"), ("itl_p95_s", "tail latency"),
    ("tpot_p90_s", "tail latency"), ("e2e_p99_s", "tail latency"), ("tpot_mean_s", "token latency"),
    ("itl_p50_s", "token latency"), ("littles_law_error", "error"), ("mean_in_flight", "load"),
    ("prefix_hit_rate", "share"), ("slo_attainment", "share"), ("power_mean_w", "machine"),
    ("energy_per_token_j", "machine"), ("sm_clock_mean_mhz", "machine"), ("output_throughput", "throughput"),
    ("goodput", "throughput"), ("chunk_throughput", "throughput"),
])
def test_every_metric_has_its_family(metric: str, expected: str) -> None:
    assert family(metric) == expected


def test_every_family_has_a_default_and_the_borrowed_ones_say_whose() -> None:
    assert set(DEFAULT_SPREADS) == {"throughput", "token latency", "first token", "tail latency", "share", "error",
                                    "load", "machine", "server", "startup", "capacity"}
    assert DEFAULT_SPREADS["share"] == DEFAULT_SPREADS["capacity"] == DEFAULT_SPREADS["throughput"]
    prior = default_prior("ttft_p50_s")
    assert (prior.launch_sd, prior.within_sd, prior.df, prior.pair_sd, prior.pair_df) == DEFAULT_SPREADS["first token"]
    assert prior.source == "default for first token metrics" and prior.metric == "ttft_p50_s"


def test_block_sd_of_a_side_a_ratio_and_a_paired_ratio() -> None:
    side = Prior("m", 0.03, 0.04, 7.0, "s")
    assert side.block_sd(4, False) == (pytest.approx(math.sqrt(0.03 ** 2 + 0.04 ** 2 / 4)), 7.0)
    assert side.block_sd(0, False)[0] == pytest.approx(0.05)  # no repeats counts as one
    assert side.block_sd(1, True)[0] == pytest.approx(0.05 * math.sqrt(2))
    paired = replace(side, pair_sd=0.011, pair_df=30.0)
    assert paired.block_sd(1, True) == (0.011, 30.0)
    assert paired.block_sd(1, False)[0] == pytest.approx(0.05)  # a side alone never reads the pair


def test_priors_take_similar_configurations_then_the_metric_then_the_default() -> None:
    shaped, wide = Prior("m", 0.1, 0, None, "shape"), Prior("m", 0.2, 0, None, "metric")
    priors = Priors({"output_throughput": wide}, {("output_throughput", (1, 2, 0, 8, None)): shaped})
    assert priors.prior("output_throughput", (1, 2, 0, 8, None)) is shaped
    assert priors.prior("output_throughput", (1, 2, 0, 16, None)) is wide
    assert priors.prior("output_throughput", None) is wide  # a capacity search has no shape
    assert priors.prior("ttft_p50_s", (1, 2, 0, 8, None)) == default_prior("ttft_p50_s")
    assert Priors().prior("output_throughput", ()) == default_prior("output_throughput")


def test_shape_of_a_point_and_a_server_metric() -> None:
    plan = compile_study(load_study(ROOT / "studies/fp8_kv.toml"))
    point = plan.launches[0].points[0]
    assert shape_of(point) == (point.input_len, point.output_len, point.prefix_len, point.concurrency,
                               point.rate_rps)
    assert shape_of(None) == ()


def test_the_critical_value_is_the_runs_last_look() -> None:
    assert end_critical(3, 3) == fixed_critical(2)
    assert end_critical(2, 5) == fixed_critical(1)
    assert end_critical(12, 3) == look_critical(12, 12, 3)(11)
    assert end_critical(12, 3) > fixed_critical(11)  # the last look spends 80% of the 5%


def test_smallest_finds_the_threshold_or_none() -> None:
    assert smallest(lambda x: 1.0 if x >= 0.37 else 0.0) == pytest.approx(0.37, rel=2e-4)
    assert smallest(lambda x: 1.0 if x >= 0.37 else 0.0) >= 0.37
    assert smallest(lambda x: x, target=0.5) == pytest.approx(0.5, rel=2e-4)


def test_smallest_ends_where_every_positive_distance_decides() -> None:
    # blocks without spread: power 1 for any x > 0 and 0 at 0 (the bisection used to halve forever)
    assert smallest(lambda x: 1.0 if x > 0 else 0.0) == 0.0
    assert smallest(lambda x: 1.0 if x > 1e-11 else 0.0) == pytest.approx(1e-11, rel=2e-4)
    assert smallest(lambda x: 1.0) == pytest.approx(0.0, abs=1e-3)  # already there at the first step
    assert smallest(lambda x: 1.0 if x >= 0.0004 else 0.0) == pytest.approx(0.0004, rel=2e-4)  # below the first
    assert smallest(lambda x: 0.8 if x >= 0.5 else 0.0) == pytest.approx(0.5, rel=2e-4)  # reaching it is enough
    assert smallest(lambda x: 0.0) == math.inf
    assert smallest(lambda x: 1.0 if x > 900 else 0.0) == pytest.approx(900, rel=2e-4)


def test_band_width_of_each_kind() -> None:
    assert band_width("value", 0.05, None, None) == pytest.approx(math.log1p(0.05))
    assert band_width("value", None, None, None) is None
    assert band_width("range", None, 1.04, 1.06) == pytest.approx(math.log(1.06 / 1.04) / 2)
    assert band_width("range", None, 0.5, 2.0) == pytest.approx(math.log(2.0))
    for low, high in ((0.0, 1.0), (-1.0, 1.0), (1.0, 1.0), (2.0, 1.0), (None, 1.0), (1.0, None)):
        assert band_width("range", None, low, high) is None
    assert band_width("relation", 0.05, 1.0, 2.0) is None


def test_decide_a_wide_band_a_narrow_one_and_a_relation() -> None:
    blocks, first = 12, 3
    sd = sd_upper(*FLAT.block_sd(1, True))
    c = end_critical(blocks, first)
    wide = decide("w", "value", 0.05, FLAT, blocks=blocks, first=first, repeats=1, ratio=True)
    assert wide.block_sd == pytest.approx(sd) and wide.blocks == 12 and wide.metric == "output_throughput"
    assert (wide.hypothesis, wide.kind, wide.band, wide.source, wide.one_launch) == ("w", "value", 0.05, "test", False)
    assert wide.detectable is not None and wide.narrowest is not None
    # the distances are report.stats.power's at 80%: just there, and not a little before
    assert power_to_clear(wide.detectable, sd, blocks, c) >= POWER > power_to_clear(wide.detectable * 0.99, sd, blocks, c)
    assert power_inside(wide.narrowest, sd, blocks, c) >= POWER > power_inside(wide.narrowest * 0.99, sd, blocks, c)
    assert wide.narrowest > wide.detectable  # two edges to clear, not one
    assert wide.best_power == pytest.approx(power_inside(0.05, sd, blocks, c))
    assert (wide.decidable, wide.refused) == (YES, False)
    narrow = decide("n", "range", 0.005, FLAT, blocks=blocks, first=first, repeats=1, ratio=True)
    assert narrow.decidable == f"only if the truth is at least {percent(narrow.detectable or 0)} from an edge"
    assert narrow.best_power < 0.5 and narrow.refused
    relation = decide("r", "relation", None, FLAT, blocks=blocks, first=first, repeats=1, ratio=False)
    assert relation.best_power == 1.0 and not relation.refused
    assert relation.decidable.startswith("only if the truth is at least ")


def test_one_launch_decides_nothing_and_is_not_refused() -> None:
    one = decide("o", "value", 0.5, FLAT, blocks=1, first=1, repeats=3, ratio=False)
    assert (one.detectable, one.narrowest, one.best_power, one.one_launch) == (None, None, 0.0, True)
    assert one.decidable == NO and not one.refused
    assert (one.hypothesis, one.kind, one.band, one.blocks, one.source) == ("o", "value", 0.5, 1, "test")
    assert one.block_sd == pytest.approx(math.sqrt(0.02 ** 2 + 0.01 ** 2 / 3))
    two = decide("t", "value", 0.5, FLAT, blocks=2, first=2, repeats=3, ratio=False)  # the fewest that decide
    assert two.detectable is not None and not two.one_launch and two.decidable == YES


def _row(**changes: object) -> Decidability:
    base = Decidability("h", "m", "value", 5, 0.01, 0.02, 0.015, 0.02, 0.8, "s")
    return replace(base, **changes)  # type: ignore[arg-type]


def test_decidable_and_refused_at_their_boundaries() -> None:
    assert _row().decidable == YES  # the band exactly the narrowest it confirms
    assert _row(narrowest=0.0201).decidable == "only if the truth is at least 1.5% from an edge"
    assert _row(band=None).decidable.startswith("only if")
    assert _row(narrowest=None).decidable.startswith("only if")
    assert _row(detectable=None).decidable == NO
    assert not _row(best_power=0.5).refused
    assert _row(best_power=0.4999).refused
    assert not _row(best_power=0.1, one_launch=True).refused
    assert _row().inconclusive_kind == "near an edge"
    assert _row(narrowest=0.0201).inconclusive_kind == "underpowered"
    assert _row(narrowest=None).inconclusive_kind == "underpowered"
    assert _row(band=None).inconclusive_kind == "near an edge"  # a relation
    assert _row(detectable=None).inconclusive_kind == "one launch"


def test_json_of_a_row() -> None:
    assert _row().to_json()["band"] == 0.02
    out = _row(block_sd=0.0123456, band=None, best_power=0.81234).to_json()
    assert out == {"hypothesis": "h", "metric": "m", "blocks": 5, "block_sd": 0.0123, "band": None,
                   "min_detectable_distance": 0.015, "narrowest_band": 0.02, "best_case_power": 0.812,
                   "decidable": "only if the truth is at least 1.5% from an edge",
                   "inconclusive_would_be": "near an edge", "refused_by_run": False,
                   "prior": "s"}


def test_percent() -> None:
    assert percent(0.0132) == "1.3%" and percent(0.5) == "50%" and percent(0.000456) == "0.046%"
    assert percent(0.999) == "100%" and percent(0.994) == "99%"
    assert percent(1.0) == "100%" and percent(1.134) == "113%" and percent(0.99) == "99%"


@pytest.mark.parametrize(("kind", "low", "high", "ci", "expected"), [
    ("relation", 1.0, None, (0.5, 5.0), "near an edge"),
    ("relation", 1.0, 1.01, (0.5, 5.0), "near an edge"),  # both edges known: still a threshold
    ("value", 0.0, 1.0, (0.5, 2.0), "underpowered"),  # an edge at 0: linear (1.5 > 1)
    ("value", -1.0, 1.0, (0.0, 2.0), "near an edge"),  # as wide as the band, linear
    ("value", None, 1.02, (0.9, 1.1), "near an edge"),
    ("value", 0.98, None, (0.9, 1.1), "near an edge"),
    ("value", 0.98, 1.02, (0.97, 1.03), "underpowered"),
    ("value", 0.98, 1.02, (1.01, 1.03), "near an edge"),
    ("range", 1.04, 1.06, (1.04, 1.06), "near an edge"),  # as wide as the band: could still fit
    ("range", 1.0, 2.0, (1.9, 3.9), "underpowered"),  # log ratio 2.05 over 2: linear would say 2.0 over 1.0 too
    ("range", 1.0, 2.0, (1.5, 2.95), "near an edge"),  # log: 1.97 < 2; linear would say wider (1.45 > 1.0)
    ("value", -1.0, 1.0, (-0.5, 2.5), "underpowered"),  # not positive: linear widths
    ("value", -1.0, 1.0, (0.5, 1.5), "near an edge"),
    ("value", 1.0, 2.0, (-0.1, 0.8), "near an edge"),  # an interval through 0: linear (0.9 < 1)
    ("value", 1.0, 2.0, (-0.1, 1.0), "underpowered"),  # linear 1.1 > 1
])
def test_inconclusive_reason(kind: str, low: float | None, high: float | None, ci: tuple[float, float],
                             expected: str) -> None:
    assert inconclusive_reason(kind, low, high, *ci) == expected


def test_fp8_kv_without_a_database() -> None:
    rows = {d.hypothesis: d for d in plan_decidability(compile_study(load_study(ROOT / "studies/fp8_kv.toml")),
                                                       Priors())}
    assert list(rows) == ["neutral-at-c1", "neutral-at-c8", "faster-at-c128-decode", "faster-at-c128-prefill",
                          "capacity-doubles"]
    assert all(d.blocks == 12 for d in rows.values())  # the budget's blocks
    decode = rows["faster-at-c128-decode"]
    assert decode.band == pytest.approx(math.log(1.06 / 1.04) / 2) and decode.refused and decode.kind == "range"
    throughput = default_prior("output_throughput")
    assert throughput.pair_sd is not None
    assert decode.block_sd == pytest.approx(sd_upper(throughput.pair_sd, throughput.pair_df))  # a paired ratio
    assert decode.source == "default for throughput metrics"
    capacity = rows["capacity-doubles"]
    assert capacity.source == "default for server metrics" and capacity.decidable == YES
    assert capacity.band == pytest.approx(math.log1p(0.03))


def test_a_similar_configuration_prior_reaches_its_hypothesis() -> None:
    plan = compile_study(load_study(ROOT / "studies/fp8_kv.toml"))
    c8 = next(p for launch in plan.launches for p in launch.points if p.concurrency == 8 and p.workload == "decode")
    tight = Prior("output_throughput", 0.001, 0.001, None, "stored", 0.004, None)
    shape = shape_of(c8)
    assert shape is not None
    rows = {d.hypothesis: d for d in plan_decidability(plan, Priors(by_shape={("output_throughput", shape): tight}))}
    assert rows["neutral-at-c8"].source == "default for throughput metrics"  # the shape alone: not its key
    keyed = {("output_throughput", (("graphs",), *shape)): tight}
    rows = {d.hypothesis: d for d in plan_decidability(plan, Priors(by_shape=keyed))}
    assert rows["neutral-at-c8"].source == "stored" and rows["neutral-at-c8"].decidable == YES
    assert rows["neutral-at-c1"].source == "default for throughput metrics"
    server = Prior("kv_capacity_tokens", 0.5, 0.0, None, "stored starts", 0.5, None)
    rows = {d.hypothesis: d for d in plan_decidability(plan, Priors(by_shape={("kv_capacity_tokens", ()): server}))}
    assert rows["capacity-doubles"].source == "stored starts"  # a server metric's shape: its start


def test_a_one_side_hypothesis_and_an_arm_of_its_own_launches(tmp_path: Path) -> None:
    text = (ROOT / "studies/quickstart.toml").read_text().replace('path = "../models/tiny-qwen3"',
                                                                   f'path = "{ROOT / "models/tiny-qwen3"}"')
    text = text.replace("launches = 3 ", "launches = 4 ").replace('cache = "keep"', 'cache = "keep"\nlaunches = 2')
    path = tmp_path / "arms.toml"
    path.write_text(text)
    rows = {d.hypothesis: d for d in plan_decidability(compile_study(load_study(path)), Priors())}
    assert rows["kept-cache-hits"].blocks == 2 and rows["batching-helps"].blocks == 4  # warm has two launches
    share = default_prior("prefix_hit_rate")
    side = math.sqrt(share.launch_sd ** 2 + share.within_sd ** 2 / 1)  # one side, one repeat, not a ratio
    assert rows["kept-cache-hits"].block_sd == pytest.approx(sd_upper(side, share.df))
    assert rows["kept-cache-hits"].decidable != NO


def test_quickstart_decides_on_three_launches_and_runs() -> None:
    rows = plan_decidability(compile_study(load_study(ROOT / "studies/quickstart.toml")), Priors())
    assert [d.decidable for d in rows] == [
        "only if the truth is at least 18% from an edge", "only if the truth is at least 14% from an edge", YES,
        "only if the truth is at least 82% from an edge"]
    assert all(d.blocks == 3 and not d.one_launch and not d.refused for d in rows)


def test_one_launch_decides_nothing_and_runs(tmp_path: Path) -> None:
    rows = plan_decidability(compile_study(load_study(study_variant(tmp_path, *ONE_LAUNCH))), Priors())
    assert [d.decidable for d in rows] == [NO] * 4 and not any(d.refused for d in rows)
    assert all(d.blocks == 1 and d.one_launch for d in rows)


def test_a_capacity_search_takes_its_familys_prior() -> None:
    rows = plan_decidability(compile_study(load_study(ROOT / "tests/runner/studies/capacity.toml")), Priors())
    assert [(d.metric, d.source) for d in rows] == [("capacity", "default for capacity metrics")]


def test_a_hypothesis_reads_the_prior_of_its_sides_step_modes() -> None:
    plan = compile_study(load_study(ROOT / "studies/roofline_h100_small_models.toml"))  # eager against graphs
    assert step_modes(plan, ["eager"]) == ("eager",) and step_modes(plan, ["graphs"]) == ("graphs",)
    assert step_modes(plan, ["graphs", "eager"]) == ("eager", "graphs") and step_modes(plan, []) == ()
    point = plan.launches[0].points[0]
    shape = shape_of(point)
    assert shape is not None
    mixed = Prior("output_throughput", 0.001, 0.001, None, "mixed", 0.004, None)
    graphs = Prior("output_throughput", 0.001, 0.001, None, "graphs only", 0.004, None)
    priors = Priors(by_shape={("output_throughput", (("eager", "graphs"), *shape)): mixed,
                              ("output_throughput", (("graphs",), *shape)): graphs})
    rows = {d.hypothesis: d for d in plan_decidability(plan, priors)}
    assert rows["small-suffers-more"].source == "mixed" and rows["fixed-overhead-ratio"].source == "mixed"
    method = compile_study(load_study(ROOT / "studies/roofline_h100_method.toml"))  # A/A: graphs on both sides
    assert shape_of(next(p for p in method.launches[0].points if p.concurrency == 1)) == shape
    assert {d.hypothesis: d for d in plan_decidability(method, priors)}["aa-within-1-2pct-c1"].source == "graphs only"
