"""The `studyc` command line: each command imports lazily, calls one library function, maps to an exit code."""

from __future__ import annotations

import json
import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from studyc.calibrate_command import calibrate
from studyc.results_command import export, import_

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
    from studyc.decide import validate_warnings

    for loaded in load_studies(list(studies)):
        _warn(loaded)
        for line in validate_warnings(loaded):
            click.echo(line, err=True)
        n = len(loaded.study.hypothesis)
        click.echo(f"{loaded.path}: ok ({n} {'hypothesis' if n == 1 else 'hypotheses'})")


def _warn(loaded: object) -> None:
    """Print a study's warnings (allowed, probably not meant) to stderr, like problems but not fatal."""
    for problem in getattr(loaded, "warnings", ()):
        click.echo(f"{problem.file}:{problem.line}: {problem.path}: warning: {problem.message}", err=True)


def _format_option(*aliases: tuple[str, str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--format table|json|markdown`, with the older one-format flags kept as aliases."""

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        func = click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown"]), default=None,
                            help="Output format (default: table).")(func)
        for flag, value in aliases:
            func = click.option(flag, "alias_" + value, is_flag=True, hidden=True,
                                help=f"Same as --format {value}.")(func)
        return func

    return wrap


def _pick_format(fmt: str | None, **aliases: bool) -> str:
    chosen = {name.removeprefix("alias_") for name, on in aliases.items() if on}
    if fmt is not None:
        chosen.add(fmt)
    if len(chosen) > 1:
        flags = " and ".join(f"--{name}" for name in sorted(chosen))
        raise click.UsageError(f"give at most one of {flags} (one --format)")
    return chosen.pop() if chosen else "table"


@main.command()
@click.argument("study", type=click.Path(path_type=Path))
@click.option("--db", type=click.Path(path_type=Path), default=None,
              help="Results database: predict every point with the step-time model fitted from its runs.")
@click.option("--bench", "bench", is_flag=True,
              help="Also give each point's equivalent `vllm bench serve` command (in JSON: `bench_equivalent`).")
@_format_option(("--json", "json"), ("--markdown", "markdown"))
def plan(study: Path, db: Path | None, bench: bool, fmt: str | None, **aliases: bool) -> None:
    """Compile a study and print its execution plan (the JSON lists each hypothesis' point ids).

    With --db, each point gets the step-time model's prediction (in JSON: `predicted`). With
    --bench, the `vllm bench serve` command that offers the same load, and how it differs."""
    from compiler.load import load_study
    from studyc.plan_command import plan_json, plan_study, plan_text

    loaded = load_study(study)
    _warn(loaded)
    shown = _pick_format(fmt, **aliases)
    summary = plan_study(loaded, db=db, bench=bench, advise=shown != "json", say=_say)
    if shown == "json":
        click.echo(plan_json(summary))
    else:
        click.echo(plan_text(summary, markdown=shown == "markdown"), nl=False)


def _say(text: str) -> None:
    """A note on stderr, as a command goes."""
    click.echo(text, err=True)


@main.command()
@click.argument("studies", nargs=-1, type=click.Path(path_type=Path))
@click.option("--db", "dbs", multiple=True, type=click.Path(path_type=Path),
              help="Results database (repeat to combine); without one, each hypothesis is compared by its plan.")
@click.option("--sources", type=click.Path(path_type=Path), default=None,
              help="Folder of sources files (default: sources/ here or above).")
@_format_option()
def claims(studies: tuple[Path, ...], dbs: tuple[Path, ...], sources: Path | None, fmt: str | None) -> None:
    """Every claim of every source document: faithful, approximate (what differs) or untested (why).

    Studies default to studies/*.toml; json rows have document, claim, status, differs, reason, hypotheses."""
    from studyc.claims_command import gather_claims, show, study_files

    rows = gather_claims(list(studies) or study_files(Path("studies")), list(dbs), sources)
    show(rows, _pick_format(fmt))


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
@click.argument("path", required=False, type=click.Path(path_type=Path))
@click.option("--db", type=click.Path(path_type=Path), default=None,
              help="Results database: print the step-time model fitted from its runs (no PATH).")
@click.option("--ledger", is_flag=True, help="With --db: the model's leave-one-study-out error by study.")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(min=1), help="Decode batch size.")
@click.option("--context", default=None, type=click.IntRange(min=0), help="Tokens of context per sequence.")
@click.option("--kv-dtype", default="auto", show_default=True, type=click.Choice(["auto", "bf16", "fp8"]))
@click.option("--hardware", default="h200", show_default=True, help="Hardware table entry.")
@_format_option(("--json", "json"), ("--markdown", "markdown"))
def model(path: Path | None, db: Path | None, ledger: bool, batch: int, context: int | None, kv_dtype: str,
          hardware: str, fmt: str | None, **aliases: bool) -> None:
    """Model math from a config.json (PATH): parameters, weight and KV bytes, decode roofline.

    With --db instead: the calibrated step-time model fitted from the database's runs, one row of
    coefficients per vLLM version, model family and engine options (fitted on every GPU's points, each
    priced on its own run's calibrated card, so they carry to a GPU by its card); with --ledger too, its
    leave-one-study-out error by study, GPU, vLLM version and metric, then by GPU and metric over every
    study, the points near saturation apart (json: {"studies", "gpus", "not_validated"})."""
    from studyc.model_command import facts_text, model_facts, step_model, step_model_text

    if (path is None) == (db is None):
        raise click.UsageError("give a model folder (PATH) or --db DB, not both")
    if ledger and db is None:
        raise click.UsageError("--ledger needs --db DB")
    shown = _pick_format(fmt, **aliases)
    if db is not None:
        found = step_model(db, ledger=ledger, say=_say)
        if shown == "json":
            click.echo(json.dumps(found.to_json(), indent=2))
        else:
            click.echo(step_model_text(found, markdown=shown == "markdown"), nl=False)
        return
    assert path is not None
    facts = model_facts(path, batch=batch, context=context, kv_dtype=kv_dtype, hardware=hardware)
    if shown == "json":
        click.echo(json.dumps(facts, indent=2))
    else:
        click.echo(facts_text(facts, markdown=shown == "markdown"), nl=False)


def _stop_on_term(signum: int, frame: Any) -> None:
    """SIGTERM during a run: stop its servers and keep what was committed, as Ctrl-C does."""
    raise KeyboardInterrupt


@main.command()
@click.argument("studies", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--db", type=click.Path(path_type=Path), default=DEFAULT_DB, show_default=True,
              help="Results database (DuckDB file).")
@click.option("--resume", is_flag=True, help="Continue each study's latest run, skipping points already committed.")
@click.option("--keep-going", is_flag=True, help="Continue past a failed server or point; report them at the end.")
@click.option("--dry-run", is_flag=True, help="Print what would run, start nothing.")
@click.option("--no-calibrate", is_flag=True, help="Skip the bandwidth/matmul calibration at run start.")
@click.option("--allow-hardware-mismatch", is_flag=True,
              help="Run a study whose `hardware` is not this host's (scored against that spec sheet anyway).")
@click.option("--gpus", default=None, metavar="IDS",
              help="Devices to place launches on, e.g. 0,1 (default: every idle GPU; on a CPU host one "
                   "logical device, or the logical ids named here). Independent launches run at once.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Run each launch as a Ray actor holding its GPUs: on the cluster at ADDRESS, or without one "
                   "on a Ray cluster started here (as many logical GPUs as --gpus names). Needs studyc[ray].")
@click.option("--cold-starts", is_flag=True,
              help="Start every server from nothing. By default, while a launch runs, the next launch's server "
                   "is spawned held after its imports and kept stopped during every point (docs/performance.md, 'Held starts').")
@click.option("--prime/--no-prime", default=None,
              help="Start each configuration's server once, unmeasured, before the first launch, so that no "
                   "measured launch compiles its graphs (default: on a GPU host; remembered per compile cache).")
@click.option("--underpowered", is_flag=True,
              help="Run hypotheses whose best-case power is under 50% at the priors (the database's stored runs, "
                   "else the defaults): refused without it (docs/decidability.md).")
def run(studies: tuple[Path, ...], db: Path, resume: bool, keep_going: bool, dry_run: bool, no_calibrate: bool,
        allow_hardware_mismatch: bool, gpus: str | None, ray_address: str | None, cold_starts: bool,
        prime: bool | None, underpowered: bool) -> None:
    """Carry out studies against real vLLM servers and store every measurement in DuckDB.

    Every study file is validated and compiled, and the engine and the hardware are checked,
    before the first server starts.
    """
    from compiler.load import load_studies
    from compiler.plan_table import format_plan

    if ray_address is not None and (ray_address.endswith(".toml") or Path(ray_address).is_file()):
        studies, ray_address = (*studies, Path(ray_address)), "local"  # `--ray study.toml`: no address given
    if ray_address is not None and not dry_run:
        from runner.execute.ray_exec import require_ray

        require_ray()
    loaded_studies = load_studies(list(studies))
    for loaded in loaded_studies:
        _warn(loaded)
    from studyc.plan_command import compile_with_model

    plans = [compile_with_model(loaded, db, _say, resume=resume) for loaded in loaded_studies]
    if dry_run:
        click.echo("\n".join(format_plan(plan) for plan in plans), nl=False)
        return
    if not underpowered:
        from studyc.decide import refuse_underpowered

        refuse_underpowered(list(zip(loaded_studies, plans, strict=True)), db)
    from base.errors import EngineError
    from studyc.run_command import failed, prepare_run, run_study, run_summary

    setup = prepare_run(plans, db, resume=resume, keep_going=keep_going, calibrate=not no_calibrate, gpus=gpus,
                        ray=ray_address, allow_hardware_mismatch=allow_hardware_mismatch, say=_say,
                        held_start=not cold_starts, prime=prime)
    any_failed = False
    signal.signal(signal.SIGTERM, _stop_on_term)  # `timeout`, `kill`, a batch scheduler: stop as on Ctrl-C
    for loaded, plan in zip(loaded_studies, plans, strict=True):
        go_on = shlex.join(["studyc", "run", str(loaded.path), "--db", str(db), "--resume"])
        try:
            report = run_study(setup, loaded, plan)
        except KeyboardInterrupt:
            click.echo(f"interrupted: servers stopped, committed points kept; continue with: {go_on}", err=True)
            sys.exit(130)
        except EngineError as exc:  # a start that failed twice, a server that died mid-point
            raise EngineError(f"{exc.message}\nthe run stopped; committed points are kept; once the cause is "
                              f"fixed, continue with: {go_on}") from exc
        click.echo(run_summary(plan, report, db), nl=False)
        any_failed = any_failed or failed(report)
    if any_failed:
        sys.exit(1)


_DBS = click.option("--db", "dbs", multiple=True, type=click.Path(path_type=Path), default=[DEFAULT_DB],
                    show_default=True, help="Results database; repeat to combine hosts (latest run per study wins).")


@main.command()
@click.argument("studies", nargs=-1, required=True, type=click.Path(path_type=Path))
@_DBS
@_format_option(("--json", "json"), ("--markdown", "markdown"))
def audit(studies: tuple[Path, ...], dbs: tuple[Path, ...], fmt: str | None, **aliases: bool) -> None:
    """Score each hypothesis against the latest run: predicted vs measured, with a verdict (exit 0 even if refuted).

    json: one object per hypothesis; markdown: a GitHub table of claim, seed, prediction, measured, verdict.
    """
    from compiler.load import load_studies
    from report.audit import audit_studies, json_rows, markdown_table, print_table

    shown = _pick_format(fmt, **aliases)
    result = audit_studies(load_studies(list(studies)), dbs)
    if shown == "json":
        click.echo(json.dumps(json_rows(result), indent=2, default=str))
    elif shown == "markdown":
        click.echo(markdown_table(result))
    else:
        print_table(result)


@main.command()
@click.argument("studies", nargs=-1, type=click.Path(path_type=Path))
@_DBS
@click.option("--out", type=click.Path(path_type=Path), default=Path("site"), show_default=True,
              help="Folder to write the static site into.")
@click.option("--strict", is_flag=True, help="Fail (exit 1) on warnings: failed checks, missing metrics.")
def site(studies: tuple[Path, ...], dbs: tuple[Path, ...], out: Path, strict: bool) -> None:
    """Build the static site (default studies: those in studies/*.toml with a run in the database)."""
    from report.pages.site import run_site

    run_site(dbs, out, strict, studies)


@main.command()
@click.argument("name")
@click.option("--from", "source", type=click.Path(path_type=Path), default=None,
              help="Start from this study file instead of the starter template.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="File to write (default: studies/NAME.toml, dashes as underscores).")
def new(name: str, source: Path | None, out: Path | None) -> None:
    """Write a commented starter study that validates and runs on this machine (refuses to overwrite)."""
    from base.errors import StudycError
    from base.settings import load_settings
    from compiler.hardware import HardwareError, get_hardware
    from compiler.load import load_study
    from runner.measure.nvml import gpu_info
    from studyc.new import check_name, default_path, from_study, template

    check_name(name)
    out = out or default_path(name)
    if out.exists():
        raise StudycError(f"{out} exists; not overwriting it (give another NAME or --out)")
    if source is not None:
        text = from_study(name, source, out)
    else:
        gpu = gpu_info(load_settings().gpu_index)
        hardware = None
        if gpu is not None:
            try:
                hardware = get_hardware(str(gpu.get("name"))).name
            except HardwareError:
                hardware = "h200"
                click.echo(f"warning: GPU {gpu.get('name')!r} is not in the hardware table; "
                           "the study names h200: change `hardware`", err=True)
        text = template(name, out, hardware)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "x", encoding="utf-8") as fh:
        fh.write(text)
    try:
        loaded = load_study(out)
    except StudycError:
        out.unlink()
        raise
    _warn(loaded)
    click.echo(f"wrote {out} ({'from ' + str(source) if source else 'starter'}; validates). Next: "
               f"studyc plan {out}; studyc run {out}; studyc audit {out}")


@main.command()
@click.argument("out", type=click.Path(path_type=Path))
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
def merge(out: Path, inputs: tuple[Path, ...]) -> None:
    """Combine results databases from several hosts into OUT (runs already there are kept).

    OUT may be a results folder (studyc export): each new run is written as its own folder."""
    from report.merge import merge_databases

    for line in merge_databases(out, inputs):
        click.echo(line)


main.add_command(export)
main.add_command(import_)
main.add_command(calibrate)


@main.command()
@click.argument("runs", nargs=-1, required=True, metavar="RUN_OR_STUDY...")
@_DBS
def phases(runs: tuple[str, ...], dbs: tuple[Path, ...]) -> None:
    """Where the wall went, run beside run: each RUN_OR_STUDY is a run id, or a study id for every run of it.

    With two runs (say the same study with --cold-starts, then without) a last column gives the second
    minus the first, phase by phase.
    """
    from base.errors import StudycError
    from report.phase_compare import compare_text, run_cost
    from report.results import all_runs, read_run

    known = all_runs(list(dbs))
    by_id = {run.run_id: db for found in known.values() for db, run in found}
    picked: list[tuple[Path, str]] = []
    for name in runs:
        if name in by_id:
            picked.append((by_id[name], name))
        elif name in known:
            picked += [(db, run.run_id) for db, run in known[name]]
        else:
            raise StudycError(f"{', '.join(map(str, dbs))}: no run or study {name!r} (studies: "
                              f"{', '.join(known) or 'none'})")
    unique = list(dict.fromkeys(picked))
    costs = [c for c in (run_cost(read_run(db, rid)) for db, rid in unique) if c is not None]
    left_out = len(unique) - len(costs)
    click.echo(compare_text(costs))
    if left_out:
        click.echo(f"  ({left_out} run(s) stored before phases were: left out)")


@main.command()
@click.option("--db", type=click.Path(path_type=Path), default=DEFAULT_DB, show_default=True,
              help="Results database (DuckDB file) to re-judge in place.")
def recheck(db: Path) -> None:
    """Recompute every point's statistics and checks from its stored request records."""
    from runner.checks.recheck import recheck as run_recheck

    report = run_recheck(db)
    click.echo(f"{db}: {report.points} point(s) rechecked, {report.changed} changed"
               + (f", {len(report.kept)} kept as stored" if report.kept else ""))
    for line in [*report.details, *report.kept]:
        click.echo(f"  {line}")


if __name__ == "__main__":
    sys.exit(main())
