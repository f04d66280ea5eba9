"""`studyc site`: results databases + study files -> a static, offline site under `site/`.

Like mkdocs' build: every page context is gathered first (scores, charts, warnings), then pages are
written; `--strict` turns warnings into failure before anything is written. Templates are Jinja with
autoescape and StrictUndefined; the vendored vega JS is copied beside the pages.
"""

from __future__ import annotations

import json
import shutil
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

from base.errors import StudycError
from compiler.claims import Catalog, find_sources, load_catalog
from compiler.load import LoadedStudy, load_studies
from report.claims import claim_rows, claims_tables, study_claims
from report.pages import page_models, pages
from report.results import RunData, all_runs, latest_runs
from report.run_compare import compare_runs
from report.scoring.context import build_context
from report.scoring.score_model import Score
from report.scoring.scoring import score
from runner.store.store import Store

TEMPLATES = Path(__file__).resolve().parents[2] / "site_templates"


class SiteError(StudycError):
    """The site cannot be built, or `--strict` found warnings."""


@dataclass
class SiteResult:
    out: Path
    pages: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def json_script(value: Any, element_id: str) -> Markup:
    """A value as JSON in a <script type="application/json"> element, safe inside HTML: `<`, `>` and `&`
    are written as JSON escapes so no text in it can close the element (django's json_script)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    text = text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
    return Markup('<script type="application/json" id="{}">{}</script>').format(element_id, Markup(text))


def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=True, undefined=StrictUndefined,
                      keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["json_script"] = json_script
    return env


def default_studies(dbs: Sequence[Path], studies_dir: Path) -> list[Path]:
    """The study files under `studies_dir` whose study id has a run in the databases."""
    have = set(latest_runs(dbs))
    found = []
    for path in sorted(studies_dir.glob("*.toml")):
        try:
            sid = tomllib.loads(path.read_text(encoding="utf-8")).get("study", {}).get("id")
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue
        if sid in have:
            found.append(path)
    return found


def _names_claims(path: Path) -> bool:
    """Whether a study file's hypotheses name claims (read as TOML only; a broken file names none here)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    return any(h.get("claims") for h in data.get("hypothesis", []) if isinstance(h, dict))


@dataclass(frozen=True)
class Gathered:
    index: page_models.IndexPage
    audit: page_models.AuditPage
    studies: tuple[tuple[page_models.StudyPage, RunData | None], ...]
    warnings: tuple[str, ...]


def gather(studies: Sequence[LoadedStudy], dbs: Sequence[Path], others: Sequence[LoadedStudy] = ()) -> Gathered:
    """Every page context, scored and charted, nothing written yet. `others`: studies without a page (not yet
    run) whose hypotheses still test claims: the claims table counts them, as `studyc claims` does."""
    ids = [s.study.study.id for s in studies]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise SiteError(f"two study files share the id {', '.join(dupes)}: pass one file per study")
    runs = latest_runs(dbs)
    used = {s.study.study.id: runs[s.study.study.id] for s in studies if s.study.study.id in runs}
    ctxs = {s.study.study.id: build_context(s, used.get(s.study.study.id)) for s in studies}  # once per study
    scores: dict[str, list[Score]] = {sid: score(ctx) for sid, ctx in ctxs.items()}
    every = all_runs(dbs)
    compared = {sid: compare_runs(ctx.loaded, every.get(sid, []), ctx.data, scores[sid]) for sid, ctx in ctxs.items()}
    study_pages = tuple((replace(page := pages.study_page(ctxs[sid], scores[sid], compared[sid].changed_line()),
                                 provenance=page.provenance + compared[sid].facts()), ctxs[sid].data)
                        for sid in sorted(ctxs))
    catalog = load_catalog(find_sources(studies[0].directory)) if studies else Catalog()
    extra = [build_context(o, runs.get(o.study.study.id)) for o in others if o.study.study.id not in ctxs]
    rows = claim_rows(catalog, [*ctxs.values(), *extra], {**{c.study.study.id: score(c) for c in extra}, **scores})
    study_pages = tuple((replace(page, claims=study_claims(rows, page.study_id)), data) for page, data in study_pages)
    warnings = tuple(w for page, _ in study_pages for w in page.warnings)
    index = replace(pages.index_page(studies, used, scores, catalog.documents),
                    claims=claims_tables(rows, catalog, pages.study_href))
    return Gathered(index, pages.audit_page(studies, used, scores), study_pages, warnings)


def write(gathered: Gathered, out: Path) -> list[Path]:
    """Write the gathered pages, the static assets and the data downloads into `out`."""
    env = environment()
    written: list[Path] = []
    static = out / "static"
    if static.exists():
        shutil.rmtree(static)
    shutil.copytree(TEMPLATES / "static", static)

    def page(template: str, path: Path, ctx: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(env.get_template(template).render(page=ctx), encoding="utf-8")
        written.append(path)

    page("index.html", out / "index.html", gathered.index)
    page("audit.html", out / "audit.html", gathered.audit)
    for study_ctx, data in gathered.studies:
        folder = out / "studies" / study_ctx.study_id
        page("study.html", folder / "index.html", study_ctx)
        if data is not None:
            _downloads(data, folder / "data")
    return written


def _downloads(data: RunData, folder: Path) -> None:
    """The run's downloads (pages.DOWNLOADS) in a fresh `folder`: a file an earlier build left there (the
    requests tables sites once carried) does not stay behind."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    with Store(data.db, read_only=True) as store:
        for table, fmt in pages.DOWNLOADS:
            store.export_sorted(data.run_id, table, folder / f"{table}.{fmt}", fmt)


def build_site(
    dbs: Sequence[Path], out: Path, *, strict: bool = False, study_paths: Sequence[Path] = (),
    studies_dir: Path = Path("studies"), ledger: bool = True,
) -> SiteResult:
    """Build the site; with `strict`, raise SiteError listing the warnings instead of writing. Without
    `ledger` the step-time model's page is left out (its leave-one-study-out fits take minutes)."""
    if not dbs:
        raise SiteError("no results database given (--db)")
    paths = list(study_paths) or default_studies(dbs, studies_dir)
    if not paths:
        raise SiteError(f"no study in {studies_dir}/ has a run in {', '.join(str(d) for d in dbs)}")
    claiming = [p for p in sorted(studies_dir.glob("*.toml")) if p not in paths and _names_claims(p)]
    gathered = gather(load_studies(paths), dbs, load_studies(claiming) if not study_paths else ())
    if strict and gathered.warnings:
        raise SiteError("--strict: the site has warnings:\n  " + "\n  ".join(gathered.warnings))
    from report.ledger.ledger_page import write_page

    written = write(gathered, out)
    if ledger:
        written.append(write_page(dbs, out, environment()))
    return SiteResult(out=out, pages=written, warnings=list(gathered.warnings))


def run_site(dbs: Sequence[Path], out: Path, strict: bool, study_paths: Sequence[Path]) -> SiteResult:
    """The `studyc site` command: build, then say what was written and what to look at."""
    import click

    result = build_site(dbs, out, strict=strict, study_paths=study_paths)
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"site: {len(result.pages)} page(s) -> {out}/index.html")
    return result
