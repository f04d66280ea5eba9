"""One launch: start its server(s), run its points, stop them. Self-contained: a `LaunchSpec` (plain,
picklable data) in, events out through `emit`; nothing here writes the database, so a launch can run
on a thread beside others, or be dispatched to another process or node, while the driver alone
commits what it emits.

Events, in order: `ServerEvent` per server (starting record, then ready or failed), `PointEvent` per
point as it completes, `ServerEvent` again when each server stopped. A server that fails to start, or
dies during a point, raises EngineError after its events are emitted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from base.errors import EngineError
from compiler.plan import Launch, PointStep, SearchStep
from runner.execute.machine import PHASE as CALIBRATION_PHASE
from runner.execute.machine import Calibrator, calibrate_servers, calibration_note
from runner.execute.point import (
    Endpoint,
    PointContext,
    PointOutcome,
    log_since,
    log_size,
    log_warnings,
    run_point,
)
from runner.execute.prestart import Prestart, with_check
from runner.execute.search import run_search
from runner.measure.calibrate import calibrate
from runner.measure.host import host_identity
from runner.server.engine import VllmServer
from runner.server.pinning import pin_engine, pin_front_end
from runner.server.placement import Placement
from runner.server.startlog import UNSPLIT, start_phases
from runner.server.tokenizer import ensure_tokenizer
from runner.store.records import ServerRecord, redact_argv
from runner.store.store import as_json

COMPILE_CACHE_ENV = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR")


class StartExited(EngineError):
    """A server of the launch exited before it was ready (held or cold): the start is tried once more, cold,
    by `run_launch_retried`; a server that is up but unready at its timeout, or lacks an expected log line,
    is not (trying again would only repeat it)."""


@dataclass(frozen=True)
class LaunchSpec:
    """Everything one launch needs."""

    launch: Launch
    points: tuple[PointStep, ...]  # those still to run (a resumed launch runs the rest)
    run_id: str
    placement: Placement
    ctx: PointContext  # client CPUs and the NVML device are this launch's own
    engine_command: tuple[str, ...]
    log_dir: Path
    key_dir: Path  # the servers' API key's folder (STUDYC_CACHE_DIR; `runner.server.engine.server_api_key`)
    startup_timeout_s: float
    cache_root: Path | None = None  # vLLM's compile cache, shared by every run (STUDYC_CACHE_DIR; vLLM keys it)
    gpu_host: bool = False  # True: each server gets CUDA_VISIBLE_DEVICES for its devices
    # Ids for this launch's servers when they differ from the plan's: a resumed launch starts new
    # servers, which must not overwrite the rows of the ones that measured its earlier points.
    server_ids: tuple[str, ...] = ()
    searches: tuple[SearchStep, ...] = ()  # capacity searches still to run, after the points
    # The machine metrics (`runner.execute.machine`): the engine python to calibrate each server's GPU with,
    # just before the servers start; empty: not asked for (`Plan.calibrate_launches` false), or
    # `calibration_skipped` says why not (--no-calibrate), stored on the server rows.
    calibrate_python: tuple[str, ...] = ()
    calibration_skipped: str = ""

    @property
    def servers(self) -> tuple[str, ...]:
        """This start's server ids: `server_ids`, else the plan's (a plan stored without them: the launch id)."""
        return self.server_ids or self.launch.server_ids or (self.launch.id,)


@dataclass(frozen=True)
class ServerEvent:
    record: ServerRecord
    info: Any = None  # runner.server.introspect.ServerInfo once ready
    status: str = ""  # what the progress line says
    starting: bool = False  # the server is being started (the launch's start begins; progress counts it once)


@dataclass(frozen=True)
class PointEvent:
    launch: Launch
    outcome: PointOutcome
    server_id: str
    device: str
    client_cpus: str


@dataclass(frozen=True)
class PointStartEvent:
    point: PointStep


@dataclass(frozen=True)
class PhaseEvent:
    """Seconds the launch spent in phases outside its points: its start's phases, its stop."""

    launch_id: str
    phases: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class RetryEvent:
    """A start failed (its server exited before it was ready) and is tried once more, cold, as `again`."""

    launch: Launch
    failed: str  # the failed start's server id
    again: str  # the retry's server id
    reason: str  # the first line of why it failed


@dataclass(frozen=True)
class StartedEvent:
    """The launch's points are about to run: every server answered."""

    launch: Launch


@dataclass
class Cancel:
    """Shared with the driver: set `event` to stop between points; `stop_all` stops every server the
    launches of this process have running (Ctrl-C on the driver)."""

    event: threading.Event = field(default_factory=threading.Event)
    servers: set[Any] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, server: Any) -> None:
        with self.lock:
            self.servers.add(server)

    def discard(self, server: Any) -> None:
        with self.lock:
            self.servers.discard(server)

    def stop_all(self) -> None:
        self.event.set()
        with self.lock:
            live = list(self.servers)
        for server in live:
            server.stop()


Event = ServerEvent | PointEvent | PointStartEvent | StartedEvent | PhaseEvent | RetryEvent
# Called after the launch's first point with (measure again, that point's outcome): the driver uses
# it to measure interference. Whatever it measures is not emitted as a point.
Interlude = Callable[[Callable[[], PointOutcome], PointOutcome], None]


def point_owner(spec: LaunchSpec) -> str:
    """The server id a launch's points are stored under: its one server's id for this start (a resumed
    launch's is "<id>~2"); replicas measure together, so their points name the launch, which every
    replica's row carries as its launch_id."""
    return spec.servers[0] if len(spec.servers) == 1 else spec.launch.id


def compile_cache_state(log_path: Path, start: int = 0) -> str | None:
    """What vLLM's compile cache gave this start, from the lines its log gained after byte `start`:
    "warm" (it loaded compiled graphs), "cold" (it compiled them), None (no torch.compile: eager,
    or a log that says neither)."""
    text = log_since(log_path, start) or ""
    if "Compiling a graph" in text:
        return "cold"
    if "Directly load the compiled graph" in text:
        return "warm"
    return None


def missing_from_log(text: str, expected: Sequence[str]) -> list[str]:
    """The expected texts (a study arm's `expect_log`) that the server's log does not contain."""
    return [e for e in expected if e not in text]


def expect_logged(log_path: Path, server_id: str, start: int, expected: Sequence[str]) -> None:
    """Raise EngineError when the server's log since byte `start` lacks a text its arm expects by ready:
    the engine did not do what the study asked of it (a backend, a feature), so nothing is measured on it."""
    if not expected:
        return
    missing = missing_from_log(log_since(log_path, start) or "", expected)
    if missing:
        said = "; ".join(repr(m) for m in missing)
        raise EngineError(f"server {server_id} is ready but its log does not say {said} (the arm's "
                          f"expect_log): see {log_path}")


def server_env(spec: LaunchSpec, devices: Sequence[str]) -> dict[str, str]:
    """The launch's env, plus the server's GPUs (GPU hosts) and the configuration's compile cache
    (unless the study sets those variables itself)."""
    env = dict(spec.launch.env)
    if spec.gpu_host:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    if spec.cache_root is not None:
        env.setdefault("VLLM_CACHE_ROOT", str(spec.cache_root))
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(spec.cache_root / "inductor"))
    return env


def new_server(spec: LaunchSpec, sid: str, devices: Sequence[str]) -> VllmServer:
    """Server `sid` of the launch, on `devices`, not yet started."""
    return VllmServer(
        spec.launch.argv, env=server_env(spec, devices), log_path=spec.log_dir / (sid.replace("/", "__") + ".log"),
        command=list(spec.engine_command), startup_timeout_s=spec.startup_timeout_s, key_dir=spec.key_dir,
        gpu_index=int(devices[0]) if spec.gpu_host and devices[0].isdigit() else 0,
    )


def run_launch(
    spec: LaunchSpec, emit: Callable[[Event], None], *, cancel: Cancel | None = None,
    interlude: Interlude | None = None, prestart: Prestart | None = None, next_spec: LaunchSpec | None = None,
    calibrator: Calibrator = calibrate, cold: bool = False,
) -> None:
    """Start the launch's servers (all at once), run its points across them, stop them. With `prestart`,
    its first server is the one held there if it matches, and once its servers are spawned the first server
    of `next_spec` is spawned held (`runner.execute.prestart`). With `spec.calibrate_python`, each server's
    GPU is calibrated with `calibrator` first (`runner.execute.machine`). `cold`: a retried start, which takes
    no held server and holds none (the one held for the next launch stays held, and paused during points)."""
    launch = spec.launch
    cancel = cancel or Cancel()
    spec.log_dir.mkdir(parents=True, exist_ok=True)
    if Path(launch.model_dir, "config.json").is_file():
        ensure_tokenizer(launch.model_dir)
    servers: list[Any] = []
    records: list[ServerRecord] = []
    starts: list[int] = []
    held, first = False, False
    for sid, devices in zip(spec.servers, spec.placement.server_devices, strict=True):
        server = new_server(spec, sid, devices)
        if prestart is not None and not servers and not cold:
            first = prestart.first
            server = prestart.claim(server)
            held = server.held
        log_path = server.log_path
        host = host_identity(devices, spec.gpu_host)  # where this start runs (a Ray worker: its node)
        records.append(ServerRecord(
            run_id=spec.run_id, server_id=sid, arm=launch.arm, fingerprint=launch.fingerprint,
            argv_json=as_json(redact_argv(list(server.argv))), env_json=as_json(launch.env),
            started_at=datetime.now(UTC), log_path=str(log_path), launch_id=launch.id, device=",".join(devices),
            machine_id=host.machine_id, hostname=host.hostname, gpu_uuid=host.gpu_uuid, gpu_serial=host.gpu_serial,
        ))
        if servers:  # the balancer sends one key: the replicas of a launch share the first one's
            server.api_key = servers[0].api_key
        servers.append(server)
        starts.append(server.log_start if server.held else log_size(log_path))
    calibrated = _calibrate(spec, servers, records, emit, calibrator)
    infos: list[Any] = []
    pin = not spec.gpu_host  # CPU servers: their engines apart from the load generator (replicas share those cores)
    t_start, spawned_at, up = time.monotonic(), datetime.now(), False  # local: as vLLM stamps
    try:
        for server, record in zip(servers, records, strict=True):
            how = "imported before its start" if first else "imported while the launch before ran"
            emit(ServerEvent(record, status=(f"starting (held: {how})" if held else "starting") + calibrated,
                             starting=True))
            cancel.add(server)
            server.start()
            if pin:  # see runner.server.pinning
                pin_engine(server.pid, spec.placement.client_cpus)
        if prestart is not None and next_spec is not None and len(next_spec.servers) == 1 and not cold:
            prestart.hold(new_server(next_spec, next_spec.servers[0], next_spec.placement.server_devices[0]))
        for server, record, start in zip(servers, list(records), starts, strict=True):
            try:
                info = server.wait_ready()
                expect_logged(server.log_path, record.server_id, start, launch.expect_log)
            except EngineError as exc:
                failed = replace(record, status="failed", error=exc.message,
                                 warnings=log_warnings(server.log_path, start))
                records[records.index(record)] = failed  # a ready server lacking an expected text is stopped below
                emit(ServerEvent(failed, status="failed"))
                if server.exit_code is not None and server.info is None:
                    raise StartExited(exc.message) from exc
                raise
            infos.append(info)
            pinned = ", " + pin_front_end(server.pid, spec.placement.client_cpus) if pin else ""
            ready = replace(
                record, status="ready", startup_s=info.startup_s, kv_capacity_tokens=info.kv_capacity_tokens,
                vllm_version=info.vllm_version, torch_version=info.torch_version, gpu_name=info.gpu_name,
                warnings=log_warnings(server.log_path, start),
                compile_cache=compile_cache_state(server.log_path, start),
            )
            records[records.index(record)] = ready
            cache = f", {ready.compile_cache} compile cache" if ready.compile_cache else ""
            emit(ServerEvent(ready, info=info, status=f"ready in {info.startup_s:.1f} s{cache}, "
                                                      f"KV {info.kv_capacity_tokens or '?'} tokens{pinned}"))
        up = True
        total = time.monotonic() - t_start
        split = start_phases(log_since(servers[0].log_path, starts[0]) or "", spawned_at, total) \
            if len(servers) == 1 else [(UNSPLIT, total)]  # replicas start side by side: one span
        emit(PhaseEvent(launch.id, tuple(split)))
        _measure(spec, servers, infos, emit, cancel, interlude, prestart)
    finally:
        if not up:
            emit(PhaseEvent(launch.id, (("start (failed)", time.monotonic() - t_start),)))
        t_stop = time.monotonic()
        for server, record in zip(servers, records, strict=True):
            server.stop()
            cancel.discard(server)
            if server.info is not None:
                emit(ServerEvent(replace(record, stopped_at=datetime.now(UTC)), status="stopped"))
        emit(PhaseEvent(launch.id, (("stop", time.monotonic() - t_stop),)))


def retried_ids(spec: LaunchSpec) -> tuple[str, ...]:
    """The server ids of a start tried again: the next "~N" after each of this start's ("x" -> "x~2",
    "x~2" -> "x~3"), as a resumed launch's are numbered (`runner.execute.driver.fresh_server_ids` gives a
    later resume the first number no start of the launch took)."""
    def bump(sid: str) -> str:
        head, sep, tail = sid.rpartition("~")
        return f"{head}~{int(tail) + 1}" if sep and tail.isdigit() and int(tail) >= 2 else f"{sid}~2"

    return tuple(bump(sid) for sid in spec.servers)


def run_launch_retried(spec: LaunchSpec, emit: Callable[[Event], None], **kw: Any) -> None:
    """`run_launch`; where a server exits before it is ready (`StartExited`), the launch is started once more,
    cold, under new server ids: both starts keep their rows, phases and logs. A second failure raises, naming
    both."""
    try:
        run_launch(spec, emit, **kw)
    except StartExited as exc:
        again = replace(spec, server_ids=retried_ids(spec))
        first_line = exc.message.splitlines()[0] if exc.message else "it exited"
        kw = {k: v for k, v in kw.items() if k != "next_spec"}
        emit(RetryEvent(spec.launch, spec.servers[0], again.servers[0], first_line))
        try:
            run_launch(again, emit, cold=True, **kw)
        except StartExited as second:
            raise EngineError(f"{spec.launch.id}: its start failed twice, the second time cold as "
                              f"{again.servers[0]} ({second.message.splitlines()[0] if second.message else ''}); "
                              f"the first: {first_line}") from second


def _calibrate(spec: LaunchSpec, servers: list[Any], records: list[ServerRecord], emit: Callable[[Event], None],
               calibrator: Calibrator) -> str:
    """The launch's machine metrics onto `records` (in place), before any of its servers starts; a held
    server (imported while the launch before ran) is stopped meanwhile. Returns what the progress line adds."""
    if spec.calibration_skipped:
        records[:] = [replace(r, calibration_error=spec.calibration_skipped) for r in records]
        return f"; not calibrated: {spec.calibration_skipped}"
    if not spec.calibrate_python:
        return ""
    devices = [int(ds[0]) if spec.gpu_host and ds and ds[0].isdigit() else None
               for ds in spec.placement.server_devices]
    paused = [s for s in servers if getattr(s, "held", False)]
    for server in paused:
        server.pause()
    try:
        records[:], seconds = calibrate_servers(records, devices, spec.calibrate_python, calibrator)
    finally:
        for server in paused:
            server.resume()
    emit(PhaseEvent(spec.launch.id, ((CALIBRATION_PHASE, seconds),)))
    return "; " + calibration_note(records)


def _measure(spec: LaunchSpec, servers: list[Any], infos: list[Any], emit: Callable[[Event], None],
             cancel: Cancel, interlude: Interlude | None, prestart: Prestart | None = None) -> None:
    launch = spec.launch
    first = infos[0]
    many = len(servers) > 1
    endpoint = Endpoint(
        first.base_url, first.api_key, launch.served_model_name, servers[0].log_path,
        replicas=tuple(i.base_url for i in infos) if many else (),
        server_ids=spec.servers if many else (), balance=launch.balance,
        prefix_caching=launch.engine.prefix_caching,
    )
    device = ";".join(",".join(ds) for ds in spec.placement.server_devices)
    cpus = ",".join(str(c) for c in spec.placement.client_cpus or ())
    owner = point_owner(spec)
    emit(StartedEvent(launch))

    def measure(point: PointStep) -> PointOutcome:
        if cancel.event.is_set():
            raise KeyboardInterrupt
        emit(PointStartEvent(point))
        if prestart is None:
            outcome = run_point(point, endpoint, spec.ctx)
        else:
            with prestart.paused() as quiet:
                outcome = run_point(point, endpoint, spec.ctx)
            check = quiet.check(point.id)
            if check is not None:
                with_check(outcome, check)
        dead = [s for s in servers if s.poll() is not None]
        if outcome.status != "ok" and dead:
            outcome.error = f"{outcome.error}; server exited ({dead[0].poll()}): {dead[0].log_tail(8)}"
            emit(PointEvent(launch, outcome, owner, device, cpus))
            raise EngineError(f"server {launch.id} died during {point.id}")
        emit(PointEvent(launch, outcome, owner, device, cpus))
        return outcome

    for k, point in enumerate(spec.points):
        outcome = measure(point)
        if k == 0 and interlude is not None:
            interlude(partial(run_point, point, endpoint, spec.ctx), outcome)
    for search in spec.searches:
        run_search(search, measure)
