"""runner.load.shapes at its edges: the bytes a seeded workload sends are pinned (a stored plan's points must
send the same prompts on every run, resume and recheck), token ids stay in the vocabulary, the model's
length bounds every conversation, and a trace's arrivals keep their shape when cycled and rescaled."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from compiler.trace import TraceRow
from compiler.workload import Normal, Shape, TraceRef, Uniform
from runner.load.shapes import Requests, point_requests, trace_offsets
from tests.runner.steps import step

ROWS = [TraceRow(timestamp_ms=t, input_length=i, output_length=o, hash_ids=h) for t, i, o, h in
        [(0, 700, 5, (1, 2)), (40, 600, 9, (1, 3)), (45, 1030, 3, (1, 2, 4, 5)), (300, 20, 2, (6,))]]
REF = TraceRef(path="t.jsonl", sha256="0" * 64, rows=4)
CASES: dict[str, tuple[Shape, dict[str, Any], list[TraceRow] | None]] = {
    "drawn": (Shape(input=Uniform(dist="uniform", min=20, max=90), output=Normal(dist="normal", mean=9, sd=3, min=1)),
              {}, None),
    "templates": (Shape(input=50, output=6, templates=3), {"prefix_len": 8}, None),
    "turns": (Shape(input=30, output=12, turns=3, think_s=0.25, max_len=100), {}, None),
    "trace": (Shape(trace=REF, trace_arrivals=True, max_len=1024), {"rate_rps": 4.0, "concurrency": None}, ROWS),
}
PINNED = {"drawn": "dbec55ff4be9c271", "templates": "4a321340c3508a1f", "turns": "33a5eb522a356f0a",
          "trace": "b0d430ebcfae44f7"}
LO, HI = 1000, 1200


def requests(name: str, count: int = 6, salt: str = "measured") -> Requests:
    shape, over, rows = CASES[name]
    return point_requests(step(shape=shape, vocab_lo=LO, vocab_hi=HI, prompt_seed=7, **over), count, salt,
                          trace_rows=rows)


def digest(req: Requests) -> str:
    blob = json.dumps([[list(s.prompt_ids), s.max_tokens, s.conversation, s.turn, s.think_s] for s in req.specs]
                      + [req.offsets], separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_bytes_of_a_seeded_workload_are_pinned(name: str) -> None:
    assert digest(requests(name)) == PINNED[name]


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_token_id_is_in_the_vocabulary(name: str) -> None:
    for salt in ("measured", "warmup"):
        assert all(LO <= t < HI for s in requests(name, salt=salt).specs for t in s.prompt_ids)


def test_a_conversation_is_numbered_only_when_it_has_turns() -> None:
    one = point_requests(step(shape=Shape(input=10, output=2)), 3, "m").specs
    assert [(s.conversation, s.turn, s.think_s) for s in one] == [(-1, 0, 0.0)] * 3
    two = point_requests(step(shape=Shape(input=10, output=2, turns=2, think_s=0.5)), 4, "m").specs
    assert [(s.conversation, s.turn, s.think_s) for s in two] == [(0, 0, 0.0), (0, 1, 0.5), (1, 0, 0.0), (1, 1, 0.5)]


def test_turns_grow_by_the_reply_and_the_new_message_when_nothing_binds() -> None:
    specs = point_requests(step(shape=Shape(input=30, output=12, turns=3)), 3, "m").specs
    assert [len(s.prompt_ids) for s in specs] == [30, 72, 114] and {s.max_tokens for s in specs} == {12}
    assert specs[1].prompt_ids[:30] == specs[0].prompt_ids and specs[2].prompt_ids[:72] == specs[1].prompt_ids


def test_the_model_length_bounds_every_turn_and_leaves_each_later_turn_room() -> None:
    specs = requests("turns").specs
    # the third turn gets what is left: 100 - 84 spent = 15 new tokens and a 1-token reply
    assert [(len(s.prompt_ids), s.max_tokens) for s in specs[:3]] == [(30, 12), (72, 12), (99, 1)]
    assert all(len(s.prompt_ids) + s.max_tokens <= 100 for s in specs)
    tight = point_requests(step(shape=Shape(input=30, output=12, turns=3, max_len=8)), 3, "m").specs
    assert [(len(s.prompt_ids), s.max_tokens) for s in tight] == [(3, 1), (5, 1), (7, 1)]  # 2 kept for each later turn


def test_a_prompt_keeps_its_template_and_one_token_of_its_own() -> None:
    shape = Shape(input=Uniform(dist="uniform", min=1, max=4), output=2, templates=2)
    specs = point_requests(step(shape=shape, prefix_len=8), 6, "m").specs
    assert {len(s.prompt_ids) for s in specs} == {9}  # floor: the 8-token template + 1
    assert specs[0].prompt_ids[:8] == specs[2].prompt_ids[:8] != specs[1].prompt_ids[:8]
    assert len({s.prompt_ids for s in specs}) == 6


def test_trace_rows_are_cut_to_the_model_length() -> None:
    specs = requests("trace", count=4).specs
    assert [(len(s.prompt_ids), s.max_tokens) for s in specs] == [(700, 5), (600, 9), (1023, 1), (20, 2)]
    assert specs[0].prompt_ids[:512] == specs[1].prompt_ids[:512] == specs[2].prompt_ids[:512]  # hash id 1
    assert specs[0].prompt_ids[512:700] == specs[2].prompt_ids[512:700] != specs[1].prompt_ids[512:600]


def test_trace_offsets_cycle_one_mean_gap_after_the_last_row_and_keep_the_rate() -> None:
    got = trace_offsets(ROWS, 6, 1.0)  # raw: 0, 40, 45, 300, then 400 (300 + 100), 440
    assert got == pytest.approx([5 * t / 440 for t in (0, 40, 45, 300, 400, 440)])
    assert trace_offsets(ROWS, 2, 4.0) == pytest.approx([0.0, 0.25])
    assert trace_offsets(ROWS, 1, 4.0) == [0.0]
    flat = [TraceRow(timestamp_ms=7, input_length=5, output_length=1, hash_ids=(1,))] * 3
    assert trace_offsets(flat, 3, 2.0) == [0.0, 0.5, 1.0]  # no shape to keep: even spacing at the rate
