"""The `studyc` command line: each command imports lazily, calls one library function, maps to an exit code."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

DEFAULT_DB = "results/studyc.duckdb"


@click.group()
@click.version_option(package_name="studyc")
def main() -> None:
    """studyc: performance studies of LLM serving as files, measured on real vLLM servers and scored."""


@main.command()
@click.argument("studies", nargs=-1, required=True, type=click.Path(path_type=Path))
def validate(studies: tuple[Path, ...]) -> None:
    """Check study files; list every problem as file:line: key: message (exit 2)."""
    from compiler.load import load_studies

    for loaded in load_studies(list(studies)):
        click.echo(f"{loaded.path}: ok ({len(loaded.study.hypothesis)} hypotheses)")


@main.command()
@click.argument("study", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(study: Path, as_json: bool) -> None:
    """Compile a study and print its execution plan."""
    from compiler.load import load_study
    from compiler.plan import compile_study
    from compiler.plan_table import format_plan

    compiled = compile_study(load_study(study))
    click.echo(compiled.to_json() if as_json else format_plan(compiled), nl=as_json)


@main.command()
def schema() -> None:
    """Print the JSON Schema of the study file (for editors)."""
    from compiler.study import Study

    click.echo(json.dumps(Study.model_json_schema(), indent=2))


@main.command()
def metrics() -> None:
    """List the metrics a hypothesis can name."""
    from compiler.metrics import METRICS

    for m in METRICS.values():
        click.echo(f"{m.name:<22} {m.unit:<9} {m.level:<7} {m.description}")


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--batch", default=1, show_default=True, type=click.IntRange(min=1), help="Decode batch size.")
@click.option("--context", default=None, type=click.IntRange(min=0), help="Tokens of context per sequence.")
@click.option("--kv-dtype", default="auto", show_default=True, type=click.Choice(["auto", "bf16", "fp8"]))
@click.option("--hardware", default="h200", show_default=True, help="Hardware table entry.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def model(path: Path, batch: int, context: int | None, kv_dtype: str, hardware: str, as_json: bool) -> None:
    """Model math from a config.json: parameters, weight and KV bytes, decode roofline."""
    from compiler.hardware import HardwareError, get_hardware
    from compiler.modelmath import ModelError, describe, load_model
    from studyc.errors import SpecError

    try:
        facts = describe(load_model(path), batch=batch, context=context, kv_dtype=kv_dtype,
                         hardware=get_hardware(hardware))
    except (ModelError, HardwareError) as exc:
        raise SpecError(str(exc)) from None
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    width = max(len(k) for k in facts)
    for key, value in facts.items():
        shown = f"{value:,.6g}" if isinstance(value, float) else (f"{value:,}" if isinstance(value, int) else value)
        click.echo(f"{key:<{width}}  {shown}")


@main.command()
@click.argument("studies", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--db", type=click.Path(path_type=Path), default=DEFAULT_DB, show_default=True,
              help="Results database (DuckDB file).")
@click.option("--resume", is_flag=True, help="Continue each study's latest run, skipping points already committed.")
@click.option("--keep-going", is_flag=True, help="Continue past a failed server or point; report them at the end.")
@click.option("--dry-run", is_flag=True, help="Print what would run, start nothing.")
@click.option("--no-calibrate", is_flag=True, help="Skip the bandwidth/matmul calibration at run start.")
def run(studies: tuple[Path, ...], db: Path, resume: bool, keep_going: bool, dry_run: bool, no_calibrate: bool) -> None:
    """Carry out studies against real vLLM servers and store every measurement in DuckDB.

    Every study file is validated and compiled before the first server starts.
    """
    from compiler.load import load_studies
    from compiler.plan import compile_study
    from compiler.plan_table import format_plan

    plans = [compile_study(loaded) for loaded in load_studies(list(studies))]
    if dry_run:
        click.echo("\n".join(format_plan(plan) for plan in plans), nl=False)
        return
    from runner.run import RunOptions, default_runs_dir, run_plan
    from studyc.progress import LiveProgress

    options = RunOptions(db=db, resume=resume, keep_going=keep_going, runs_dir=default_runs_dir(db),
                         calibrate=not no_calibrate)
    failed = False
    for plan in plans:
        try:
            report = run_plan(plan, options, LiveProgress())
        except KeyboardInterrupt:
            click.echo("interrupted: servers stopped, committed points kept (use --resume to continue)", err=True)
            sys.exit(130)
        click.echo(
            f"run {report.run_id} ({plan.study_id}): {report.points_done} point(s) measured, "
            f"{report.points_skipped} skipped, wall {report.wall_s:.1f} s "
            f"(measurement windows {report.window_s:.1f} s) -> {db}"
        )
        for label, items in (("failed", report.points_failed), ("servers failed", report.servers_failed),
                             ("invalid (a check failed)", report.invalid), ("flagged", report.flagged)):
            if items:
                click.echo(f"  {label}: {', '.join(items)}")
        failed = failed or bool(report.points_failed or report.servers_failed)
    if failed:
        sys.exit(1)


_DBS = click.option("--db", "dbs", multiple=True, type=click.Path(path_type=Path), default=[DEFAULT_DB],
                    show_default=True, help="Results database; repeat to combine hosts (latest run per study wins).")


@main.command()
@click.argument("studies", nargs=-1, required=True, type=click.Path(path_type=Path))
@_DBS
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per hypothesis.")
@click.option("--markdown", is_flag=True, help="Print a GitHub-markdown table: claim, seed, prediction, measured, verdict.")
def audit(studies: tuple[Path, ...], dbs: tuple[Path, ...], as_json: bool, markdown: bool) -> None:
    """Score each hypothesis against the latest run: predicted vs measured, with a verdict (exit 0 even if refuted)."""
    from report.audit import run_audit

    if as_json and markdown:
        raise click.UsageError("give at most one of --json and --markdown")
    run_audit(studies, dbs, as_json, markdown)


@main.command()
@click.argument("studies", nargs=-1, type=click.Path(path_type=Path))
@_DBS
@click.option("--out", type=click.Path(path_type=Path), default=Path("site"), show_default=True,
              help="Folder to write the static site into.")
@click.option("--strict", is_flag=True, help="Fail (exit 1) on warnings: failed checks, missing metrics.")
def site(studies: tuple[Path, ...], dbs: tuple[Path, ...], out: Path, strict: bool) -> None:
    """Build the static site (default studies: those in studies/*.toml with a run in the database)."""
    from report.site import run_site

    run_site(dbs, out, strict, studies)


@main.command()
@click.argument("out", type=click.Path(path_type=Path))
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
def merge(out: Path, inputs: tuple[Path, ...]) -> None:
    """Combine results databases from several hosts into OUT (runs already there are kept)."""
    from report.merge import merge_databases

    for line in merge_databases(out, inputs):
        click.echo(line)


@main.command()
@click.option("--db", type=click.Path(path_type=Path), default=DEFAULT_DB, show_default=True,
              help="Results database (DuckDB file) to re-judge in place.")
def recheck(db: Path) -> None:
    """Recompute every point's statistics and checks from its stored request records."""
    from runner.recheck import recheck as run_recheck

    report = run_recheck(db)
    click.echo(f"{db}: {report.points} point(s) rechecked, {report.changed} changed")
    for line in report.details or []:
        click.echo(f"  {line}")


if __name__ == "__main__":
    sys.exit(main())
