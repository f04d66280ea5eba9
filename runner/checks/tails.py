"""Whether a tail percentile measures a latency or a share: a percentile "on a cliff".

A latency with two modes (decode steps of ~5 ms, and the gaps that wait out a prefill, ~25 ms, say 4.8% of
them) puts its p95 wherever the slow share falls: just under 5% and the p95 reads the fast mode, just over
and it reads the slow one. It then measures the slow share against 5%, not how slow either mode is, and
jumps between launches that differ in that share by a fraction of a point. On the H200 (fp8-weights,
2026-12-04, Qwen3-4B at 100 users, fixed 96-token outputs) the ITL p95 of six launches read 5.6-16.7 ms
while each launch's p94 stayed at 4.8-5.5 ms and its p96 at 18-28 ms; its fp8 / bf16 ratio ran from
0.76x to 5.7x.

The test: the percentiles at a tail share a fifth smaller and a fifth larger than q's (p94 and p96 around
p95, p98.8 and p99.2 around p99) differ by at least `CLIFF_RATIO`. A unimodal latency tail would need a
Pareto index under 0.6 to do that. Over the 676 points of the H200 database (2026-12-05) no TTFT p95 or p99
does, and 52 ITL p95 and 15 ITL p99 do (fp8-weights, batched-tokens, max-num-seqs, the prefix-cache
studies, kv-capacity-slo, fp8-kv, batch-ladder).

Pure: values in, a typed verdict out. `runner.checks.checks.tail_stable` makes it a point's warn check, one
per metric of `TAILS`; `report.scoring.sides` keeps a hypothesis on such a metric from a verdict its points'
cliffs would decide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runner.checks.stats import percentile

# The tail share is moved by this fraction each side of q's (p95: 5% -> 4% and 6%).
SHARE_STEP = 0.2
# Neighbours this far apart (high / low) put the percentile on a cliff.
CLIFF_RATIO = 2.0
# The summary's tail percentiles that are checked: metric -> (distribution, q).
TAILS: dict[str, tuple[str, float]] = {
    "ttft_p95_s": ("ttft", 95.0),
    "ttft_p99_s": ("ttft", 99.0),
    "itl_p95_s": ("itl", 95.0),
    "itl_p99_s": ("itl", 99.0),
}


def check_name(metric: str) -> str:
    """The point check of a tail metric: itl_p95_s -> itl_p95_stable."""
    return metric.removesuffix("_s") + "_stable"


def neighbours(q: float, step: float = SHARE_STEP) -> tuple[float, float]:
    """The percentiles whose tail shares are (1 + step) and (1 - step) times q's: (94, 96) for 95."""
    share = 100.0 - q
    return 100.0 - share * (1 + step), 100.0 - share * (1 - step)


@dataclass(frozen=True)
class Cliff:
    """A percentile with its neighbours. `ratio` None: fewer than two values, or a low neighbour of 0
    (nothing to divide by): the test cannot be made."""

    q: float
    low: float | None  # the percentile below q (p94 for p95)
    at: float | None
    high: float | None
    n: int

    @property
    def ratio(self) -> float | None:
        if self.n < 2 or self.low is None or self.high is None or self.low <= 0:
            return None
        return self.high / self.low

    @property
    def on_cliff(self) -> bool | None:
        """True: on a cliff; False: not; None: cannot tell."""
        r = self.ratio
        return None if r is None else r >= CLIFF_RATIO


def cliff(values: Sequence[float], q: float) -> Cliff:
    """The q-th percentile of the values with its two neighbours (`neighbours`)."""
    lo_q, hi_q = neighbours(q)
    return Cliff(q=q, low=percentile(values, lo_q), at=percentile(values, q), high=percentile(values, hi_q),
                 n=len(values))
