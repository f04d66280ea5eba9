"""Every reconciliation item fails monotonically: a larger discrepancy never passes where a smaller one
fails. A property test over seeded random discrepancies (with and without a measured client stall) plus
each item's exact boundaries, on dyadic numbers so that the sums are exact."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from runner.checks.reconcile import LatencyBound, Reconciliation, client_share, reconcile
from runner.measure import prometheus
from runner.store.records import RequestRecord

LABELS = 'engine="0",model_name="m"'
N = 4  # requests in the window
TOKENS = 8
TRANSPORT = 1 / 512  # the client sees each request 2^-9 s after the server's clock starts and ends
# Dyadic bounds: 1/32 s on both latency spans, no relative part, a floor of -1/1024 s.
BOUND = LatencyBound(abs_s=1 / 32, rel=0.0, floor_s=-1 / 1024, stream_abs_s=1 / 32, stream_rel=0.0)
HI = 1 / 32


def _record(i: int, *, warmup: bool = False, sent_s: float | None = None) -> RequestRecord:
    t0 = float(10 + i) if sent_s is None else sent_s
    toks = tuple(t0 + 1 / 16 + j / 64 for j in range(TOKENS))
    return RequestRecord(index=i, warmup=warmup, scheduled_s=t0, sent_s=t0, first_token_s=toks[0],
                         end_s=toks[-1] + TRANSPORT, token_times_s=toks, prompt_tokens=128,
                         output_tokens=TOKENS, chunks=TOKENS, ok=True, error=None, status=200)


RECORDS = [_record(i) for i in range(N)]


@dataclass
class Server:
    """The server's counters over the window, agreeing with RECORDS until a scenario shifts one."""

    n: float = N
    aborted: float = 0.0
    prompt: float = 128.0 * N
    gen: float = float(TOKENS * N)
    e2e_n: float = N
    e2e: float = sum(r.end_s - r.sent_s - TRANSPORT for r in RECORDS)
    ttft_n: float = N
    ttft: float = sum((r.first_token_s or 0.0) - r.sent_s - TRANSPORT for r in RECORDS)
    itl_n: float = float((TOKENS - 1) * N)
    itl: float = sum(r.token_times_s[-1] - r.token_times_s[0] for r in RECORDS)

    def text(self) -> str:
        rows = [
            (f'vllm:request_success_total{{{LABELS},finished_reason="length"}}', self.n),
            (f'vllm:request_success_total{{{LABELS},finished_reason="abort"}}', self.aborted),
            (f"vllm:prompt_tokens_total{{{LABELS}}}", self.prompt),
            (f"vllm:generation_tokens_total{{{LABELS}}}", self.gen),
            (f"vllm:e2e_request_latency_seconds_sum{{{LABELS}}}", self.e2e),
            (f"vllm:e2e_request_latency_seconds_count{{{LABELS}}}", self.e2e_n),
            (f"vllm:time_to_first_token_seconds_sum{{{LABELS}}}", self.ttft),
            (f"vllm:time_to_first_token_seconds_count{{{LABELS}}}", self.ttft_n),
            (f"vllm:inter_token_latency_seconds_sum{{{LABELS}}}", self.itl),
            (f"vllm:inter_token_latency_seconds_count{{{LABELS}}}", self.itl_n),
        ]
        return "\n".join(f"{name} {value!r}" for name, value in rows) + "\n"


def _run(server: Server, records: list[RequestRecord] = RECORDS, stall_s: float | None = None) -> Reconciliation:
    before = prometheus.parse(Server(**dict.fromkeys(vars(Server()), 0.0)).text(), t_s=5.0)
    after = prometheus.parse(server.text(), t_s=100.0)
    return reconcile(before, after, records, BOUND, client_stall_s=stall_s)


def _count(field: str, sign: int) -> Callable[[float, float | None], Reconciliation]:
    def make(d: float, stall: float | None) -> Reconciliation:
        base = Server()
        return _run(replace(base, **{field: getattr(base, field) + sign * int(d)}), stall_s=stall)
    return make


def _sum(field: str, per_request: float) -> Callable[[float, float | None], Reconciliation]:
    """Shift a latency sum by `per_request` x d per request."""
    def make(d: float, stall: float | None) -> Reconciliation:
        base = Server()
        return _run(replace(base, **{field: getattr(base, field) + per_request * d * N}), stall_s=stall)
    return make


def _late_warmup(d: float, stall: float | None) -> Reconciliation:
    late = [_record(100 + k, warmup=True, sent_s=4.875 + k / 64) for k in range(int(d))]  # they end after 5.0
    return _run(Server(), RECORDS + late, stall)


def _outside(d: float, stall: float | None) -> Reconciliation:
    moved = [_record(i, sent_s=1.0 + i) if i < int(d) else r for i, r in enumerate(RECORDS)]  # before the window
    return _run(Server(), moved, stall)


def _aborted(d: float, stall: float | None) -> Reconciliation:
    return _run(replace(Server(), aborted=float(int(d))), stall_s=stall)


# (item, what grows with d): every item of `reconcile`, each discrepancy in each direction it can take.
Make = Callable[[float, float | None], Reconciliation]
COUNTS: dict[str, tuple[str, Make]] = {
    "late warmup": ("window", _late_warmup),
    "requests outside the window": ("window", _outside),
    "more requests": ("requests", _count("n", +1)),
    "fewer requests": ("requests", _count("n", -1)),
    "aborted": ("requests_aborted", _aborted),
    "more prompt tokens": ("prompt_tokens", _count("prompt", +1)),
    "fewer prompt tokens": ("prompt_tokens", _count("prompt", -1)),
    "more generation tokens": ("generation_tokens", _count("gen", +1)),
    "fewer generation tokens": ("generation_tokens", _count("gen", -1)),
    "more e2e entries": ("e2e_count", _count("e2e_n", +1)),
    "fewer e2e entries": ("e2e_count", _count("e2e_n", -1)),
    "more ttft entries": ("ttft_count", _count("ttft_n", +1)),
    "fewer ttft entries": ("ttft_count", _count("ttft_n", -1)),
    "more itl entries": ("decode_count", _count("itl_n", +1)),
    "fewer itl entries": ("decode_count", _count("itl_n", -1)),
}
LATENCIES: dict[str, tuple[str, Make]] = {
    # the server counts more time than the client saw (the floors are one-sided: more client time passes)
    "server e2e longer": ("e2e", _sum("e2e", +1)),
    "server ttft longer": ("ttft", _sum("ttft", +1)),
    # first to end: the server's span shorter (the client read the end late) or longer (the first token late)
    "client span longer": ("first_to_end", _sum("e2e", -1)),
    "client span shorter": ("first_to_end", _sum("e2e", +1)),
    "client span shorter (ttft)": ("first_to_end", _sum("ttft", -1)),
    # decode: the server's inter-token sum shorter or longer than the client's span
    "client decode longer": ("decode", _sum("itl", -1)),
    "client decode shorter": ("decode", _sum("itl", +1)),
}
STALLS = (None, 0.0, 1 / 1024, HI / 2, HI, HI + 1 / 1024, 2 * HI, 0.2)


def _first_pass_after_fail(points: list[tuple[float, str]]) -> tuple[float, float] | None:
    failed_at: float | None = None
    for d, status in sorted(points):
        if status != "pass":
            failed_at = d if failed_at is None else failed_at
        elif failed_at is not None:
            return failed_at, d
    return None


def test_the_checker_finds_a_non_monotonic_item() -> None:
    """The property's own failing case: the rule this replaces (fail only between the bound and the
    bound plus the stall) is caught."""
    def old_rule(d: float, stall: float) -> str:
        return "pass" if d <= HI or d - stall > HI else "fail"
    assert _first_pass_after_fail([(d, old_rule(d, 0.02)) for d in (0.0, 0.04, 0.06)]) == (0.04, 0.06)
    assert _first_pass_after_fail([(0.0, "pass"), (0.04, "fail"), (0.06, "fail")]) is None


@pytest.mark.parametrize("case", sorted(COUNTS))
def test_count_items_are_monotonic(case: str) -> None:
    name, make = COUNTS[case]
    assert make(0, None).status == "pass"  # no discrepancy: the whole window reconciles
    rng = random.Random(f"counts/{case}")
    for stall in (None, 0.0, 0.2):
        ds = sorted({0, 1, *(rng.randint(0, N) for _ in range(12))})
        points = [(float(d), _item(make(d, stall), name)) for d in ds]
        assert _first_pass_after_fail(points) is None, (case, stall, points)
        assert dict(points)[1.0] == "fail", (case, stall)  # one unit off fails: the boundary


@pytest.mark.parametrize("case", sorted(LATENCIES))
def test_latency_items_are_monotonic(case: str) -> None:
    name, make = LATENCIES[case]
    rng = random.Random(f"latency/{case}")
    for stall in (*STALLS, *(rng.uniform(0, 0.1) for _ in range(4))):
        ds = [0.0, HI, HI + 1 / 1024, *(rng.uniform(0, 0.5) for _ in range(30))]
        points = [(d, _item(make(d, stall), name)) for d in ds]
        assert _first_pass_after_fail(points) is None, (case, stall, points)
        assert dict(points)[0.0] == "pass"


def _item(result: Reconciliation, name: str) -> str:
    found = [i for i in result.items if i.name == name]
    return found[0].status if found else "pass"  # window and requests_aborted appear only when they fail


# ---- exact boundaries ----------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["client span longer", "client span shorter", "client decode longer",
                                  "client decode shorter"])
def test_two_sided_spans_at_their_boundaries(case: str) -> None:
    name, make = LATENCIES[case]
    step = 1 / 1024
    at_bound = make(HI, None).item(name)
    assert at_bound.status == "pass" and "output path" not in at_bound.message  # within it: nothing to explain
    assert make(HI + step, None).item(name).status == "fail"  # just beyond, no stall: all the client's
    # beyond the bound, a stall at the bound clears the client whatever the difference; just over it does not
    for d in (HI + step, 0.5):
        assert make(d, HI).item(name).status == "pass"
        assert make(d, HI + step).item(name).status == "fail"
    assert make(HI, 0.2).item(name).status == "pass"  # within the bound, a long stall is no matter


@pytest.mark.parametrize("case", ["server e2e longer", "server ttft longer"])
def test_floors_at_their_boundaries(case: str) -> None:
    name, make = LATENCIES[case]
    step = 1 / 4096
    # the base excess is TRANSPORT; the floor is -1/1024
    assert make(TRANSPORT + 1 / 1024, None).item(name).status == "pass"
    assert make(TRANSPORT + 1 / 1024 + step, None).item(name).status == "fail"
    assert make(TRANSPORT + 1 / 1024 + step, 0.0).item(name).status == "fail"  # a stall clears no floor


def test_client_share() -> None:
    assert client_share(-0.05, None) == 0.05
    assert client_share(0.05, 0.01) == 0.01
    assert client_share(-0.005, 0.01) == 0.005
    assert client_share(0.01, 0.01) == 0.01


def test_a_pass_beyond_the_bound_is_said_in_the_message() -> None:
    """The stored check detail is the reconciliation's message: a pass the stall explains names the item
    and the server's output path there; a pass within the bound does not."""
    name, make = LATENCIES["client decode shorter"]
    beyond = make(0.5, 1 / 1024)
    assert beyond.status == "pass" and beyond.item(name).beyond_bound
    assert beyond.message.startswith("server counters agree with the client's records (10 comparisons); decode: ")
    assert "server's output path" in beyond.message
    within = make(HI, None)
    assert not within.item(name).beyond_bound and "output path" not in within.message
    failed = make(0.5, None)
    assert failed.message.startswith("decode: ") and not failed.item(name).beyond_bound
