"""The index's "Verdicts by seed document": every scored hypothesis under the seed document its study quotes,
then under the section of it that the study's `source` names. Pure: studies, runs and scores in, page
models (report.page_models) out; report.pages puts them on the index page.

A study's `source` names its seed as "<document>, <section>", several joined by ";":
"h100-roofline-study, sections 02 and 04" is the document h100-roofline-study, section "sections 02 and
04". A source that starts with no known document's id has no seed. A hypothesis goes where its study's
source puts it, unless its own `source` (usually the seed's own words) names a document: either as
"<document>, <section>" (then there), or, in a study quoting several documents, by name ("twelve
experiments"), which picks that one of the study's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from compiler.load import LoadedStudy
from report.page_models import SeedGroup, SeedRow, SeedSection, VerdictCount
from report.results import RunData
from report.score_model import Score, verdict_counts
from runner.store.records import base_server_id

NO_SEED = ""  # the document of a source that names none


@dataclass(frozen=True)
class SeedDocument:
    id: str  # as a study's source names it
    title: str  # its heading on the index
    aliases: tuple[str, ...]  # other names a hypothesis' own source may give it (lower case)
    order: tuple[str, ...]  # its parts in document order (lower case), to sort the sections citing them


DOCUMENTS: tuple[SeedDocument, ...] = (
    SeedDocument("h100-roofline-study", "“What is an H100 actually doing?” (the roofline study)",
                 ("roofline study",), tuple(f"{i:02d}" for i in range(1, 10))),
    SeedDocument("twelve-serving-experiments",
                 "“A Better Knob Beats More Silicon: 12 vLLM Serving Experiments on H100s” (twelve serving experiments)",
                 ("twelve experiments", "twelve serving experiments", "12 vllm serving experiments"),
                 ("the setup", "the mental model", "compiled cuda graphs", "what worked", "what failed",
                  "where my own measurements misled me", "final configuration", "what i'd try next", "limitations")),
)
NO_SEED_TITLE = "No seed"
_BY_ID = {d.id: d for d in DOCUMENTS}


def seed_refs(source: str) -> tuple[tuple[str, str], ...]:
    """Each `;`-separated part of a source that starts with a known document's id, as (document, section):
    "h100-roofline-study, section 03; twelve-serving-experiments, 'Compiled CUDA graphs'" -> both. The
    section is the rest of the part, as written ("" when it names none)."""
    refs = []
    for part in source.split(";"):
        part = part.strip()
        for doc in DOCUMENTS:
            head, rest = part[:len(doc.id)], part[len(doc.id):]
            if head.lower() == doc.id and (not rest or rest[0] in ",: "):
                refs.append((doc.id, rest.lstrip(",: ").strip()))
    return tuple(refs)


def seed_source(source: str) -> tuple[str, str]:
    """(document, section) of a source: its first known document; without one (NO_SEED, the source as
    written), so a seedless study's own source still groups it."""
    refs = seed_refs(source)
    return refs[0] if refs else (NO_SEED, source.strip())


def place(study_source: str, hypothesis_source: str = "") -> tuple[str, str]:
    """(document, section) of one hypothesis: its own source's when that starts with a known document;
    else its study's, and of a study quoting several documents the first one its own source names (by id
    or alias), else the study's first."""
    own = seed_refs(hypothesis_source)
    if own:
        return own[0]
    refs = seed_refs(study_source)
    said = hypothesis_source.lower()
    named = [r for r in refs if any(name in said for name in (r[0], *_BY_ID[r[0]].aliases))]
    return (named or list(refs) or [seed_source(study_source)])[0]


def section_key(document: str, section: str) -> tuple[int, str]:
    """Sections in document order: by the earliest part of the document they name ("sections 02-06": 02;
    "'What worked' 2 and 'Where my own measurements misled me'": what worked), then by their text; a
    section naming no known part, or of no seed, after those."""
    doc = _BY_ID.get(document)
    text = section.lower().replace("’", "'")
    found = [i for i, part in enumerate(doc.order) if part in text] if doc else []
    return (min(found) if found else len(doc.order) if doc else 0, text)


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
                href: Callable[[str], str]) -> tuple[SeedGroup, ...]:
    """Every scored hypothesis by document (DOCUMENTS' order, then no seed), then by section; `href` is a
    study id's page."""
    placed: dict[str, dict[str, list[tuple[Score, SeedRow]]]] = {}
    for loaded in sorted(studies, key=lambda s: s.study.study.id):
        meta = loaded.study.study
        own = {h.id: h.source for h in loaded.study.hypothesis}
        for s in scores.get(meta.id, []):
            document, section = place(meta.source, own.get(s.hypothesis, ""))
            n = launches(s, runs.get(meta.id))
            row = SeedRow(claim=s.claim, hypothesis=s.hypothesis, study=meta.title, study_id=meta.id,
                          href=f"{href(meta.id)}#h-{s.hypothesis}", verdict=s.verdict, verdict_label=s.verdict_label,
                          launches="-" if n is None else str(n), interval=s.interval)
            placed.setdefault(document, {}).setdefault(section, []).append((s, row))
    groups = []
    for document in [d.id for d in DOCUMENTS] + [NO_SEED]:
        sections = placed.get(document)
        if not sections:
            continue
        every = [s for rows in sections.values() for s, _ in rows]
        title = _BY_ID[document].title if document in _BY_ID else NO_SEED_TITLE
        groups.append(SeedGroup(
            document=document or "no-seed", title=title, counts=_counts(every), hypotheses=len(every),
            sections=tuple(SeedSection(section, _counts([s for s, _ in rows]), tuple(r for _, r in rows))
                           for section, rows in sorted(sections.items(), key=lambda kv: section_key(document, kv[0]))),
        ))
    return tuple(groups)
