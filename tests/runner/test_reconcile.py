"""Reconciliation of the server's counters with the client's records: pure cases, then the real
CPU vLLM server (clean at two concurrencies, another client on the server)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runner import metrics
from runner.loadgen import RequestSpec, make_prompts, run_load
from runner.reconcile import LatencyBound, reconcile, server_step_s
from tests.runner.faults import OtherClient

# ---------------------------------------------------------------------------------- pure cases
LABELS = 'engine="0",model_name="m"'


def _text(*, n: float, prompt: float, gen: float, e2e: float, ttft: float, itl_n: float, itl: float,
          aborted: float = 0.0, drop: Sequence[str] = ()) -> str:
    lines = [
        f'vllm:request_success_total{{{LABELS},finished_reason="length"}} {n}',
        f'vllm:request_success_total{{{LABELS},finished_reason="stop"}} 0',
        f'vllm:request_success_total{{{LABELS},finished_reason="abort"}} {aborted}',
        f"vllm:prompt_tokens_total{{{LABELS}}} {prompt}",
        f"vllm:generation_tokens_total{{{LABELS}}} {gen}",
        f"vllm:e2e_request_latency_seconds_sum{{{LABELS}}} {e2e}",
        f"vllm:e2e_request_latency_seconds_count{{{LABELS}}} {n}",
        f"vllm:time_to_first_token_seconds_sum{{{LABELS}}} {ttft}",
        f"vllm:time_to_first_token_seconds_count{{{LABELS}}} {n}",
        f"vllm:inter_token_latency_seconds_sum{{{LABELS}}} {itl}",
        f"vllm:inter_token_latency_seconds_count{{{LABELS}}} {itl_n}",
    ]
    return "\n".join(ln for ln in lines if not any(ln.startswith(d) for d in drop)) + "\n"


@dataclass(frozen=True)
class Rec:
    sent_s: float
    end_s: float
    first_token_s: float | None
    token_times_s: tuple[float, ...]
    prompt_tokens: int = 128
    output_tokens: int = 4
    ok: bool = True
    warmup: bool = False


def _rec(t0: float, *, lag: float = 0.0) -> Rec:
    # server: ttft 50 ms, 4 tokens 10 ms apart, e2e 80 ms; client adds 2 ms each way
    toks = tuple(t0 + 0.052 + 0.010 * i for i in range(4))
    return Rec(sent_s=t0, end_s=toks[-1] + 0.002 + lag, first_token_s=toks[0], token_times_s=toks)


ZERO = dict(n=0, prompt=0, gen=0, e2e=0, ttft=0, itl_n=0, itl=0)


def _window(recs: list[Rec], server: dict[str, float], drop: Sequence[str] = ()) -> Any:
    before = metrics.parse(_text(**ZERO, drop=drop), t_s=0.0)
    after = metrics.parse(_text(**server, drop=drop), t_s=100.0)
    return reconcile(before, after, recs)


CLEAN = dict(n=3, prompt=384, gen=12, e2e=3 * 0.080, ttft=3 * 0.050, itl_n=9, itl=3 * 0.030)


def test_clean_window_passes() -> None:
    recs = [_rec(1.0), _rec(2.0), _rec(3.0)]
    result = _window(recs, CLEAN)
    assert result.status == "pass", result.message
    assert {i.name for i in result.items} >= {"requests", "prompt_tokens", "generation_tokens", "e2e", "ttft",
                                              "decode_count", "decode"}


def test_another_client_fails() -> None:
    extra = dict(CLEAN, n=4, prompt=512, gen=16, e2e=4 * 0.080, ttft=4 * 0.05, itl_n=12, itl=4 * 0.03)
    result = _window([_rec(1.0), _rec(2.0), _rec(3.0)], extra)
    assert result.status == "fail"
    assert result.item("requests").status == "fail"
    assert "more on the server" in result.item("requests").message


def test_request_answered_without_the_server_fails() -> None:
    fewer = dict(CLEAN, n=2, prompt=256, gen=8, e2e=2 * 0.08, ttft=2 * 0.05, itl_n=6, itl=2 * 0.03)
    result = _window([_rec(1.0), _rec(2.0), _rec(3.0)], fewer)
    assert result.item("requests").status == "fail"
    assert result.item("generation_tokens").status == "fail"


def test_lagging_client_fails_on_latency() -> None:
    result = _window([_rec(1.0, lag=0.05), _rec(2.0, lag=0.05), _rec(3.0, lag=0.05)], CLEAN)
    assert result.item("e2e").status == "fail"
    assert result.item("requests").status == "pass"


def test_missing_counter_is_unverified_never_pass() -> None:
    result = _window([_rec(1.0), _rec(2.0), _rec(3.0)], CLEAN, drop=("vllm:generation_tokens",))
    assert result.item("generation_tokens").status == "unverified"
    assert result.status == "unverified"
    nothing = _window([_rec(1.0)], CLEAN, drop=("vllm:",))
    assert nothing.status == "unverified"
    assert all(i.status == "unverified" for i in nothing.items)


def test_warmup_inside_the_window_fails() -> None:
    warm = Rec(sent_s=-1.0, end_s=0.5, first_token_s=-0.9, token_times_s=(-0.9, -0.8), warmup=True)
    result = _window([warm, _rec(1.0), _rec(2.0), _rec(3.0)], CLEAN)
    assert result.item("window").status == "fail"


def test_client_failures_make_tokens_unverified() -> None:
    bad = Rec(sent_s=4.0, end_s=5.0, first_token_s=None, token_times_s=(), output_tokens=0, ok=False)
    result = _window([_rec(1.0), _rec(2.0), _rec(3.0), bad], CLEAN)
    assert result.item("requests").status == "pass"
    assert result.item("generation_tokens").status == "unverified"
    assert result.status == "unverified"


def test_server_step_from_histogram() -> None:
    before = metrics.parse(_text(**ZERO), t_s=0.0)  # type: ignore[arg-type]
    after = metrics.parse(_text(**CLEAN), t_s=1.0)  # type: ignore[arg-type]
    assert server_step_s(before, after) == pytest.approx(0.010)
    assert server_step_s(before, before) is None


def test_bound_text() -> None:
    assert LatencyBound().describe() == "mean client-server excess in [-1 ms, 20 ms + 5%]"


# --------------------------------------------------------------------------- real CPU server
def _specs(n: int, salt: str, output_len: int = 32) -> list[RequestSpec]:
    prompts = make_prompts(n, 128, vocab_lo=4, vocab_hi=4096, seed=9, salt=salt)
    return [RequestSpec(p, output_len) for p in prompts]


def measure_window(base_url: str, scrape_url: str, api_key: str, model: str, n: int, concurrency: int,
                   salt: str) -> Any:
    """What a point does: warmup, the before-snapshot, measured load, the after-snapshot."""
    warm = run_load(base_url, model, [], warmup=_specs(concurrency, salt + "-warm"), api_key=api_key,
                    concurrency=concurrency, cpus=(1,))
    before = metrics.scrape(scrape_url, api_key)
    result = run_load(base_url, model, _specs(n, salt), api_key=api_key, concurrency=concurrency, cpus=(1,))
    after = metrics.scrape(scrape_url, api_key)
    return reconcile(before, after, list(warm.records) + list(result.records))


@pytest.mark.vllm
@pytest.mark.parametrize("concurrency", [1, 4])
def test_clean_run_on_the_real_server_passes(vllm_server: Any, tiny_model_dir: Path, concurrency: int) -> None:
    result = measure_window(vllm_server.base_url, vllm_server.base_url, vllm_server.api_key, str(tiny_model_dir),
                            8 * concurrency, concurrency, f"clean-c{concurrency}")
    assert result.status == "pass", result.message


@pytest.mark.vllm
def test_another_client_on_the_real_server_fails(vllm_server: Any, tiny_model_dir: Path) -> None:
    model = str(tiny_model_dir)
    with OtherClient(vllm_server.base_url, vllm_server.api_key, model, list(range(100, 164)), 8) as other:
        other.wait_started()
        result = measure_window(vllm_server.base_url, vllm_server.base_url, vllm_server.api_key, model, 8, 1,
                                "other-client")
    assert other.sent > 0
    assert result.status == "fail"
    assert result.item("requests").status == "fail", result.message
    assert result.item("generation_tokens").status == "fail"
