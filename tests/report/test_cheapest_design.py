"""The GPU-time planner's optimiser (report.planning.cheapest_design): the cheapest launches x repeats that decide a
hypothesis, checked against a brute-force search and at its boundaries."""

from __future__ import annotations

import math

import pytest

from report.planning.cheapest_design import Components, Costs, Design, Goal, Limits, Proposal, cheapest, power
from report.stats.intervals import fixed_critical
from report.stats.power import power_to_clear, sd_upper

NOISY_REPEATS = Components(launch_var=0.01 ** 2, launch_df=10, repeat_var=0.05 ** 2, repeat_df=20)
GOAL = Goal(0.05)


def brute(items: list[tuple[Components, Goal]], costs: Costs, limits: Limits) -> Design | None:
    """Every design in the limits, the cheapest (then fewer launches, then fewer repeats) that decides all."""
    found = []
    for r in range(1, limits.repeats + 1):
        for n in range(2, limits.launches + 1):
            got = [power(c, g, n, r) for c, g in items]
            if all(p >= g.power for (p, _), (_, g) in zip(got, items, strict=True)):
                found.append((costs.gpu_s(n, r), n, r))
                break
    if not found:
        return None
    gpu, n, r = min(found)
    return Design(n, r, gpu, 0.0, 0.0)


def test_components_and_costs_arithmetic() -> None:
    c = Components(launch_var=0.04, launch_df=4, repeat_var=0.09, repeat_df=9)
    sd, df = c.block(3)
    assert sd == pytest.approx(math.sqrt(0.04 + 0.03))
    assert df == pytest.approx(0.07 ** 2 / (0.04 ** 2 / 4 + 0.03 ** 2 / 9))
    assert Costs(start_s=60.0, point_s=5.0).gpu_s(3, 2) == 3 * (60 + 2 * 5)


def test_power_uses_the_upper_bound_and_a_fixed_designs_t() -> None:
    p, sd = power(NOISY_REPEATS, GOAL, 4, 2)
    raw, df = NOISY_REPEATS.block(2)
    assert sd == pytest.approx(sd_upper(raw, df)) and sd > raw
    assert p == pytest.approx(power_to_clear(0.05, sd, 4, fixed_critical(3)))
    assert power(NOISY_REPEATS, GOAL, 1, 5) == (0.0, NOISY_REPEATS.block(5)[0])  # one launch: no interval
    inside, _ = power(NOISY_REPEATS, Goal(0.05, inside=True), 4, 2)
    assert 0.0 < inside < p  # both edges to clear: less power than one
    assert power(Components(0.0, 0, 0.0, 0), GOAL, 5, 1)[0] == 0.0  # nothing measured: no power


def test_launches_cheaper_than_repeats_buy_launches_and_repeats_cheaper_buy_repeats() -> None:
    cheap_starts = cheapest([(NOISY_REPEATS, GOAL)], Costs(start_s=1.0, point_s=100.0)).design
    dear_starts = cheapest([(NOISY_REPEATS, GOAL)], Costs(start_s=1000.0, point_s=1.0)).design
    assert cheap_starts is not None and dear_starts is not None
    assert cheap_starts.repeats == 1 and dear_starts.repeats > 1
    assert cheap_starts.launches > dear_starts.launches
    assert cheap_starts.gpu_s == Costs(1.0, 100.0).gpu_s(cheap_starts.launches, 1)


def test_no_repeat_spread_means_one_repeat_even_when_starts_are_dear() -> None:
    c = Components(launch_var=0.02 ** 2, launch_df=6, repeat_var=0.0, repeat_df=0)
    got = cheapest([(c, GOAL)], Costs(start_s=1000.0, point_s=1.0)).design
    assert got is not None and got.repeats == 1
    assert power(c, GOAL, got.launches - 1, 1)[0] < GOAL.power <= got.power  # the fewest launches that do


@pytest.mark.parametrize("costs", [Costs(1.0, 100.0), Costs(1000.0, 1.0), Costs(100.0, 10.0), Costs(50.0, 0.0)])
@pytest.mark.parametrize("goal", [Goal(0.05), Goal(0.03, inside=True), Goal(0.04, power=0.95)])
def test_the_cheapest_is_the_brute_force_cheapest(costs: Costs, goal: Goal) -> None:
    limits = Limits(launches=20, repeats=6)
    got = cheapest([(NOISY_REPEATS, goal)], costs, limits).design
    want = brute([(NOISY_REPEATS, goal)], costs, limits)
    assert got is not None and want is not None
    assert (got.launches, got.repeats, got.gpu_s) == (want.launches, want.repeats, want.gpu_s)
    assert got.power >= goal.power and got.power == power(NOISY_REPEATS, goal, got.launches, got.repeats)[0]


def test_free_repeats_tie_on_cost_and_take_the_fewest() -> None:
    """Repeats that cost nothing: designs of the same launches cost the same; the fewest repeats is kept."""
    got = cheapest([(NOISY_REPEATS, GOAL)], Costs(50.0, 0.0), Limits(launches=20, repeats=6)).design
    assert got is not None
    assert power(NOISY_REPEATS, GOAL, got.launches, got.repeats - 1)[0] < GOAL.power  # one fewer would not


def test_several_goals_are_decided_together() -> None:
    tight = (Components(0.015 ** 2, 8, 0.01 ** 2, 16), Goal(0.02))
    loose = (NOISY_REPEATS, GOAL)
    costs = Costs(100.0, 5.0)
    both = cheapest([tight, loose], costs).design
    alone = [cheapest([x], costs).design for x in (tight, loose)]
    assert both is not None and all(a is not None for a in alone)
    assert both.gpu_s >= max(a.gpu_s for a in alone if a is not None)
    assert all(power(c, g, both.launches, both.repeats)[0] >= g.power for c, g in (tight, loose))
    want = brute([tight, loose], costs, Limits())
    assert want is not None and (both.launches, both.repeats) == (want.launches, want.repeats)
    assert both.power == min(power(c, g, both.launches, both.repeats)[0] for c, g in (tight, loose))


def test_infeasible_under_a_cap_of_launches_or_of_gpu_time() -> None:
    wide = Components(0.05 ** 2, 4, 0.01 ** 2, 8)
    capped = cheapest([(wide, Goal(0.06))], Costs(100.0, 1.0), Limits(launches=3, repeats=10))
    assert capped == Proposal(None, "no design of up to 3 launches per arm and 10 repeats decides it with 80% "
                                    "power")
    free = cheapest([(wide, Goal(0.06))], Costs(100.0, 1.0)).design
    assert free is not None and free.launches > 3
    at_cap = cheapest([(wide, Goal(0.06))], Costs(100.0, 1.0), Limits(gpu_s=free.gpu_s))
    assert at_cap.design == free  # a design that costs the cap is within it
    over = cheapest([(wide, Goal(0.06))], Costs(100.0, 1.0), Limits(gpu_s=free.gpu_s - 0.5))
    assert over.design is None and over.why_not.startswith(
        f"the cheapest design ({free.launches} launches per arm x {free.repeats} repeats) costs ")
    assert "over the cap of" in over.why_not


def test_a_spread_between_launches_never_measured_is_not_guessed() -> None:
    one_launch = Components(0.0, 0, 0.01 ** 2, 12)
    got = cheapest([(one_launch, GOAL)], Costs(60.0, 5.0))
    assert got == Proposal(None, "the spread between launches was not measured: it needs an earlier run of at least "
                                 "2 launches per arm")
    assert cheapest([], Costs(60.0, 5.0)) == Proposal(None, "nothing to decide")
    # one measured launch df is enough
    assert cheapest([(Components(0.0, 1, 0.01 ** 2, 12), GOAL)], Costs(60.0, 5.0)).design is not None


def test_a_wider_goal_or_a_lower_power_needs_no_more_gpu_time() -> None:
    costs = Costs(100.0, 5.0)
    near, far = (cheapest([(NOISY_REPEATS, Goal(d))], costs).design for d in (0.03, 0.06))
    weak = cheapest([(NOISY_REPEATS, Goal(0.03, power=0.5))], costs).design
    assert near is not None and far is not None and weak is not None
    assert far.gpu_s < near.gpu_s and weak.gpu_s < near.gpu_s


def test_a_spread_measured_as_zero_decides_at_two_launches() -> None:
    exact = Components(0.0, 6, 0.0, 0)
    assert power(exact, GOAL, 2, 1) == (1.0, 0.0) and power(exact, GOAL, 1, 1) == (0.0, 0.0)
    got = cheapest([(exact, GOAL)], Costs(60.0, 5.0)).design
    assert got == Design(2, 1, 130.0, 1.0, 0.0)


def test_the_caps_are_inclusive() -> None:
    free = cheapest([(NOISY_REPEATS, GOAL)], Costs(1.0, 100.0)).design
    assert free is not None
    assert free.repeats == 1
    at = Limits(launches=free.launches, repeats=1)
    assert cheapest([(NOISY_REPEATS, GOAL)], Costs(1.0, 100.0), at).design == free
    below = Limits(launches=free.launches - 1, repeats=1)
    assert cheapest([(NOISY_REPEATS, GOAL)], Costs(1.0, 100.0), below).design is None
    dear = cheapest([(NOISY_REPEATS, GOAL)], Costs(1000.0, 1.0)).design
    assert dear is not None and dear.repeats > 3
    capped = cheapest([(NOISY_REPEATS, GOAL)], Costs(1000.0, 1.0), Limits(repeats=3)).design
    assert capped is not None and capped.repeats == 3  # as many repeats as allowed, not one more


def test_power_asked_exactly_is_enough_and_none_asked_still_needs_two_launches() -> None:
    exact = Components(0.0, 6, 0.0, 0)
    assert cheapest([(exact, Goal(0.05, power=1.0))], Costs(60.0, 5.0)).design == Design(2, 1, 130.0, 1.0, 0.0)
    got = cheapest([(NOISY_REPEATS, Goal(0.05, power=0.0))], Costs(60.0, 5.0)).design
    assert got is not None and got.launches == 2


def test_the_reported_power_is_the_goal_nearest_its_target() -> None:
    """Two goals: the design's power is the one with the least room over what it asks for (here the higher
    power: 96% against an asked 95%, beside 59% against an asked 50%)."""
    easy = (Components(0.03 ** 2, 10, 0.01 ** 2, 20), Goal(0.05, power=0.5))
    hard = (NOISY_REPEATS, Goal(0.08, power=0.95))
    got = cheapest([easy, hard], Costs(100.0, 5.0)).design
    assert got is not None
    (p_easy, _), (p_hard, sd_hard) = (power(c, g, got.launches, got.repeats) for c, g in (easy, hard))
    assert p_easy - 0.5 > p_hard - 0.95 and p_hard > p_easy
    assert (got.power, got.block_sd) == (p_hard, sd_hard)
    flipped = cheapest([hard, easy], Costs(100.0, 5.0)).design
    assert flipped is not None and flipped.power == p_hard
