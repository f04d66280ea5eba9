"""report.stats.intervals at its edges: Student's t against closed forms and a numerical integral, every field
of an Interval for each level (launches, repeats, one value, blocks, one shared launch, unpaired, linear),
zero denominators, Welch degrees of freedom, and the stored plan's layout (v1 and v2, budget, defaults)."""

from __future__ import annotations

import json
import math
from statistics import NormalDist
from typing import Any

import pytest

from compiler.plan import Plan
from report.stats.intervals import (
    SINGLE_LAUNCH,
    Interval,
    Layout,
    Obs,
    Place,
    _betainc,
    fixed_critical,
    layout,
    mean_interval,
    ratio_interval,
    split,
    t_cdf,
    t_quantile,
    welch_df,
)
from tests.report.helpers import plan_json

# ---- Student's t ----------------------------------------------------------------------------------------


def _cdf_closed(x: float, df: int) -> float:
    if df == 1:
        return 0.5 + math.atan(x) / math.pi
    if df == 2:
        return 0.5 + x / (2.0 * math.sqrt(2.0 + x * x))
    assert df == 3
    return 0.5 + (x / (math.sqrt(3.0) * (1.0 + x * x / 3.0)) + math.atan(x / math.sqrt(3.0))) / math.pi


def _cdf_integral(x: float, df: float, steps: int = 4000) -> float:
    """0.5 + the integral of the t density from 0 to x (Simpson)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def f(t: float) -> float:
        return c * (1 + t * t / df) ** (-(df + 1) / 2)

    h = x / steps
    s = f(0.0) + f(x) + sum((4 if k % 2 else 2) * f(k * h) for k in range(1, steps))
    return 0.5 + s * h / 3


@pytest.mark.parametrize("df", [1, 2, 3])
@pytest.mark.parametrize("x", [-40.0, -3.0, -1.0, -0.2, 0.0, 0.05, 0.7, 1.5, 2.5, 10.0, 300.0])
def test_t_cdf_matches_closed_forms(x: float, df: int) -> None:
    assert t_cdf(x, df) == pytest.approx(_cdf_closed(x, df), abs=1e-13)


@pytest.mark.parametrize(("x", "df"), [(0.3, 0.7), (1.2, 2.5), (2.0, 7.3), (0.8, 30.0), (3.0, 150.0), (4.0, 5.0)])
def test_t_cdf_matches_the_integral_of_the_density(x: float, df: float) -> None:
    assert t_cdf(x, df) == pytest.approx(_cdf_integral(x, df), abs=1e-10)
    assert t_cdf(-x, df) == pytest.approx(1 - _cdf_integral(x, df), abs=1e-10)


def test_t_cdf_infinite_df_is_the_normal() -> None:
    for x in (-2.0, 0.0, 1.0, 1.96):
        assert t_cdf(x, math.inf) == NormalDist().cdf(x)


def test_betainc_ends() -> None:
    assert _betainc(2.0, 0.5, 0.0) == 0.0
    assert _betainc(2.0, 0.5, -0.5) == 0.0
    assert _betainc(2.0, 0.5, 1.0) == 1.0
    assert _betainc(2.0, 0.5, 1.5) == 1.0
    # I_x(1, 1) = x; I_x(a, 1) = x^a; both sides of the continued fraction's switch point
    for x in (0.1, 0.5, 0.9):
        assert _betainc(1.0, 1.0, x) == pytest.approx(x, abs=1e-14)
        assert _betainc(3.0, 1.0, x) == pytest.approx(x**3, abs=1e-14)
        assert _betainc(1.0, 3.0, x) == pytest.approx(1 - (1 - x) ** 3, abs=1e-14)


@pytest.mark.parametrize(("p", "df", "want"), [
    (0.975, 1, 12.706204736174698), (0.975, 2, 4.302652729749464), (0.995, 4, 4.604094871349993),
    (0.9995, 1, 636.6192487687196), (0.6, 3, 0.2766706623986867), (0.5, 5, 0.0),
    (0.025, 5, -2.5705818356363146), (0.999999, 1, 318309.88618379),
])  # fmt: skip
def test_t_quantile_values(p: float, df: float, want: float) -> None:
    assert t_quantile(p, df) == pytest.approx(want, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize(("p", "df"), [(0.9, 1.0), (0.51, 3.0), (0.99, 9.5), (0.7, 0.5), (0.975, 1e6)])
def test_t_quantile_inverts_the_cdf(p: float, df: float) -> None:
    assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-11)


def test_t_quantile_bounds_and_the_normal_limit() -> None:
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=rf"^probability must be in \(0, 1\), got {bad}$"):
            t_quantile(bad, 3)
    for df in (0, -1.0):
        with pytest.raises(ValueError, match=rf"^degrees of freedom must be > 0, got {df}$"):
            t_quantile(0.9, df)
    z = NormalDist().inv_cdf(0.975)
    assert t_quantile(0.975, math.inf) == z
    assert t_quantile(0.975, 2e7) == z
    assert t_quantile(0.975, 1e7) != z and t_quantile(0.975, 1e7) == pytest.approx(z, rel=1e-6)
    assert fixed_critical(3) == t_quantile(0.975, 3)
    assert fixed_critical(7.5) == t_quantile(0.975, 7.5)


# ---- observations and intervals --------------------------------------------------------------------------


def test_obs_and_place_defaults() -> None:
    o = Obs("p", 1.0, "L", None)
    assert (o.repeat, o.exchangeable, o.why) == (1, True, "")
    p = Place("L", 2)
    assert (p.repeat, p.exchangeable, p.why) == (1, True, "")
    i = Interval(1, 1.0, 1.0, 1.0, 1.0, 1.0, (1.0,), "value", "one value")
    assert (i.df, i.single_launch, i.log_scale, i.excluded, i.unpaired, i.zero_denominator) == (
        None, False, False, (), 0, 0)
    assert i.notes == ()
    marked = Interval(1, 1.0, 1.0, 1.0, 1.0, 1.0, (1.0,), "repeats", "m", single_launch=True,
                      excluded=(("a", "cold"), ("b", "warm")))
    assert marked.notes == (SINGLE_LAUNCH, "a: left out, not exchangeable (cold)", "b: left out, not exchangeable (warm)")


def test_split_names_why_or_says_not_exchangeable() -> None:
    data = [Obs("a", 1.0, "L", 1), Obs("b", 2.0, "L", 1, 2, False, "cold"), Obs("c", 3.0, "L", 1, 3, False)]
    kept, out = split(data)
    assert kept == [data[0]]
    assert out == (("b", "cold"), ("c", "not exchangeable"))


def assert_interval(got: Interval, want: Interval) -> None:
    for name in Interval.__dataclass_fields__:
        g, w = getattr(got, name), getattr(want, name)
        if isinstance(w, float):
            assert g == pytest.approx(w, rel=1e-12, abs=1e-15), name
        elif isinstance(w, tuple) and w and all(isinstance(x, float) for x in w):
            assert g == pytest.approx(w, rel=1e-12), name
        else:
            assert g == w, name


def test_mean_of_launch_means_every_field() -> None:
    # launches out of order, blocks 2, 1, None (unknown block sorts first as 0), repeats out of order
    data = [Obs("x2", 12.0, "Lb", 2, 2), Obs("x1", 10.0, "Lb", 2, 1), Obs("y", 20.0, "La", 1),
            Obs("z", 30.0, "Lz", None), Obs("cold", 99.0, "La", 1, 2, False, "cold")]
    means = [30.0, 20.0, 11.0]
    m = sum(means) / 3
    sd = math.sqrt(sum((x - m) ** 2 for x in means) / 2)
    half = t_quantile(0.975, 2) * sd / math.sqrt(3)
    assert_interval(mean_interval(data), Interval(
        3, m, m - half, m + half, 11.0, 30.0, tuple(means), "launches", "t on 3 launch means, df 2", 2.0, False,
        False, (("cold", "cold"),), blocks=(1, 2)))  # the unknown block is no block


def test_mean_with_a_custom_critical_value() -> None:
    data = [Obs("a", 1.0, "L1", 1), Obs("b", 3.0, "L2", 2)]
    got = mean_interval(data, lambda df: 10.0 * df)
    assert (got.ci_low, got.ci_high) == pytest.approx((2.0 - 10.0, 2.0 + 10.0))


def test_mean_of_repeats_on_one_launch_every_field() -> None:
    data = [Obs(f"r{r}", v, "L", 1, r) for r, v in ((3, 6.0), (1, 2.0), (2, 4.0))]
    half = t_quantile(0.975, 2) * 2.0 / math.sqrt(3)
    assert_interval(mean_interval(data), Interval(
        3, 4.0, 4.0 - half, 4.0 + half, 2.0, 6.0, (6.0, 2.0, 4.0), "repeats", "t on 3 repeats of one launch, df 2",
        2.0, True, blocks=(1,)))


def test_one_value_every_field() -> None:
    data = [Obs("r1", 5.0, "L", 1), Obs("r2", 9.0, "L", 1, 2, False, "cold")]
    assert_interval(mean_interval(data), Interval(1, 5.0, 5.0, 5.0, 5.0, 5.0, (5.0,), "value", "one value", None, False,
                                                  False, (("r2", "cold"),), blocks=(1,)))
    assert mean_interval(data, lambda df: 1 / df).ci_high == 5.0  # no critical value is asked for df 0


def test_mean_without_exchangeable_observations() -> None:
    with pytest.raises(ValueError, match="^no exchangeable observations$"):
        mean_interval([Obs("r1", 5.0, "L", 1, 1, False)])
    with pytest.raises(ValueError, match="^no exchangeable observations on one side of the ratio$"):
        ratio_interval([Obs("t", 5.0, "L", 1)], [Obs("b", 5.0, "M", 1, 1, False)])
    with pytest.raises(ValueError, match="^no exchangeable observations on one side of the ratio$"):
        ratio_interval([Obs("t", 5.0, "L", 1, 1, False)], [Obs("b", 5.0, "M", 1)])


# ---- ratios -------------------------------------------------------------------------------------------


def test_paired_blocks_every_field() -> None:
    top = [Obs("t1a", 4.0, "T1", 1, 1), Obs("t1b", 6.0, "T1", 1, 2), Obs("t2", 9.0, "T2", 2), Obs("t5", 1.0, "T5", 5),
           Obs("tc", 50.0, "T1", 1, 3, False, "cold")]
    bottom = [Obs("b1", 2.0, "B1", 1), Obs("b2", 3.0, "B2", 2), Obs("b3", 3.0, "B3", 3)]
    d = [math.log(5.0 / 2.0), math.log(3.0)]
    m = sum(d) / 2
    half = t_quantile(0.975, 1) * abs(d[1] - d[0]) / 2
    assert_interval(ratio_interval(top, bottom), Interval(
        2, math.exp(m), math.exp(m - half), math.exp(m + half), 2.5, 3.0, (2.5, 3.0), "blocks",
        "paired: t on 2 block log-ratios, df 1", 1.0, False, True, (("tc", "cold"),), 2, 0, (1, 2)))  # paired only


def test_paired_blocks_with_a_zero_are_linear() -> None:
    top = [Obs(f"t{k}", v, f"T{k}", k) for k, v in ((1, 4.0), (2, 9.0), (3, 1.0), (4, 0.0))]
    bottom = [Obs(f"b{k}", v, f"B{k}", k) for k, v in ((1, 2.0), (2, 3.0), (3, 0.0), (4, 1.0))]
    d = [2.0, 3.0, 0.0]
    m = 5.0 / 3
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / 2)
    half = t_quantile(0.975, 2) * sd / math.sqrt(3)
    assert_interval(ratio_interval(top, bottom), Interval(
        3, m, m - half, m + half, 0.0, 3.0, (2.0, 3.0, 0.0), "blocks",
        "paired: t on 3 block ratios (linear: a value is not positive), df 2", 2.0, False, False, (), 0, 1, (1, 2, 4)))


def test_one_shared_launch_pairs_repeats_every_field() -> None:
    top = [Obs(f"t{r}", v, "L", 1, r) for r, v in ((1, 4.0), (2, 9.0), (3, 8.0), (5, 1.0))]
    bottom = [Obs(f"b{r}", v, "L", 1, r) for r, v in ((2, 3.0), (1, 2.0), (3, 2.0), (4, 7.0))]
    d = [math.log(2.0), math.log(3.0), math.log(4.0)]
    m = sum(d) / 3
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / 2)
    half = t_quantile(0.975, 2) * sd / math.sqrt(3)
    assert_interval(ratio_interval(top, bottom), Interval(
        3, math.exp(m), math.exp(m - half), math.exp(m + half), 2.0, 4.0, (2.0, 3.0, 4.0), "repeats",
        "paired on one launch: t on 3 repeat log-ratios, df 2", 2.0, True, True, (), 2, 0, (1,)))


def test_one_shared_launch_with_a_zero_repeat() -> None:
    top = [Obs(f"t{r}", v, "L", 1, r) for r, v in ((1, 4.0), (2, 9.0), (3, 8.0))]
    bottom = [Obs(f"b{r}", v, "L", 1, r) for r, v in ((1, 2.0), (2, 3.0), (3, 0.0))]
    got = ratio_interval(top, bottom)
    half = t_quantile(0.975, 1) * 0.5
    assert_interval(got, Interval(2, 2.5, 2.5 - half, 2.5 + half, 2.0, 3.0, (2.0, 3.0), "repeats",
                                  "paired on one launch: t on 2 repeat ratios (linear: a value is not positive), df 1",
                                  1.0, True, False, (), 0, 1, (1,)))


def test_one_pair_is_not_enough_and_falls_back_to_a_ratio_of_means() -> None:
    top = [Obs("t1", 4.0, "L", 1, 1), Obs("t2", 6.0, "M", 2, 1)]
    bottom = [Obs("b1", 2.0, "N", 1, 1), Obs("b3", 4.0, "O", 3, 1)]
    got = ratio_interval(top, bottom)
    assert got.method.startswith("unpaired ratio of means") and got.unpaired == 0 and got.level == "launches"


def test_blocks_holding_two_launches_of_a_side_are_not_paired() -> None:
    top = [Obs("t1", 4.0, "T1", 1), Obs("t2", 6.0, "T2", 1), Obs("t3", 5.0, "T3", 2)]
    bottom = [Obs("b1", 2.0, "B1", 1), Obs("b2", 3.0, "B2", 2)]
    assert ratio_interval(top, bottom).method.startswith("unpaired")
    assert ratio_interval(bottom, top).method.startswith("unpaired")


def test_unknown_blocks_are_not_paired() -> None:
    top = [Obs("t1", 4.0, "T1", None), Obs("t2", 6.0, "T2", None)]
    bottom = [Obs("b1", 2.0, "B1", None), Obs("b2", 3.0, "B2", None)]
    assert ratio_interval(top, bottom).method.startswith("unpaired")
    assert ratio_interval([Obs("t1", 4.0, "T1", 1), Obs("t2", 6.0, "T2", 2)], bottom).method.startswith("unpaired")


def test_unpaired_log_ratio_every_field() -> None:
    top = [Obs("t1", 10.0, "T1", 1), Obs("t2", 14.0, "T2", 3), Obs("t3", 12.0, "T3", 5)]
    bottom = [Obs("b1", 4.0, "B1", 2, 1), Obs("b2", 6.0, "B1", 2, 2), Obs("b3", 5.0, "B1", 2, 3)]
    va, vb = (4.0 / 3) / 144.0, (1.0 / 3) / 25.0
    df = (va + vb) ** 2 / (va * va / 2 + vb * vb / 2)
    half = t_quantile(0.975, df) * math.sqrt(va + vb)
    c = math.log(12.0 / 5.0)
    assert_interval(ratio_interval(top, bottom), Interval(
        3, 2.4, math.exp(c - half), math.exp(c + half), 10.0 / 6.0, 14.0 / 4.0, (), "repeats",
        f"unpaired ratio of means: delta method on the log scale, Welch df {df:.1f} (3 vs 3 repeats)", df, True, True,
        blocks=(1, 2, 3, 5)))


def test_unpaired_launches_on_both_sides() -> None:
    top = [Obs("t1", 10.0, "T1", 1), Obs("t2", 14.0, "T2", 3)]
    bottom = [Obs("b1", 4.0, "B1", 2), Obs("b2", 6.0, "B2", 4), Obs("b3", 5.0, "B3", 6)]
    got = ratio_interval(top, bottom)
    assert (got.level, got.n, got.single_launch) == ("launches", 2, False)
    assert got.method.endswith("(2 vs 3 launches)")


def test_unpaired_with_one_value_each_every_field() -> None:
    assert_interval(ratio_interval([Obs("t", 3.0, "T", 1)], [Obs("b", 2.0, "B", 2)]), Interval(
        1, 1.5, 1.5, 1.5, 1.5, 1.5, (1.5,), "value", "one value on each side: no interval", None, False, True,
        blocks=(1, 2)))


def test_unpaired_one_value_against_repeats_has_no_spread_on_one_side() -> None:
    top = [Obs("t", 6.0, "T", 1)]
    bottom = [Obs("b1", 2.0, "B", 2, 1), Obs("b2", 4.0, "B", 2, 2)]
    got = ratio_interval(top, bottom)
    vb = 1.0 / 9.0  # variance of the mean 1 over a mean of 3, squared
    half = t_quantile(0.975, 1.0) * math.sqrt(vb)
    assert got.df == pytest.approx(1.0) and got.level == "value" and got.n == 1
    assert (got.ci_low, got.ci_high) == pytest.approx((math.exp(math.log(2.0) - half), math.exp(math.log(2.0) + half)))
    assert got.method == "one value on each side: no interval" and got.units == pytest.approx((2.0,))
    assert got.single_launch


def test_unpaired_linear_every_field() -> None:
    top = [Obs("t1", -2.0, "T1", 1), Obs("t2", 4.0, "T2", 3)]
    bottom = [Obs("b1", 1.0, "B1", 2), Obs("b2", 3.0, "B2", 4)]
    r = 1.0 / 2.0
    va, vb = 9.0 / 4.0, r * r * 1.0 / 4.0
    df = (va + vb) ** 2 / (va * va + vb * vb)
    half = t_quantile(0.975, df) * math.sqrt(va + vb)
    assert_interval(ratio_interval(top, bottom), Interval(
        2, r, r - half, r + half, -2.0 / 3.0, 4.0, (), "launches",
        f"unpaired ratio of means: delta method, linear (a value is not positive), Welch df {df:.1f}", df, False,
        False, blocks=(1, 2, 3, 4)))


def test_unpaired_linear_one_value_each() -> None:
    got = ratio_interval([Obs("t", -3.0, "T", 1)], [Obs("b", 2.0, "B", 2)])
    assert_interval(got, Interval(1, -1.5, -1.5, -1.5, -1.5, -1.5, (-1.5,), "value",
                                  "unpaired ratio of means: delta method, linear (a value is not positive), Welch df 0.0",
                                  None, False, False, blocks=(1, 2)))


def test_unpaired_zero_denominators() -> None:
    with pytest.raises(ZeroDivisionError, match="^the denominator's mean is zero$"):
        ratio_interval([Obs("t", 3.0, "T", 1)], [Obs("b1", 0.0, "B", 2), Obs("b2", 0.0, "C", 4)])
    # a zero among the denominators (mean not zero): the spread's far end is infinite
    got = ratio_interval([Obs("t1", 3.0, "T", 1), Obs("t2", 5.0, "U", 3)], [Obs("b1", 0.0, "B", 2), Obs("b2", 2.0, "C", 4)])
    assert (got.spread_low, got.spread_high) == (1.5, math.inf) and got.mean == 4.0
    got = ratio_interval([Obs("t1", -3.0, "T", 1), Obs("t2", 5.0, "U", 3)],
                         [Obs("b1", -2.0, "B", 2), Obs("b2", 0.0, "C", 4)])
    assert (got.spread_low, got.spread_high) == (-2.5, math.inf) and got.mean == -1.0


@pytest.mark.parametrize(("parts", "want"), [
    ([], 0.0), ([(0.0, 3.0)], 0.0), ([(1.0, 0.0)], 0.0), ([(2.0, 4.0)], 4.0),
    ([(1.0, 2.0), (1.0, 2.0)], 4.0), ([(1.0, 2.0), (3.0, 5.0)], 16.0 / (1.0 / 2 + 9.0 / 5)),
    ([(1.0, 2.0), (0.0, 5.0), (3.0, 0.0)], 2.0), ([(-1.0, 3.0), (2.0, 3.0)], 3.0),
])  # fmt: skip
def test_welch_df(parts: list[tuple[float, float]], want: float) -> None:
    assert welch_df(parts) == pytest.approx(want)


# ---- the plan's layout ----------------------------------------------------------------------------------


def _layout(plan: dict[str, Any]) -> Layout:
    return layout(Plan.from_stored(plan_json(plan)))


def test_layout_of_a_v2_plan_every_field() -> None:
    plan: dict[str, Any] = {
        "launches": [
            {"id": "L1", "block": 2, "server_ids": ["s1", "s2"],
             "points": [{"id": "p1", "repeat": 2, "exchangeable": False, "not_exchangeable_because": "cold"},
                        {"id": "p2"}]},
            {"id": "L2", "points": [{"id": "p3", "repeat": 3}]},
            {"id": "L3", "block": 4},
        ],
        "design": {"launches": {"a": 2, "b": 3}, "budget": {"blocks": 6}},
    }
    got = _layout(plan)
    assert got == Layout(
        points={"p1": Place("L1", 2, 2, False, "cold"), "p2": Place("L1", 2, 1, True, ""), "p3": Place("L2", 1, 3)},
        servers={"s1": Place("L1", 2, 1), "s2": Place("L1", 2, 2), "L2": Place("L2", 1, 1), "L3": Place("L3", 4, 1)},
        budget_blocks=6, first_look=3)


@pytest.mark.parametrize(("design", "blocks", "first"), [
    ({}, None, 1), ({"budget": {"blocks": 5}, "launches": {"a": 1}}, 5, 1), ({"budget": None, "launches": {}}, None, 1),
    ({"launches": {"a": 2, "b": 3}}, None, 3),
])  # fmt: skip
def test_layout_design_budget_and_first_look(design: Any, blocks: int | None, first: int) -> None:
    got = _layout({"launches": [], "design": design})
    assert (got.budget_blocks, got.first_look) == (blocks, first)


@pytest.mark.parametrize("text", [None, "", "not json", "[1, 2]", "3", "null", "{}",
                                  plan_json({"design": {"budget": {"blocks": 0}}}),
                                  plan_json({"design": {"budget": "4"}})])
def test_layout_of_nothing_usable_is_empty(text: str | None) -> None:
    assert Plan.from_stored(text) is None
    assert layout(None) == Layout()
    assert Layout().budget_blocks is None and Layout().first_look == 1


def test_layout_places_fall_back_to_the_server() -> None:
    empty = Layout()
    assert empty.point("p", "srv", 3) == Place("srv", None, 3)
    assert empty.point("p", None, 2) == Place("p", None, 2)
    assert empty.server("s", 4) == Place("s", None, 4)
    known = Layout(points={"p": Place("L", 1, 2)}, servers={"s": Place("L", 1, 1)})
    assert known.point("p", "srv", 9) == Place("L", 1, 2)
    assert known.server("s", 7) == Place("L", 1, 1)


def _v1_point(pid: str, requests: int, cache: str = "keep", **kw: Any) -> dict[str, Any]:
    return {"id": pid, "cache": cache, "requests": requests, "input_len": 128, "prefix_len": 0, "prompt_seed": 0,
            "vocab_lo": 10, "vocab_hi": 100, **kw}


def test_layout_of_a_v1_plan_derives_cold_points() -> None:
    points = [_v1_point("a", 8), _v1_point("b", 8), _v1_point("c", 16, repeat=2), _v1_point("d", 8, prompt_seed=1),
              _v1_point("e", 8, cache="reset"), _v1_point("f", 16, repeat=3)]
    plan = {"schema_version": 1, "servers": [{"id": "S1", "points": points}, {"id": "S2"}]}
    got = _layout(plan)
    first = "cache = keep: the first point of this launch to send 8 of its 8 prompts, so it runs (partly) cold where " \
            "its other repeats run warm"
    more = "cache = keep: the first point of this launch to send 8 of its 16 prompts, so it runs (partly) cold where " \
           "its other repeats run warm"
    assert got.points == {
        "a": Place("S1", 1, 1, False, first), "b": Place("S1", 1, 1, True, ""), "c": Place("S1", 1, 2, False, more),
        "d": Place("S1", 1, 1, False, first), "e": Place("S1", 1, 1, True, ""), "f": Place("S1", 1, 3, True, ""),
    }
    assert got.servers == {"S1": Place("S1", 1, 1), "S2": Place("S2", 1, 1)}


def test_a_plan_neither_v1_nor_v2_does_not_read() -> None:
    """Only schema 1 upgrades `servers`; a later plan with them, or a v1 plan without them, is no plan."""
    assert Plan.from_stored(json.dumps({"schema_version": 2, "servers": [{"id": "S1", "points": []}]})) is None
    assert Plan.from_stored(json.dumps({"schema_version": 1, "launches": [{"id": "S1", "points": []}]})) is None


@pytest.mark.parametrize("key", ["input_len", "prefix_len", "prompt_seed", "vocab_lo", "vocab_hi"])
def test_v1_prompt_sets_differ_by_each_key(key: str) -> None:
    """A point whose prompts differ in any one key sends a new prompt set: it runs cold too."""
    other = _v1_point("b", 8)
    other[key] = 999
    plan = {"schema_version": 1, "servers": [{"id": "S1", "points": [_v1_point("a", 8), other, _v1_point("c", 8)]}]}
    got = _layout(plan).points
    assert [got[i].exchangeable for i in "abc"] == [False, False, True]


def test_v1_reset_points_do_not_stop_the_scan() -> None:
    points = [_v1_point("r", 8, cache="reset"), _v1_point("a", 8), _v1_point("d", 4, prompt_seed=7)]
    got = _layout({"schema_version": 1, "servers": [{"id": "S1", "points": points}]}).points
    assert [got[i].exchangeable for i in "rad"] == [True, False, False]
    assert got["d"].why.startswith("cache = keep: the first point of this launch to send 4 of its 4 prompts")


def test_a_v2_point_marked_not_exchangeable_without_a_reason() -> None:
    plan = {"launches": [{"id": "L", "points": [{"id": "p", "exchangeable": False}]}]}
    assert _layout(plan).points == {"p": Place("L", 1, 1, False, "")}


def test_unpaired_ratios_report_what_they_left_out() -> None:
    cold = Obs("tc", 1.0, "T", 1, 2, False, "cold")
    got = ratio_interval([Obs("t", 3.0, "T", 1), cold], [Obs("b", 2.0, "B", 2), Obs("bc", 1.0, "B", 2, 2, False)])
    assert got.log_scale and got.excluded == (("tc", "cold"), ("bc", "not exchangeable"))
    got = ratio_interval([Obs("t", -3.0, "T", 1), cold], [Obs("b", 2.0, "B", 2)])
    assert not got.log_scale and got.excluded == (("tc", "cold"),)


def test_unpaired_linear_with_one_degree_of_freedom() -> None:
    top = [Obs("t1", -1.0, "T", 1, 1), Obs("t2", 3.0, "T", 1, 2)]
    got = ratio_interval(top, [Obs("b", 2.0, "B", 2)])
    half = t_quantile(0.975, 1) * math.sqrt(4.0 / 4.0)  # var of the top mean 4, over 2^2
    assert got.df == pytest.approx(1.0)
    assert (got.ci_low, got.ci_high) == pytest.approx((0.5 - half, 0.5 + half))


def test_two_repeats_of_one_launch_are_repeats_not_a_value() -> None:
    got = mean_interval([Obs("r1", 1.0, "L", 1, 1), Obs("r2", 3.0, "L", 1, 2)])
    assert (got.level, got.method, got.single_launch, got.df) == ("repeats", "t on 2 repeats of one launch, df 1", True, 1.0)


# ---- launch variation and the blocks an interval uses ------------------------------------------------


def test_one_launch_is_one_launch_per_side_or_one_value_and_two_launches_are_not() -> None:
    """`one_launch`: no launch-to-launch variation in the interval. One launch per side (repeats), both sides
    on one shared launch, or a single value (n 1) are; two launches per side (n 2) are not."""
    one = mean_interval([Obs(f"r{r}", v, "L", 1, r) for r, v in ((1, 2.0), (2, 3.0))])
    two = mean_interval([Obs("a", 2.0, "L1", 1), Obs("b", 3.0, "L2", 2)])
    value = mean_interval([Obs("a", 2.0, "L1", 1)])
    assert (one.one_launch, two.one_launch, value.one_launch) == (True, False, True)
    assert (one.n, two.n, value.n) == (2, 2, 1)
    shared = ratio_interval([Obs(f"t{r}", 2.0 + r, "L", 1, r) for r in (1, 2)],
                            [Obs(f"b{r}", 1.0 + r, "L", 1, r) for r in (1, 2)])
    assert shared.level == "repeats" and shared.one_launch
    paired = ratio_interval([Obs(f"t{k}", 2.0 + k, f"T{k}", k) for k in (1, 2)],
                            [Obs(f"b{k}", 1.0 + k, f"B{k}", k) for k in (1, 2)])
    assert paired.level == "blocks" and not paired.one_launch
    one_side = ratio_interval([Obs(f"t{k}", 2.0 + k, f"T{k}", k) for k in (1, 2)],
                              [Obs(f"b{r}", 1.0 + r, "B", 3, r) for r in (1, 2)])
    assert one_side.single_launch and one_side.one_launch  # unpaired: one side on one launch


def test_a_paired_ratio_uses_only_its_paired_blocks() -> None:
    """One side in blocks 1-5, the other in 1, 2 and 4: the pairs use blocks 3 of 5, and `blocks` says which;
    a mean uses every block its values come from."""
    top = [Obs(f"t{k}", 2.0 + 0.1 * k, f"T{k}", k) for k in (1, 2, 3, 4, 5)]
    bottom = [Obs(f"b{k}", 1.0 + 0.01 * k, f"B{k}", k) for k in (1, 2, 4)]
    got = ratio_interval(top, bottom)
    assert got.level == "blocks" and got.blocks == (1, 2, 4) and got.n == 3 and got.unpaired == 2
    assert mean_interval(top).blocks == (1, 2, 3, 4, 5)
