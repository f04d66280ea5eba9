"""The index's "Verdicts by seed document": every scored hypothesis under the seed document its study quotes,
then under the section of it that the study's `source` names. Pure: studies, runs and scores in, page
models (report.pages.page_models) out; report.pages.pages puts them on the index page.

A study's `source` names its seed as "<document>, <section>", several joined by ";":
"bench-a, sections 02 and 04" is the document bench-a, section "sections 02 and 04" (documents are the
sources files of compiler.claims). A source that starts with no known document's id has no seed. A hypothesis goes where its study's
source puts it, unless its own `source` (usually the seed's own words) names a document: either as
"<document>, <section>" (then there), or, in a study quoting several documents, by one of its
aliases, which picks that one of the study's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from compiler.claims import Document
from compiler.load import LoadedStudy
from report.pages.page_models import SeedGroup, SeedRow, SeedSection, VerdictCount
from report.results import RunData
from report.scoring.score_model import Score, verdict_counts
from runner.store.records import base_server_id

NO_SEED = ""  # the document of a source that names none


NO_SEED_TITLE = "No seed"


def _by_id(docs: Sequence[Document]) -> dict[str, Document]:
    return {d.id: d for d in docs}


def seed_refs(source: str, docs: Sequence[Document]) -> tuple[tuple[str, str], ...]:
    """Each `;`-separated part of a source that starts with a known document's id, as (document, section):
    "bench-a, section 03; bench-b, 'Compiled CUDA graphs'" -> both. The
    section is the rest of the part, as written ("" when it names none)."""
    refs = []
    for part in source.split(";"):
        part = part.strip()
        for doc in docs:
            head, rest = part[:len(doc.id)], part[len(doc.id):]
            if head.lower() == doc.id and (not rest or rest[0] in ",: "):
                refs.append((doc.id, rest.lstrip(",: ").strip()))
    return tuple(refs)


def seed_source(source: str, docs: Sequence[Document]) -> tuple[str, str]:
    """(document, section) of a source: its first known document; without one (NO_SEED, the source as
    written), so a seedless study's own source still groups it."""
    refs = seed_refs(source, docs)
    return refs[0] if refs else (NO_SEED, source.strip())


def place(study_source: str, hypothesis_source: str, docs: Sequence[Document]) -> tuple[str, str]:
    """(document, section) of one hypothesis: its own source's when that starts with a known document;
    else its study's, and of a study quoting several documents the first one its own source names (by id
    or alias), else the study's first."""
    own = seed_refs(hypothesis_source, docs)
    if own:
        return own[0]
    refs = seed_refs(study_source, docs)
    said = hypothesis_source.lower()
    by_id = _by_id(docs)
    named = [r for r in refs if any(name in said for name in (r[0], *by_id[r[0]].aliases))]
    return (named or list(refs) or [seed_source(study_source, docs)])[0]


def section_key(document: str, section: str, docs: Sequence[Document]) -> tuple[int, str]:
    """Sections in document order: by the earliest part of the document they name ("sections 02-06": 02;
    "'What worked' 2 and 'Where my own measurements misled me'": what worked), then by their text; a
    section naming no known part, or of no seed, after those."""
    doc = _by_id(docs).get(document)
    text = section.lower().replace("’", "'")
    found = [i for i, part in enumerate(doc.sections) if part in text] if doc else []
    return (min(found) if found else len(doc.sections) if doc else 0, text)


def launches(score: Score, data: RunData | None) -> int | None:
    """How many launches its measurements came from: its points' servers' launches (a server metric: its
    servers'; a capacity search is one launch's). None: no run, or nothing read."""
    if data is None or not score.point_ids:
        return None
    launch_of = {s.server_id: s.launch_id or base_server_id(s.server_id) for s in data.servers}
    wanted = set(score.point_ids)
    points = [p for p in data.points if p.point_id in wanted]
    found = {launch_of.get(p.server_id, base_server_id(p.server_id)) if p.server_id else p.point_id for p in points}
    found |= {launch_of.get(i, i) for i in wanted - {p.point_id for p in points}}  # servers, searches
    return len(found)


def _counts(scores: Sequence[Score]) -> tuple[VerdictCount, ...]:
    return tuple(VerdictCount(v, c) for v, c in verdict_counts(scores).items())


def seed_groups(studies: Sequence[LoadedStudy], runs: Mapping[str, RunData], scores: Mapping[str, list[Score]],
                href: Callable[[str], str], docs: Sequence[Document] = ()) -> tuple[SeedGroup, ...]:
    """Every scored hypothesis by document (the sources files' order, then no seed), then by section; `href`
    is a study id's page; `docs` the source documents (compiler.claims)."""
    placed: dict[str, dict[str, list[tuple[Score, SeedRow]]]] = {}
    for loaded in sorted(studies, key=lambda s: s.study.study.id):
        meta = loaded.study.study
        own = {h.id: h.source for h in loaded.study.hypothesis}
        for s in scores.get(meta.id, []):
            document, section = place(meta.source, own.get(s.hypothesis, ""), docs)
            n = launches(s, runs.get(meta.id))
            row = SeedRow(claim=s.claim, hypothesis=s.hypothesis, study=meta.title, study_id=meta.id,
                          href=f"{href(meta.id)}#h-{s.hypothesis}", verdict=s.verdict, verdict_label=s.verdict_label,
                          launches="-" if n is None else str(n), interval=s.interval)
            placed.setdefault(document, {}).setdefault(section, []).append((s, row))
    groups = []
    by_id = _by_id(docs)
    for document in [d.id for d in docs] + [NO_SEED]:
        sections = placed.get(document)
        if not sections:
            continue
        every = [s for rows in sections.values() for s, _ in rows]
        title = by_id[document].title if document in by_id else NO_SEED_TITLE
        groups.append(SeedGroup(
            document=document or "no-seed", title=title, counts=_counts(every), hypotheses=len(every),
            sections=tuple(SeedSection(section, _counts([s for s, _ in rows]), tuple(r for _, r in rows))
                           for section, rows in sorted(sections.items(), key=lambda kv: section_key(document, kv[0], docs))),
        ))
    return tuple(groups)
