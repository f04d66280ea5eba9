"""`studyc calibrate`: measure this machine's GPU (bandwidth, FLOP/s) and host, and store it as a run with no
points, so that `studyc plan --db` prices predictions for this GPU on its own card. Registered on the `studyc`
group by studyc.cli."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from runner.store.records import RunRecord


@click.command("calibrate")
@click.option("--db", type=click.Path(path_type=Path), required=True,
              help="Results database (or results folder) to store the calibration in.")
@click.option("--device", type=click.IntRange(min=0), default=None,
              help="GPU index to calibrate (default: STUDYC_GPU_INDEX, else 0).")
def calibrate(db: Path, device: int | None) -> None:
    """Measure this GPU's bandwidth and bf16 FLOP/s, and the host probe; store them as a run with no points."""
    from base.settings import load_settings
    from runner.execute.calibration_run import describe, measure_machine

    settings = load_settings()
    run = measure_machine(settings.gpu_index if device is None else device, settings.python_argv)
    store_run(db, run)
    click.echo(f"{db}: calibration {run.run_id}: {describe(run)}")


def store_run(db: Path, run: RunRecord) -> None:
    """Write the run into `db`: a database directly; a results folder through a one-run database merged in."""
    from report.merge import merge_databases
    from runner.execute.calibration_run import save_calibration

    if not db.is_dir():
        save_calibration(db, run)
        return
    with tempfile.TemporaryDirectory(prefix="studyc-calibrate-") as tmp:
        one = Path(tmp) / "calibration.duckdb"
        save_calibration(one, run)
        merge_databases(db, [one])
