"""The capacity search's choice of the next probe and what it found, pure: bracket, bisection, probe count,
the attainment boundary, and the replay the report makes from stored probes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from compiler.capacity import Probe, found, holds, next_level, probe_of, probe_point, replay
from compiler.load import load_study
from compiler.plan import SearchStep
from compiler.plan_compile import compile_study
from tests.compiler.test_slo import CAPACITY
from tests.variants import study_variant


def search(lo: float, hi: float, probes: int, integer: bool, capacity: float) -> list[float]:
    """The levels a search probes when every level up to `capacity` holds and every one above fails."""
    done: list[Probe] = []
    while (level := next_level(lo, hi, probes, integer, done)) is not None:
        done.append(Probe(level, level <= capacity))
    return [p.level for p in done]


def test_hi_first_then_lo_then_bisection() -> None:
    assert search(1, 16, 10, True, 5) == [16, 1, 8, 4, 6, 5]
    r = found(1, 16, 10, True, [Probe(x, x <= 5) for x in (16, 1, 8, 4, 6, 5)])
    assert (r.status, r.capacity, r.held, r.failed, r.probes) == ("resolved", 5, 5, 6, 6)
    assert r.detail == "holds at 5, fails at 6"


def test_hi_holds_is_above_the_range_after_one_probe() -> None:
    assert search(1, 16, 10, True, 16) == [16]
    r = found(1, 16, 10, True, [Probe(16, True)])
    assert (r.status, r.capacity, r.held) == ("above", None, 16) and "raise hi" in r.detail


def test_lo_fails_is_below_the_range_after_two_probes() -> None:
    assert search(2, 16, 10, True, 1) == [16, 2]
    r = found(2, 16, 10, True, [Probe(16, False), Probe(2, False)])
    assert (r.status, r.capacity, r.failed) == ("below", None, 2) and "lower lo" in r.detail


def test_lo_holding_exactly_brackets() -> None:
    assert search(2, 3, 10, True, 2) == [3, 2]
    assert found(2, 3, 10, True, [Probe(3, False), Probe(2, True)]).capacity == 2


def test_integer_bisection_stops_one_apart() -> None:
    # 4 and 5: one apart, nothing between them to probe
    levels = search(1, 8, 12, True, 4)
    assert levels == [8, 1, 4, 6, 5] and found(1, 8, 12, True, [Probe(x, x <= 4) for x in levels]).capacity == 4
    # two apart: the middle one is probed
    assert next_level(1, 8, 12, True, [Probe(8, False), Probe(1, True), Probe(4, True), Probe(6, False)]) == 5
    assert next_level(1, 8, 12, True, [Probe(8, False), Probe(1, True), Probe(4, True), Probe(5, False)]) is None


@pytest.mark.parametrize("capacity", range(1, 16))
def test_integer_search_finds_every_capacity_exactly(capacity: int) -> None:
    levels = search(1, 16, 12, True, capacity)
    r = found(1, 16, 12, True, [Probe(x, x <= capacity) for x in levels])
    assert (r.status, r.capacity, r.failed) == ("resolved", capacity, capacity + 1)
    assert len(levels) == len(set(levels)) <= 2 + 4  # hi, lo, then log2(15) rounded up


def test_the_probe_budget_is_the_most_probes() -> None:
    assert search(1, 100, 4, True, 37) == [100, 1, 50, 25]
    r = found(1, 100, 4, True, [Probe(x, x <= 37) for x in (100, 1, 50, 25)])
    assert (r.status, r.capacity, r.failed, r.probes) == ("resolved", 25, 50, 4)
    assert search(1, 100, 3, True, 37) == [100, 1, 50]
    assert search(1, 100, 2, True, 37) == [100, 1]
    assert found(1, 100, 2, True, [Probe(100, False), Probe(1, True)]).capacity == 1


def test_rate_bisects_halves_until_the_probes_are_spent() -> None:
    assert search(1.0, 9.0, 5, False, 4.2) == [9.0, 1.0, 5.0, 3.0, 4.0]
    assert found(1.0, 9.0, 5, False, [Probe(x, x <= 4.2) for x in (9.0, 1.0, 5.0, 3.0, 4.0)]).capacity == 4.0
    assert next_level(1.0, 9.0, 5, False, [Probe(9.0, False), Probe(1.0, True), Probe(5.0, True), Probe(7.0, False)]) \
        == 6.0


def test_an_invalid_probe_stops_the_search_unresolved() -> None:
    done = [Probe(16, False), Probe(1, True), Probe(8, None)]
    assert next_level(1, 16, 10, True, done) is None
    r = found(1, 16, 10, True, done)
    assert (r.status, r.capacity) == ("unresolved", None) and r.detail == "stopped by an invalid probe"
    assert found(1, 16, 10, True, [Probe(16, None)]).status == "unresolved"


def test_running_until_two_probes() -> None:
    assert found(1, 16, 10, True, []).status == "running" and next_level(1, 16, 10, True, []) == 16
    assert found(1, 16, 10, True, [Probe(16, False)]).status == "running"
    assert next_level(1, 16, 10, True, [Probe(16, False)]) == 1


def test_attainment_holds_at_the_target_itself() -> None:
    assert holds(0.95, 0.95) is True
    assert holds(0.9499, 0.95) is False
    assert holds(1.0, 1.0) is True
    assert holds(None, 0.95) is None


@pytest.fixture(scope="module")
def steps() -> list[SearchStep]:
    plan = compile_study(load_study(CAPACITY))
    return [q for launch in plan.launches for q in launch.searches]


def test_probe_points_carry_their_level_id_and_own_fingerprint(steps: list[SearchStep]) -> None:
    q = steps[0]
    a, b = probe_point(q, 4.0), probe_point(q, 5.0)
    assert (a.id, a.concurrency, a.rate_rps, a.requests) == (f"{q.id}/c4/r1", 4, None, 16)
    assert a.fingerprint != b.fingerprint != q.template.fingerprint and probe_point(q, 4.0) == a
    rate = q.model_copy(update={"over": "rate"})
    r = probe_point(rate, 2.5)
    assert (r.id, r.concurrency, r.rate_rps) == (f"{q.id}/rate2.5/r1", None, 2.5)


@pytest.mark.parametrize(("turns", "per_conversation"), [("", 1), ("turns = 4\n", 4)])
def test_waves_size_each_probe_by_its_own_level(tmp_path: Path, turns: str, per_conversation: int) -> None:
    path = study_variant(tmp_path, ("probes = 4 }\nrequests = 16", "probes = 4, waves = 3 }"),
                         ("output_len = 16\n", f"output_len = 16\n{turns}"), source=CAPACITY)
    q = compile_study(load_study(path)).launches[0].searches[0]
    hi, lo, mid = probe_point(q, 8.0), probe_point(q, 1.0), probe_point(q, 5.0)
    assert (hi.requests, lo.requests, mid.requests) == tuple(3 * c * per_conversation for c in (8, 1, 5))
    assert hi.requests == q.template.requests and lo.concurrency == 1
    assert lo.fingerprint != hi.fingerprint != mid.fingerprint


def test_without_waves_every_probe_sends_the_templates_requests(steps: list[SearchStep]) -> None:
    q = steps[0]
    assert q.waves is None and {probe_point(q, x).requests for x in (1.0, 5.0, 8.0)} == {16}


class Row:
    def __init__(self, point_id: str, concurrency: int | None, rate_rps: float | None = None) -> None:
        self.point_id, self.concurrency, self.rate_rps = point_id, concurrency, rate_rps


def test_a_stored_probe_maps_back_to_its_step(steps: list[SearchStep]) -> None:
    q = steps[0]
    assert probe_of(steps, Row(f"{q.id}/c3/r1", 3)) == probe_point(q, 3.0)
    assert probe_of(steps, Row("capacity/other/w/c3/r1", 3)) is None
    assert probe_of(steps, Row(f"{q.id}/c3/r1", None)) is None


def test_replay_follows_the_stored_probes(steps: list[SearchStep]) -> None:
    q = steps[0]  # concurrency 1..8, 4 probes
    held: Callable[[float], bool] = lambda x: x <= 3  # noqa: E731
    stored = {x: held(x) for x in (8.0, 1.0, 4.0, 2.0)}
    done, r = replay(q, stored)
    assert [p.level for p in done] == [8.0, 1.0, 4.0, 2.0] and (r.status, r.capacity) == ("resolved", 2.0)
    done, r = replay(q, {8.0: False, 1.0: True})  # cut short before its third probe
    assert r.status == "running" and len(done) == 2 and r.detail == "still searching"
    _, r = replay(q, {8.0: False, 1.0: True, 4.0: None})
    assert r.status == "unresolved"


def test_estimate_adds_think_time_between_turns() -> None:
    """Multi-turn conversations think between turns: (turns - 1) x think_s per wave of conversations, on the
    measured requests only (warmup requests are single); a single-turn point is unchanged."""
    from types import SimpleNamespace

    from compiler.plan_estimate import estimate_point_s

    hw = SimpleNamespace(name="h200", bandwidth_Bps=4.8e12)
    params = {"output_len": 10, "input_len": 10, "warmup": 8, "requests": 80, "concurrency": 10, "rate_rps": None}
    base = estimate_point_s(params, None, hw, "auto")
    assert base == round(1 * 10 * 0.002 + 8 * 10 * 0.002 + 1.0, 1)
    assert estimate_point_s(params, None, hw, "auto", turns=4, think_s=0.0) == base
    # 80 requests = 20 four-turn conversations, 10 at once: 2 waves x 3 pauses x 1.5 s = 9 s more
    assert estimate_point_s(params, None, hw, "auto", turns=4, think_s=1.5) == round(base + 9.0, 1)
    odd = {**params, "requests": 84}  # 21 conversations: 3 waves
    assert estimate_point_s(odd, None, hw, "auto", turns=4, think_s=1.0) == round(
        estimate_point_s(odd, None, hw, "auto") + 3 * 3 * 1.0, 1)
    same = {**params, "warmup": 80}  # as many warmup requests as measured: the pause still counted once
    assert estimate_point_s(same, None, hw, "auto", turns=4, think_s=1.5) == round(
        estimate_point_s(same, None, hw, "auto") + 9.0, 1)


def test_estimate_prefills_every_prompt_at_half_the_spec_sheet() -> None:
    """Each request's prompt (warmup and measured) costs 2 x active params FLOPs a token at half the spec-sheet
    bf16 rate: on the H200 about 33 us a token for the 8B shape, so 336 prompts of 1,280 tokens add ~14 s."""
    from compiler.hardware import get_hardware
    from compiler.modelconfig import load_model
    from compiler.plan_estimate import PREFILL_EFFICIENCY, estimate_point_s, prefill_s_per_token

    shape = load_model(Path(__file__).resolve().parents[2] / "models/qwen3-8b")
    hw = get_hardware("h200")
    per_token = prefill_s_per_token(shape, hw)
    assert PREFILL_EFFICIENCY == 0.5
    assert per_token == pytest.approx(2 * shape.active_params / (hw.flops_bf16 * 0.5))
    assert 30e-6 < per_token < 36e-6
    params = {"output_len": 64, "input_len": 1280, "warmup": 16, "requests": 320, "concurrency": 32,
              "rate_rps": None}
    no_prefill = hw.calibrated(flops_bf16=1e30)  # the same bandwidth, prefill free
    added = estimate_point_s(params, shape, hw, "auto") - estimate_point_s(params, shape, no_prefill, "auto")
    assert added == pytest.approx((16 + 320) * 1280 * per_token, abs=0.11)
    rate = {**params, "concurrency": None, "rate_rps": 10.0, "warmup": 0}  # open loop: the same prompts' cost
    assert estimate_point_s(rate, shape, hw, "auto") - estimate_point_s(rate, shape, no_prefill, "auto") == \
        pytest.approx(320 * 1280 * per_token, abs=0.11)


def test_estimate_decode_steps_at_their_roofline_pace() -> None:
    """Closed loop: waves x output_len decode steps, each the roofline step at the mean context (prompt + half
    the output) over 0.75, never under the per-step floor (2 ms, 3.5 ms on the CPU); fp8 KV reads half the KV
    bytes; open loop: the arrivals' span plus one request's decode at batch 1; nothing for zero warmup; think
    time only for conversations of more than one turn."""
    from types import SimpleNamespace

    from compiler.hardware import get_hardware
    from compiler.modelconfig import load_model
    from compiler.plan_estimate import estimate_point_s

    shape = load_model(Path(__file__).resolve().parents[2] / "models/qwen3-8b")
    hw = get_hardware("h200").calibrated(flops_bf16=1e30)  # prefill free: the decode alone

    def step(batch: int, kv: str = "auto") -> float:
        return max(shape.decode_step_s(batch, 1000 + 200 // 2, hw.bandwidth_Bps, kv_dtype=kv) / 0.75, 0.002)

    params = {"output_len": 200, "input_len": 1000, "warmup": 0, "requests": 96, "concurrency": 32,
              "rate_rps": None}
    assert estimate_point_s(params, shape, hw, "auto") == round(3 * 200 * step(32) + 1.0, 1)
    assert estimate_point_s(params, shape, hw, "fp8_e4m3") == round(3 * 200 * step(32, "fp8") + 1.0, 1)
    assert estimate_point_s(params, shape, hw, "fp8_e4m3") < estimate_point_s(params, shape, hw, "auto")
    warm = {**params, "warmup": 8}  # one wave of 8 more
    assert estimate_point_s(warm, shape, hw, "auto") == round(3 * 200 * step(32) + 200 * step(8) + 1.0, 1)
    assert estimate_point_s(params, shape, hw, "auto", turns=4) == estimate_point_s(params, shape, hw, "auto")
    assert estimate_point_s(params, shape, hw, "auto", turns=1, think_s=2.0) == \
        estimate_point_s(params, shape, hw, "auto")
    assert estimate_point_s(params, shape, hw, "auto", turns=2, think_s=2.0) == round(
        3 * 200 * step(32) + 2 * 1 * 2.0 + 1.0, 1)  # 48 conversations of 2 turns, 32 at once: 2 waves
    open_loop = {**params, "concurrency": None, "rate_rps": 4.0}
    assert estimate_point_s(open_loop, shape, hw, "auto") == round(96 / 4.0 + 200 * step(1) + 1.0, 1)
    cpu = SimpleNamespace(name="cpu", bandwidth_Bps=1e11)
    gpu = SimpleNamespace(name="h200", bandwidth_Bps=1e11)
    tiny = {**params, "output_len": 10, "requests": 32}
    assert estimate_point_s(tiny, None, cpu, "auto") == round(10 * 0.0035 + 1.0, 1)
    assert estimate_point_s({**tiny, "output_len": 1000}, None, cpu, "auto") == round(1000 * 0.0035 + 1.0, 1)
    assert estimate_point_s({**tiny, "output_len": 1000}, None, gpu, "auto") == round(1000 * 0.002 + 1.0, 1)
