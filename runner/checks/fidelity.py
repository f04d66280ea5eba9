"""The client's own fidelity: are the token gaps it recorded real?

A client that cannot keep up (too few cores, a garbage-collection pause, a busy event loop) reads
several SSE chunks in one socket read; they share one timestamp and the gaps between them read as
~0. Its inter-token latency then describes the client, not the server. The server cannot produce
tokens of one request faster than its own decode step, so a gap far below that step is bunching.

Pure: records and a step time in, a typed verdict out. The step time comes from the server's
inter-token histogram over the window (`runner.checks.reconcile.server_step_s`) when it exports one,
else from the median TPOT of the same requests.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from runner.checks.stats import gaps
from runner.store.records import RequestRecord

Status = Literal["pass", "fail", "unverified"]

# A gap below this fraction of the step is bunched. Across all 90 points of the H200 database the
# bunched share is at most 0.40% (median 0.01%). On a 2-core CPU host with the engine on its own
# core and the API server beside the client (runner.server.pinning), the quickstart's 48 points over four
# runs show at most 0.54% (c1 and c4, 128-token requests); with the engine's threads free to run
# on the client's core, up to 86% (362 of 423 gaps at c4), and 66% in an earlier starved run (642
# of 977 gaps under 10 us at a 2.1 ms TPOT, ITL p50 0.0 ms).
BUNCHED_FRACTION_OF_STEP = 0.05
# The point is flagged, and its ITL percentiles withheld, above this share. Every ITL quantile below
# the bunched share is a bunched ~0 gap, not a measurement, so the flag must come well before the
# share reaches 50% (the median): at 25% the p50 always lies 25 points above the bunched mass,
# where a gap absorbs at most the one or two reads bunched before it. A clean 2-core client (0.5%)
# stays far under it; a starved one (66-86%) is far over it. H200 data (0.4%) never comes near it.
MAX_BUNCHED_SHARE = 0.25
# What a failing fidelity check withholds from the point's summary (TPOT and throughput stand).
WITHHELD_METRICS = ("itl_p50_s", "itl_p90_s", "itl_p95_s", "itl_p99_s")


@dataclass(frozen=True)
class Fidelity:
    status: Status  # pass: ITL trusted; fail: ITL untrusted; unverified: too little to judge
    gaps: int
    bunched: int
    step_s: float | None
    step_source: str  # "server inter-token histogram", "client TPOT median" or "none"
    message: str

    @property
    def bunched_share(self) -> float | None:
        return self.bunched / self.gaps if self.gaps else None


def token_gaps(records: Sequence[RequestRecord]) -> list[float]:
    """Gaps between consecutive chunk arrivals within each completed measured request."""
    return gaps([r for r in records if not r.warmup and r.ok])


def client_tpot_s(records: Sequence[RequestRecord]) -> float | None:
    """Median over requests of (last chunk - first chunk) / (chunks - 1)."""
    per = [(r.token_times_s[-1] - r.token_times_s[0]) / (len(r.token_times_s) - 1)
           for r in records if not r.warmup and r.ok and len(r.token_times_s) >= 2]
    return statistics.median(per) if per else None


def check_fidelity(
    records: Sequence[RequestRecord],
    server_step_s: float | None = None,
    *,
    fraction_of_step: float = BUNCHED_FRACTION_OF_STEP,
    max_share: float = MAX_BUNCHED_SHARE,
) -> Fidelity:
    """Flag a point whose token gaps bunch far below the server's step time."""
    seen = token_gaps(records)
    step: float | None
    if server_step_s is not None and server_step_s > 0:
        step, source = server_step_s, "server inter-token histogram"
    else:
        step, source = client_tpot_s(records), "client TPOT median"
    if not seen or step is None or step <= 0:
        return Fidelity("unverified", len(seen), 0, step, source if step else "none",
                        "no token gaps to judge (fewer than two chunks per request)")
    limit = fraction_of_step * step
    bunched = sum(1 for g in seen if g < limit)
    share = bunched / len(seen)
    head = (f"{bunched} of {len(seen)} token gaps ({share:.1%}) are under {limit * 1e6:.0f} us, "
            f"{fraction_of_step:.0%} of the {step * 1e3:.2f} ms step ({source})")
    if share <= max_share:
        return Fidelity("pass", len(seen), bunched, step, source, head)
    return Fidelity(
        "fail", len(seen), bunched, step, source,
        f"{head}: the client read several tokens per socket read, so ITL percentiles describe the "
        "client, not the server (TPOT and throughput stand). Cause: the load generator was starved of "
        "CPU (shared cores, other jobs, a GC pause; on a CPU host, an engine thread on its core) or the "
        "server's API process wrote in bursts. Fix: give the load generator its own cores "
        "(STUDYC_CLIENT_CPUS; a lone CPU server then runs on the others), run fewer jobs on the machine "
        "at once, fewer streams per worker, or a faster host; then rerun the point.",
    )
