"""Point statistics and checks from scripted request records (pure arithmetic, no server)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from runner.summary import concurrency_error, halves_gap, percentile, summarize


@dataclass(frozen=True)
class Rec:
    sent_s: float
    end_s: float
    warmup: bool = False
    ok: bool = True
    scheduled_s: float | None = None
    first_token_s: float | None = None
    output_tokens: int = 10
    prompt_tokens: int = 5
    chunks: int = 10
    token_times_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.scheduled_s is None:
            object.__setattr__(self, "scheduled_s", self.sent_s)
        if self.first_token_s is None:
            object.__setattr__(self, "first_token_s", self.sent_s + 0.1 * (self.end_s - self.sent_s))


def closed_loop(concurrency: int, waves: int, duration: float = 1.0, ramp: float = 0.0) -> list[Rec]:
    """Fixed-length requests in lockstep waves; the first wave is sent over `ramp` seconds."""
    out = []
    for slot in range(concurrency):
        t = slot * ramp / concurrency
        for _ in range(waves):
            out.append(Rec(t, t + duration))
            t += duration
    return out


def test_percentile_matches_numpy_linear() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    assert percentile([], 50) is None


def test_one_wave_burst_with_ramp_holds_concurrency() -> None:
    # 128 requests sent over 23 ms, each running 1 s: the H200 prefix-cache case.
    recs = closed_loop(128, 1, duration=1.0, ramp=0.023)
    assert concurrency_error(recs, 128) == pytest.approx(0.0, abs=1e-9)


def test_multi_wave_holds_concurrency() -> None:
    recs = closed_loop(8, 4, duration=0.5, ramp=0.01)
    assert concurrency_error(recs, 8) < 0.001


def test_client_that_does_not_refill_is_caught() -> None:
    # Every second slot waits 0.5 s before sending its next request.
    recs = []
    for slot in range(4):
        t = 0.0
        for _ in range(3):
            recs.append(Rec(t, t + 1.0))
            t += 1.0 + (0.5 if slot % 2 else 0.0)
    assert concurrency_error(recs, 4) > 0.1


def test_littles_law_holds_and_catches_warmup_bleed_and_client_lag() -> None:
    recs = closed_loop(4, 3)
    s = summarize(recs, 4)
    assert s["littles_law_error"] == pytest.approx(0.0, abs=1e-9)
    assert s["mean_in_flight"] == pytest.approx(4.0, rel=0.01)
    assert s["output_throughput"] == pytest.approx(12 * 10 / 3.0)
    # Requests that waited 0.5 s in the client before being sent: W from schedule > L / lambda.
    lagged = [Rec(r.sent_s, r.end_s, scheduled_s=r.sent_s - 0.5) for r in recs]
    assert summarize(lagged, 4)["littles_law_error"] > 0.1
    # Failed requests were in flight but complete nothing: lambda * W undercounts L.
    failing = [Rec(r.sent_s, r.end_s, ok=(i % 3 != 0)) for i, r in enumerate(recs)]
    assert summarize(failing, 4)["littles_law_error"] > 0.1


def test_warmup_records_are_excluded() -> None:
    recs = closed_loop(2, 2) + [Rec(-5.0, -4.0, warmup=True)]
    s = summarize(recs, 2)
    assert s["requests_ok"] == 4
    assert s["window_s"] == pytest.approx(2.0)


def test_halves_gap_sees_a_slow_start() -> None:
    slow = [Rec(i, i + (2.0 if i < 2 else 1.0), output_tokens=11) for i in range(4)]
    assert halves_gap(slow) > 0.4
    steady = [Rec(i, i + 1.0, output_tokens=11) for i in range(4)]
    assert halves_gap(steady) == pytest.approx(0.0, abs=1e-9)
    # A first half that is faster than the second is no sign of a missing warmup.
    slow_end = [Rec(i, i + (1.0 if i < 2 else 2.0), output_tokens=11) for i in range(4)]
    assert halves_gap(slow_end) < 0


def test_store_keeps_every_column_of_mixed_telemetry_rows(tmp_path) -> None:
    from runner.store import Store

    with Store(tmp_path / "t.duckdb") as store:
        point = {"run_id": "r", "point_id": "p", "status": "ok"}
        rows = [
            {"run_id": "r", "point_id": "p", "source": "nvml", "t_s": 0.0, "power_w": 300.0},
            {"run_id": "r", "point_id": "p", "source": "metrics", "t_s": 0.1, "kv_cache_usage": 0.5, "running": 3.0},
        ]
        store.commit_point(point, [], [], rows)
        got = {r["source"]: r for r in store.telemetry("r")}
    assert got["nvml"]["power_w"] == 300.0 and got["nvml"]["kv_cache_usage"] is None
    assert got["metrics"]["kv_cache_usage"] == 0.5 and got["metrics"]["running"] == 3.0
