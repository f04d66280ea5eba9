"""The client's balancer across replicas: least outstanding requests (ties to the lowest index) and
round robin, local and shared by worker processes, and run_load spreading a point over two servers."""

from __future__ import annotations

import os
import tempfile
from itertools import pairwise

import pytest

from runner.load.client import Balancer
from runner.load.instrument import Instrument
from runner.load.loadgen import RequestSpec, make_prompts, run_load
from runner.load.stream_server import InstrumentConfig


def specs(n: int) -> list[RequestSpec]:
    return [RequestSpec(p, 8) for p in make_prompts(n, 16, vocab_lo=4, vocab_hi=4096, seed=3)]


def test_least_outstanding_picks_the_fewest_in_flight_ties_lowest() -> None:
    b = Balancer("least_outstanding", 3)
    assert [b.pick(), b.pick(), b.pick()] == [0, 1, 2]
    b.release(1)
    assert b.pick() == 1  # the only one with nothing in flight
    assert b.pick() == 0  # all have one: the lowest index
    assert b.outstanding() == [2, 1, 1]


def test_round_robin_goes_in_turn_whatever_is_in_flight() -> None:
    b = Balancer("round_robin", 2)
    picks = [b.pick() for _ in range(5)]
    assert picks == [0, 1, 0, 1, 0]
    assert b.outstanding() == [3, 2]


def test_shared_state_counts_every_process() -> None:
    fd, path = tempfile.mkstemp()
    os.close(fd)
    try:
        Balancer.create_shared(2, path)
        one, two = Balancer("least_outstanding", 2, path), Balancer("least_outstanding", 2, path)
        assert one.pick() == 0
        assert two.pick() == 1  # sees the other's request in flight
        one.release(0)
        assert two.pick() == 0
        one.close()
        two.close()
    finally:
        os.unlink(path)


def test_bad_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="balance must be one of"):
        Balancer("random", 2)


@pytest.mark.parametrize("workers", [0, 2])
def test_run_load_round_robin_splits_requests_evenly(workers: int) -> None:
    with Instrument() as a, Instrument() as b:
        res = run_load([a.base_url, b.base_url], "m", specs(12), concurrency=2, workers=workers,
                       balance="round_robin")
    assert all(r.ok for r in res.records)
    assert sorted(res.replicas) == [0] * 6 + [1] * 6


def test_run_load_least_outstanding_never_stacks_two_streams_on_one_server_at_concurrency_two() -> None:
    """Least outstanding at c2 over two servers: each pick sees at most the other stream in flight and
    takes the other server, so no two requests on one server ever overlap in time (however the
    requests happen to be timed on a busy host)."""
    cfg = InstrumentConfig(itl_s=0.002)
    with Instrument(cfg) as a, Instrument(cfg) as b:
        res = run_load([a.base_url, b.base_url], "m", specs(10), concurrency=2, workers=0)
    assert all(r.ok for r in res.records)
    assert len(res.replicas) == len(res.records) and set(res.replicas) <= {0, 1}
    for replica in (0, 1):
        spans = sorted((r.sent_s, r.end_s) for r, k in zip(res.records, res.replicas, strict=True) if k == replica)
        for (_, end), (sent, _) in pairwise(spans):
            assert sent >= end, f"two requests in flight on server {replica} at once"
    first = min(range(len(res.records)), key=lambda i: res.records[i].sent_s)
    assert res.replicas[first] == 0  # nothing in flight at the first pick: the lowest index


def test_least_outstanding_at_concurrency_one_keeps_to_the_first() -> None:
    with Instrument() as a, Instrument() as b:
        res = run_load([a.base_url, b.base_url], "m", specs(4), concurrency=1, workers=0)
    assert res.replicas == (0, 0, 0, 0)  # nothing in flight at each pick: ties go to the lowest index
