"""Decidability before the run for the command line: the priors read once at the edge (a database's
stored runs, else the documented defaults), handed to report.planning.decidability; validate's warnings and run's
refusal."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from base.errors import SpecError
from compiler.load import LoadedStudy
from compiler.plan import Plan
from report.planning.decidability import Decidability, Priors, plan_decidability
from report.planning.decidability_text import refusals, warnings


def priors_for(db: Path | None) -> Priors:
    """The priors from the runs stored in `db` (report.planning.priors), or the defaults without one."""
    if db is None or not db.exists():
        return Priors()
    from report.planning.priors import read_priors

    return read_priors(db)


def decidability(plan: Plan, db: Path | None = None) -> list[Decidability]:
    return plan_decidability(plan, priors_for(db))


def validate_warnings(loaded: LoadedStudy) -> list[str]:
    """The decidability warnings of a valid study under the default priors."""
    from compiler.plan_compile import compile_study

    return warnings(loaded, decidability(compile_study(loaded)))


def refuse_underpowered(studies: Sequence[tuple[LoadedStudy, Plan]], db: Path | None) -> None:
    """Refuse (SpecError, one line per hypothesis) a run of any hypothesis whose best-case power is under
    50% at the priors of `db` (its stored runs), else the defaults."""
    priors = priors_for(db)
    lines = [line for loaded, plan in studies for line in refusals(loaded, plan_decidability(plan, priors))]
    if lines:
        raise SpecError("\n".join(lines))
