"""Study file -> validated `Study`, or every problem of every file as `file:line: key: message`.

Pure: reads the study file and the model config it names, nothing else.
"""

from __future__ import annotations

import difflib
import hashlib
import tomllib
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from compiler.study import Study
from compiler.toml_lines import dotted, key_lines, line_of
from studyc.errors import SpecError


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

    @property
    def directory(self) -> Path:
        return self.path.parent

    def line(self, path: str) -> int:
        return line_of(self.lines, path)


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
    from compiler.validate import cross_check

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
        return None, [_schema_problem(name, lines, data, err) for err in exc.errors()]
    loaded = LoadedStudy(study, path, hashlib.sha256(raw).hexdigest(), lines)
    problems = [Problem(name, line_of(lines, key), key, message) for key, message in cross_check(loaded)]
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


def _schema_problem(name: str, lines: dict[str, int], data: dict[str, Any], err: Any) -> Problem:
    loc = tuple(part for part in err["loc"] if not _is_union_tag(part))
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
    elif message.startswith("Value error, "):
        message = message[len("Value error, "):]
    return Problem(name, line_of(lines, path), path, message)


def _is_union_tag(part: str | int) -> bool:
    """Pydantic adds the union member's type name (`str`, `Where`, `float`) to error locations."""
    return isinstance(part, str) and (part in {"str", "int", "float", "Where"} or "[" in part)


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
