"""Live progress of a run in the terminal (rich): points done/total, arm, point, ETA, tok/s."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from runner import run as run_mod


class LiveProgress(run_mod.Progress):
    def __init__(self) -> None:
        self.console = Console(stderr=True)
        self.bar = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[rate]}"),
            console=self.console, transient=False,
        )
        self.task: Any = None

    def start(self, total: int, done: int) -> None:
        self.bar.start()
        self.task = self.bar.add_task("points", total=total, completed=done, rate="")

    def server(self, step: Any, status: str) -> None:
        self.console.print(f"[bold]server[/] {step.id}: {status}")

    def point_started(self, point: Any) -> None:
        self.bar.update(self.task, description=f"{point.arm} {point.workload} {point.level_label} r{point.repeat}")

    def point_done(self, outcome: Any) -> None:
        tps = outcome.summary.get("output_throughput")
        mark = "ok" if outcome.valid else ("FAILED" if outcome.status != "ok" else "invalid")
        if outcome.flagged:
            mark += ", flagged"
        rate = f"{tps:,.0f} tok/s" if tps else ""
        self.bar.update(self.task, advance=1, rate=rate)
        failed = [c.name for c in outcome.checks if not c.passed]
        extra = f" checks: {', '.join(failed)}" if failed else ""
        self.console.print(f"  {outcome.point.id}: {mark} {rate}{extra}" + (f" ({outcome.error})" if outcome.error else ""))

    def message(self, text: str) -> None:
        self.console.print(text)

    def close(self) -> None:
        self.bar.stop()
