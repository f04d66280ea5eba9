"""What the step-time model's replay does not model is left out, with the reason, not predicted as something
else: a conversation, drawn lengths, several templates or a trace replayed as fixed-length single-turn
requests would be a wrong number (prefix-cache-shared's four-turn conversations were predicted at twice
their measured throughput before they were left out)."""

from __future__ import annotations

from pathlib import Path

from compiler.load import load_study
from compiler.plan import Plan
from compiler.plan_compile import compile_study
from report.ledger import predict_points, read_points, unreplayed, unreplayed_points
from tests.variants import study_variant

REPO = Path(__file__).resolve().parents[2]
SHAPES = REPO / "studies" / "examples" / "workload_shapes.toml"
COMMITTED = REPO / "results" / "h200.duckdb"


def _plan(tmp_path: Path, *edits: tuple[str, str]) -> Plan:
    trace = ('trace = "../traces/mini_mooncake.jsonl"', f'trace = "{REPO / "studies/traces/mini_mooncake.jsonl"}"')
    return compile_study(load_study(study_variant(tmp_path, trace, *edits, source=SHAPES)))


def _reasons(plan: Plan) -> dict[str, str | None]:
    return {p.workload: unreplayed(p) for s in plan.launches for p in s.points}


def test_each_shaped_workload_says_why_it_is_not_replayed(tmp_path: Path) -> None:
    closed = _reasons(_plan(tmp_path, ("rate = [2.0]", "concurrency = [4]")))
    assert closed["chat"] is not None and "(drawn lengths)" in closed["chat"]
    assert closed["fewshot"] is not None and "(4 shared prefixes)" in closed["fewshot"]
    conversation = closed["conversation"]
    assert conversation is not None and "(3-turn conversations, drawn lengths)" in conversation
    assert closed["replay"] is not None and "(a replayed trace)" in closed["replay"]
    assert all(r.endswith("the replay sends fixed-length, single-turn requests") for r in closed.values() if r)


def test_open_loop_points_are_not_replayed_whatever_their_workload(tmp_path: Path) -> None:
    reasons = _reasons(_plan(tmp_path))  # the example as shipped: rate = [2.0]
    assert set(reasons) == {"chat", "fewshot", "conversation", "replay"}
    assert all(r is not None and r.startswith("an open-loop (request rate) point") for r in reasons.values())


def test_a_classic_workload_and_one_shared_prefix_are_replayed(tmp_path: Path) -> None:
    plan = compile_study(load_study(study_variant(tmp_path)))  # quickstart: fixed lengths
    assert {unreplayed(p) for s in plan.launches for p in s.points} == {None}
    shared = compile_study(load_study(REPO / "studies" / "prefix_cache_shared.toml"))
    reasons = {p.workload: unreplayed(p) for s in shared.launches for p in s.points}
    assert reasons["system-prompt"] is None  # prefix_len alone: the replay models the shared prefix
    assert reasons["conversation"] is not None and "(4-turn conversations)" in reasons["conversation"]


def test_the_committed_conversations_are_left_out_of_the_ledger_and_named() -> None:
    rows = unreplayed_points(COMMITTED)
    assert [(r["study"], r["n"]) for r in rows] == [("prefix-cache-shared", 6)]
    assert all("/conversation/" in pid for pid in rows[0]["points"])
    read = read_points(COMMITTED)
    assert not [p for p in read if p.workload == "conversation"]
    assert [p for p in read if p.study == "prefix-cache-shared" and p.workload == "system-prompt"]


def test_a_plan_prediction_for_a_conversation_is_none_with_the_reason() -> None:
    plan = compile_study(load_study(REPO / "studies" / "prefix_cache_shared.toml"))
    predicted = predict_points(plan, [])  # no stored point: every replayed point says so, the others why not
    for launch in plan.launches:
        for point in launch.points:
            found = predicted[point.id]
            assert set(found.values.values()) == {None}
            if point.workload == "conversation":
                assert "(4-turn conversations)" in found.note
            else:
                assert found.note == "no calibrated run on h200 in the database"
