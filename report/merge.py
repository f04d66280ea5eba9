"""`studyc merge`: combine results databases (or folders) from several hosts into one (a run already present
is kept, unless the input holds it continued: every point of it and more)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from base.errors import StoreError
from report.exporting import merge_into_folder
from runner.store.store import Store, compact


def merge_databases(out: Path, inputs: Sequence[Path]) -> list[str]:
    """Copy every run of each input into `out` (created if missing; a results folder gets each new run's
    folder: report.exporting); one line of report per input (a database or a results folder)."""
    if Path(out).is_dir():
        return merge_into_folder(out, inputs)
    lines = []
    replaced = False
    with Store(out) as store:
        for source in inputs:
            if not Path(source).exists():
                raise StoreError(f"{source}: no such results database")
            if Path(source).resolve() == Path(out).resolve():
                raise StoreError(f"{source}: cannot merge a database into itself")
            copied = store.merge_from(Store.database_file(Path(source), read_only=True))
            line = f"{source}: {copied.get('runs_new', 0)} new run(s)"
            if copied.get("runs_continued"):
                line += f", {copied['runs_continued']} continued (more points than the copy in {out})"
            if copied.get("runs_kept"):
                line += f", {copied['runs_kept']} already there (kept)"
            lines.append(f"{line} -> {out}")
            replaced = replaced or bool(copied.get("runs_continued"))
    if replaced:  # the replaced copies' rows are deleted, but their space stays in the file until rewritten
        before, after = compact(Path(out))
        lines.append(f"{out}: compacted {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
    return lines
