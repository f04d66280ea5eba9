"""`studyc claims`: every claim of every sources file, with its status and the hypotheses that test it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import click

from base.errors import StudycError
from compiler.claims import find_sources, load_catalog
from compiler.load import load_studies
from report.claims import ClaimRow, claim_rows, counts


def study_files(studies_dir: Path) -> list[Path]:
    """Every study file in `studies_dir` (its examples/ and traces/ aside)."""
    return sorted(studies_dir.glob("*.toml"))


def gather_claims(studies: Sequence[Path], dbs: Sequence[Path], sources: Path | None) -> list[ClaimRow]:
    """The claims table: each study scored against its latest complete run in `dbs` (none: its plan)."""
    from report.results import latest_runs
    from report.scoring.context import build_context
    from report.scoring.scoring import score

    folder = sources or find_sources(Path.cwd())
    if folder is None or not folder.is_dir():
        raise StudycError("no sources/ folder here or above: give --sources DIR (one TOML file per document)")
    catalog = load_catalog(folder)
    if not catalog.documents:
        raise StudycError(f"{folder}: no sources file (*.toml) in it")
    missing = [str(d) for d in dbs if not d.exists()]
    if missing:
        raise StudycError(f"no such database: {', '.join(missing)}")
    loaded = [s for s in load_studies(list(studies)) if any(h.claims for h in s.study.hypothesis)]
    runs = latest_runs(dbs) if dbs else {}
    contexts = [build_context(s, runs.get(s.study.study.id)) for s in loaded]
    scores = {c.study.study.id: score(c) for c in contexts}
    return claim_rows(catalog, contexts, scores, measured=bool(dbs))


def markdown(rows: Sequence[ClaimRow]) -> str:
    out = ["| document | claim | status | tested by | differs / reason |", "|---|---|---|---|---|"]
    for r in rows:
        tests = "; ".join(f"{t.study}/{t.hypothesis}: {t.verdict} ({t.gpu})" for t in r.tests) or "-"
        why = r.reason or "; ".join(r.differs) or "-"
        out.append(f"| {r.document} | {r.claim} | {r.status} | {_cell(tests)} | {_cell(why)} |")
    return "\n".join(out)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def table(rows: Sequence[ClaimRow]) -> None:
    doc = None
    for r in rows:
        if r.document != doc:
            doc = r.document
            click.echo(f"\n{doc}")
        first = r.tests[0] if r.tests else None
        test = f"{first.study}/{first.hypothesis}: {first.verdict} ({first.gpu})" if first else r.reason
        more = f" (+{len(r.tests) - 1} more)" if len(r.tests) > 1 else ""
        click.echo(f"  {r.claim:<44} {r.status:<12} {test}{more}")
        demoting = [d for d in (first.differences if first else ()) if d.demotes]
        for d in demoting:
            click.echo(f"  {'':<44} {'':<12}   differs: {d}")
    click.echo("")
    for doc_id, per in counts(rows).items():
        click.echo(f"{doc_id}: {sum(per.values())} claims, " + ", ".join(f"{n} {s}" for s, n in per.items()))


def show(rows: Sequence[ClaimRow], fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps([r.json() for r in rows], indent=2))
    elif fmt == "markdown":
        click.echo(markdown(rows))
    else:
        table(rows)
