"""The verdict rule: an interval against a prediction's band (value, range) or threshold (relation) is
confirmed inside it, refuted wholly outside it, inconclusive straddling one of its edges. Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

Verdict = Literal["confirmed", "refuted", "inconclusive", "invalid", "not run"]
VERDICTS: tuple[Verdict, ...] = ("confirmed", "refuted", "inconclusive", "invalid", "not run")


def straddled(kind: str, relation: str | None, band_low: float | None, band_high: float | None,
              low: float, high: float) -> tuple[float, ...]:
    """The band edges (or the relation's threshold) lying inside the interval [low, high]: what makes a
    verdict inconclusive."""
    edges: tuple[float | None, ...] = (band_low, band_high)
    if kind == "relation":
        edges = (band_low if relation in (">", ">=") else band_high,)
    return tuple(e for e in edges if e is not None and low <= e <= high and low < high)


def judge(
    kind: str, relation: str | None, band_low: float | None, band_high: float | None, low: float, high: float
) -> Verdict:
    """Verdict of the interval [low, high] against a band (value, range) or a threshold (relation):
    inside -> confirmed, entirely outside -> refuted, straddling -> inconclusive."""
    if kind == "relation":
        threshold = band_low if relation in (">", ">=") else band_high
        assert threshold is not None
        holds: dict[str, Callable[[float], bool]] = {
            ">": lambda x: x > threshold, ">=": lambda x: x >= threshold,
            "<": lambda x: x < threshold, "<=": lambda x: x <= threshold,
        }
        test = holds[relation or ">"]
        if test(low) and test(high):
            return "confirmed"
        if not test(low) and not test(high):
            return "refuted"
        return "inconclusive"
    assert band_low is not None and band_high is not None
    if band_low <= low and high <= band_high:
        return "confirmed"
    if high < band_low or low > band_high:
        return "refuted"
    return "inconclusive"
