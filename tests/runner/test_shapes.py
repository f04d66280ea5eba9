"""runner.load.shapes: a point's requests from its shape, token-exact and seeded; trace rows and arrivals;
the expected prefix-hit rate of a workload's own structure."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from base.errors import EngineError
from compiler.trace import TraceRow
from compiler.workload import Histogram, LogNormal, Normal, Shape, TraceRef, Uniform
from runner.load.shapes import draw_length, expected_hit_rate, point_requests, trace_offsets
from runner.load.trace_file import trace_rows
from runner.load.workload import RequestSpec, make_prompts
from tests.runner.steps import step


def shaped(shape: Shape, **over: Any) -> Any:
    return step(shape=shape, **over)


def test_classic_point_is_exactly_what_make_prompts_gives() -> None:
    p = step(input_len=40, output_len=5, prefix_len=8, prompt_seed=3)
    got = point_requests(p, 6, "measured")
    want = make_prompts(6, 40, vocab_lo=10, vocab_hi=1000, seed=3, prefix_len=8, salt="measured")
    assert [s.prompt_ids for s in got.specs] == want
    assert {s.max_tokens for s in got.specs} == {5} and got.offsets is None


@pytest.mark.parametrize("shape", [
    Shape(input=Uniform(dist="uniform", min=20, max=90), output=Normal(dist="normal", mean=9, sd=3, min=1)),
    Shape(input=50, output=6, templates=3),
    Shape(input=30, output=LogNormal(dist="lognormal", mean=8, sd=4), turns=3, think_s=0.25),
])
def test_same_seed_same_bytes_and_salt_separates(shape: Shape) -> None:
    p = shaped(shape, prefix_len=8 if shape.templates > 1 else 0)
    one, two = point_requests(p, 12, "measured"), point_requests(p, 12, "measured")
    assert one == two
    warm = point_requests(p, 12, "warmup")
    measured_blocks = {s.prompt_ids[:16] for s in one.specs}
    assert not measured_blocks & {s.prompt_ids[:16] for s in warm.specs}  # warmup shares no prefix
    other_seed = point_requests(step(shape=shape, prompt_seed=2, prefix_len=p.prefix_len), 12, "measured")
    assert other_seed.specs != one.specs


def test_uniform_lengths_moments_within_their_standard_error() -> None:
    n = 4000
    p = shaped(Shape(input=Uniform(dist="uniform", min=10, max=110), output=Uniform(dist="uniform", min=1, max=9)))
    specs = point_requests(p, n, "measured").specs
    lengths = [len(s.prompt_ids) for s in specs]
    assert min(lengths) == 10 and max(lengths) == 110
    sd = math.sqrt((101**2 - 1) / 12)
    assert abs(statistics.mean(lengths) - 60) < 4 * sd / math.sqrt(n)
    assert {s.max_tokens for s in specs} == set(range(1, 10))


@pytest.mark.parametrize("dist", [Normal(dist="normal", mean=300, sd=40), LogNormal(dist="lognormal", mean=300, sd=90)])
def test_normal_and_lognormal_mean_and_sd_are_of_the_lengths(dist: Any) -> None:
    import random
    rng = random.Random(5)
    n = 6000
    draws = [draw_length(dist, rng) for _ in range(n)]
    assert abs(statistics.mean(draws) - dist.mean) < 4 * dist.sd / math.sqrt(n)
    # the sample sd's standard error is about sd / sqrt(2n) for a normal; lognormal tails need more room
    assert abs(statistics.stdev(draws) - dist.sd) < 8 * dist.sd / math.sqrt(2 * n)


def test_clipping_to_min_and_max_and_histogram_weights() -> None:
    import random
    rng = random.Random(1)
    clipped = [draw_length(Normal(dist="normal", mean=50, sd=100, min=20, max=60), rng) for _ in range(500)]
    assert min(clipped) == 20 and max(clipped) == 60
    hist = Histogram(dist="histogram", values=(5, 7), weights=(3.0, 1.0))
    draws = [draw_length(hist, rng) for _ in range(4000)]
    assert set(draws) == {5, 7}
    share = draws.count(5) / len(draws)
    assert abs(share - 0.75) < 4 * math.sqrt(0.75 * 0.25 / len(draws))
    never = Histogram(dist="histogram", values=(5, 7), weights=(1.0, 0.0))
    assert {draw_length(never, rng) for _ in range(200)} == {5}


def test_lengths_are_clipped_to_max_model_len() -> None:
    p = shaped(Shape(input=Uniform(dist="uniform", min=90, max=200), output=50, max_len=120))
    for s in point_requests(p, 50, "measured").specs:
        assert len(s.prompt_ids) <= 119 and len(s.prompt_ids) + s.max_tokens <= 120 and s.max_tokens >= 1


def test_templates_are_used_in_turn() -> None:
    p = shaped(Shape(input=40, output=4, templates=3), prefix_len=16)
    specs = point_requests(p, 7, "measured").specs
    heads = [s.prompt_ids[:16] for s in specs]
    assert len(set(heads)) == 3 and heads[0] == heads[3] == heads[6] and heads[1] == heads[4]
    assert len({s.prompt_ids[16] for s in specs}) == 7  # each request's own part starts differently
    assert all(len(s.prompt_ids) == 40 for s in specs)


def test_a_conversation_grows_by_the_reply_and_a_new_message() -> None:
    p = shaped(Shape(input=20, output=Uniform(dist="uniform", min=3, max=9), turns=3, think_s=0.5))
    specs = point_requests(p, 7, "measured").specs  # rounded up to 3 whole conversations
    assert len(specs) == 9
    assert [(s.conversation, s.turn) for s in specs[:4]] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert [s.think_s for s in specs[:3]] == [0.0, 0.5, 0.5]
    first, second, third = specs[:3]
    assert len(first.prompt_ids) == 20
    assert second.prompt_ids[:20] == first.prompt_ids
    assert len(second.prompt_ids) == 20 + first.max_tokens + 20
    assert third.prompt_ids[:len(second.prompt_ids)] == second.prompt_ids
    assert specs[3].prompt_ids[:4] != first.prompt_ids[:4]


def test_a_conversation_stays_within_max_model_len() -> None:
    p = shaped(Shape(input=Uniform(dist="uniform", min=10, max=60), output=30, turns=4, max_len=200))
    specs = point_requests(p, 40, "measured").specs
    for c in range(10):
        last = specs[4 * c + 3]
        assert len(last.prompt_ids) + last.max_tokens <= 200


ROWS = [
    TraceRow(0.0, 600, 5, (1, 2)),
    TraceRow(10.0, 520, 3, (1, 7)),
    TraceRow(1010.0, 100, 4, (9,)),
]


def test_trace_rows_share_their_hash_blocks_and_cycle() -> None:
    p = shaped(Shape(trace=TraceRef(path="x", sha256="0", rows=3)), vocab_hi=30000)
    specs = point_requests(p, 5, "measured", trace_rows=ROWS).specs
    assert [len(s.prompt_ids) for s in specs] == [600, 520, 100, 600, 520]
    assert [s.max_tokens for s in specs] == [5, 3, 4, 5, 3]
    assert specs[0].prompt_ids[:512] == specs[1].prompt_ids[:512]  # hash id 1 in both
    assert specs[0].prompt_ids[512:520] != specs[1].prompt_ids[512:520]
    assert specs[3] == specs[0]
    warm = point_requests(p, 1, "warmup", trace_rows=ROWS).specs
    assert warm[0].prompt_ids[:16] != specs[0].prompt_ids[:16]
    with pytest.raises(ValueError, match="give its rows"):
        point_requests(p, 2, "measured")


def test_trace_arrivals_keep_the_shape_at_the_rungs_mean_rate() -> None:
    offsets = trace_offsets(ROWS, 3, rate_rps=2.0)
    assert offsets[0] == 0.0 and offsets[-1] == pytest.approx(1.0)  # 2 gaps at 2/s
    assert offsets[1] / offsets[2] == pytest.approx(10 / 1010)  # the burst kept
    cycled = trace_offsets(ROWS, 5, rate_rps=1.0)
    assert cycled[-1] == pytest.approx(4.0) and cycled == sorted(cycled)
    assert cycled[3] > cycled[2]  # the next cycle starts a mean gap after the last row
    assert trace_offsets([TraceRow(5.0, 1, 1, (1,))] * 3, 3, 4.0) == [0.0, 0.25, 0.5]
    p = shaped(Shape(trace=TraceRef(path="x", sha256="0", rows=3), trace_arrivals=True), concurrency=None,
               rate_rps=2.0, arrival="trace")
    assert point_requests(p, 3, "measured", trace_rows=ROWS).offsets == offsets


def spec(ids: list[int]) -> RequestSpec:
    return RequestSpec(tuple(ids), 1)


def test_expected_hit_rate_edges() -> None:
    a = list(range(32))
    assert expected_hit_rate([], 16) == 0.0
    assert expected_hit_rate([spec(a)], 16) == 0.0
    # the same 32 tokens again: only the first block may hit (vLLM computes the last prompt token)
    assert expected_hit_rate([spec(a), spec(a)], 16) == pytest.approx(16 / 64)
    # 33 tokens: both full blocks hit
    assert expected_hit_rate([spec(a), spec(a + [99])], 16) == pytest.approx(32 / 65)
    # a differing first block stops the chain even where a later block is the same
    b = [1000] + a[1:]
    assert expected_hit_rate([spec(a + [5]), spec(b + [5])], 16) == 0.0
    # 15 shared tokens are less than a block: no hit
    assert expected_hit_rate([spec(a[:15] + [7] * 20), spec(a[:15] + [8] * 20)], 16) == 0.0
    assert expected_hit_rate([spec(a[:16] + [7] * 20), spec(a[:16] + [8] * 20)], 16) == pytest.approx(16 / 72)


def test_changed_trace_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 3, "output_length": 2, "hash_ids": [1]}\n')
    import hashlib
    sha = hashlib.sha256(f.read_bytes()).hexdigest()
    p = shaped(Shape(trace=TraceRef(path=str(f), sha256=sha, rows=1)))
    assert trace_rows(p) == [TraceRow(0.0, 3, 2, (1,))]
    assert trace_rows(step()) is None
    f.write_text('{"timestamp": 0, "input_length": 4, "output_length": 2, "hash_ids": [1]}\n')
    with pytest.raises(EngineError, match="changed since the plan was compiled"):
        trace_rows(p)
    f.unlink()
    with pytest.raises(EngineError, match="no such file"):
        trace_rows(p)
