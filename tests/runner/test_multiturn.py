"""Multi-turn load and explicit arrival offsets against the loopback instrument: conversations are what
slots take and arrivals start, turns go in order after their think time, a failed turn ends its
conversation, every turn goes to the first turn's server, and a trace's offsets reach the records."""

from __future__ import annotations

import time

import pytest

from runner.load.instrument import Instrument
from runner.load.loadgen import (
    EARLIER_TURN_FAILED,
    NOT_SENT,
    LoadResult,
    RequestSpec,
    conversations,
    make_prompts,
    run_load,
)
from runner.store.records import RequestRecord


def chats(n: int, turns: int, think_s: float, *, max_tokens: int = 4, input_len: int = 16) -> list[RequestSpec]:
    """`n` conversations of `turns` turns each, consecutive; turn k's prompt grows by 8 ids a turn."""
    prompts = make_prompts(n, input_len + 8 * (turns - 1), vocab_lo=4, vocab_hi=4096, seed=5, salt="chat")
    return [RequestSpec(p[: input_len + 8 * k], max_tokens, conversation=c, turn=k, think_s=think_s if k else 0.0)
            for c, p in enumerate(prompts) for k in range(turns)]


def singles(n: int) -> list[RequestSpec]:
    return [RequestSpec(p, 3) for p in make_prompts(n, 16, vocab_lo=4, vocab_hi=4096, seed=5, salt="one")]


def by_conversation(records: tuple[RequestRecord, ...]) -> dict[int, list[RequestRecord]]:
    out: dict[int, list[RequestRecord]] = {}
    for r in records:
        out.setdefault(r.conversation, []).append(r)
    return out


def max_overlap(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    cur = best = 0
    for _, d in edges:
        cur += d
        best = max(best, cur)
    return best


# ----------------------------------------------------------------------------- conversations()
def test_single_requests_have_no_conversations() -> None:
    assert conversations(singles(3)) is None
    assert conversations([]) is None


def test_conversations_are_the_index_ranges_of_consecutive_turns() -> None:
    specs = chats(2, 3, 0.0)[:5] + singles(1)  # a conversation of 3, one cut to 2 turns, a single request
    assert conversations(specs) == ((0, 3), (3, 5), (5, 6))
    assert conversations(chats(1, 1, 0.0)) == ((0, 1),)


@pytest.mark.parametrize(("specs", "message"), [
    ([RequestSpec((1,), 1, conversation=0, turn=0), RequestSpec((1,), 1, conversation=0, turn=2)],
     "request 1: conversation 0 has turn 2 after turn 0"),
    ([RequestSpec((1,), 1, conversation=0, turn=1)], "request 0: conversation 0 starts at turn 1, not 0"),
    ([RequestSpec((1,), 1, conversation=0), RequestSpec((1,), 1, conversation=1),
      RequestSpec((1,), 1, conversation=0, turn=1)], "request 2: conversation 0 starts at turn 1"),
    ([RequestSpec((1,), 1, conversation=0), RequestSpec((1,), 1, conversation=1),
      RequestSpec((1,), 1, conversation=0)], "request 2: the turns of conversation 0 are not consecutive"),
    ([RequestSpec((1,), 1, conversation=0), RequestSpec((1,), 1, conversation=0, turn=1, think_s=-0.001)],
     "request 1: conversation must be >= -1 and think_s >= 0"),
    ([RequestSpec((1,), 1, conversation=0, think_s=float("inf"))], "request 0: conversation must be"),
    ([RequestSpec((1,), 1, conversation=-2)], "request 0: conversation must be >= -1"),
    ([RequestSpec((1,), 1, conversation=0), RequestSpec((1,), 1, turn=1)], "request 1: conversation -1 starts"),
])
def test_turns_out_of_order_are_refused(specs: list[RequestSpec], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        conversations(specs)


# --------------------------------------------------------------------------------- closed loop
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_closed_loop_slots_take_whole_conversations_and_think_between_turns(workers: int) -> None:
    think = 0.03
    with Instrument(itl_s=0.001) as inst:
        res = run_load(inst.base_url, "m", chats(6, 3, think), concurrency=2, workers=workers)
    assert all(r.ok for r in res.records) and not res.timed_out
    convs = by_conversation(res.records)
    assert sorted(convs) == list(range(6))
    for turns in convs.values():
        assert [r.turn for r in turns] == [0, 1, 2]
        assert [r.prompt_tokens for r in turns] == [16, 24, 32]
        for prev, r in zip(turns, turns[1:], strict=False):
            assert r.scheduled_s == prev.end_s + think  # due its think time after the previous turn ended
            assert r.sent_s >= prev.end_s + think
    # Two conversations in flight at most and at least: a slot holds one from its first send to its last end.
    spans = [(t[0].sent_s, t[-1].end_s) for t in convs.values()]
    assert max_overlap(spans) == 2
    assert max_overlap([(r.sent_s, r.end_s) for r in res.records]) <= 2


def test_think_time_waits_on_a_timer_not_a_spin() -> None:
    """One conversation thinking 0.4 s: the client's CPU time stays a small part of the wall (a spin
    would take a core for the whole think)."""
    with Instrument() as inst:
        cpu0, wall0 = time.process_time(), time.monotonic()
        res = run_load(inst.base_url, "m", chats(1, 2, 0.4), concurrency=1, workers=0)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    first, second = res.records
    assert second.sent_s - first.end_s >= 0.4 and wall >= 0.4
    assert cpu < 0.5 * wall
    lateness = second.sent_s - second.scheduled_s
    assert 0.0 <= lateness < 0.05


def test_a_failed_turn_ends_its_conversation() -> None:
    # Every 2nd request fails: with one slot, each conversation's turn 1 fails and its turn 2 is not sent.
    with Instrument(fail_every=2) as inst:
        res = run_load(inst.base_url, "m", chats(3, 3, 0.0), concurrency=1, workers=0)
        assert inst.stats()["requests"] == 6  # the third turns never reached the server
    errors = [(r.conversation, r.turn, r.ok, (r.error or "")[:8]) for r in res.records]
    assert errors == [(c, k, k == 0, ["", "HTTP 500", "not sent"][k]) for c in range(3) for k in range(3)]
    unsent = [r for r in res.records if r.turn == 2]
    assert all(r.error == EARLIER_TURN_FAILED and r.chunks == 0 for r in unsent)
    assert not res.timed_out  # a turn that failed is not a point timeout
    sent = [r for r in res.records if r.turn < 2]
    assert res.window_end_s == max(r.end_s for r in sent)  # the unsent turns stay out of the window


def test_the_points_deadline_during_a_think_leaves_the_later_turns_not_sent() -> None:
    with Instrument() as inst:
        t0 = time.monotonic()
        res = run_load(inst.base_url, "m", chats(2, 2, 5.0), concurrency=2, workers=0, point_timeout_s=0.5)
        wall = time.monotonic() - t0
    assert res.timed_out and wall < 3.0  # woken at the deadline, not at the end of the think
    assert [(r.turn, r.ok, r.error) for r in res.records] == [(0, True, None), (1, False, NOT_SENT)] * 2


def test_single_requests_are_recorded_as_before() -> None:
    with Instrument() as inst:
        res = run_load(inst.base_url, "m", singles(4), concurrency=2, workers=1)
    assert [(r.index, r.conversation, r.turn, r.ok) for r in res.records] == [(i, -1, 0, True) for i in range(4)]


# ----------------------------------------------------------------------------------- open loop
@pytest.mark.parametrize("workers", [1, 2])
def test_open_loop_offsets_start_conversations(workers: int) -> None:
    offsets = [0.0, 0.01, 0.05, 0.06, 0.2]
    think = 0.02
    with Instrument(itl_s=0.001) as inst:
        res = run_load(inst.base_url, "m", chats(5, 2, think), offsets=offsets, workers=workers)
    assert all(r.ok for r in res.records) and res.workers == workers
    convs = by_conversation(res.records)
    t0 = convs[0][0].scheduled_s
    for c, off in enumerate(offsets):
        first, second = convs[c]
        assert first.scheduled_s - t0 == pytest.approx(off, abs=1e-6)  # exactly the given offsets
        assert first.sent_s >= first.scheduled_s - 1e-6
        assert second.scheduled_s == first.end_s + think <= second.sent_s


def test_an_open_loop_cap_counts_conversations() -> None:
    with Instrument(itl_s=0.002) as inst:
        res = run_load(inst.base_url, "m", chats(6, 3, 0.01), rate_rps=1000.0, concurrency=2, workers=1)
    assert all(r.ok for r in res.records)
    convs = by_conversation(res.records)
    assert max_overlap([(t[0].sent_s, t[-1].end_s) for t in convs.values()]) == 2


def test_offsets_are_one_per_conversation() -> None:
    with pytest.raises(ValueError, match="offsets has 4 entries for 2 conversations"):
        run_load("http://127.0.0.1:9", "m", chats(2, 2, 0.0), offsets=[0.0, 0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="offsets has 2 entries for 3 requests"):
        run_load("http://127.0.0.1:9", "m", singles(3), offsets=[0.0, 0.1])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_replayed_traces_offsets_reach_the_records(workers: int) -> None:
    """`offsets` without a rate: open loop on the given schedule, in every worker mode."""
    offsets = [0.0, 0.002, 0.002, 0.03, 0.031, 0.1, 0.25]
    with Instrument() as inst:
        res = run_load(inst.base_url, "m", singles(len(offsets)), offsets=offsets, workers=workers)
    assert all(r.ok for r in res.records)
    t0 = res.records[0].scheduled_s
    assert [r.scheduled_s - t0 for r in res.records] == pytest.approx(offsets, abs=1e-6)
    assert all(r.sent_s >= r.scheduled_s - 1e-6 for r in res.records)
    # the window opens at the first send (which may lag its schedule by a busy host's milliseconds) and
    # closes after the last request, due 0.25 s after the first was
    assert res.window_start_s == min(r.sent_s for r in res.records)
    assert res.window_end_s >= max(r.end_s for r in res.records) >= t0 + 0.25


def test_unsent_first_turns_keep_their_offsets() -> None:
    """A point timeout before a conversation's arrival: its first turn is recorded at its due time,
    its later turns at the deadline."""
    with Instrument() as inst:  # the second conversation due 1 s in, long after the 0.3 s deadline
        res = run_load(inst.base_url, "m", chats(2, 2, 0.0), offsets=[0.0, 1.0], workers=0, point_timeout_s=0.3)
    late = by_conversation(res.records)[1]
    assert res.timed_out and [r.error for r in late] == [NOT_SENT, NOT_SENT]
    t0 = res.records[0].scheduled_s
    assert late[0].scheduled_s - t0 == pytest.approx(1.0, abs=0.01) and late[1].scheduled_s < t0 + 1.0


# ------------------------------------------------------------------------------------ replicas
@pytest.mark.parametrize("workers", [1, 2])
def test_a_conversation_stays_on_the_server_of_its_first_turn(workers: int) -> None:
    """Round robin would alternate every request between the two servers; each conversation's turns
    all go to one (sticky routing), and the conversations still spread over both."""
    with Instrument() as a, Instrument() as b:
        res: LoadResult = run_load([a.base_url, b.base_url], "m", chats(6, 3, 0.0), concurrency=2,
                                   workers=workers, balance="round_robin")
    assert all(r.ok for r in res.records)
    served: dict[int, set[int]] = {}
    for r, replica in zip(res.records, res.replicas, strict=True):
        served.setdefault(r.conversation, set()).add(replica)
    assert all(len(s) == 1 for s in served.values())
    assert {next(iter(s)) for s in served.values()} == {0, 1}
