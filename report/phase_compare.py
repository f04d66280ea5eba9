"""Where the wall went, run beside run (`studyc phases`): the phase tables of several runs in one table, so
a lever is read from the same study measured before and after it, on the same machine and day, phase by
phase. With two runs a last column gives the second minus the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from report.results import RunData
from runner.execute.segments import PHASES, START, WINDOW, PhaseTable, phase_table

STARTS = "starts:"  # how the run's notes say how its servers were started (runner.execute.run)


@dataclass(frozen=True)
class RunCost:
    """One run's wall by phase, with what it rests on."""

    run_id: str
    study_id: str
    table: PhaseTable
    launches: int  # launches with a server start in this run's phases
    starts: str  # "held" | "cold (--cold-starts)" | "not recorded" (a run stored before runs said)

    @property
    def over_windows(self) -> float | None:
        """Wall over measurement windows (None without a window)."""
        return self.table.wall_s / self.table.window_s if self.table.window_s > 0 else None


def run_cost(data: RunData) -> RunCost | None:
    """The run's cost, or None for a run stored before its phases were."""
    table = phase_table(data.segments, data.phases)
    if table is None:
        return None
    launches = {p.launch_id for p in data.phases if p.launch_id and p.phase.startswith(START)}
    said = [part.strip()[len(STARTS):].strip() for part in (data.run.notes or "").split(";")
            if part.strip().startswith(STARTS)]
    starts = " then ".join(dict.fromkeys(said)) or "not recorded"  # a resumed segment may have said otherwise
    return RunCost(data.run.run_id, data.run.study_id, table, len(launches), starts)


def compare_text(costs: Sequence[RunCost]) -> str:
    """The runs' phases side by side: seconds and share per run, and with two runs the second minus the
    first; then wall, windows, wall over windows and the launches started."""
    if not costs:
        return "no run with stored phases"
    seen = {name for c in costs for name, _, _ in c.table.rows}
    order = {name: i for i, name in enumerate(PHASES)}
    names = sorted(seen, key=lambda n: (order.get(n, len(order)), n))
    two = len(costs) == 2
    width = max([len("wall over windows"), *(len(n) for n in names)])
    col = max(17, *(len(c.run_id) for c in costs))

    def row(label: str, cells: Sequence[str], diff: str = "") -> str:
        line = f"  {label:<{width}}" + "".join(f"  {cell:>{col}}" for cell in cells)
        return line + (f"  {diff:>12}" if two else "")

    lines = [row("run", [c.run_id for c in costs], "second - first" if two else ""),
             row("study", [c.study_id for c in costs]),
             row("starts", [c.starts for c in costs])]
    by_phase = [{n: (s, share) for n, s, share in c.table.rows} for c in costs]
    for name in names:
        got = [phases.get(name) for phases in by_phase]
        cells = [f"{s:.1f} s {share:6.1%}" if s is not None else "-" for s, share in (g or (None, 0.0) for g in got)]
        diff = ""
        if two:
            a, b = ((g[0] if g else 0.0) for g in got)
            diff = f"{b - a:+.1f} s"
        lines.append(row(name, cells, diff))
    lines.append(row("wall", [f"{c.table.wall_s:.1f} s" for c in costs],
                     f"{costs[1].table.wall_s - costs[0].table.wall_s:+.1f} s" if two else ""))
    lines.append(row(WINDOW + "s", [f"{c.table.window_s:.1f} s" for c in costs]))
    ratios = [c.over_windows for c in costs]
    lines.append(row("wall over windows", [f"{r:.2f}x" if r is not None else "-" for r in ratios]))
    lines.append(row("launches started", [str(c.launches) for c in costs]))
    return "\n".join(lines)
