"""Conversations in the scheduler replay: per-request prompt lengths, turns sent in order by one slot, the
user's think time between them as seconds outside the coefficients, and the fit that subtracts them."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from compiler.modelconfig import load_model
from compiler.stepcost import Card, Coefficients, EngineShape, dot, scale
from compiler.stepfit import Observation, fit, fit_linear
from compiler.stepreplay import StepLoad, cache_hit_tokens, evaluate, predict, replay

MODELS = Path(__file__).resolve().parents[2] / "models"
QWEN8B = load_model(MODELS / "qwen3-8b")
CARD = Card(4.2e12, 6.5e14)
COEF = Coefficients(step_s=1.5e-3, seq_s=2e-5, mem=0.9, flop=1.1, request_s=0.012, admit_s=0.003)
GRAPHS = EngineShape()
LENS = (256, 576, 896, 1216)  # four turns of 256 user tokens after 64-token replies
HITS = (0, 256, 576, 896)  # each turn hits the one before's prompt (whole 16-token blocks)


def _talk(concurrency: int, conversations: int, think: float, hits: bool = True) -> StepLoad:
    return StepLoad(concurrency, 4 * conversations, 256, 64, HITS * conversations if hits else (),
                    LENS * conversations, 4, think)


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"input_lens": (256,)}, "input_lens has 1 entries for 4 requests"),
    ({"input_lens": (256, 0, 256, 256)}, "input_lens must be at least 1, got 0"),
    ({"turns": 3}, "4 requests are not whole conversations of 3 turns"),
    ({"turns": 0}, "load turns must be at least 1, got 0"),
    ({"turns": 2, "think_s": -0.5}, "think_s must be >= 0 and finite, got -0.5"),
    ({"turns": 2, "think_s": math.inf}, "think_s must be >= 0 and finite, got inf"),
])
def test_a_bad_conversation_load_is_refused(kwargs: dict[str, object], said: str) -> None:
    with pytest.raises(ValueError) as caught:
        StepLoad(1, 4, 256, 64, **kwargs)  # type: ignore[arg-type]
    assert str(caught.value) == said


def test_the_edges_of_a_conversation_load_are_accepted() -> None:
    assert StepLoad(1, 4, 256, 64, turns=4, think_s=0.0).prompt(3) == 256  # no input_lens: every prompt
    assert StepLoad(1, 2, 256, 64, input_lens=(1, 9), turns=2).prompt(1) == 9
    assert StepLoad(1, 1, 1, 1, turns=1).turns == 1


def test_one_slot_without_think_replays_the_turns_as_single_requests_in_order() -> None:
    talk = replay(QWEN8B, _talk(1, 2, 0.0), GRAPHS, CARD, COEF)
    single = replay(QWEN8B, StepLoad(1, 8, 256, 64, HITS * 2, LENS * 2), GRAPHS, CARD, COEF)
    assert talk == single
    assert talk.window_fixed == talk.ttft_fixed == talk.tpot_fixed == talk.burst_fixed == 0.0


def test_think_time_lengthens_the_window_by_every_pause_one_slot_waits() -> None:
    quick = replay(QWEN8B, _talk(1, 2, 0.0), GRAPHS, CARD, COEF)
    slow = replay(QWEN8B, _talk(1, 2, 0.5), GRAPHS, CARD, COEF)
    # One slot, two conversations of four turns: three pauses each, the engine idle through them.
    assert slow.window_fixed == pytest.approx(3.0)
    assert slow.window == pytest.approx(quick.window)  # the same steps and sends, shifted
    assert slow.ttft_fixed == pytest.approx(0.0) and slow.tpot_fixed == pytest.approx(0.0)
    assert evaluate(slow, CARD, COEF).window_s == pytest.approx(evaluate(quick, CARD, COEF).window_s + 3.0)
    assert evaluate(slow, CARD, COEF).ttft_s == pytest.approx(evaluate(quick, CARD, COEF).ttft_s)


def test_a_thinking_slot_leaves_the_engine_to_the_others() -> None:
    """Two slots: while one conversation thinks the other runs, so the pauses hide partly behind its
    steps; a turn is sent only after its own conversation's previous turn and pause."""
    alone = evaluate(replay(QWEN8B, _talk(1, 4, 0.05), GRAPHS, CARD, COEF), CARD, COEF)
    shared = evaluate(replay(QWEN8B, _talk(2, 4, 0.05), GRAPHS, CARD, COEF), CARD, COEF)
    assert shared.window_s < alone.window_s
    assert shared.window_s > alone.window_s / 2 + 0.05  # two conversations a slot, at least their pauses
    assert shared.output_throughput > alone.output_throughput


def test_a_turn_hits_the_turn_before_it_and_prefills_the_rest() -> None:
    cold = evaluate(replay(QWEN8B, _talk(4, 4, 0.0, hits=False), GRAPHS, CARD, COEF), CARD, COEF)
    warm = evaluate(replay(QWEN8B, _talk(4, 4, 0.0), GRAPHS, CARD, COEF), CARD, COEF)
    assert warm.ttft_s < cold.ttft_s and warm.window_s < cold.window_s
    off = evaluate(replay(QWEN8B, _talk(4, 4, 0.0), replace(GRAPHS, prefix_caching=False), CARD, COEF), CARD, COEF)
    assert off == cold  # the hits count only with prefix caching on
    assert [cache_hit_tokens(n + 1) for n in (0, *LENS[:3])] == list(HITS)


def test_the_fit_subtracts_the_think_time_and_recovers_the_coefficients() -> None:
    loads = [_talk(1, 2, 0.5), _talk(8, 8, 0.25), _talk(16, 16, 1.0), StepLoad(4, 8, 128, 64),
             StepLoad(32, 64, 1024, 32), StepLoad(64, 64, 128, 128)]
    obs = []
    for load in loads:
        terms = replay(QWEN8B, load, GRAPHS, CARD, COEF)
        pr = evaluate(terms, CARD, COEF)
        burst = dot(scale(terms.burst, CARD), COEF) + terms.burst_fixed if any(terms.burst) else None
        obs.append(Observation(QWEN8B, load, GRAPHS, CARD, pr.tpot_s, pr.ttft_s, pr.window_s, burst))
    points = [replay(QWEN8B, ob.load, GRAPHS, CARD, COEF) for ob in obs]
    linear = fit_linear(obs, points, prior=0.0, admit_s=COEF.admit_s)
    for name in ("step_s", "seq_s", "mem", "flop", "request_s"):
        assert getattr(linear, name) == pytest.approx(getattr(COEF, name), rel=1e-6, abs=1e-12), name
    got = fit(obs, prior=0.0).coefficients
    for ob in obs:  # the full fit predicts the conversations' windows, think time included
        assert predict(QWEN8B, ob.load, GRAPHS, CARD, got).window_s == pytest.approx(ob.window_s, rel=0.02)


def test_a_conversation_replays_step_by_step_as_its_turns_prefill_and_decode() -> None:
    """One slot, one conversation of two turns, caching on: the replay's window features are exactly the
    sum of its steps' (each turn one prefill step of its uncached tokens over its cached context, then a
    decode step per further token over the growing context), plus a request_s and an admit_s per turn."""
    from compiler.stepcost import overlap_terms, step_work

    load = StepLoad(1, 2, 32, 4, (0, 32), (32, 68), 2, 0.25)
    point = replay(QWEN8B, load, GRAPHS, CARD, COEF)
    steps = []
    for cached, prompt in ((0, 32), (32, 68)):
        steps.append([(prompt - cached, cached, True)])
        steps += [[(1, prompt + 1 + k, True)] for k in range(3)]  # the context counts each sampled token
    total = [0.0] * 6
    for chunks in steps:
        for j, v in enumerate(overlap_terms(step_work(QWEN8B, GRAPHS, chunks), None, None)):
            total[j] += v
    total[4] += 2.0  # request_s: the first turn's last token reaching the client, then the second's
    total[5] += 2.0  # admit_s: each turn admitted once
    assert point.steps == 8
    assert point.window == pytest.approx(tuple(total), rel=1e-12)
    assert point.window_fixed == pytest.approx(0.25) and point.ttft_fixed == pytest.approx(0.0)
