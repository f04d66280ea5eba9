"""Study file -> validated `Study`, or every problem of every file as `file:line: key: message`.

Pure: reads the study file and the model config it names, nothing else.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import tomllib
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from base.errors import SpecError
from compiler.study import Study
from compiler.toml_lines import dotted, key_lines, line_of
from compiler.validate import claims_warnings, cross_check, study_warnings


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    path: str
    message: str

    def __str__(self) -> str:
        key = f" {self.path}:" if self.path else ""
        return f"{self.file}:{self.line}:{key} {self.message}"


@dataclass(frozen=True)
class LoadedStudy:
    """A valid study with where it came from: the plan and the site cite the file and its hash."""

    study: Study
    path: Path
    sha256: str
    lines: dict[str, int] = field(repr=False, compare=False)
    warnings: tuple[Problem, ...] = field(default=(), compare=False)

    @property
    def directory(self) -> Path:
        return self.path.parent

    def line(self, path: str) -> int:
        return line_of(self.lines, path)


def study_version(text: str) -> str | None:
    """sha256 of a study file read as TOML and written back canonically (keys sorted, JSON): an edit of a
    comment or of the layout keeps it, an edit of any value changes it. None: not TOML."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def load_study(path: str | Path) -> LoadedStudy:
    """Load one study; raise SpecError listing every problem."""
    return load_studies([path])[0]


def load_studies(paths: Sequence[str | Path]) -> list[LoadedStudy]:
    """Load every study; raise one SpecError listing every problem of every file."""
    loaded: list[LoadedStudy] = []
    problems: list[Problem] = []
    for path in paths:
        study, found = check_file(Path(path))
        problems.extend(found)
        if study is not None:
            loaded.append(study)
    if problems:
        raise SpecError("\n".join(str(p) for p in problems))
    return loaded


def check_file(path: Path) -> tuple[LoadedStudy | None, list[Problem]]:
    """Validate one file: syntax, schema, then cross references. Never raises for user mistakes."""
    name = str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, [Problem(name, 1, "", "no such file")]
    except IsADirectoryError:
        return None, [Problem(name, 1, "", "is a folder, not a study file")]
    except OSError as exc:
        return None, [Problem(name, 1, "", f"cannot read: {exc.strerror}")]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, [Problem(name, 1, "", "not a TOML study file (not UTF-8 text)")]
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return None, [_syntax_problem(name, exc)]
    lines = key_lines(text)
    try:
        study = Study.model_validate(data)
    except ValidationError as exc:
        return None, schema_problems(name, lines, data, exc.errors())
    warnings = tuple(Problem(name, line_of(lines, key), key, message)
                     for key, message in [*study_warnings(study), *claims_warnings(study, path.parent)])
    loaded = LoadedStudy(study, path, hashlib.sha256(raw).hexdigest(), lines, warnings)
    problems = [Problem(name, line_of(lines, key), key, message) for key, message in cross_check(study, path.parent)]
    return (None if problems else loaded), problems


def _syntax_problem(name: str, exc: tomllib.TOMLDecodeError) -> Problem:
    message = str(exc)
    line = getattr(exc, "lineno", None)
    if line is None and "(at line " in message:
        line = int(message.split("(at line ", 1)[1].split(",", 1)[0].rstrip(")"))
        message = message.split(" (at line ", 1)[0]
    elif line is not None:
        message = getattr(exc, "msg", message)
    return Problem(name, line or 1, "", f"TOML syntax: {message}")


_TYPE_MISMATCH = {"list_type", "string_type", "model_type", "int_type", "float_type", "dict_type", "bool_type",
                  "int_parsing", "float_parsing", "tuple_type", "literal_error", "model_attributes_type"}


def schema_problems(name: str, lines: dict[str, int], data: dict[str, Any], errors: list[Any]) -> list[Problem]:
    """One problem per key. A union field (`requests = 8` or a list) fails once per member type in
    pydantic; keep the member whose failure says something (a bound), else say which types fit."""
    groups: dict[tuple[Any, ...], list[tuple[tuple[Any, ...], str | None, Any]]] = {}
    for err in errors:
        loc, tag, head = _split_tags(err["loc"], data, err["type"])
        groups.setdefault(head if tag is not None else loc, []).append((loc, tag, err))
    problems: list[Problem] = []
    for members in groups.values():
        if len(members) == 1 or members[0][1] is None:
            problems += [_schema_problem(name, lines, loc, err) for loc, _, err in members]
            continue
        telling = [m for m in members if m[2]["type"] not in _TYPE_MISMATCH or len(m[0]) > len(_head(m))]
        if telling:
            loc, _, err = telling[0]
            problems.append(_schema_problem(name, lines, loc, err))
        else:
            loc = members[0][0]
            kinds = list(dict.fromkeys(_kind_of_tag(tag) for _, tag, _ in members))
            problems.append(Problem(name, line_of(lines, dotted(loc)), dotted(loc), f"should be {' or '.join(kinds)}"))
    return problems


def _head(member: tuple[tuple[Any, ...], str | None, Any]) -> tuple[Any, ...]:
    loc, tag, err = member
    raw = tuple(err["loc"])
    return raw[: raw.index(tag)] if tag in raw else loc


def _split_tags(raw: Any, data: Any, kind: str) -> tuple[tuple[Any, ...], str | None, tuple[Any, ...]]:
    """(location without union member tags, the first tag, the location before it).

    A tag is a string part that is not a key of the data at that point (pydantic inserts the member
    type's name: `constrained-int`, `list[constrained-int]`, `Where`, `str`)."""
    loc: list[Any] = []
    tag: str | None = None
    head: tuple[Any, ...] = ()
    current: Any = data
    parts = list(raw)
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(part, int) and isinstance(current, list) and 0 <= part < len(current):
            current = current[part]
            loc.append(part)
        elif isinstance(part, str) and isinstance(current, dict) and part in current:
            current = current[part]
            loc.append(part)
        elif isinstance(current, dict) and isinstance(part, str) and current.get("dist") == part:
            continue  # the tag pydantic adds for a length distribution's `dist`
        elif isinstance(part, str) and (not last or kind != "missing") and _is_union_tag(part):
            if tag is None:
                tag, head = part, tuple(loc)
        else:
            loc.append(part)
            current = None
    return tuple(loc), tag, head


def _kind_of_tag(tag: str | None) -> str:
    if tag is None:
        return "a value"
    if tag.startswith(("list[", "tuple[")):
        return "a list"
    if tag.startswith("tagged-union["):  # a length distribution (compiler.workload.Distribution)
        return "a distribution table { dist = \"uniform\" | \"normal\" | \"lognormal\" | \"histogram\", ... }"
    base = tag.removeprefix("constrained-")
    return {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false"}.get(
        base, "a table" if base[:1].isupper() else f"a {base}"
    )


def _schema_problem(name: str, lines: dict[str, int], loc: tuple[Any, ...], err: Any) -> Problem:
    path = dotted(loc)
    message = err["msg"]
    if err["type"] == "extra_forbidden":
        known = _fields_at(loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
        message = "unknown key" + (f"; did you mean '{close[0]}'?" if close else "")
        if known:
            message += f" (known: {', '.join(sorted(known))})" if not close else ""
    elif err["type"] == "missing":
        message = "required key is missing"
    elif err["type"] == "union_tag_invalid":
        ctx = err.get("ctx", {})
        message = f"unknown {str(ctx.get('discriminator', 'kind')).strip(chr(39))} {ctx.get('tag')!r} (known: {ctx.get('expected_tags')})"
    elif message.startswith("Value error, "):
        message = message[len("Value error, "):]
    message = message.replace("Input should be", "should be")
    return Problem(name, line_of(lines, path), path, message)


def _is_union_tag(part: str | int) -> bool:
    """Pydantic adds the union member's type name (`str`, `Where`, `constrained-int`) to error locations."""
    return isinstance(part, str) and (
        part in {"str", "int", "float", "bool"} or part.startswith("constrained-") or "[" in part or part[:1].isupper()
    )


def _fields_at(loc: tuple[str | int, ...]) -> list[str]:
    """Field names of the model that `loc` points into, for did-you-mean."""
    current: Any = Study
    for part in loc:
        if isinstance(part, int):
            continue
        model = _model_in(current)
        if model is not None and part in model.model_fields:
            current = model.model_fields[part].annotation
            continue
        if typing.get_origin(current) is dict:
            current = typing.get_args(current)[1]
            continue
        return []
    model = _model_in(current)
    return list(model.model_fields) if model is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (list, tuple, typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None
