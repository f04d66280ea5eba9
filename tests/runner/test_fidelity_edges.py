"""The fidelity check at its edges: which requests give gaps, the client TPOT's exact arithmetic, the step's
source, a gap exactly at the limit, a share exactly at the maximum, and every word of what it says."""

from __future__ import annotations

import pytest

from runner.checks.fidelity import Fidelity, check_fidelity, client_tpot_s, token_gaps
from tests.runner.test_fidelity import rec

FAIL_TAIL = (
    ": the client read several tokens per socket read, so ITL percentiles describe the client, not the server "
    "(TPOT and throughput stand). Cause: the load generator was starved of CPU (shared cores, other jobs, a GC "
    "pause; on a CPU host, an engine thread on its core) or the server's API process wrote in bursts. Fix: give "
    "the load generator its own cores (STUDYC_CLIENT_CPUS; a lone CPU server then runs on the others), run fewer "
    "jobs on the machine at once, fewer streams per worker, or a faster host; then rerun the point."
)


def test_gaps_come_from_completed_measured_requests_only() -> None:
    records = [rec((0.0, 1.0)), rec((0.0, 2.0), ok=False), rec((0.0, 4.0), warmup=True),
               rec((0.0, 8.0), ok=False, warmup=True)]
    assert token_gaps(records) == [1.0]


def test_client_tpot_is_the_median_of_first_to_last_over_gaps() -> None:
    assert client_tpot_s([rec((0.0, 1.0, 3.0))]) == 1.5  # (3 - 0) / 2, not / 1 or / 3, not from the 2nd token
    assert client_tpot_s([rec((0.0, 0.5, 1.0, 4.0))]) == pytest.approx(4.0 / 3)
    assert client_tpot_s([rec((0.0, 2.0))]) == 2.0  # two chunks are enough
    assert client_tpot_s([rec((5.0,))]) is None  # one is not
    assert client_tpot_s([rec((0.0, 1.0), warmup=True), rec((0.0, 3.0), ok=False)]) is None


def test_the_server_step_is_used_when_positive_else_the_client_tpot() -> None:
    records = [rec((0.0, 1.0, 2.0))]
    served = check_fidelity(records, 0.5)
    assert (served.step_s, served.step_source) == (0.5, "server inter-token histogram")
    for missing in (None, 0.0):
        client = check_fidelity(records, missing)
        assert (client.step_s, client.step_source) == (1.0, "client TPOT median")


def test_nothing_to_judge_is_unverified_with_what_it_had() -> None:
    none = check_fidelity([rec((5.0,))])
    assert none == Fidelity("unverified", 0, 0, None, "none",
                            "no token gaps to judge (fewer than two chunks per request)")
    no_gaps = check_fidelity([rec((5.0,))], 0.01)  # a step, but no gaps
    assert no_gaps == Fidelity("unverified", 0, 0, 0.01, "server inter-token histogram",
                               "no token gaps to judge (fewer than two chunks per request)")
    flat = check_fidelity([rec((1.0, 1.0, 1.0))])  # every chunk at one instant: a client step of 0
    assert flat == Fidelity("unverified", 2, 0, 0.0, "none",
                            "no token gaps to judge (fewer than two chunks per request)")


def test_a_gap_at_the_limit_is_not_bunched_and_a_share_at_the_maximum_passes() -> None:
    at_limit = check_fidelity([rec((0.0, 0.5, 1.0))], 1.0, fraction_of_step=0.5)
    assert at_limit.bunched == 0 and at_limit.status == "pass"
    quarter = check_fidelity([rec((0.0, 0.25, 1.0, 2.0, 3.0))], 1.0, fraction_of_step=0.5, max_share=0.25)
    assert quarter == Fidelity(
        "pass", 4, 1, 1.0, "server inter-token histogram",
        "1 of 4 token gaps (25.0%) are under 500000 us, 50% of the 1000.00 ms step (server inter-token histogram)")
    over = check_fidelity([rec((0.0, 0.25, 0.5, 2.0, 3.0))], 1.0, fraction_of_step=0.5, max_share=0.25)
    head = ("2 of 4 token gaps (50.0%) are under 500000 us, 50% of the 1000.00 ms step "
            "(server inter-token histogram)")
    assert over == Fidelity("fail", 4, 2, 1.0, "server inter-token histogram", head + FAIL_TAIL)
    assert over.bunched_share == 0.5 and Fidelity("unverified", 0, 0, None, "none", "").bunched_share is None
