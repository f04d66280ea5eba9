"""Live progress of a run (rich): points done/total, the current point, tok/s, and an ETA that counts
the server starts still ahead, not only the points.

On a terminal a live bar; otherwise (a log file, a pipe) plain lines at full width, never wrapped.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from base import format as fmt
from compiler.plan import Plan
from runner.execute import driver


def console_for(stream: Any) -> Console:
    """A console that wraps only on a terminal: piped or logged output keeps its full lines."""
    tty = bool(getattr(stream, "isatty", lambda: False)())
    if tty:
        return Console(file=stream)
    return Console(file=stream, width=10_000, soft_wrap=True, force_terminal=False)


def remaining_s(plan: Plan, done_points: set[str], started_servers: set[str], pace: float) -> float:
    """Seconds left: the estimates of points not done and of launches not started, times the pace
    (measured seconds per estimated second so far; 1.0 before anything finished)."""
    total = 0.0
    for launch in plan.launches:
        left = [p for p in launch.points if p.id not in done_points]
        searches = [] if launch.id in started_servers else list(launch.searches)  # a capacity search: its most probes
        if not left and not searches:
            continue
        if launch.id not in started_servers:
            total += launch.estimated_start_s
        total += sum(p.estimated_s for p in left) + sum(q.estimated_s for q in searches)
    return total * pace


# Seconds of plan estimate the pace is shrunk toward 1.0 by: after one short point, a slow start (or a
# fast one) says little, and an ETA of hours for a run of minutes is worse than the plan's own estimate.
PACE_PRIOR_S = 120.0


def pace_of(elapsed_s: float, estimated_s: float, prior_s: float = PACE_PRIOR_S) -> float:
    """Measured seconds per estimated second so far, shrunk toward 1.0 (the plan) by `prior_s` of estimate:
    with nothing estimated done yet, 1.0; with much done, the measured ratio."""
    return (elapsed_s + prior_s) / (estimated_s + prior_s)


def most_points(plan: Plan) -> int:
    """The plan's points, and the most probes its capacity searches may measure."""
    return len(plan.points) + sum(q.probes for launch in plan.launches for q in launch.searches)


def eta_text(seconds: float) -> str:
    return f"eta {fmt.duration(seconds)}"


class LiveProgress(driver.Progress):
    def __init__(self, plan: Plan, stream: Any = None) -> None:
        stream = stream or sys.stderr
        self.plan = plan
        self.console = console_for(stream)
        self.live = self.console.is_terminal
        self.bar = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[eta]}"), TextColumn("{task.fields[rate]}"),
            console=self.console, transient=False, disable=not self.live,
        )
        self.task: Any = None
        self.done: set[str] = set()
        self.started: set[str] = set()
        self.origin: float | None = None  # the first measured start: calibration and priming are not the pace
        self.estimated_done_s = 0.0
        self.skipped = 0

    def _eta(self) -> str:
        elapsed = 0.0 if self.origin is None else time.monotonic() - self.origin
        pace = pace_of(elapsed, self.estimated_done_s)
        left = remaining_s(self.plan, self.done, self.started, pace)
        # Points skipped by --resume are not known by id here: scale by the share still to run.
        total = len(self.plan.points)
        if self.skipped and total:
            left *= max(total - self.skipped - len(self.done), 0) / max(total - len(self.done), 1)
        return eta_text(left)

    def start(self, total: int, done: int) -> None:
        self.skipped = done
        self.bar.start()
        self.task = self.bar.add_task("points", total=total, completed=done, rate="", eta=self._eta())

    def server(self, step: Any, status: str, starting: bool = False) -> None:
        """A server line; `starting`: the launch's server is being started (its start counts once, whatever
        the line says: held, calibrated, a replica's)."""
        if starting and step.id not in self.started:
            self.origin = time.monotonic() if self.origin is None else self.origin
            self.started.add(step.id)
            self.estimated_done_s += step.estimated_start_s
        self.console.print(f"server {step.id}: {status}", markup=False, highlight=False)

    def point_started(self, point: Any) -> None:
        self.bar.update(self.task, description=f"{point.arm} {point.workload} {point.rung.id_label} r{point.repeat}")

    def point_done(self, outcome: Any) -> None:
        point = outcome.point
        self.done.add(point.id)
        self.estimated_done_s += point.estimated_s
        judgement = getattr(outcome, "judgement", None)
        tps = getattr(judgement.summary, "output_throughput", None) if judgement is not None else None
        mark = "ok" if outcome.valid else ("FAILED" if outcome.status != "ok" else "invalid")
        if outcome.flagged:
            mark += ", flagged"
        rate = f"{tps:,.0f} tok/s" if tps else ""
        eta = self._eta()
        self.bar.update(self.task, advance=1, rate=rate, eta=eta)
        failed = [c.name for c in (judgement.checks if judgement is not None else ()) if not c.passed]
        extra = f" checks: {', '.join(failed)}" if failed else ""
        error = f" ({outcome.error})" if outcome.error else ""
        most = most_points(self.plan)
        of = f"{most}" if most == len(self.plan.points) else f"at most {most}"
        count = f"[{len(self.done) + self.skipped}/{of}, {eta}]"
        self.console.print(f"  {point.id}: {mark} {rate}{extra}{error} {count}", markup=False, highlight=False)

    def message(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False)

    def close(self) -> None:
        self.bar.stop()
