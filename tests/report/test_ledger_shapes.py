"""What the step-time model's replay does not model is left out, with the reason, not predicted as something
else: drawn lengths, several templates, a trace or a conversation on a kept cache replayed as fixed-length
requests would be a wrong number (prefix-cache-shared's four-turn conversations were once replayed as single
requests and predicted at twice their measured throughput). Conversations of fixed lengths are replayed:
per-turn prompts, the hits on the turn before, and the think time between turns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from compiler.load import load_study
from compiler.plan import Plan
from compiler.plan_compile import compile_study
from report.ledger.ledger import (
    StoredPoint,
    conversation_load,
    predict_points,
    read_ledger,
    read_points,
    unreplayed,
    unreplayed_points,
)
from tests.variants import study_variant

REPO = Path(__file__).resolve().parents[2]
SHAPES = REPO / "studies" / "examples" / "workload_shapes.toml"
COMMITTED = REPO / "results" / "h200"
Readers = tuple[list[StoredPoint], list[dict[str, Any]]]


def _plan(tmp_path: Path, *edits: tuple[str, str]) -> Plan:
    trace = ('trace = "../traces/mini_mooncake.jsonl"', f'trace = "{REPO / "studies/traces/mini_mooncake.jsonl"}"')
    return compile_study(load_study(study_variant(tmp_path, trace, *edits, source=SHAPES)))


def _reasons(plan: Plan) -> dict[str, str | None]:
    return {p.workload: unreplayed(p) for s in plan.launches for p in s.points}


def test_each_shaped_workload_says_why_it_is_not_replayed(tmp_path: Path) -> None:
    closed = _reasons(_plan(tmp_path, ("rate = [2.0]", "concurrency = [4]")))
    assert closed["chat"] is not None and "(drawn lengths)" in closed["chat"]
    assert closed["fewshot"] is not None and "(4 shared prefixes)" in closed["fewshot"]
    assert closed["conversation"] is not None and "(drawn lengths)" in closed["conversation"]  # its replies
    assert closed["replay"] is not None and "(a replayed trace)" in closed["replay"]
    assert all(r.endswith("the replay sends fixed-length requests, single or in conversations")
               for r in closed.values() if r)


def test_a_conversation_of_fixed_lengths_is_replayed_unless_its_cache_is_kept(tmp_path: Path) -> None:
    fixed = ('output_len = { dist = "histogram", values = [8, 16, 32], weights = [1, 2, 1] }', "output_len = 16")
    closed = ("rate = [2.0]", "concurrency = [4]")
    assert _reasons(_plan(tmp_path, closed, fixed))["conversation"] is None
    kept = _reasons(_plan(tmp_path, closed, fixed, ("repeats = 1", 'repeats = 1\ncache = "keep"')))
    assert kept["conversation"] is not None and "(3-turn conversations on a kept cache)" in kept["conversation"]


def test_a_conversation_load_grows_its_prompts_and_hits_the_turn_before() -> None:
    plan = compile_study(load_study(REPO / "studies" / "prefix_cache_shared.toml"))
    point = next(p for s in plan.launches for p in s.points if p.workload == "conversation")
    load = conversation_load(point)
    assert (load.requests, load.turns, load.think_s, load.concurrency) == (320, 4, 1.0, 32)
    assert load.input_lens[:8] == (256, 576, 896, 1216) * 2  # 256 new tokens after each 64-token reply
    assert load.cached_tokens[:8] == (0, 256, 576, 896) * 2  # no shared prefix: the first turn hits nothing


def test_a_conversation_with_a_shared_prefix_hits_it_once_any_conversation_sent_it(tmp_path: Path) -> None:
    plan = _plan(tmp_path, ("rate = [2.0]", "concurrency = [4]"),
                 ('output_len = { dist = "histogram", values = [8, 16, 32], weights = [1, 2, 1] }', "output_len = 16"))
    point = next(p for s in plan.launches for p in s.points if p.workload == "conversation")
    load = conversation_load(point)  # 64 user tokens (32 of them the shared prefix), 16-token replies, 3 turns
    assert load.input_lens[:6] == (64, 144, 224) * 2
    assert load.cached_tokens[:6] == (0, 64, 144, 32, 64, 144)  # cache_hit_tokens(33) = 32 from the second on
    assert load.requests % 3 == 0 and load.requests >= point.requests


def test_open_loop_points_are_not_replayed_whatever_their_workload(tmp_path: Path) -> None:
    reasons = _reasons(_plan(tmp_path))  # the example as shipped: rate = [2.0]
    assert set(reasons) == {"chat", "fewshot", "conversation", "replay"}
    assert all(r is not None and r.startswith("an open-loop (request rate) point") for r in reasons.values())


def test_a_classic_workload_and_one_shared_prefix_are_replayed(tmp_path: Path) -> None:
    plan = compile_study(load_study(study_variant(tmp_path)))  # quickstart: fixed lengths
    assert {unreplayed(p) for s in plan.launches for p in s.points} == {None}
    shared = compile_study(load_study(REPO / "studies" / "prefix_cache_shared.toml"))
    assert {unreplayed(p) for s in shared.launches for p in s.points} == {None}


@pytest.fixture(scope="module")
def two_readers() -> Readers:
    """The published results read by `read_points` and by `unreplayed_points` (each read takes seconds)."""
    return read_points(COMMITTED), unreplayed_points(COMMITTED)


def test_the_committed_conversations_are_in_the_ledger(two_readers: Readers) -> None:
    points, gaps = two_readers
    assert gaps == []
    talks = [p for p in points if p.workload == "conversation"]
    assert len(talks) == 6 and {p.load.turns for p in talks} == {4}


def test_one_reading_of_the_database_gives_what_the_two_readers_give(
    two_readers: Readers,
) -> None:
    points, gaps = read_ledger(COMMITTED)
    assert gaps == two_readers[1]
    assert [(p.run_id, p.point_id, p.measured) for p in points] == \
        [(p.run_id, p.point_id, p.measured) for p in two_readers[0]]
    assert len({p.run_id for p in points}) > 20


def test_a_plan_prediction_for_an_unreplayed_point_is_none_with_the_reason(tmp_path: Path) -> None:
    plan = _plan(tmp_path, ("rate = [2.0]", "concurrency = [4]"))
    predicted = predict_points(plan, [])  # no stored point: a replayed point says so, the others why not
    for launch in plan.launches:
        for point in launch.points:
            found = predicted[point.id]
            assert set(found.values.values()) == {None}
            assert found.note == unreplayed(point) is not None
            assert found.note.startswith("its workload (")
