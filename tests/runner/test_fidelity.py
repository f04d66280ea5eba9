"""Client fidelity: bunched token timestamps mark a point's ITL untrusted; clean ones do not."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from runner.checks.fidelity import check_fidelity, client_tpot_s, token_gaps
from runner.store.records import RequestRecord

H200_DB = Path(__file__).resolve().parents[2] / "results" / "h200"


def rec(token_times_s: tuple[float, ...], ok: bool = True, warmup: bool = False) -> RequestRecord:
    """A request record with these token times (the rest is not read by the fidelity check)."""
    t0 = token_times_s[0] if token_times_s else 0.0
    t1 = token_times_s[-1] if token_times_s else 0.0
    return RequestRecord(index=0, warmup=warmup, scheduled_s=t0, sent_s=t0, first_token_s=t0 if token_times_s else None,
                         end_s=t1, token_times_s=token_times_s, prompt_tokens=1, output_tokens=len(token_times_s),
                         chunks=len(token_times_s), ok=ok, error=None, status=200)


def _starved(n_requests: int = 31, tokens: int = 32, step: float = 0.0021, seed: int = 0) -> list[RequestRecord]:
    """What the 2-core CPU quickstart recorded at c1: reads coalesce, most gaps are ~0 while the
    server steps every 2.1 ms (there: 642 of 977 gaps under 10 us, ITL p50 0.0 ms, TPOT 2.1 ms)."""
    rng = random.Random(seed)
    out = []
    for r in range(n_requests):
        t, times = r * 1.0, []
        for _ in range(tokens):
            t += step
            times.append(t)
        # the client reads every ~3 tokens: each read stamps its chunks with the read's time
        stamped, i = [], 0
        while i < len(times):
            k = rng.choice((1, 2, 3, 4, 5))
            stamped.extend([times[min(i + k, len(times)) - 1]] * len(times[i:i + k]))
            i += k
        out.append(rec(tuple(stamped)))
    return out


def _clean(n_requests: int = 31, tokens: int = 32, step: float = 0.0021, seed: int = 0) -> list[RequestRecord]:
    rng = random.Random(seed)
    out = []
    for r in range(n_requests):
        t, times = r * 1.0, []
        for _ in range(tokens):
            t += step * rng.uniform(0.9, 1.3)
            times.append(t)
        out.append(rec(tuple(times)))
    return out


def test_starved_client_is_flagged_with_cause_and_fix() -> None:
    recs = _starved()
    gaps = token_gaps(recs)
    assert len(gaps) == 31 * 31
    result = check_fidelity(recs, server_step_s=0.0021)
    assert result.status == "fail"
    assert result.bunched_share is not None and result.bunched_share > 0.5
    assert "STUDYC_CLIENT_CPUS" in result.message and "starved" in result.message


def test_starved_client_is_flagged_from_its_own_tpot_without_server_histogram() -> None:
    result = check_fidelity(_starved())
    assert result.status == "fail"
    assert result.step_source == "client TPOT median"
    assert client_tpot_s(_starved()) == pytest.approx(0.0021, rel=0.2)


def test_clean_client_passes() -> None:
    result = check_fidelity(_clean(), server_step_s=0.0021)
    assert result.status == "pass", result.message
    assert result.bunched == 0


def test_no_gaps_is_unverified() -> None:
    assert check_fidelity([rec((1.0,))]).status == "unverified"
    assert check_fidelity([rec((1.0, 1.1), ok=False), rec((2.0, 2.1), warmup=True)]).status == "unverified"


@pytest.mark.skipif(not H200_DB.exists(), reason="no committed H200 database")
def test_no_h200_point_is_flagged() -> None:
    """Every point of the committed H200 runs is a clean client on a fast host."""
    from runner.store.store import Store

    with Store(H200_DB, read_only=True) as store:  # the published folder, through its cached database
        rows = store.con.execute("select point_id, warmup, ok, token_times_s from requests").fetchall()
    by: dict[str, list[RequestRecord]] = {}
    for pid, warm, ok, times in rows:
        by.setdefault(pid, []).append(rec(tuple(times or ()), ok=ok, warmup=warm))
    results = {pid: check_fidelity(recs) for pid, recs in by.items()}
    flagged = [pid for pid, r in results.items() if r.status == "fail"]
    assert len(results) > 50 and not flagged


QUICKSTART_GAPS = Path(__file__).resolve().parent / "data" / "quickstart_token_gaps.json"


def _recorded(key: str) -> tuple[list[RequestRecord], float]:
    """One quickstart point's measured requests as the 2-core CPU host recorded them."""
    point = json.loads(QUICKSTART_GAPS.read_text())[key]
    recs = []
    for first, *gaps in point["requests"]:
        times = [first * 1e-6]
        for g in gaps:
            times.append(times[-1] + g * 1e-6)
        recs.append(rec(tuple(times)))
    return recs, point["server_step_ms"] * 1e-3


def test_recorded_point_with_the_engine_on_the_clients_core_is_flagged() -> None:
    recs, step = _recorded("engine_unpinned")
    result = check_fidelity(recs, server_step_s=step)
    assert result.status == "fail" and result.gaps == 423 and result.bunched == 362  # 85.6%


def test_recorded_point_with_the_engine_apart_passes() -> None:
    """The same point once the CPU server's engine runs apart from the load generator (runner.server.pinning):
    3,926 gaps, none bunched."""
    recs, step = _recorded("engine_apart")
    result = check_fidelity(recs, server_step_s=step)
    assert result.status == "pass" and result.gaps == 3926 and result.bunched == 0, result.message
