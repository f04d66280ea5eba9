"""The Ray driver's dispatch and interference bookkeeping (runner.execute.ray_gate), branch by branch; the real
local-cluster run that measures interference is in test_ray.py."""

from __future__ import annotations

from runner.execute.ray_gate import Gate


def gate(blocks: dict[int, int], first: int | None = 0) -> Gate:
    return Gate(sorted(blocks), blocks, first)


def test_first_runs_alone_then_the_others_follow_block_turns() -> None:
    g = gate({0: 1, 1: 1, 2: 2, 3: 2})
    assert g.to_dispatch() == [0]
    g.on_started(0, "A")
    assert g.to_dispatch() == []  # still measuring alone
    g.measured_alone()
    assert g.to_dispatch() == [1]  # block 2 waits until every block-1 launch has started
    g.on_started(1, "A")
    assert g.to_dispatch() == [2, 3]
    assert g.to_dispatch() == []  # nothing is dispatched twice


def test_beside_only_a_launch_on_the_first_ones_node() -> None:
    g = gate({0: 1, 1: 1, 2: 1})
    g.to_dispatch()
    assert g.on_started(0, "A") is None
    g.measured_alone()
    g.to_dispatch()
    assert g.on_started(1, "B") is None  # another node shares nothing with the first
    assert not g.give_up()  # launch 2 may still start on A
    assert g.on_started(2, "A") == 2
    assert g.on_started(2, "A") is None  # told once
    assert not g.give_up()


def test_no_launch_beside_it_gives_up_once() -> None:
    g = gate({0: 1, 1: 1})
    g.to_dispatch()
    g.on_started(0, "A")
    assert not g.give_up()  # not yet measured alone
    g.measured_alone()
    g.to_dispatch()
    assert not g.give_up()  # launch 1 dispatched, not started
    assert g.on_started(1, "B") is None
    assert g.give_up() and not g.give_up()


def test_a_launch_that_ended_without_starting_lets_the_first_give_up() -> None:
    g = gate({0: 1, 1: 1})
    g.to_dispatch()
    g.on_started(0, "A")
    g.measured_alone()
    g.to_dispatch()
    g.on_ended(1)  # its server failed to start
    assert g.give_up()


def test_closed_gate_goes_one_launch_at_a_time_in_plan_order() -> None:
    g = gate({0: 1, 1: 1, 2: 2, 3: 2})
    g.to_dispatch()
    g.on_started(0, "A")
    g.measured_alone()
    g.to_dispatch()
    g.on_started(1, "A")
    g.measured(False)
    assert g.to_dispatch() == []  # 0 and 1 still running
    g.on_ended(0)
    assert g.to_dispatch() == []
    g.on_ended(1)
    assert g.to_dispatch() == [2]
    g.on_started(2, "A")
    assert g.to_dispatch() == []
    g.on_ended(2)
    assert g.to_dispatch() == [3]


def test_open_gate_keeps_launches_side_by_side() -> None:
    g = gate({0: 1, 1: 1, 2: 2, 3: 2})
    g.to_dispatch()
    g.on_started(0, "A")
    g.measured_alone()
    g.to_dispatch()
    g.on_started(1, "A")
    g.measured(True)
    assert g.to_dispatch() == [2, 3]


def test_a_lost_launch_sent_again_has_not_finished() -> None:
    g = gate({0: 1, 1: 1, 2: 2})
    g.to_dispatch()
    g.on_started(0, "A")
    g.measured_alone()
    g.to_dispatch()
    g.measured(False)
    g.on_ended(0)
    g.on_ended(1, again=True)  # its rest runs on a fresh worker
    assert g.to_dispatch() == []
    g.on_ended(1)
    assert g.to_dispatch() == [2]


def test_first_ending_early_releases_the_hold() -> None:
    g = gate({0: 1, 1: 1})
    assert g.to_dispatch() == [0]
    g.on_ended(0)  # failed before its first point
    assert g.to_dispatch() == [1]
    assert not g.give_up()


def test_no_first_no_hold_and_nothing_beside() -> None:
    g = gate({0: 1, 1: 1}, first=None)
    assert g.to_dispatch() == [0, 1]
    assert g.on_started(1, "A") is None and not g.give_up()
