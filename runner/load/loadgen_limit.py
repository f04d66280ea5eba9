"""Self-test of the load generator's ceiling on this host: streams from the loopback instrument
as fast as it can send them, and reports what the client sustained. The runner records it beside
each run so a study can show that the client was never the bottleneck.
"""

from __future__ import annotations

import math
import os
from typing import Any

from runner.load.instrument import Instrument
from runner.load.loadgen import RequestSpec, make_prompts, run_load
from runner.load.stream_server import InstrumentConfig

__all__ = ["measure_client_ceiling"]


def measure_client_ceiling(
    duration_s: float = 3.0,
    *,
    concurrency: int = 256,
    max_tokens: int = 256,
    input_len: int = 32,
    workers: int | None = None,
    instrument_cpu: int | None = None,
    client_cpus: set[int] | None = None,
) -> dict[str, Any]:
    """Run the load generator against an in-process instrument for about `duration_s` seconds.

    The instrument (a thread of this process, pinned to `instrument_cpu` if given) writes each
    response in one piece, so the client's parsing is the only limit; the load generator runs in
    its usual worker process(es) on `client_cpus`. Left out, with two or more CPUs to use, the
    instrument takes the lowest (core 0, where a CPU vLLM pins its model thread) and the client
    the others: sharing a core would halve both (1.3 M vs 0.2 M chunks/s measured on 2 cores).
    Returns chunks_per_s,
    requests_per_s, concurrency and workers of the measured window (plus chunks, duration_s).
    """
    if duration_s <= 0:
        raise ValueError("duration_s must be > 0")
    allowed = sorted(os.sched_getaffinity(0))
    if instrument_cpu is None and client_cpus is None and len(allowed) >= 2:
        instrument_cpu, client_cpus = allowed[0], set(allowed[1:])
    cfg = InstrumentConfig(cpu=instrument_cpu, keep_log=False)
    with Instrument(cfg) as inst:
        def point(n: int, seed: int) -> Any:
            prompts = make_prompts(n, input_len, vocab_lo=4, vocab_hi=4096, seed=seed, salt="ceiling")
            specs = [RequestSpec(p, max_tokens) for p in prompts]
            return run_load(inst.base_url, "instrument", specs, concurrency=concurrency, workers=workers,
                            cpus=client_cpus)

        # Grow the point until its window lasts most of duration_s; the short rounds warm both up.
        n = max(2 * concurrency, 64)
        for seed in range(1, 5):
            res = point(n, seed)
            window = max(res.window_end_s - res.window_start_s, 1e-3)
            if window >= 0.7 * duration_s:
                break
            n = max(n, math.ceil(n * duration_s / window))
    m = res.measured
    window = max(res.window_end_s - res.window_start_s, 1e-9)
    chunks = sum(r.chunks for r in m)
    failed = [r.error for r in m if not r.ok]
    return {
        "chunks_per_s": chunks / window,
        "requests_per_s": len(m) / window,
        "concurrency": concurrency,
        "workers": res.workers,
        "chunks": chunks,
        "duration_s": window,
        "failed": len(failed),
        "max_tokens": max_tokens,
        "instrument_cpu": instrument_cpu,
        "client_cpus": sorted(client_cpus) if client_cpus else None,
    }
