"""Claims as data: one TOML file per source document (`sources/<document>.toml`), each claim with the
document's own words, its numbers and the conditions it was made under.

A hypothesis names the claims it tests (`claims = ["roofline-02-batch1"]`); `report.claims` compares each
claim's conditions with the plan and the run that scored it. Pure: reads the sources files, nothing else.

    [document]
    id = "some-benchmark"                # what studies cite; claim ids are unique across documents
    title = "The document's title"
    sections = ["01", "02"]              # its parts in order (claims sort by them)

    [conditions]                         # what holds for every claim unless the claim says otherwise
    gpu = "h100-sxm"                     # a hardware table entry
    model = ["qwen3-8b"]                 # models/ folders with the claim's shape (any of them)
    input_len = 128                      # fixed; or { max = 96 } / "drawn" for drawn lengths
    output_len = 1024
    dataset = "random"                   # random | shared-prefix | multi-turn | trace
    cache = "reset"

    [[claim]]
    id = "bench-02-batch1"
    section = "02"
    text = "Measured: 149.9 tok/s at 6.63 ms per token"
    numbers = { "tok/s" = 149.9, "ms/token" = 6.63 }
    conditions = { concurrency = [1] }
    untested = "needs 8 GPUs"            # why no hypothesis tests it, shown while none does
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from base.errors import SpecError
from compiler.toml_lines import dotted, key_lines, line_of

SOURCES_DIR = "sources"
CLAIM_ID = r"^[a-z0-9][a-z0-9_.-]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Drawn(_Strict):
    """Lengths drawn per request rather than fixed; `max` (and `mean`) where the document states them."""

    max: int | None = Field(default=None, ge=1, description="The longest length the document allows.")
    mean: float | None = Field(default=None, gt=0, description="The mean length, where stated.")


Length = int | Drawn | Literal["drawn", "any"]  # "any": the claim does not depend on it (not compared)


class Conditions(_Strict):
    """What a claim was measured under. A key left out is not stated by the document and is not compared."""

    gpu: str | None = Field(default=None, description="Hardware table entry of the GPU (h100-sxm, h200, ...).")
    gpus: int | None = Field(default=None, ge=1, description="GPUs in the measured deployment.")
    replicas: int | None = Field(default=None, ge=1, description="Serving replicas behind the load generator.")
    vllm: str | None = Field(default=None, description="vLLM version.")
    driver: str | None = Field(default=None, description="GPU driver version.")
    model: list[str] | None = Field(
        default=None, description="Folders under models/ with the claim's model shape (any one of them matches)."
    )
    model_name: str | None = Field(default=None, description="The model as the document names it.")
    weights: Literal["any", "real"] | None = Field(
        default=None, description="`real`: the claim depends on the weights' values, so dummy weights differ.")
    input_len: Length | None = Field(default=None, description="Prompt tokens: a fixed number or drawn.")
    output_len: Length | None = Field(default=None, description="Output tokens: a fixed number or drawn.")
    dataset: Literal["random", "shared-prefix", "multi-turn", "trace"] | None = Field(
        default=None, description="Prompt kind: random (no reuse), shared-prefix, multi-turn or a trace.")
    concurrency: list[int] | None = Field(default=None, description="Closed-loop levels the claim was made at.")
    rate: list[float] | None = Field(default=None, description="Open-loop rates (requests/s) it was made at.")
    cache: Literal["reset", "keep", "any"] | list[Literal["reset", "keep"]] | None = Field(
        default=None, description="Prefix cache reset before each measurement, kept warm, or both (a list: the "
        "claim compares a kept arm with a reset one); \"any\": not compared.")
    repeats: int | None = Field(default=None, ge=1, description="Repeats per point.")
    engine: dict[str, Any] | None = Field(
        default=None, description="`vllm serve` options every measured configuration had (CLI names).")

    def over(self, base: Conditions) -> Conditions:
        """These conditions on top of `base`: a key given here wins; `engine` tables merge."""
        mine = {key: value for key, value in self.model_dump().items() if value is not None}
        merged = {**base.model_dump(), **mine}
        if base.engine and self.engine is not None:
            merged["engine"] = {**base.engine, **self.engine}
        return Conditions.model_validate(merged)


class Claim(_Strict):
    id: str = Field(pattern=CLAIM_ID, description="Stable id, unique across every sources file.")
    section: str = Field(default="", description="The document's part it comes from.")
    text: str = Field(min_length=1, description="The document's own words.")
    numbers: dict[str, float] = Field(default_factory=dict, description="Its numbers, by what they measure.")
    conditions: Conditions = Field(default_factory=Conditions, description="Overrides of the document's.")
    untested: str = Field(default="", description="Why no hypothesis tests it (needs 8 GPUs, ...).")


class DocumentMeta(_Strict):
    id: str = Field(pattern=CLAIM_ID, description="The id studies cite (`source = \"<id>, section 02\"`).")
    title: str = Field(description="Its title, as the index shows it.")
    aliases: list[str] = Field(default_factory=list, description="Other names a hypothesis' source may use.")
    sections: list[str] = Field(default_factory=list, description="Its parts in order (lower case compares).")
    url: str = Field(default="", description="Where it is published, if anywhere.")


class SourceFile(_Strict):
    document: DocumentMeta
    conditions: Conditions = Field(default_factory=Conditions)
    claim: list[Claim] = Field(min_length=1)


@dataclass(frozen=True)
class Document:
    """One source document: its claims with the document's conditions applied to each."""

    id: str
    title: str
    aliases: tuple[str, ...]
    sections: tuple[str, ...]
    url: str
    path: Path
    claims: tuple[Claim, ...]
    lines: dict[str, int] = field(repr=False, compare=False)


@dataclass(frozen=True)
class Catalog:
    """Every claim of every sources file, by id."""

    documents: tuple[Document, ...] = ()

    def claim(self, claim_id: str) -> tuple[Document, Claim] | None:
        for doc in self.documents:
            for claim in doc.claims:
                if claim.id == claim_id:
                    return doc, claim
        return None

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(c.id for d in self.documents for c in d.claims)



def find_sources(start: Path) -> Path | None:
    """The nearest `sources/` folder at `start` or above it (a study in studies/examples/ finds the repo's)."""
    for folder in (start, *start.resolve().parents):
        candidate = folder / SOURCES_DIR
        if candidate.is_dir():
            return candidate
    return None


def load_catalog(folder: Path | None) -> Catalog:
    """Every `*.toml` in `folder` as a document; raise SpecError naming file, line and key of each problem."""
    if folder is None or not folder.is_dir():
        return Catalog()
    documents: list[Document] = []
    problems: list[str] = []
    for path in sorted(folder.glob("*.toml")):
        doc, found = _load_document(path)
        problems += found
        if doc is not None:
            documents.append(doc)
    owner: dict[str, str] = {}
    for doc in documents:
        for index, claim in enumerate(doc.claims):
            if claim.id in owner:
                line = line_of(doc.lines, f"claim[{index}].id")
                problems.append(f"{doc.path}:{line}: claim[{index}].id: {claim.id!r} is already a claim of "
                                f"{owner[claim.id]}")
            owner[claim.id] = doc.id
    if problems:
        raise SpecError("\n".join(problems))
    return Catalog(tuple(documents))


def _load_document(path: Path) -> tuple[Document | None, list[str]]:
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except (OSError, UnicodeDecodeError) as exc:
        return None, [f"{path}:1: cannot read: {exc}"]
    except tomllib.TOMLDecodeError as exc:
        found = re.match(r"(.*) \(at line (\d+), column \d+\)$", str(exc))
        message, line = (found.group(1), found.group(2)) if found else (str(exc), "1")
        return None, [f"{path}:{line}: TOML syntax: {message}"]
    lines = key_lines(text)
    try:
        source = SourceFile.model_validate(data)
    except ValidationError as exc:
        return None, [_problem(path, lines, err) for err in exc.errors()]
    seen: set[str] = set()
    twice = []
    for index, claim in enumerate(source.claim):
        if claim.id in seen:
            twice.append(f"{path}:{line_of(lines, f'claim[{index}].id')}: claim[{index}].id: claim id {claim.id!r} "
                         "appears twice")
        seen.add(claim.id)
    if twice:
        return None, twice
    claims = tuple(c.model_copy(update={"conditions": c.conditions.over(source.conditions)}) for c in source.claim)
    meta = source.document
    return Document(meta.id, meta.title, tuple(a.lower() for a in meta.aliases),
                    tuple(s.lower() for s in meta.sections), meta.url, path, claims, lines), []


_TYPE_TAGS = frozenset({"int", "str", "float", "bool"})  # pydantic's names of a union's member types


def _problem(path: Path, lines: dict[str, int], err: Any) -> str:
    """One schema error as `file:line: key: message`; the key without pydantic's union member tags
    (`int`, `Drawn`, `literal['drawn','any']`, `list[...]`)."""
    loc = tuple(p for p in err["loc"] if not _is_tag(p))
    key = dotted(loc)
    message = err["msg"].replace("Input should be", "should be")
    if err["type"] == "extra_forbidden":
        message = "unknown key"
    elif err["type"] == "missing":
        message = "required key is missing"
    return f"{path}:{line_of(lines, key)}: {key}: {message}"


def _is_tag(part: object) -> bool:
    return isinstance(part, str) and (part[:1].isupper() or "[" in part or part in _TYPE_TAGS)


def unknown_claims(names: Sequence[str], catalog: Catalog) -> list[str]:
    """The ids in `names` that no sources file has."""
    known = set(catalog.ids)
    return [n for n in names if n not in known]
