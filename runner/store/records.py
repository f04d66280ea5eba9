"""Typed records that cross studyc's stage boundaries after the Plan.

The load generator makes `RequestRecord`s; the judge (`runner.checks.judge`) turns a point's records and
what the server said into a `PointSummary` and `CheckResult`s; the point runner adds
`TelemetrySample`s; `runner.execute.run` makes the `RunRecord`, `ServerRecord`s and `PointRecord`s. The
store (`runner.store.store`) declares its tables from these dataclasses (field name + Python type ->
column) and maps them to rows and back, so nothing else keeps a list of columns or metric names.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from compiler.metrics import SERVER_METRICS, ridge_point

__all__ = [
    "CheckResult",
    "CheckStatus",
    "PointRecord",
    "PhaseRecord",
    "PointSummary",
    "RequestRecord",
    "RunRecord",
    "SegmentRecord",
    "ServerRecord",
    "TelemetrySample",
    "redact_argv",
]

REDACTED = "***"
SECRET_FLAGS = ("--api-key",)


def redact_argv(argv: list[str] | tuple[str, ...]) -> list[str]:
    """argv with the value of every secret flag (`--api-key X`, `--api-key=X`) replaced by `***`."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif arg in SECRET_FLAGS:
            out.append(arg)
            hide_next = True
        elif any(arg.startswith(flag + "=") for flag in SECRET_FLAGS):
            out.append(arg.split("=", 1)[0] + "=" + REDACTED)
        else:
            out.append(arg)
    return out


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one request. Times are `time.monotonic()` seconds.

    `token_times_s` holds the arrival time of each content-bearing SSE chunk (a chunk can carry
    several tokens); chunks that arrived in the same socket read share one timestamp, which is the
    earliest moment the client could know of them. Token counts come from the final `usage` event.
    `conversation` and `turn`: the request's place in a multi-turn conversation (-1 and 0: a single request).
    """

    index: int
    warmup: bool
    scheduled_s: float
    sent_s: float
    first_token_s: float | None
    end_s: float
    token_times_s: tuple[float, ...]
    prompt_tokens: int
    output_tokens: int
    chunks: int
    ok: bool
    error: str | None
    status: int | None
    conversation: int = -1
    turn: int = 0


@dataclass(frozen=True)
class PointSummary:
    """Every statistic of one point (None where it was not measured). Field names are the metric
    names a hypothesis can use (`compiler.metrics.METRICS`, point level) plus their ingredients."""

    window_s: float | None = None
    requests_ok: int = 0
    requests_failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    chunks: int = 0
    output_throughput: float | None = None
    total_throughput: float | None = None
    request_throughput: float | None = None
    chunk_throughput: float | None = None
    goodput: float | None = None
    ttft_mean_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None
    ttft_p95_s: float | None = None
    ttft_p99_s: float | None = None
    itl_mean_s: float | None = None
    itl_p50_s: float | None = None
    itl_p90_s: float | None = None
    itl_p95_s: float | None = None
    itl_p99_s: float | None = None
    tpot_mean_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p90_s: float | None = None
    tpot_p95_s: float | None = None
    tpot_p99_s: float | None = None
    e2e_mean_s: float | None = None
    e2e_p50_s: float | None = None
    e2e_p90_s: float | None = None
    e2e_p95_s: float | None = None
    e2e_p99_s: float | None = None
    prefix_hit_rate: float | None = None
    kv_cache_usage_peak: float | None = None  # no longer measured: /metrics is not sampled inside the window
    littles_law_error: float | None = None
    mean_in_flight: float | None = None
    power_mean_w: float | None = None
    energy_per_token_j: float | None = None
    sm_clock_mean_mhz: float | None = None
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    preemptions: float | None = None
    mem_clock_mean_mhz: float | None = None
    energy_j: float | None = None
    temp_max_c: float | None = None
    # The steady phase (closed loop: from the C-th send to the last send, every slot busy): the
    # requests that ran wholly inside it. Rates, TPOT, ITL and the Little's Law terms are its own.
    steady_requests: int | None = None
    little_lambda_w: float | None = None  # lambda * W from the records (closed multi-turn: + think time), vs the load
    server_in_flight: float | None = None  # the server's e2e histogram sum over the window / window length
    client_in_flight: float | None = None  # the client's in-flight average over the same whole window
    # Open loop: latencies from the scheduled time (send-based ones are ttft_*/e2e_*) and the client's lag.
    ttft_sched_mean_s: float | None = None
    ttft_sched_p50_s: float | None = None
    ttft_sched_p99_s: float | None = None
    e2e_sched_mean_s: float | None = None
    e2e_sched_p50_s: float | None = None
    e2e_sched_p99_s: float | None = None
    client_lag_mean_s: float | None = None  # sent - scheduled
    client_lag_p99_s: float | None = None
    client_lag_max_s: float | None = None
    itl_bunched_share: float | None = None  # token gaps far below the server's step (runner.checks.fidelity)
    # Mean TTFT excess of the client over the server (runner.checks.reconcile): the API server's front end and
    # the transport before the engine saw the request. Measured and reported, not a fault.
    frontend_delay_s: float | None = None
    # The load generator's longest event-loop stall in the measured window (runner.load.workers): an upper
    # bound on how late it read any chunk. None: not measured (points stored before it was).
    client_stall_max_s: float | None = None
    # Share of the measured requests meeting every [slo] objective (runner.checks.stats.meets_slo); None: the
    # study has no [slo], or the point was stored before schema 7.
    slo_attainment: float | None = None

    def metric(self, name: str) -> float | None:
        """A metric by name, as a float (None where unmeasured); KeyError for a name it lacks."""
        if name not in SUMMARY_FIELDS:
            raise KeyError(f"no point metric named {name!r}")
        value = getattr(self, name)
        return None if value is None else float(value)


SUMMARY_FIELDS = frozenset(f.name for f in dataclasses.fields(PointSummary))


CheckStatus = Literal["pass", "fail", "unverified"]


@dataclass(frozen=True)
class CheckResult:
    """One validity check of one point: a `fail` check that did not pass makes the point invalid, a
    `warn` check that did not pass flags it. `status` says why it did not pass: `fail` (the check
    measured a fault) or `unverified` (it could not measure: an input was missing). An unverified
    check never passes. Left out, `status` follows `passed` (rows stored before it existed)."""

    point_id: str
    name: str
    passed: bool
    severity: Literal["fail", "warn"]
    value: float | None
    threshold: float | None
    detail: str
    status: CheckStatus | None = None

    def __post_init__(self) -> None:
        if self.status is None:
            object.__setattr__(self, "status", "pass" if self.passed else "fail")
        elif (self.status == "pass") != self.passed:
            raise ValueError(f"check {self.name}: status {self.status!r} with passed={self.passed}")


@dataclass(frozen=True)
class TelemetrySample:
    """One sample taken while a point ran: `nvml` (GPU) or `metrics` (the engine's /metrics).
    `t_s` is seconds since the run started; fields a source does not give are None."""

    point_id: str
    source: str
    t_s: float
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    power_w: float | None = None
    temp_c: float | None = None
    mem_used_bytes: float | None = None
    gpu_util: float | None = None
    kv_cache_usage: float | None = None
    running: float | None = None
    waiting: float | None = None
    energy_j: float | None = None  # NVML's total-energy counter at the sample


def new_run_id(at: datetime | None = None) -> str:
    """A new run's id: its start in UTC to the second, then six random hex digits (20261207T125949-3ca2f6)."""
    return (at or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]


@dataclass(frozen=True)
class RunRecord:
    """One `studyc run` of one study: provenance, calibration and the client's own ceiling."""

    run_id: str
    study_id: str
    study_path: str | None = None
    study_sha256: str | None = None
    plan_json: str | None = None
    studyc_version: str | None = None
    git_sha: str | None = None  # studyc's own source; None outside a git checkout
    host: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    status: str | None = None
    engine_command: str | None = None
    vllm_version: str | None = None
    torch_version: str | None = None
    gpu_name: str | None = None
    driver_version: str | None = None
    calibrated: bool | None = None
    bandwidth_Bps: float | None = None
    flops_bf16: float | None = None
    calibration_json: str | None = None
    client_ceiling_chunks_per_s: float | None = None
    client_ceiling_json: str | None = None
    nvml_available: bool | None = None
    notes: str | None = None
    # Scale-out (runner.execute.launch, runner.server.placement): the run's wall time and the sum of its measurement
    # windows, the devices it ran on, each launch's placement, and the interference measured once
    # when launches ran side by side (and whether it sent the run back to one launch at a time).
    wall_s: float | None = None
    window_s: float | None = None
    devices: str | None = None  # e.g. "0,1" (GPU indices, or logical ids on a CPU host)
    placement_json: str | None = None
    interference_json: str | None = None
    # sha256 of the study file read as TOML and written back canonically (compiler.load.study_version):
    # comments and layout do not change it, any value does. None: runs stored before it was.
    study_toml_sha256: str | None = None


@dataclass(frozen=True)
class SegmentRecord:
    """One invocation of `studyc run` on a run (the first, or a `--resume`): a run's wall is the sum of
    its segments'. Written when it opens and again at every phase, so a killed one keeps its wall up to
    its last record; the next `--resume` marks it "killed"."""

    segment: int  # 1, 2, ... in the order they ran
    started_at: datetime
    ended_at: datetime | None = None
    wall_s: float = 0.0  # monotonic seconds from its start to its end (a killed one: to its last record)
    ended: str = "running"  # running, complete, partial, interrupted, killed
    slots: int = 1  # device slots its launches ran on at once: its phases add up to wall_s x slots
    host: str | None = None


@dataclass(frozen=True)
class PhaseRecord:
    """Seconds one segment spent in one phase (`runner.execute.segments.PHASES`), for one launch
    ("" for the run's own: calibration, the client self-test, the predictions, the gap)."""

    segment: int
    seq: int  # order within the segment
    launch_id: str
    phase: str
    seconds: float


def base_server_id(server_id: str) -> str:
    """The plan's id of a server: a resumed launch's servers carry "~N" after it (N >= 2)."""
    head, sep, tail = server_id.rpartition("~")
    return head if sep and tail.isdigit() and int(tail) >= 2 else server_id


@dataclass(frozen=True)
class ServerRecord:
    """One server of a run. `argv_json` never holds the API key (see `redact_argv`)."""

    run_id: str
    server_id: str
    arm: str | None = None
    fingerprint: str | None = None
    argv_json: str | None = None
    env_json: str | None = None
    started_at: datetime | None = None
    startup_s: float | None = None
    kv_capacity_tokens: int | None = None
    vllm_version: str | None = None
    torch_version: str | None = None
    gpu_name: str | None = None
    status: str | None = None
    error: str | None = None
    log_path: str | None = None
    warnings: tuple[str, ...] = ()  # the server log's WARNING lines up to ready
    launch_id: str | None = None  # the launch this server belongs to (several with replicas)
    device: str | None = None  # the device(s) it ran on: GPU indices (CUDA_VISIBLE_DEVICES) or a logical id
    stopped_at: datetime | None = None
    compile_cache: str | None = None  # vLLM's log at start: "warm" (loaded compiled graphs), "cold" (compiled), None
    # The host it ran on (runner.measure.host): None on servers stored before it was recorded.
    machine_id: str | None = None
    hostname: str | None = None
    gpu_uuid: str | None = None  # NVML's, "," between a server's GPUs
    gpu_serial: str | None = None
    # The launch's own calibration of its GPU, just before this server started (`Plan.calibrate_launches`):
    # dense bf16 matmul FLOP/s and HBM copy bytes/s; None where it was not asked for or failed (`calibration_error`
    # says why it failed). None on servers stored before it existed.
    machine_flops: float | None = None
    machine_bandwidth: float | None = None
    calibration_error: str | None = None

    def metric(self, name: str) -> float | None:
        """A server-level metric (`kv_capacity_tokens`, `startup_s`, the machine metrics `machine_flops`,
        `machine_bandwidth`, `ridge_point`) as a float, None if unmeasured."""
        if name == "ridge_point":
            return ridge_point(self.machine_flops, self.machine_bandwidth)
        if name not in SERVER_METRICS:
            raise KeyError(f"no server metric named {name!r}")
        value = getattr(self, name)
        return None if value is None else float(value)


@dataclass(frozen=True)
class PointRecord:
    """One point as stored: identity, status, its summary and its verdict."""

    run_id: str
    point_id: str
    server_id: str | None = None
    arm: str = ""
    workload: str = ""
    concurrency: int | None = None
    rate_rps: float | None = None
    repeat: int = 0
    fingerprint: str | None = None
    status: str = "ok"
    error: str | None = None
    cache_policy: str | None = None
    reset_ok: bool | None = None
    started_at: datetime | None = None
    summary: PointSummary = field(default_factory=PointSummary)
    valid: bool = False
    flagged: bool = False
    phases_json: str | None = None
    server_warnings: tuple[str, ...] = ()  # the server log's WARNING lines while the point ran
    reset_attempts: int | None = None
    verdict: str | None = None  # "valid", "invalid: <checks>" or "unverified: <checks>"
    # The server's counters at the measured window's edges (runner.measure.prometheus.edge_json), so the
    # reconciliation can be judged again from the database.
    counters_before_json: str | None = None
    counters_after_json: str | None = None
    # The step-time model's prediction for the point, fitted before the run from the other runs in
    # the same database on the host's GPU (report.ledger.ledger); NULL where none could be made, and why.
    predicted_output_throughput: float | None = None
    predicted_tpot_s: float | None = None
    predicted_ttft_s: float | None = None
    prediction_note: str | None = None
    device: str | None = None  # the launch's device(s), replicas separated by ";"
    client_cpus: str | None = None  # the CPUs the load generator was pinned to ("" = not pinned)
    replicas_json: str | None = None  # replicas only: per server, the requests sent and its counter deltas
    # Why the point is kept but no longer read (its point_id then carries "#aside<N>"): e.g. `--resume` ran
    # its block again whole on another host. None: a current point.
    set_aside: str | None = None

    def metric(self, name: str) -> float | None:
        return self.summary.metric(name)
