"""Workload generation: prompts of exact length, distinct after a shared prefix, warmup prompts that
share no prefix with measured ones; seeded arrival schedules of the right rate and shape; the split
of a point over workers."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from runner.load.workload import Arrival, arrival_times, make_prompts, schedule, share


def test_make_prompts_exact_deterministic_and_unique() -> None:
    a = make_prompts(300, 40, vocab_lo=4, vocab_hi=4096, seed=1)
    assert a == make_prompts(300, 40, vocab_lo=4, vocab_hi=4096, seed=1)
    assert a != make_prompts(300, 40, vocab_lo=4, vocab_hi=4096, seed=2)
    assert all(len(p) == 40 and all(4 <= t < 4096 for t in p) for p in a)
    assert len({p[0] for p in a}) == 300  # no two share even a first token


def test_make_prompts_shared_prefix_then_distinct() -> None:
    a = make_prompts(50, 64, vocab_lo=4, vocab_hi=4096, seed=1, prefix_len=32)
    assert len({p[:32] for p in a}) == 1
    assert len({p[32] for p in a}) == 50


def test_make_prompts_more_than_the_vocabulary() -> None:
    a = make_prompts(40, 8, vocab_lo=0, vocab_hi=10, seed=0)
    assert len({p[:2] for p in a}) == 40
    with pytest.raises(ValueError):
        make_prompts(11, 1, vocab_lo=0, vocab_hi=10, seed=0)
    with pytest.raises(ValueError):
        make_prompts(2, 4, vocab_lo=0, vocab_hi=10, seed=0, prefix_len=5)


def test_salts_share_no_prefix() -> None:
    measured = make_prompts(100, 48, vocab_lo=4, vocab_hi=4096, seed=9, prefix_len=16)
    warm = make_prompts(100, 48, vocab_lo=4, vocab_hi=4096, seed=9, prefix_len=16, salt="warmup")
    assert measured[0][:16] != warm[0][:16]
    assert not {p[:16] for p in measured} & {p[:16] for p in warm}
    plain_m = make_prompts(100, 48, vocab_lo=4, vocab_hi=4096, seed=9)
    plain_w = make_prompts(100, 48, vocab_lo=4, vocab_hi=4096, seed=9, salt="warmup")
    assert not {p[:4] for p in plain_m} & {p[:4] for p in plain_w}


@pytest.mark.parametrize(("n", "input_len", "prefix_len"), [(1, 1, 0), (1, 1, 1), (7, 2, 0), (64, 129, 64),
                                                             (5, 3000, 0)])
def test_make_prompts_lengths_are_exact(n: int, input_len: int, prefix_len: int) -> None:
    got = make_prompts(n, input_len, vocab_lo=10, vocab_hi=20, seed=4, prefix_len=prefix_len)
    assert len(got) == n and {len(p) for p in got} == {input_len}
    assert all(10 <= t < 20 for p in got for t in p)


def test_make_prompts_refuses_a_vocabulary_of_one() -> None:
    with pytest.raises(ValueError, match="too small"):
        make_prompts(1, 4, vocab_lo=5, vocab_hi=6, seed=0)


def test_warmup_shares_no_block_with_measured_prompts_at_any_prefix() -> None:
    # The point runner salts warmup prompts: not even their shared prefix may match (a cache hit
    # in the measured window would be a lie about prefill).
    for prefix_len in (0, 1, 16, 32):
        measured = make_prompts(40, 48, vocab_lo=4, vocab_hi=4096, seed=2, prefix_len=prefix_len)
        warm = make_prompts(40, 48, vocab_lo=4, vocab_hi=4096, seed=2, prefix_len=prefix_len, salt="warmup")
        assert not {p[:prefix_len + 2] for p in measured} & {p[:prefix_len + 2] for p in warm}


def test_arrival_processes() -> None:
    n, rate = 20_000, 50.0

    def gaps(kind: str, b: float = 1.0, seed: int = 1) -> list[float]:
        t = arrival_times(n, rate, arrival=kind, burstiness=b, seed=seed)
        return [y - x for x, y in itertools.pairwise(t)]

    assert arrival_times(3, rate)[0] == 0.0
    for kind, b, cv in (("poisson", 1.0, 1.0), ("gamma", 0.5, math.sqrt(2)), ("gamma", 4.0, 0.5)):
        g = gaps(kind, b)
        mean = statistics.fmean(g)
        assert mean == pytest.approx(1 / rate, rel=0.03), kind
        assert statistics.pstdev(g) / mean == pytest.approx(cv, rel=0.05), (kind, b)
    assert {round(x, 12) for x in gaps("constant")} == {round(1 / rate, 12)}
    assert gaps("poisson", seed=1) == gaps("poisson", seed=1) != gaps("poisson", seed=2)
    with pytest.raises(ValueError):
        arrival_times(3, 0.0)
    with pytest.raises(ValueError):
        arrival_times(3, 1.0, arrival="uniformish")


def test_arrivals_are_deterministic_per_seed_and_start_at_zero() -> None:
    for kind in ("poisson", "gamma", "constant"):
        a = arrival_times(50, 10.0, arrival=kind, burstiness=2.0, seed=5)
        assert a == arrival_times(50, 10.0, arrival=kind, burstiness=2.0, seed=5)
        assert a[0] == 0.0 and a == sorted(a) and len(a) == 50
    assert arrival_times(0, 1.0) == []
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            arrival_times(3, bad)
    with pytest.raises(ValueError, match="burstiness"):
        arrival_times(3, 1.0, arrival="gamma", burstiness=0.0)


def test_schedule_deals_arrivals_round_robin_in_time_order() -> None:
    offsets = [0.0, 0.1, 0.2, 0.3, 0.4]
    assert schedule(offsets, 0, 2) == (Arrival(0, 0.0), Arrival(2, 0.2), Arrival(4, 0.4))
    assert schedule(offsets, 1, 2) == (Arrival(1, 0.1), Arrival(3, 0.3))
    assert sorted(a for w in range(3) for a in schedule(offsets, w, 3)) == [Arrival(i, o) for i, o in enumerate(offsets)]


def test_share_splits_slots_evenly_and_completely() -> None:
    assert [share(10, w, 3) for w in range(3)] == [4, 3, 3]
    assert [share(2, w, 3) for w in range(3)] == [1, 1, 0]
    for total, workers in itertools.product(range(20), range(1, 6)):
        parts = [share(total, w, workers) for w in range(workers)]
        assert sum(parts) == total and max(parts) - min(parts) <= 1
