"""The step-time model's terms at their edges, the scheduler replay, and the fit's recovery of known
coefficients."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from compiler import stepfit, stepreplay
from compiler.modelconfig import load_model
from compiler.stepcost import Card, Coefficients, EngineShape, decode_step_s, overlap_terms, scale, step_work
from compiler.stepfit import START, Observation, fit, fit_at
from compiler.stepreplay import StepLoad, cache_hit_tokens, evaluate, predict, replay

MODELS = Path(__file__).resolve().parents[2] / "models"
QWEN8B = load_model(MODELS / "qwen3-8b")
MOE = load_model(MODELS / "deepseek-v2-lite")
CARD = Card(4.2e12, 6.5e14)
COEF = Coefficients(step_s=1.5e-3, seq_s=2e-5, mem=0.9, flop=1.1, request_s=0.012, admit_s=0.003)
GRAPHS = EngineShape()


def step_terms(shape, engine, chunks):
    """A step's features with streaming and compute added (overlap p = 1)."""
    return overlap_terms(step_work(shape, engine, chunks), None, None)


def test_batch_1_vs_64_dense():
    one = step_terms(QWEN8B, GRAPHS, [(1, 256, True)])
    many = step_terms(QWEN8B, GRAPHS, [(1, 256, True)] * 64)
    kv = QWEN8B.kv_bytes_per_token("auto") * 257
    assert one[:2] == (1.0, 1.0) and many[:2] == (1.0, 64.0)
    # Dense weights are read once per step whatever the batch; only the KV grows with it.
    assert many[2] - one[2] == pytest.approx(63 * kv)
    assert many[3] == pytest.approx(64 * one[3])
    assert one[2] == pytest.approx(QWEN8B.decode_weight_bytes(1) + kv)


def test_moe_union_grows_sublinearly():
    one = step_terms(MOE, GRAPHS, [(1, 0, True)])
    many = step_terms(MOE, GRAPHS, [(1, 0, True)] * 64)
    kv = MOE.kv_bytes_per_token("auto")
    assert many[2] - 64 * kv == pytest.approx(MOE.decode_weight_bytes(64))
    assert one[2] - kv == pytest.approx(MOE.decode_weight_bytes(1))
    assert 1.5 < (many[2] - 64 * kv) / (one[2] - kv) < 64 / 4


def test_graphs_vs_eager_and_argv():
    eager = EngineShape(budget_tokens=2048, enforce_eager=True)
    assert eager.enforce_eager and eager.budget_tokens == 2048
    assert not GRAPHS.enforce_eager and GRAPHS.budget_tokens == 8192
    fast = decode_step_s(QWEN8B, GRAPHS, CARD, COEF, 1, 256)
    slow = decode_step_s(QWEN8B, eager, CARD, Coefficients(0.02, 2e-5, 0.9, 1.1, 0.012, 0.003), 1, 256)
    assert slow - fast == pytest.approx(0.02 - 1.5e-3)


def test_bad_inputs_fail():
    with pytest.raises(ValueError, match="bandwidth_Bps"):
        Card(0, 1e14)
    with pytest.raises(ValueError, match="flops_per_s"):
        Card(1e12, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="step_s"):
        Coefficients(-1.0, 0, 1, 1, 0, 0)
    with pytest.raises(ValueError, match="cached_tokens"):
        StepLoad(1, 2, 128, 8, (0,))
    with pytest.raises(ValueError, match="concurrency"):
        StepLoad(0, 2, 128, 8)
    with pytest.raises(ValueError, match="batch"):
        decode_step_s(QWEN8B, GRAPHS, CARD, COEF, 0, 10)
    with pytest.raises(ValueError, match="zero-length"):
        predict(QWEN8B, StepLoad(1, 1, 16, 4), GRAPHS, CARD, Coefficients(0, 0, 0, 0, 0, 0))
    with pytest.raises(ValueError, match="nothing to fit"):
        fit([])


def test_replay_c1_one_token_per_step():
    point = replay(QWEN8B, StepLoad(1, 3, 128, 8), GRAPHS, CARD, COEF)
    assert point.steps == 3 * 8  # one prefill step and seven decode steps per request
    assert point.tpot[0] == pytest.approx(1.0) and point.tpot[1] == pytest.approx(1.0)
    # Each request is admitted once (admit_s) and its last token travels once (request_s).
    assert point.window[5] == 3.0 and point.window[4] == 3.0
    assert point.burst == (0.0,) * 6  # one slot: no burst
    single = predict(QWEN8B, StepLoad(1, 2, 128, 1), GRAPHS, CARD, COEF)
    assert single.tpot_s is None and single.ttft_s > COEF.request_s + COEF.admit_s


def test_prefill_whole_or_chunked():
    monolithic = EngineShape(budget_tokens=4096, chunked_prefill=False)
    chunked = EngineShape(budget_tokens=4096)
    assert not monolithic.chunked_prefill and chunked.chunked_prefill
    load = StepLoad(3, 3, 2500, 2)
    # Chunked: 2500 + 1596 | decode, 904 + 2500 | decode, decode. Whole prompts only: the second waits a
    # step for room, the third another: 2500 | decode + 2500 | decode + 2500 | decode.
    coef = replace(COEF, admit_s=0.0)  # all three schedulable at the first step
    assert replay(QWEN8B, load, chunked, CARD, coef).steps == 3
    assert replay(QWEN8B, load, monolithic, CARD, coef).steps == 4


def test_decode_runs_in_bulk_equal_step_by_step(monkeypatch):
    # A run of pure decode steps is replayed in bulk; one step at a time gives the same features.
    load = StepLoad(64, 160, 128, 96)
    coef = replace(COEF, overlap=2.0)
    bulk = replay(QWEN8B, load, GRAPHS, CARD, coef)
    run = stepreplay._decode_run
    monkeypatch.setattr(stepreplay, "_decode_run", lambda *a: run(*a[:5], 1, *a[6:]))
    single = replay(QWEN8B, load, GRAPHS, CARD, coef)
    assert bulk.steps == single.steps
    for name in ("tpot", "ttft", "window", "burst"):
        assert getattr(bulk, name) == pytest.approx(getattr(single, name), rel=1e-12), name


def test_admission_queue_holds_the_opening_burst_until_it_is_all_admitted():
    warm = StepLoad(64, 64, 1024, 32, (cache_hit_tokens(1024),) * 64)
    at_once = replay(QWEN8B, warm, GRAPHS, CARD, replace(COEF, admit_s=0.0))
    queued = replay(QWEN8B, warm, GRAPHS, CARD, COEF)
    # Without a queue the cached burst is one prefill step; with one, 64 admissions of 3 ms take 192 ms and
    # the burst reaches the engine together after the last of them: still one prefill step (handed over one
    # at a time, the first requests would run many smaller steps), every first token after all 64.
    assert at_once.steps == queued.steps == 32
    burst_s = sum(t * c for t, c in zip(scale(queued.burst, CARD), COEF.as_terms(), strict=True))
    assert burst_s > 64 * COEF.admit_s  # the last first token follows all 64 admissions
    assert evaluate(queued, CARD, COEF).ttft_s > 64 * COEF.admit_s  # so does every first token
    # Tokens made while the front end admits reach the client when it is done: the first requests'
    # first tokens are held to the end of the burst, so their TTFT grows and their TPOT shrinks.
    assert queued.ttft[5] > 55.0  # mean TTFT carries nearly the whole queue (64 admissions)
    queued_tpot, at_once_tpot = evaluate(queued, CARD, COEF).tpot_s, evaluate(at_once, CARD, COEF).tpot_s
    assert queued_tpot is not None and at_once_tpot is not None and queued_tpot < at_once_tpot * 1.2


def test_budget_queues_a_burst_and_cache_hits_skip_prefill():
    coef = replace(COEF, admit_s=0.0)
    cold = replay(QWEN8B, StepLoad(16, 16, 1024, 4), GRAPHS, CARD, coef)
    warm = replay(QWEN8B, StepLoad(16, 16, 1024, 4, (cache_hit_tokens(1024),) * 16), GRAPHS, CARD, coef)
    # 8 prompts fit the 8192-token budget; the next step's 8 decode tokens leave the 16th prompt a
    # chunk of 1016, finished the step after: last first token at step 2, last end at step 5.
    assert cold.steps == 6
    assert warm.steps == 4 and warm.ttft[3] < cold.ttft[3] / 10
    assert cache_hit_tokens(1024) == 1008 and cache_hit_tokens(1) == 0 and cache_hit_tokens(16) == 0


def _synthetic(coef):
    loads = [StepLoad(c, r, i, o, cached) for c, r, i, o, cached in [
        (1, 4, 128, 64, ()), (8, 16, 128, 64, ()), (32, 64, 1024, 32, ()), (64, 64, 128, 128, ()),
        (128, 128, 1024, 16, (cache_hit_tokens(1024),) * 128), (32, 32, 1024, 64, (cache_hit_tokens(1024),) * 32)]]
    obs = []
    for load in loads:
        terms = replay(QWEN8B, load, GRAPHS, CARD, coef)
        pr = evaluate(terms, CARD, coef)
        burst = sum(t * c for t, c in zip(scale(terms.burst, CARD), coef.as_terms(), strict=True))
        obs.append(Observation(QWEN8B, load, GRAPHS, CARD, pr.tpot_s, pr.ttft_s, pr.window_s, burst or None))
    return obs


def test_fit_converges_to_known_coefficients():
    obs = _synthetic(COEF)
    got = fit(obs, prior=0.0)
    # Replay-then-fit from the default start reaches the coefficients that made the data.
    assert got.changes[-1] <= stepfit.TOLERANCE and got.iterations < stepfit.MAX_ITERATIONS
    for name in ("step_s", "seq_s", "mem", "flop", "request_s", "admit_s"):
        assert getattr(got.coefficients, name) == pytest.approx(getattr(COEF, name), rel=0.02, abs=1e-6), name
    # One model size cannot separate the fixed step cost from weight streaming: the default prior
    # then moves mem toward the calibrated ceiling (1.0) and step_s absorbs the rest; predictions hold.
    pulled = fit(obs).coefficients
    assert pulled.mem > COEF.mem and pulled.step_s < COEF.step_s
    for ob in obs:
        pr = predict(QWEN8B, ob.load, GRAPHS, CARD, pulled)
        assert pr.tpot_s == pytest.approx(ob.tpot_s, rel=0.03)
        assert pr.window_s == pytest.approx(ob.window_s, rel=0.03)


def test_fit_searches_admit_s_on_a_grid_then_frees_it():
    """admit_s decides which step each request joins, so `fit` holds it at each grid value (fit_at
    keeps it there exactly), then frees it from the best."""
    truth = replace(COEF, admit_s=6e-3)
    obs = _synthetic(truth)
    held = fit_at(obs, 0.0, replace(START, admit_s=2e-3), admit_s=2e-3).coefficients
    assert held.admit_s == 2e-3
    on_grid = fit(obs, prior=0.0, admits=(2e-3, 6e-3)).coefficients
    assert on_grid.admit_s == pytest.approx(6e-3, rel=0.02)
    assert on_grid.request_s == pytest.approx(truth.request_s, rel=0.02)
    # Off the grid, freeing admit_s moves it from the best grid value (4 ms) toward the truth.
    off_grid = fit(obs, prior=0.0, admits=(2e-3, 4e-3)).coefficients
    assert 4e-3 < off_grid.admit_s < 6.1e-3


def test_fit_that_does_not_settle_fails(monkeypatch):
    monkeypatch.setattr(stepfit, "MAX_ITERATIONS", 1)
    with pytest.raises(ValueError, match="did not converge"):
        fit(_synthetic(COEF), prior=0.0)


def test_overlap_joins_streaming_and_compute():
    work = step_work(QWEN8B, GRAPHS, [(1, 256, True)] * 128)
    # The matmuls stream the weights and compute 2 FLOPs per parameter and token; the attention kernel
    # streams the KV cache and computes attention.
    assert work[2] == pytest.approx(QWEN8B.decode_weight_bytes(128))
    assert work[4] == pytest.approx(128 * 257 * QWEN8B.kv_bytes_per_token("auto"))
    assert work[3] + work[5] == pytest.approx(step_terms(QWEN8B, GRAPHS, [(1, 256, True)] * 128)[3])
    mw, fm = COEF.mem * work[2] / CARD.bandwidth_Bps, COEF.flop * work[3] / CARD.flops_per_s
    mk, fa = COEF.mem * work[4] / CARD.bandwidth_Bps, COEF.flop * work[5] / CARD.flops_per_s

    def seconds(p):
        coef = replace(COEF, overlap=p)
        return sum(t * c for t, c in zip(scale(overlap_terms(work, CARD, coef), CARD),
                                         coef.as_terms(), strict=True))

    fixed = COEF.step_s + COEF.seq_s * 128
    assert seconds(1.0) == pytest.approx(fixed + mw + fm + mk + fa)  # p = 1: everything adds
    # Each kernel joins its own streaming and compute; the two kernels run one after the other.
    norm = (mw * mw + fm * fm) ** 0.5 + (mk * mk + fa * fa) ** 0.5
    assert seconds(2.0) == pytest.approx(fixed + norm)  # reweighted features are exact
    assert fixed + max(mw, fm) + max(mk, fa) < seconds(8.0) < fixed + 1.1 * (max(mw, fm) + max(mk, fa))
    with pytest.raises(ValueError, match="overlap"):
        replace(COEF, overlap=0.5)


def test_fit_chooses_the_overlap_that_made_the_data():
    truth = replace(COEF, overlap=4.0)
    got = fit(_synthetic(truth), prior=0.0, overlaps=(1.0, 4.0))
    assert got.coefficients.overlap == 4.0
    assert got.coefficients.mem == pytest.approx(truth.mem, rel=0.05)


def test_a_whole_prompt_larger_than_the_budget_fails_not_hangs():
    monolithic = EngineShape(budget_tokens=2048, chunked_prefill=False)
    with pytest.raises(ValueError, match="never fits the budget of 2048"):
        replay(QWEN8B, StepLoad(1, 1, 3000, 4), monolithic, CARD, COEF)
    # Chunked, the same prompt takes two steps and then decodes.
    assert replay(QWEN8B, StepLoad(1, 1, 3000, 4), EngineShape(budget_tokens=2048), CARD, COEF).steps == 2 + 3


@pytest.mark.parametrize(("load", "engine", "steps"), [
    # two slots, admitted together: one step prefills both prompts, then each decode step runs both
    # (a decoding sequence's context counts the tokens sampled so far)
    (StepLoad(2, 2, 32, 3), GRAPHS,
     [[(32, 0, True)] * 2, [(1, 33, True)] * 2, [(1, 34, True)] * 2]),
    # a 40-token budget: the second prompt is chunked (8 tokens, nothing sampled), finished beside the
    # first one's decode step, then decoded alone
    (StepLoad(2, 2, 32, 2), EngineShape(budget_tokens=40),
     [[(32, 0, True), (8, 0, False)], [(1, 33, True), (24, 8, True)], [(1, 33, True)]]),
    # whole prompts only: the second waits for a step with room
    (StepLoad(2, 2, 32, 2), EngineShape(budget_tokens=40, chunked_prefill=False),
     [[(32, 0, True)], [(1, 33, True), (32, 0, True)], [(1, 33, True)]]),
    # a cached prompt prefills only its uncached tokens over the cached context
    (StepLoad(1, 1, 64, 2, (48,)), GRAPHS, [[(16, 48, True)], [(1, 65, True)]]),
])
def test_a_replay_is_exactly_the_sum_of_its_steps(load, engine, steps):
    coef = replace(COEF, admit_s=0.0)  # every request schedulable at the first step
    point = replay(QWEN8B, load, engine, CARD, coef)
    expected = [0.0] * 6
    for chunks in steps:
        for j, v in enumerate(overlap_terms(step_work(QWEN8B, engine, chunks), None, None)):
            expected[j] += v
    expected[4] += 1.0  # the last request's last token reaching the client
    # no admit_s: with it at 0 every request is admitted at time 0, before the first step, off the engine's path
    assert point.steps == len(steps)
    assert point.window == pytest.approx(tuple(expected), rel=1e-12)


def test_async_scheduling_makes_a_request_arriving_mid_step_wait_one_step_more():
    """Under async scheduling (vLLM's default on GPUs) step k + 1 is scheduled when step k starts: a request the
    engine receives while it runs waits for the step after the next. An idle engine schedules it at once."""
    sync = replace(GRAPHS, async_scheduling=False)
    assert GRAPHS.async_scheduling and not sync.async_scheduling
    alone = StepLoad(concurrency=1, requests=4, input_len=128, output_len=256)  # each request finds the engine idle
    assert predict(QWEN8B, alone, GRAPHS, CARD, COEF) == predict(QWEN8B, alone, sync, CARD, COEF)
    busy = StepLoad(concurrency=8, requests=32, input_len=128, output_len=256)  # the next ones arrive mid-step
    later = predict(QWEN8B, busy, GRAPHS, CARD, COEF).ttft_s - predict(QWEN8B, busy, sync, CARD, COEF).ttft_s
    assert 0.2 * decode_step_s(QWEN8B, GRAPHS, CARD, COEF, 8, 256) < later < decode_step_s(QWEN8B, GRAPHS, CARD, COEF, 8, 256)


def test_a_launch_without_async_scheduling_is_replayed_without_it():
    from compiler.plan import Engine

    assert Engine.from_argv(["serve", "m"]).async_scheduling
    assert not Engine.from_argv(["serve", "m", "--no-async-scheduling"]).async_scheduling
