"""Expected failures of every stage: one clean message, a non-zero exit, no traceback.

Anything that is not a StudycError is a bug and shows its traceback.
"""

from __future__ import annotations

from typing import IO, Any

import click


class StudycError(click.ClickException):
    """Base of all expected failures; click prints `Error: message` and exits with `exit_code`."""

    exit_code = 1


class SpecError(StudycError):
    """A study file is wrong: the message lists every problem as `file:line: key: message`."""

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(self.format_message(), err=True)


class EngineError(StudycError):
    """The serving engine failed to start, answer or stop."""


class StoreError(StudycError):
    """The results database is missing, locked, or of another schema version."""
