"""`studyc merge`: combine results databases (or folders) from several hosts into one (a run already present
is kept, unless the input holds it continued: every point of it and more)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from base.errors import StoreError
from runner.store.folder import folder_manifest, stored_points
from runner.store.store import SCHEMA_VERSION, Store, compact


def _source(source: Path, out: Path, kind: str) -> None:
    """An input that exists and is not `out` itself (`kind`: what `out` is, for the message)."""
    if not Path(source).exists():
        raise StoreError(f"{source}: no such results database")
    if Path(source).resolve() == Path(out).resolve():
        raise StoreError(f"{source}: cannot merge a {kind} into itself")


def _line(source: Path, out: Path, new: int, continued: int, kept: int) -> str:
    """One input's line of report: its runs new, continued and kept."""
    line = f"{source}: {new} new run(s)"
    if continued:
        line += f", {continued} continued (more points than the copy in {out})"
    if kept:
        line += f", {kept} already there (kept)"
    return f"{line} -> {out}"


def merge_into_folder(out: Path, inputs: Sequence[Path]) -> list[str]:
    """Add each input's runs to the results folder `out`: a new run gets its folder; a run already there is
    replaced when the input holds every point of it and more (continued with `--resume`), kept otherwise.
    No other run's files are written."""
    lines = []
    for source in inputs:
        _source(source, out, "folder")
        points = stored_points(out, SCHEMA_VERSION)
        with Store(source, read_only=True) as store:
            new, continued, kept = [], [], 0
            for run_id in store.run_ids():
                if run_id not in points:
                    new.append(run_id)
                elif points[run_id] < {p.point_id for p in store.points(run_id)}:
                    continued.append(run_id)
                else:
                    kept += 1
            store.export_runs(out, new + continued, folder_manifest(out, SCHEMA_VERSION)["file_format"])
        lines.append(_line(source, out, len(new), len(continued), kept))
    return lines


def merge_databases(out: Path, inputs: Sequence[Path]) -> list[str]:
    """Copy every run of each input into `out` (created if missing; a results folder gets each new run's
    folder: merge_into_folder); one line of report per input (a database or a results folder)."""
    if Path(out).is_dir():
        return merge_into_folder(out, inputs)
    lines = []
    replaced = False
    with Store(out) as store:
        for source in inputs:
            _source(source, out, "database")
            copied = store.merge_from(Store.database_file(Path(source), read_only=True))
            lines.append(_line(source, out, copied.get("runs_new", 0), copied.get("runs_continued", 0),
                               copied.get("runs_kept", 0)))
            replaced = replaced or bool(copied.get("runs_continued"))
    if replaced:  # the replaced copies' rows are deleted, but their space stays in the file until rewritten
        before, after = compact(Path(out))
        lines.append(f"{out}: compacted {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
    return lines
