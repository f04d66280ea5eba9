"""Held starts: while a launch starts and measures, the next launch's server is spawned held after its
imports (`runner.server.held`), so its own start begins where those imports end. Used by the sequential
executor, for a launch of one server whose engine command names its interpreter (`engine_python`), on a
host with /proc; `studyc run --cold-starts` turns it off. The run's first launch has nothing to overlap
its imports with, but it is held too (`hold_first`: spawned held, let go once imported), so that every
launch's start counts from the same point and `startup_s` compares like with like between arms.

It must not disturb what is measured: the held server's process group is stopped (SIGSTOP) for the
whole of every point of the running launch (warmup, reset, load, judge), and the point's check
`held_start_paused` reads the group's CPU time before and after. A tick used, a member that appeared or
vanished, or a group that never showed as stopped fails the point. The held process runs only while the
current launch starts, between its points and after it stops.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.execute import replicas
from runner.server.engine import VllmServer, engine_python
from runner.server.procs import group_cpu_ticks, group_stopped
from runner.store.records import CheckResult

CHECK = "held_start_paused"
STOP_WAIT_S = 2.0  # how long a SIGSTOPped group may take to show every member stopped
IMPORTED = "modules imported in"  # the held script's line once its imports are done (runner.server.held)


def paused_check(point_id: str, stopped: bool, before: dict[int, int], after: dict[int, int]) -> CheckResult:
    """Whether the held server stayed still through a point: every member of its group stopped before the
    point, the same members after it, and no CPU tick used between (`before` and `after`: pid -> ticks)."""
    used = sum(after.get(pid, 0) - ticks for pid, ticks in before.items())
    same = set(before) == set(after)
    if not stopped:
        why = "the held next server's processes did not all stop"
    elif not same:
        why = f"the held next server's processes changed during the point ({len(before)} -> {len(after)})"
    elif used > 0:
        why = f"the held next server used {used} CPU tick(s) during the point"
    else:
        why = f"the held next server ({len(before)} process(es)) stayed stopped through the point"
    passed = stopped and same and used <= 0
    return CheckResult(point_id=point_id, name=CHECK, passed=passed, severity="fail", value=float(used),
                       threshold=0.0, detail=why)


def with_check(outcome: Any, check: CheckResult) -> None:
    """Add `check` to a point outcome's judgement, its verdict read again (no judgement: nothing to add to)."""
    if outcome.judgement is not None:
        outcome.judgement = replicas.with_check(outcome.judgement, check)


@dataclass
class Quiet:
    """What `Prestart.paused` saw of the held server across one point; `check` once the point is over."""

    stopped: bool = False
    before: dict[int, int] = field(default_factory=dict)
    after: dict[int, int] = field(default_factory=dict)
    watched: bool = False  # False: nothing was held, nothing to check

    def check(self, point_id: str) -> CheckResult | None:
        return paused_check(point_id, self.stopped, self.before, self.after) if self.watched else None


class Prestart:
    """At most one held server: the next launch's first server, spawned by `hold`, taken by `claim`.
    `stop_signal` is what `paused` sends (a test sends one that does not stop, to make the check fail)."""

    def __init__(self, stop_signal: signal.Signals = signal.SIGSTOP, proc: Path = Path("/proc")) -> None:
        self.server: VllmServer | None = None
        self.first = False  # the held server is the run's first launch's (`hold_first`): it overlapped nothing
        self.stop_signal = stop_signal
        self.proc = proc

    def hold(self, server: VllmServer) -> bool:
        """Spawn `server` held (dropping any other held one); False when it cannot be held (its engine
        command's interpreter unknown, or no /proc to check it by): it then starts cold when claimed."""
        self.close()
        self.first = False
        python = engine_python(server.command)
        if python is None or not self.proc.is_dir():
            return False
        server.hold(python, server.key_dir)
        self.server = server
        return True

    def hold_first(self, server: VllmServer, timeout_s: float = 600.0) -> float | None:
        """The run's first launch held as well, with nothing to overlap: `server` spawned held and waited
        for until its imports are done (its log's imported line), it exits, or `timeout_s` passes. The
        seconds waited (its API process's imports, a phase of the launch), or None when it cannot be held
        (it then starts cold when claimed)."""
        t0 = time.monotonic()
        if not self.hold(server):
            return None
        self.first = True
        while server.poll() is None and IMPORTED not in server.log_tail(5) and time.monotonic() - t0 < timeout_s:
            time.sleep(0.05)
        return time.monotonic() - t0

    def claim(self, server: VllmServer) -> VllmServer:
        """The held server if it is `server` (same command, arguments, environment and log), else `server`;
        a held server that is not it is stopped."""
        held, self.server = self.server, None
        if held is None:
            return server
        if (held.command, held.argv_tail, held.extra_env, held.log_path) == (
                server.command, server.argv_tail, server.extra_env, server.log_path) and held.poll() is None:
            held.api_key = server.api_key
            return held
        held.stop()
        return server

    @contextmanager
    def paused(self) -> Iterator[Quiet]:
        """The held server stopped for the block's duration; the returned Quiet is filled on exit."""
        quiet = Quiet()
        server = self.server
        pgid = server.pid if server is not None and server.held else None
        if server is None or pgid is None:
            yield quiet
            return
        quiet.watched = True
        try:
            server.pause(self.stop_signal)
            deadline = time.monotonic() + STOP_WAIT_S
            while not group_stopped(pgid, self.proc) and time.monotonic() < deadline:
                time.sleep(0.01)
            quiet.stopped = group_stopped(pgid, self.proc)
            quiet.before = group_cpu_ticks(pgid, self.proc)
            yield quiet
        finally:
            quiet.after = group_cpu_ticks(pgid, self.proc)
            server.resume()

    def close(self) -> None:
        """Stop a held server nobody claimed."""
        if self.server is not None:
            self.server.stop()
            self.server = None
