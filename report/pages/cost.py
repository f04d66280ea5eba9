"""Where a study's GPU time went, for the pages: the study page's phase table and its stacked bar per
launch (`runner.execute.segments` sums the stored phases), and the index's GPU-seconds per decided
hypothesis. A run stored before phases were (the committed H200 runs) has its wall only, and says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import altair as alt

from report.pages.charts import WIDTH, _data, spec
from report.pages.page_models import Chart, Timing
from report.results import RESUMED, RunData
from report.scoring.score_model import Score
from runner.execute.segments import PHASES, launch_phases, phase_table

DECIDED = ("confirmed", "refuted")


def gpu_seconds(data: RunData) -> tuple[float | None, bool]:
    """(the run's GPU-seconds: each segment's wall x the device slots it ran on, every segment counted;
    whether that is the stored wall only, without phases). (None, True) when neither was stored."""
    table = phase_table(data.segments, data.phases)
    if table is not None:
        return table.total_s, False
    return data.run.wall_s, True


def unrecorded_segments(data: RunData) -> int:
    """Segments of a resumed run stored before segments were whose wall no row holds: its stored wall is the
    last segment's (the runner's resume notes count the others)."""
    if data.segments:
        return 0
    return len(RESUMED.findall(data.run.notes or ""))


def cost_text(data: RunData | None, scores: Sequence[Score]) -> str:
    """The index's cell: GPU-seconds per decided (confirmed or refuted) hypothesis, and what it rests on; a
    resumed run stored before segments were is a lower bound ("at least"), its earlier segments unrecorded."""
    if data is None:
        return "-"
    total, wall_only = gpu_seconds(data)
    if total is None:
        return "not recorded"
    decided = sum(1 for s in scores if s.verdict in DECIDED)
    missing = unrecorded_segments(data)
    only = "; wall only" if wall_only else ""
    if missing:
        only = f"; wall of its last segment only, {missing} earlier not recorded"
    least = "at least " if missing else ""
    if not decided:
        return f"{least}{total:,.0f} GPU-s, none of {len(scores)} decided{only}"
    return (f"{least}{total / decided:,.0f} GPU-s each ({total:,.0f} GPU-s, {decided} of {len(scores)} "
            f"decided{only})")


def site_cost_text(runs: dict[str, RunData], scores: dict[str, list[Score]]) -> str:
    """Every study's GPU-seconds summed, and per decided hypothesis across the site."""
    total, decided, wall_only, partial = 0.0, 0, 0, 0
    for sid, data in runs.items():
        seconds, only = gpu_seconds(data)
        total += seconds or 0.0
        wall_only += only
        partial += unrecorded_segments(data) > 0
        decided += sum(1 for s in scores.get(sid, ()) if s.verdict in DECIDED)
    if not runs:
        return "-"
    per = f"{total / decided:,.0f} GPU-s per decided hypothesis ({decided} decided)" if decided else "none decided"
    note = f"; {wall_only} of {len(runs)} studies' runs stored their wall only" if wall_only else ""
    if partial:
        note += f" ({partial} of them resumed: their earlier segments' walls are not recorded, so at least)"
    return f"{'at least ' if partial else ''}{total:,.0f} GPU-s in all, {per}{note}"


def timing(data: RunData) -> Timing:
    table = phase_table(data.segments, data.phases)
    if table is None:
        wall = data.run.wall_s
        return Timing((), None, "Phases not recorded: this run was stored before studyc kept them"
                      + (f"; its wall was {wall:,.1f} s (wall only)." if wall is not None else ", nor its wall."))
    rows = tuple((name, f"{seconds:,.1f}", f"{share:.1%}") for name, seconds, share in table.rows)
    slots = f" x device slots = {table.total_s:,.1f} s" if table.total_s != table.wall_s else ""
    note = (f"{table.segments} segment(s) ({', '.join(table.ended)}), wall {table.wall_s:,.1f} s{slots}. Server "
            "start phases are read from the server's log, stamped to the second; a span the log does not split "
            "is 'start (unsplit)'. The gap is wall no phase covers.")
    bars = [{"launch": lid, "phase": name, "order": PHASES.index(name) if name in PHASES else len(PHASES),
             "seconds": round(seconds, 3)} for lid, got in launch_phases(data.phases).items() for name, seconds in got]
    chart = Chart("phases", "Where each launch's time went",
                  "Seconds per phase, one bar per launch (all segments); the run's own phases (calibration, "
                  "self-test, gap) are in the table only.", spec(phase_chart(bars))) if bars else None
    return Timing(rows, chart, note)


def phase_chart(rows: Sequence[dict[str, Any]]) -> Any:
    """A stacked horizontal bar per launch, one segment per phase in run order. Rows: launch, phase, order, seconds."""
    launches = sorted({str(r["launch"]) for r in rows})
    names = [p for p in PHASES if any(r["phase"] == p for r in rows)]
    return alt.Chart(_data(rows)).mark_bar().encode(
        y=alt.Y("launch:N", title="launch", sort=launches),
        x=alt.X("sum(seconds):Q", title="seconds"),
        color=alt.Color("phase:N", title="phase", sort=names, scale=alt.Scale(domain=names, scheme="tableau20")),
        order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("launch:N"), alt.Tooltip("phase:N"), alt.Tooltip("seconds:Q", format=",.1f")],
    ).properties(width=WIDTH, height=max(60, 22 * len(launches)))
