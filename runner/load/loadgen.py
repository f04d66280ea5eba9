"""studyc's load generator: streams `/v1/completions` requests at a closed-loop concurrency or an
open-loop arrival rate and returns one frozen record per request, with the arrival time of every
content-bearing SSE chunk. The runner turns a point's records into its statistics.

Speed is a requirement (it must never be what a study measures): raw asyncio protocols on uvloop, a
bytes-level HTTP/SSE reader (`runner.load.sse`) that never parses a chunk's JSON, one clock reading per
socket read, and worker processes (each with its own event loop) when one core is not enough.
`benchmarks/loadgen_ceiling.py` measures all of this against `vllm bench serve`.

The parts: `runner.load.workload` (prompts, arrival schedules), `runner.load.client` (connections, one
request), `runner.load.workers` (request loops, worker processes); this module splits a point over the
workers and turns their outcomes into records.

Multi-turn: a conversation (consecutive specs with one `conversation` >= 0, turns 0, 1, ...) is the unit
a closed-loop slot takes or an open-loop arrival starts; it stays on one worker and one server.
"""

from __future__ import annotations

import math
import os
from array import array
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import repeat

from runner.load.client import NOT_SENT, POINT_TIMEOUT, TIMEOUT, Outcome, make_target, now
from runner.load.workers import Warmup, WorkerPlan, run_inprocess, run_processes
from runner.load.workload import RequestSpec, arrival_times, make_prompts, schedule, share
from runner.store.records import RequestRecord

__all__ = [
    "EARLIER_TURN_FAILED",
    "NOT_SENT",
    "POINT_TIMEOUT",
    "TIMEOUT",
    "LoadResult",
    "RequestSpec",
    "arrival_times",
    "auto_workers",
    "conversations",
    "make_prompts",
    "run_load",
]


EARLIER_TURN_FAILED = "not sent: an earlier turn of its conversation failed"


@dataclass(frozen=True)
class LoadResult:
    """All records of one point (warmup ones flagged), and the measured window."""

    records: tuple[RequestRecord, ...]
    window_start_s: float  # first measured send
    window_end_s: float  # last measured end
    workers: int
    timed_out: bool
    replicas: tuple[int, ...] = ()  # per record (same order): the server that answered it; -1 if never sent
    stall_s: float | None = None  # the workers' longest event-loop stall while measuring (None: unknown)

    @property
    def measured(self) -> tuple[RequestRecord, ...]:
        return tuple(r for r in self.records if not r.warmup)


def auto_workers(concurrency: int | None, rate_rps: float | None, n_requests: int, *,
                 cpus: int | None = None) -> int:
    """Worker processes for a point when the caller does not say.

    One uvloop worker reads 1.0-1.4 M SSE chunks/s when reads coalesce, and spends ~5 us per read
    when each chunk arrives alone (~200 k reads/s; reads coalesce as load rises), on one core of
    this kind (benchmarks/README.md): far above what a server streams. Beyond 512 streams in flight
    add a worker per 512, up to the CPUs this process may use, leaving one for the runner.
    """
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if concurrency is None:  # all at once, or open loop without a cap: in flight depends on the server
        concurrency = n_requests if rate_rps is None else 512
    want = max(1, math.ceil(concurrency / 512))
    return max(1, min(want, cpus - 1 if cpus > 2 else 1))


def conversations(specs: Sequence[RequestSpec]) -> tuple[tuple[int, int], ...] | None:
    """The (first, end) index range of each conversation, single requests being one-turn ones; None
    when every request is single (conversation -1). Raises ValueError for turns out of order."""
    if all(s.conversation == -1 for s in specs):
        return None
    units: list[tuple[int, int]] = []
    seen: set[int] = set()
    for i, s in enumerate(specs):
        c = s.conversation
        if c < -1 or not 0 <= s.think_s < math.inf:
            raise ValueError(f"request {i}: conversation must be >= -1 and think_s >= 0 and finite")
        if c >= 0 and i and specs[i - 1].conversation == c:
            if s.turn != specs[i - 1].turn + 1:
                raise ValueError(f"request {i}: conversation {c} has turn {s.turn} after turn {specs[i - 1].turn}")
            units[-1] = (units[-1][0], i + 1)
            continue
        if s.turn != 0:
            raise ValueError(f"request {i}: conversation {c} starts at turn {s.turn}, not 0")
        if c in seen:
            raise ValueError(f"request {i}: the turns of conversation {c} are not consecutive")
        if c >= 0:
            seen.add(c)
        units.append((i, i + 1))
    return tuple(units)


def run_load(
    base_url: str | Sequence[str],
    model: str,
    requests: Sequence[RequestSpec],
    *,
    api_key: str | None = None,
    concurrency: int | None = None,
    rate_rps: float | None = None,
    arrival: str = "poisson",
    burstiness: float = 1.0,
    seed: int = 0,
    warmup: Sequence[RequestSpec] = (),
    request_timeout_s: float = 600.0,
    point_timeout_s: float | None = None,
    workers: int | None = None,
    extra_body: Mapping | None = None,
    busy_poll: bool = False,
    cpus: Collection[int] | None = None,
    balance: str = "least_outstanding",
    offsets: Sequence[float] | None = None,
) -> LoadResult:
    """Run one load point and return a record per request (warmup ones flagged); never raises for
    what happens to requests.

    Closed loop (`rate_rps` None): `concurrency` requests in flight until all are done; with neither
    given, all requests at once. Open loop: arrivals from a seeded process at `rate_rps`
    (`arrival`: poisson, gamma with shape `burstiness`, or constant), the first at the start; a
    `concurrency` given with a rate caps the requests in flight. Warmup runs first, to completion,
    at `concurrency` (or all at once) and stays out of the window. A request past
    `request_timeout_s` is aborted and recorded as "timeout"; when `point_timeout_s` runs out, the
    requests in flight are aborted ("point_timeout") and the unsent ones recorded as not sent.

    `workers`: processes, each with its own event loop, sharing concurrency and requests; None picks
    by concurrency (`auto_workers`); 0 runs on this process's thread without spawning.
    `busy_poll`: keep each worker's loop spinning through the measured window (a core at 100% per
    worker) so chunk timestamps are taken ~6 us after arrival instead of ~25 us; only where the load
    generator has cores of its own (never beside a CPU vLLM server on a 2-core machine).
    `cpus`: pin the worker processes to these CPUs (e.g. {1} on a 2-core machine, where a CPU vLLM
    pins its model thread to core 0); None leaves them where this process may run.
    `base_url` may list several servers (the replicas of one launch): each request goes to the one
    `balance` picks (`least_outstanding` or `round_robin`, `runner.load.balance.Balancer`), across workers.
    `offsets`: open loop, the arrival offsets to use instead of drawing them (a replayed trace's
    timestamps, one per request, the first 0); `rate_rps` may then be None.

    Multi-turn (`RequestSpec.conversation` >= 0): closed loop, `concurrency` counts conversations in
    flight, a slot sending one conversation's turns in order, each `think_s` after the previous turn
    ended; open loop, arrivals (drawn, or `offsets`: one per conversation) start conversations and a
    cap counts conversations. A failed turn ends its conversation (later turns: `EARLIER_TURN_FAILED`).
    A conversation stays on one worker and one server (sticky routing: its prefix cache is reused).
    Warmup requests are sent as single requests, whatever their conversation.
    """
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if request_timeout_s <= 0:
        raise ValueError("request_timeout_s must be > 0")
    urls = (base_url,) if isinstance(base_url, str) else tuple(base_url)
    if not urls:
        raise ValueError("run_load needs at least one server")
    targets = tuple(make_target(u, model, api_key, extra_body) for u in urls)
    target = targets[0]
    specs = tuple(requests)
    units = conversations(specs)
    n = len(specs) if units is None else len(units)  # what slots take and arrivals start
    wspecs = tuple(warmup)
    open_loop = rate_rps is not None or offsets is not None
    pinned = tuple(sorted(cpus)) if cpus else None
    if workers is None:  # auto_workers reads a rate as "open loop": a replayed trace is one without a rate
        workers = auto_workers(concurrency, rate_rps if rate_rps is not None or not open_loop else 1.0, n,
                               cpus=len(pinned) if pinned else None)
    inprocess = workers == 0
    nw = max(1, min(workers, max(n, 1))) if not inprocess else 1
    warmup_concurrency = concurrency if concurrency is not None else max(len(wspecs), 1)
    if not open_loop:  # closed loop without a concurrency: every request at once
        concurrency = concurrency if concurrency is not None else max(n, 1)
        nw = min(nw, concurrency)
    start = now()
    deadline = start + point_timeout_s if point_timeout_s is not None else math.inf

    # Split: closed-loop slots and warmup evenly; open-loop arrivals round-robin in time order.
    if offsets is not None:
        if len(offsets) != n:
            raise ValueError(f"offsets has {len(offsets)} entries for {n} "
                             f"{'requests' if units is None else 'conversations'}")
        offsets = list(offsets)
    elif rate_rps is not None:
        offsets = arrival_times(n, rate_rps, arrival=arrival, burstiness=burstiness, seed=seed)
    plans = []
    for w in range(nw):
        plans.append(WorkerPlan(
            target=target,
            specs=specs,
            warmup=tuple(Warmup(i, wspecs[i]) for i in range(w, len(wspecs), nw)),
            warmup_concurrency=max(1, share(warmup_concurrency, w, nw)),
            worker_concurrency=share(concurrency, w, nw) if concurrency is not None else None,
            open_loop=schedule(offsets, w, nw) if offsets is not None else None,
            request_timeout_s=request_timeout_s,
            busy_poll=busy_poll,
            cpus=pinned,
            replicas=targets if len(targets) > 1 else (),
            balance=balance,
            conversations=units,
        ))

    ran = run_inprocess(plans[0], n, deadline) if inprocess else run_processes(plans, n, deadline)
    timed_out = ran.expired or any(o.error in (POINT_TIMEOUT, NOT_SENT) for o in ran.outcomes)
    due: list[float | None] | None = list(offsets) if offsets is not None else None
    if due is not None and units is not None:  # a conversation's offset is its first turn's
        due = [None] * len(specs)
        for (first, _), off in zip(units, offsets or (), strict=True):
            due[first] = off
    return replace(_assemble(ran.outcomes, specs, wspecs, due, deadline, nw, timed_out), stall_s=ran.stall_s)


def _assemble(outcomes: list[Outcome], specs: Sequence[RequestSpec], wspecs: Sequence[RequestSpec],
              offsets: list[float | None] | None, deadline: float, nw: int, timed_out: bool) -> LoadResult:
    seen_m: dict[int, Outcome] = {}
    seen_w: dict[int, Outcome] = {}
    for o in outcomes:
        (seen_w if o.warmup else seen_m)[o.request_index] = o
    t_fill = deadline if math.isfinite(deadline) else now()
    first_sent = min((o.sent_s for o in outcomes if not o.warmup), default=t_fill)
    records: list[RequestRecord] = []
    replicas: list[int] = []
    for pool, count, warm in ((seen_w, len(wspecs), True), (seen_m, len(specs), False)):
        for i in range(count):
            got = pool.get(i)
            spec = (wspecs if warm else specs)[i]
            conv, turn = (-1, 0) if warm else (spec.conversation, spec.turn)
            if got is None:  # never sent (point timeout, an earlier turn failed) or lost with a dead worker
                off = offsets[i] if offsets is not None and not warm else None
                sched = first_sent + off if off is not None else t_fill
                why = NOT_SENT if timed_out else "lost: worker process died"
                if turn and _failed_turn(records[-1]):
                    why = EARLIER_TURN_FAILED
                records.append(RequestRecord(
                    index=i, warmup=warm, scheduled_s=sched, sent_s=t_fill, first_token_s=None, end_s=t_fill,
                    token_times_s=(), prompt_tokens=0, output_tokens=0, chunks=0, ok=False, error=why,
                    status=None, conversation=conv, turn=turn,
                ))
                replicas.append(-1)
                continue
            o = got
            replicas.append(o.replica)
            records.append(RequestRecord(
                index=o.request_index, warmup=o.warmup, scheduled_s=o.scheduled_s, sent_s=o.sent_s,
                first_token_s=o.first_token_s, end_s=o.end_s, token_times_s=_expand(o.runs),
                prompt_tokens=o.prompt_tokens, output_tokens=o.output_tokens, chunks=o.chunks, ok=o.ok,
                error=o.error, status=o.status, conversation=conv, turn=turn,
            ))
    measured = [r for r in records if not r.warmup and r.error not in (NOT_SENT, EARLIER_TURN_FAILED)]
    w0 = min((r.sent_s for r in measured), default=t_fill)
    w1 = max((r.end_s for r in measured), default=t_fill)
    return LoadResult(tuple(records), w0, w1, nw, timed_out, tuple(replicas))


def _failed_turn(prev: RequestRecord) -> bool:
    """The previous turn failed by itself (not cut by the point's timeout, not lost with a worker)."""
    err = prev.error or ""
    return not prev.ok and err not in (POINT_TIMEOUT, NOT_SENT) and not err.startswith("lost")


def _expand(runs: bytes) -> tuple[float, ...]:
    if not runs:
        return ()
    a = array("d")
    a.frombytes(runs)
    out: list[float] = []
    ext = out.extend
    for k in range(0, len(a), 2):
        c = int(a[k + 1])
        if c == 1:
            out.append(a[k])
        else:
            ext(repeat(a[k], c))
    return tuple(out)
