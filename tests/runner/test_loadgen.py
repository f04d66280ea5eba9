"""The load generator against the loopback instrument: exact counts, record fields, failures
recorded never raised, timeouts, closed-loop concurrency, open-loop arrivals, a quiet Ctrl-C."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from runner.load.instrument import Instrument
from runner.load.loadgen import (
    POINT_TIMEOUT,
    TIMEOUT,
    LoadResult,
    RequestSpec,
    arrival_times,
    auto_workers,
    make_prompts,
    run_load,
)
from runner.load.stream_server import InstrumentConfig, prompt_key
from runner.store.records import RequestRecord


def specs(n: int, max_tokens: int, *, input_len: int = 16, salt: str = "") -> list[RequestSpec]:
    return [RequestSpec(p, max_tokens)
            for p in make_prompts(n, input_len, vocab_lo=4, vocab_hi=4096, seed=3, salt=salt)]


def max_overlap(records: list[RequestRecord]) -> int:
    edges = sorted([(r.sent_s, 1) for r in records] + [(r.end_s, -1) for r in records],
                   key=lambda e: (e[0], e[1]))
    cur = best = 0
    for _, d in edges:
        cur += d
        best = max(best, cur)
    return best


# ------------------------------------------------------------------------------- the generator
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_exact_token_counts_and_record_fields(workers: int) -> None:
    with Instrument() as inst:
        res = run_load(inst.base_url, "m", specs(30, 17, input_len=24), concurrency=4, workers=workers)
    assert isinstance(res, LoadResult) and res.workers == max(workers, 1) and not res.timed_out
    assert [r.index for r in res.records] == list(range(30))
    for r in res.records:
        assert r.ok and r.error is None and r.status == 200 and not r.warmup
        assert (r.prompt_tokens, r.output_tokens, r.chunks, len(r.token_times_s)) == (24, 17, 17, 17)
        assert r.scheduled_s <= r.sent_s <= r.first_token_s == r.token_times_s[0] <= r.end_s  # type: ignore[operator]
        assert list(r.token_times_s) == sorted(r.token_times_s) and r.token_times_s[-1] <= r.end_s
    assert res.window_start_s == min(r.sent_s for r in res.records)
    assert res.window_end_s == max(r.end_s for r in res.records)


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_the_loop_stall_is_measured_in_every_worker_mode(workers: int) -> None:
    """Each worker measures its longest event-loop stall while measuring; the point keeps the worst."""
    with Instrument(itl_s=0.002) as inst:
        res = run_load(inst.base_url, "m", specs(6, 20), concurrency=3, workers=workers)
    assert res.stall_s is not None and 0.0 <= res.stall_s < 5.0


@pytest.mark.parametrize("busy_poll", [False, True])
def test_a_blocked_loop_shows_as_a_stall(busy_poll: bool) -> None:
    """The fault: something holds the load generator's loop for 80 ms mid-window. The stall it
    measures covers it (so reconciliation cannot clear the client of reading late)."""
    import math

    from runner.load.client import make_target, now
    from runner.load.workers import WorkerPlan, _LocalCounter, _new_loop, _Worker

    with Instrument(itl_s=0.002) as inst:
        reqs = tuple(specs(4, 100))
        plan = WorkerPlan(target=make_target(inst.base_url, "m", None, None), specs=reqs, warmup=(),
                          warmup_concurrency=1, worker_concurrency=2, open_loop=None, request_timeout_s=30.0,
                          busy_poll=busy_poll)
        worker = _Worker(plan, _LocalCounter(len(reqs)))
        loop = _new_loop()

        async def measure() -> None:
            asyncio.get_running_loop().call_later(0.05, time.sleep, 0.08)
            await worker.run_measured(now(), math.inf)

        try:
            loop.run_until_complete(measure())
            worker.client.close()
        finally:
            loop.close()
    assert all(o.ok for o in worker.client.outcomes) and len(worker.client.outcomes) == 4
    assert worker.stall_s is not None and worker.stall_s >= 0.079


def test_chunks_are_not_tokens() -> None:
    with Instrument(tokens_per_chunk=4) as inst:
        res = run_load(inst.base_url, "m", specs(5, 10), concurrency=2, workers=0)
    assert {(r.output_tokens, r.chunks, len(r.token_times_s)) for r in res.records} == {(10, 3, 3)}


def test_paced_token_times_follow_the_stream() -> None:
    reqs = specs(3, 12)
    with Instrument(itl_s=0.002) as inst:
        res = run_load(inst.base_url, "m", reqs, concurrency=3, workers=1)
        logs = {x.key: x for x in inst.send_log()}
    for r, spec in zip(res.records, reqs, strict=True):
        log = logs[prompt_key(spec.prompt_ids)]
        assert r.ok and r.chunks == len(log.times) == 12
        # one clock for both processes: every chunk is stamped after the instrument sent it
        assert all(c >= s for c, s in zip(r.token_times_s, log.times, strict=True))
        assert r.token_times_s[-1] >= log.times[-1] >= log.t_request + 11 * 0.002


def test_warmup_is_flagged_run_first_and_outside_the_window() -> None:
    with Instrument(itl_s=0.001) as inst:
        res = run_load(inst.base_url, "m", specs(6, 5), concurrency=2, workers=1,
                       warmup=specs(3, 5, salt="warmup"))
    warm = [r for r in res.records if r.warmup]
    assert [r.index for r in warm] == [0, 1, 2] and all(r.ok for r in warm)
    assert len(res.measured) == 6
    assert max(r.end_s for r in warm) <= res.window_start_s == min(r.sent_s for r in res.measured)


def test_http_errors_are_recorded_not_raised() -> None:
    with Instrument(fail_every=3, fail_status=500) as inst:
        res = run_load(inst.base_url, "m", specs(12, 4), concurrency=1, workers=0)
    bad = [r for r in res.records if not r.ok]
    assert len(bad) == 4
    for r in bad:
        assert r.status == 500 and r.error is not None and r.error.startswith("HTTP 500")
        assert "injected failure" in r.error and r.chunks == 0 and r.first_token_s is None
    assert all(r.output_tokens == 4 for r in res.records if r.ok)


def test_stream_error_event_and_disconnect_are_recorded() -> None:
    with Instrument(error_every=2, error_after=2, disconnect_every=3, disconnect_after=1) as inst:
        res = run_load(inst.base_url, "m", specs(6, 6), concurrency=1, workers=0)
    by_error: dict[str | None, int] = {}
    for r in res.records:
        key = (r.error or "").split(":")[0] or None
        by_error[key] = by_error.get(key, 0) + 1
    # serials 2 and 4 get an error event, 3 and 6 a reset (the disconnect fault is checked first)
    assert by_error == {None: 2, "stream error": 2, "disconnected": 2}
    cut = next(r for r in res.records if r.error and r.error.startswith("disconnected"))
    assert cut.chunks == 1 and cut.status == 200 and not cut.ok


def test_connection_refused_is_recorded() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        res = run_load(f"http://127.0.0.1:{port}", "m", specs(3, 2), concurrency=2, workers=0)
    assert [r.ok for r in res.records] == [False] * 3
    assert all(r.error and r.error.startswith("connect failed") for r in res.records)


def test_api_key_and_extra_body_reach_the_server() -> None:
    with Instrument(api_key="k") as inst:
        good = run_load(inst.base_url, "m", specs(2, 3), api_key="k", workers=0)
        denied = run_load(inst.base_url, "m", specs(2, 3), workers=0)
        teapot = run_load(inst.base_url, "m", specs(2, 3), api_key="k", workers=0,
                          extra_body={"instrument": {"fail_status": 418}})
    assert all(r.ok for r in good.records)
    assert {r.status for r in denied.records} == {401} and not any(r.ok for r in denied.records)
    assert {r.status for r in teapot.records} == {418}


def test_hung_stream_is_cancelled_and_recorded_as_timeout() -> None:
    with Instrument(hang_every=2, hang_after=1) as inst:
        t0 = time.monotonic()
        res = run_load(inst.base_url, "m", specs(4, 3), concurrency=4, workers=1, request_timeout_s=0.5)
        wall = time.monotonic() - t0
    hung = [r for r in res.records if not r.ok]
    assert len(hung) == 2 and all(r.error == TIMEOUT for r in hung)
    assert all(r.chunks == 1 and r.end_s - r.sent_s >= 0.5 for r in hung)
    assert all(r.ok for r in res.records if r not in hung)
    assert not res.timed_out and wall < 10


def test_point_timeout_bounds_the_whole_point() -> None:
    with Instrument(hang_every=1, hang_after=0) as inst:
        t0 = time.monotonic()
        res = run_load(inst.base_url, "m", specs(6, 3), concurrency=2, workers=1, point_timeout_s=1.0)
        wall = time.monotonic() - t0
    assert res.timed_out and wall < 8
    errors = sorted(r.error or "" for r in res.records)
    assert errors.count(POINT_TIMEOUT) == 2
    assert errors.count("not sent: point timeout") == 4
    assert not any(r.ok for r in res.records)


def test_a_slot_freed_at_the_deadline_sends_nothing_before_the_points_timer_fires() -> None:
    """A request's own timer at the deadline can fire before the point's: the client reads the clock,
    so the freed slot sees the deadline passed (without it, a loaded machine sent two more requests)."""
    from runner.load.client import Client, make_target, now

    async def go() -> tuple[bool, bool]:
        client = Client(make_target("http://127.0.0.1:9", "m", None, None), 1.0)
        client.arm(now() + 0.2)
        before = client.expired
        client.deadline = now() - 1e-6  # past, while the point's timer is still 0.2 s away
        return before, client.expired

    before, after = asyncio.run(go())
    assert not before and after


def test_bodies_encoded_ahead_are_the_bytes_encoded_when_sent() -> None:
    """Client.prepare encodes the measured bodies before the window; what goes on the wire is the same
    bytes, for every replica's header, and past the byte cap the rest are encoded when sent."""
    from runner.load.client import Client, make_target

    targets = (make_target("http://127.0.0.1:9", "m", None, None),
               make_target("http://127.0.0.1:10", "m", "k", {"top_k": 1}))
    reqs = specs(6, 5, input_len=32) + [RequestSpec((7,) * 300, 9)]
    fresh = Client(targets, 1.0)
    sent_now = [[fresh._encode(i, s, False, r) for i, s in enumerate(reqs)] for r in (0, 1)]
    ahead = Client(targets, 1.0)
    assert ahead.prepare(reqs) == len(reqs)
    assert [[ahead._encode(i, s, False, r) for i, s in enumerate(reqs)] for r in (0, 1)] == sent_now
    assert sent_now[0][0] != sent_now[1][0]  # the replicas' headers differ; the bodies are shared
    # A warmup request with the index of a measured one is its own body, not the prepared one.
    warm = RequestSpec((5,) * 8, 2)
    assert ahead._encode(0, warm, True, 0) == fresh._encode(0, warm, True, 0) != sent_now[0][0]
    # A cap of two bodies' bytes: two are held, the rest are encoded when sent, the same bytes.
    capped = Client(targets, 1.0)
    held = capped.prepare(reqs, most_bytes=len(capped._body(reqs[0])) + len(capped._body(reqs[1])))
    assert held == 2
    assert [capped._encode(i, s, False, 1) for i, s in enumerate(reqs)] == sent_now[1]


@pytest.mark.parametrize("workers", [1, 2])
def test_closed_loop_concurrency_is_never_exceeded(workers: int) -> None:
    with Instrument(itl_s=0.001) as inst:
        res = run_load(inst.base_url, "m", specs(40, 20), concurrency=5, workers=workers)
        stats = inst.stats()
    assert all(r.ok for r in res.records)
    assert stats["max_in_flight"] == 5 and max_overlap(list(res.records)) == 5
    assert stats["connections"] <= 5  # keep-alive: one connection per slot, reused


def test_all_at_once_when_neither_concurrency_nor_rate() -> None:
    with Instrument(itl_s=0.002) as inst:
        res = run_load(inst.base_url, "m", specs(8, 10), workers=0)
        assert inst.stats()["max_in_flight"] == 8
    assert all(r.ok for r in res.records)


def test_open_loop_arrivals_follow_the_rate() -> None:
    rate, n, seed = 200.0, 100, 7
    with Instrument() as inst:
        res = run_load(inst.base_url, "m", specs(n, 4), rate_rps=rate, seed=seed, workers=1)
    recs = sorted(res.records, key=lambda r: r.index)
    assert all(r.ok for r in recs)
    expect = arrival_times(n, rate, seed=seed)
    t0 = recs[0].scheduled_s
    for r, off in zip(recs, expect, strict=True):
        assert r.scheduled_s - t0 == pytest.approx(off, abs=1e-6)  # exactly the seeded schedule
        assert r.sent_s >= r.scheduled_s - 1e-6  # never early
    lateness = sorted(r.sent_s - r.scheduled_s for r in recs)
    assert lateness[n // 2] < 0.005  # sent on time (sleep to 1 ms short, then spin)


def test_open_loop_with_a_cap_and_two_workers() -> None:
    with Instrument(itl_s=0.002) as inst:
        res = run_load(inst.base_url, "m", specs(30, 10), rate_rps=2000, concurrency=3, workers=2)
        stats = inst.stats()
    assert all(r.ok for r in res.records) and res.workers == 2
    assert stats["max_in_flight"] <= 3 and max_overlap(list(res.records)) <= 3


def test_run_load_from_async_code() -> None:
    with Instrument() as inst:
        async def main() -> LoadResult:
            return run_load(inst.base_url, "m", specs(3, 2), workers=0)

        res = asyncio.run(main())
    assert all(r.ok for r in res.records)


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError):
        run_load("https://127.0.0.1:1", "m", specs(1, 1))
    with pytest.raises(ValueError):
        run_load("http://127.0.0.1:1", "m", specs(1, 1), concurrency=0)


def test_auto_workers_scale_with_streams_and_cpus() -> None:
    assert auto_workers(1, None, 10, cpus=16) == 1
    assert auto_workers(512, None, 10_000, cpus=16) == 1
    assert auto_workers(1024, None, 10_000, cpus=16) == 2
    assert auto_workers(8192, None, 10_000, cpus=8) == 7
    assert auto_workers(4096, None, 10_000, cpus=2) == 1
    assert auto_workers(None, 5.0, 100, cpus=16) == 1


def test_instrument_config_roundtrip_used_by_tests() -> None:
    # keyword overrides build on a config
    inst = Instrument(InstrumentConfig(itl_s=0.5), fail_every=2)
    assert inst.cfg.itl_s == 0.5 and inst.cfg.fail_every == 2


# ------------------------------------------------------------------------------------ Ctrl-C
# A point run by a separate process, as `studyc run` runs one: worker processes streaming from the
# instrument, then Ctrl-C (SIGINT to the whole process group, as a terminal sends it).
_INTERRUPTED_DRIVER = """
import sys
from runner.load.loadgen import RequestSpec, make_prompts, run_load
prompts = make_prompts(66, 16, vocab_lo=4, vocab_hi=4096, seed=1)
specs = [RequestSpec(p, 5000) for p in prompts[:64]]
warmup = [RequestSpec(p, 2) for p in prompts[64:]]
try:
    run_load(sys.argv[1], "m", specs, concurrency=8, workers=int(sys.argv[2]), warmup=warmup)
except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    sys.exit(130)
print("finished", file=sys.stderr)
"""


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except OSError:
        return []


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_during_a_point_is_quiet(workers: int) -> None:
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with Instrument(itl_s=0.002) as inst:
        proc = subprocess.Popen(
            [sys.executable, "-c", _INTERRUPTED_DRIVER, inst.base_url, str(workers)],
            cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        deadline = time.monotonic() + 30
        # measuring: more requests than the warmup's two have reached the instrument
        while inst.stats()["requests"] < 6 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        assert inst.stats()["in_flight"] > 0, "the point never started"
        workers_seen = _children(proc.pid)
        assert len(workers_seen) == workers
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert err.strip() == "interrupted"  # and nothing else: no traceback from any worker
    for bad in ("Traceback", "Fatal error on transport", "BrokenPipeError", "KeyboardInterrupt"):
        assert bad not in err
    assert not any(os.path.exists(f"/proc/{p}") for p in workers_seen), "a worker outlived the point"
