"""`studyc export` and `studyc import`: a results database as a folder of files, one folder per run, and
back (docs/results-format.md). Registered on the `studyc` group by studyc.cli."""

from __future__ import annotations

import time
from pathlib import Path

import click


@click.command("export")
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--db", type=click.Path(path_type=Path), required=True, help="Results database (or folder) to export.")
@click.option("--format", "fmt", type=click.Choice(["parquet", "csv"]), default="parquet", show_default=True,
              help="File format of the tables (csv: lists as JSON text).")
def export(out: Path, db: Path, fmt: str) -> None:
    """Write a results database as a folder: OUT/<run_id>/<table>.parquet, with manifests."""
    from report.exporting import export_database

    started = time.monotonic()
    counts = export_database(db, out, fmt)
    rows = ", ".join(f"{n} {name}" for name, n in counts.items())
    click.echo(f"{db} -> {out}: {rows} ({time.monotonic() - started:.1f} s)")


@click.command("import")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--db", type=click.Path(path_type=Path), required=True, help="Results database to create.")
def import_(folder: Path, db: Path) -> None:
    """Build a results database (a new DuckDB file) from a results folder."""
    from report.exporting import import_folder

    click.echo(f"{folder} -> {db}: {import_folder(folder, db)} run(s)")
