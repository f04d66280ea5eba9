"""`studyc audit`: score studies against the latest run in one or more results databases and print
predicted vs measured, as a rich table, as JSON or as a GitHub-markdown table. Refuted is a result,
not an error: exit 0.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from compiler.load import LoadedStudy
from report.pages.seed import gpu_name
from report.results import RunData, all_runs, latest_runs
from report.run_compare import StudyRuns, compare_runs
from report.scoring import score_text
from report.scoring.context import build_context
from report.scoring.score_model import Score, Why
from report.scoring.scoring import score
from report.stats.alpha_ledger import ONE_RUN, SHARED
from runner.store.records import base_server_id

VERDICT_STYLE = {
    "confirmed": "bold green",
    "refuted": "bold red",
    "inconclusive": "yellow",
    "invalid": "magenta",
    "not run": "dim",
}


@dataclass(frozen=True)
class Audit:
    """Every scored hypothesis of the audited studies, in study then file order."""

    studies: tuple[LoadedStudy, ...]
    runs: dict[str, RunData]
    scores: tuple[Score, ...]
    compared: dict[str, StudyRuns] = field(default_factory=dict)  # every run of each study (report.run_compare)


def audit_studies(studies: Sequence[LoadedStudy], dbs: Sequence[Path]) -> Audit:
    runs = latest_runs(dbs)
    every = all_runs(dbs)
    scores: list[Score] = []
    compared: dict[str, StudyRuns] = {}
    for loaded in studies:
        sid = loaded.study.study.id
        mine = score(build_context(loaded, runs.get(sid)))
        scores.extend(mine)
        compared[sid] = compare_runs(loaded, every.get(sid, []), runs.get(sid), mine)
    return Audit(tuple(studies), runs, tuple(scores), compared)


def json_row(s: Score) -> dict[str, Any]:
    """A score as JSON: numbers in the metric's own unit, the prediction as text, reasons structured."""
    out = asdict(s)
    out["study"] = out.pop("study_id")
    out["values"] = list(s.values)
    for key in ("targets", "checks", "flags", "point_ids"):
        out[key] = list(out[key])
    out["reasons"] = [asdict(r) | {"why": r.why.value, "checks": list(r.checks), "text": r.text} for r in s.reasons]
    out["notes"] = list(s.notes)
    out["prediction"] = score_text.prediction(s)
    out["look"] = list(s.look) if s.look else None
    out["interval_label"] = s.interval_label
    out["verdict_label"] = s.verdict_label
    out["inconclusive_reason"] = s.inconclusive_reason
    out["verdict_spec_label"] = s.verdict_spec_label
    out["alpha_ledger"] = None if s.alpha_ledger is None else out["alpha_ledger"] | {
        "runs": list(s.alpha_ledger.runs), "other_prediction": list(s.alpha_ledger.other_prediction),
        "unknown": list(s.alpha_ledger.unknown), "m": s.alpha_ledger.m, "share": s.alpha_ledger.share,
        "text": s.alpha_ledger.text}
    out["set_aside"] = None if s.set_aside is None else out["set_aside"] | {
        "blocks": list(s.set_aside.blocks), "look": list(s.set_aside.look) if s.set_aside.look else None,
        "published": s.verdict, "text": score_text.set_aside(s)}
    return out


def json_rows(result: Audit) -> list[dict[str, Any]]:
    """Every score as JSON, each with how its study file changed since the run it is read from (null if not)."""
    changed = {sid: c.changed or None for sid, c in result.compared.items()}
    return [json_row(s) | {"study_file_changed": changed.get(s.study_id)} for s in result.scores]


def print_table(result: Audit) -> None:
    """One rich table per study; the spec-sheet column only where it differs from the calibrated one."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # A terminal gets its own width; a pipe or a CI log gets room for the whole table.
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    console = Console(width=150 if wide else None)
    for study_id in sorted({s.study_id for s in result.scores}):
        scores = [s for s in result.scores if s.study_id == study_id]
        run_id = next((s.run_id for s in scores if s.run_id), None)
        show_spec = any(spec_differs(s) for s in scores)
        table = Table(title=f"{study_id}: predicted vs measured" + (f" (run {run_id})" if run_id else " (no run)"),
                      title_justify="left")
        table.add_column("hypothesis", no_wrap=True)
        table.add_column("metric", no_wrap=True)
        table.add_column("predicted", justify="right")
        if show_spec:
            table.add_column("on spec sheet", justify="right")
        table.add_column("measured", justify="right")
        table.add_column("interval", justify="right")
        table.add_column("read at", justify="right")
        table.add_column("n", justify="right")
        table.add_column("off band", justify="right")
        table.add_column("verdict", no_wrap=True)
        table.add_column("checks", overflow="fold")
        for s in scores:
            cells = [s.hypothesis, s.metric, score_text.prediction(s)]
            if show_spec:
                cells.append(score_text.prediction(s, spec=True, sides=False) if spec_differs(s) else "")
            cells += [score_text.mean(s), score_text.interval(s), score_text.read_at(s), str(s.n),
                      score_text.off_band(s)]
            # Text cells: study text is never read as rich markup.
            table.add_row(*(Text(c) for c in cells), Text(s.shown_verdict, style=VERDICT_STYLE[s.verdict]),
                          Text(", ".join(s.checks)))
        console.print(table, highlight=False)
    uncalibrated = sorted({s.study_id for s in result.scores if s.has(Why.NOT_CALIBRATED)})
    if uncalibrated:
        console.print(f"not calibrated (predicted against the spec sheet): {', '.join(uncalibrated)}",
                      markup=False, highlight=False)
    for s in result.scores:
        for line in [r.text for r in s.reasons if r.why is not Why.NOT_CALIBRATED] + ledger_lines(s):
            console.print(f"  {s.study_id}/{s.hypothesis}: {line}", markup=False, highlight=False)
    if any(r.why is Why.STRADDLES for s in result.scores for r in s.reasons):
        console.print(PLANNER_POINTER, markup=False, highlight=False)
    for study_runs in result.compared.values():
        for line in study_runs.lines():
            console.print(line, markup=False, highlight=False)


# Said once under the notes where an interval straddles an edge: their launch counts are the run's own point
# estimate at its own spread, where the planner sizes a design for 80% power from every stored run.
PLANNER_POINTER = ("  (those launch counts hold this run's spread and mean; launches for 80% power, with their GPU "
                   "time: studyc plan STUDY --db DB)")


def ledger_lines(s: Score) -> list[str]:
    """The score's lines beyond its reasons: a block set aside after the run (both verdicts), and the alpha
    ledger where more than one run states the hypothesis' id (shared 5%, or a new hypothesis)."""
    out = [score_text.set_aside(s)] if s.set_aside else []
    if s.alpha_ledger is not None and s.alpha_ledger.case != ONE_RUN:
        out.append(s.alpha_ledger.text)
    return out


def spec_differs(s: Score) -> bool:
    """Whether the spec sheet predicts something else than the measured ceilings (value or verdict)."""
    return (s.predicted_spec, s.band_low_spec, s.band_high_spec, s.verdict_spec) != (
        s.predicted, s.band_low, s.band_high, s.verdict)


MARKDOWN_HEADER = ("study", "claim", "seed said", "our prediction", "measured", "n", "verdict")


def md_cell(text: str) -> str:
    """Text for one markdown table cell: one line, pipes escaped, no raw HTML, never empty."""
    text = " ".join(str(text).split()).replace("\\", "\\\\").replace("|", "\\|")
    text = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", text)  # a tag or comment would be HTML; "< 0.5" stays
    return text or "-"


def markdown_rows(result: Audit) -> list[tuple[str, ...]]:
    """One row per hypothesis, in study then file order: the cells of `markdown_table`, unescaped."""
    source = {(loaded.study.study.id, h.id): h.source.strip()
              for loaded in result.studies for h in loaded.study.hypothesis}
    return [(s.study_id, s.claim, source.get((s.study_id, s.hypothesis)) or "-", score_text.prediction(s),
             score_text.measured(s), str(s.n), verdict_cell(s)) for s in result.scores]


def verdict_cell(s: Score) -> str:
    """The published verdict, with the one the stopping rule saw during the run beside it where a block was set
    aside after the run, and the run's share where runs share the hypothesis' 5%: "inconclusive (during the run,
    with block 11: refuted at look 11)", "confirmed (5%/2: 2 runs share it)"; an inconclusive one says why:
    "inconclusive (near an edge)"."""
    out = s.shown_verdict
    if s.set_aside is not None:
        look = f" at look {s.set_aside.look[0]}" if s.set_aside.look else ""
        blocks = ", ".join(str(b) for b in s.set_aside.blocks)
        out += f" (during the run, with block {blocks}: {s.set_aside.verdict}{look})"
    if s.alpha_ledger is not None and s.alpha_ledger.case == SHARED:
        out += f" (5%/{s.alpha_ledger.m}: {s.alpha_ledger.m} runs share it)"
    return out


def markdown_table(result: Audit) -> str:
    """A GitHub-markdown table of every hypothesis, then one line naming the runs it rests on."""
    lines = ["| " + " | ".join(MARKDOWN_HEADER) + " |",
             "|" + "|".join(("---", "---", "---", "---", "---:", "---:", "---")) + "|"]
    lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in markdown_rows(result)]
    runs = []
    for loaded in result.studies:
        sid = loaded.study.study.id
        data = result.runs.get(sid)
        if data is None:
            runs.append(f"`{sid}` not run")
            continue
        engine = f", vLLM {data.run.vllm_version}" if data.run.vllm_version else ""
        others = result.compared[sid].summary() if sid in result.compared else ""
        runs.append(f"`{sid}` run {data.run_id} ({gpu_name(data.run)}{engine}; {design_note(data)}{others})")
    lines += ["", md_cell("Measured: the mean with its interval at the level it was read at (95% for a fixed "
                             "design; a run under a sequential budget reads each hypothesis at the run's look after "
                             "the last block it uses, \"look 10 of 12\", at that look's own level), between launches "
                             "where an arm ran on several (n counts them), else between the repeats of its one "
                             "launch (n counts those): such a row leaves out launch-to-launch variation and is at "
                             "most \"inconclusive (one launch)\", as is a single value. A tail percentile that sits "
                             "between two modes on any of its points is read as the launches' mean percentile with "
                             "its between-launch interval, the points named in a note. A ratio's interval is on the log scale, never "
                             "negative. A block set aside after the run (split across hosts by a resume) is left "
                             "out of the published verdict; the verdict the stopping rule saw with it is beside "
                             "it. Runs that state the same prediction under the same id share its 5% (\"5%/2\": "
                             "each read at 97.5%, a sequential run's looks splitting that share); a changed "
                             "prediction is a new hypothesis. Runs: " + "; ".join(runs) + ".")]
    return "\n".join(lines)


def design_note(data: RunData) -> str:
    """How many launches per arm and repeats per launch the run's points rest on: "3 launches per arm x 1
    repeat"."""
    launches: dict[str, set[str]] = {}
    for p in data.points:
        launches.setdefault(p.arm, set()).add(base_server_id(p.server_id or ""))
    counts = sorted({len(v) for v in launches.values()}) or [0]
    repeats = len({p.repeat for p in data.points})
    span = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    note = (f"{span} launch{'es' if counts[-1] != 1 else ''} per arm x {repeats} "
            f"repeat{'s' if repeats != 1 else ''}")
    return note + sequential_note(data)


def sequential_note(data: RunData) -> str:
    """For a run with a budget: the blocks it has measured of the budget's, and the confidence of the look its
    intervals are read at ("; blocks 5 of 12: a repeated interval, this look's at 99.9%")."""
    from report.stats.intervals import layout, run_look
    from report.stats.sequential import look_confidence

    design = layout(data.plan)
    if design.budget_blocks is None:
        return ""
    blocks = run_look(design.blocks(data.points))
    confidence = look_confidence(blocks, design.budget_blocks, design.first_look)
    return f"; blocks {blocks} of {design.budget_blocks}: a repeated interval, this look's at {confidence}"
