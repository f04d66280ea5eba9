"""The stopping rule simulated in bulk with numpy: the same draws as tests.report.simulate (launch effects and
repeat noise per block and arm), every run of a case at once, each look's interval at the multiplier
report.stats.sequential gives (`look_critical`, so a changed ALPHA reaches it) and judged as report.stats.verdict judges.
Only designs that pair their arms in blocks (one server per arm, at least two launches) are vectorised: a
block's log-ratio is then the unit. `agree` checks it against production scoring on the same draws, verdict
for verdict, so the bulk simulates the rule production runs, not a copy of it.
"""

from __future__ import annotations

import math
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from report.scoring.score_model import Score
from report.stats import sequential as sequential_rule
from report.stats.sequential import looks
from tests.report.simulate import (
    BULK_SIMS,
    LAUNCH_SD,
    LEVEL,
    REPEAT_SD,
    Case,
    Prepared,
    Rates,
    block_sd,
    cases,
    in_memory,
    models_read_once,
    planner_checks,
    prepare,
    simulate,
    table,
)

ARMS = ("a", "b")  # index 0: the numerator arm, 1: the denominator


@dataclass(frozen=True)
class Draws:
    """Every run's launch effects (runs, blocks, arms) and repeat noise (runs, blocks, arms, repeats), log scale."""

    effects: np.ndarray
    noise: np.ndarray

    def values(self, case: Case, k: int, prep: Prepared) -> dict[str, float]:
        """Run k's value of every point of the prepared case (as tests.report.simulate.draw would give them)."""
        out = {}
        for block, points in prep.blocks.items():
            for p in points:
                arm = ARMS.index(p.arm)
                scale = case.truth if p.arm == "a" else 1.0
                out[p.point_id] = LEVEL * scale * math.exp(self.effects[k, block - 1, arm]
                                                           + self.noise[k, block - 1, arm, p.repeat - 1])
        return out

    def block_logs(self, truth: float) -> np.ndarray:
        """(runs, blocks): each block's log of its arms' ratio of launch means (repeats averaged linearly)."""
        level = np.log(np.exp(self.effects[..., None] + self.noise).mean(axis=-1))
        return math.log(truth) + level[..., 0] - level[..., 1]


def draws(case: Case, runs: int, seed: int) -> Draws:
    """The launch effects (SD LAUNCH_SD; Student's t with 3 df scaled to it for `tails = "t3"`) and repeat noise
    (SD REPEAT_SD) of `runs` runs of the case, every block the budget allows."""
    rng = np.random.default_rng(seed)
    blocks = case.budget or case.launches
    shape = (runs, blocks, 2)
    raw = rng.standard_t(3, shape) / math.sqrt(3.0) if case.tails == "t3" else rng.standard_normal(shape)
    return Draws(LAUNCH_SD * raw, REPEAT_SD * rng.standard_normal((*shape, case.repeats)))


@dataclass(frozen=True)
class Band:
    """A prediction as report.stats.verdict.judge reads it."""

    kind: str
    relation: str | None
    low: float | None
    high: float | None

    def judge(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """0 inconclusive, 1 confirmed, 2 refuted, for each interval [lo, hi] (report.stats.verdict.judge)."""
        if self.kind == "relation":
            at = self.low if self.relation in (">", ">=") else self.high
            assert at is not None
            ops = {">": np.greater, ">=": np.greater_equal, "<": np.less, "<=": np.less_equal}
            holds = ops[self.relation or ">"]
            a, b = holds(lo, at), holds(hi, at)
            return np.where(a & b, 1, np.where(~a & ~b, 2, 0))
        assert self.low is not None and self.high is not None
        inside = (self.low <= lo) & (hi <= self.high)
        outside = (hi < self.low) | (lo > self.high)
        return np.where(inside, 1, np.where(outside, 2, 0))


def band_of(score: Score) -> Band:
    return Band(score.kind, score.relation, score.band_low, score.band_high)


def run_all(case: Case, band: Band, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(verdict code, blocks used) of every run whose block log-ratios are `d`: looks from the required blocks,
    a run stopping at the first look that decides it, as report.scoring.scoring.undecided asks, else at the budget."""
    runs, most = d.shape
    verdict = np.zeros(runs, dtype=np.int8)
    used = np.full(runs, most)
    open_ = np.ones(runs, dtype=bool)
    schedule = looks(case.launches, case.budget) if case.budget else (case.launches,)
    for n in schedule:
        x = d[:, :n]
        mean = x.mean(axis=1)
        half = sequential_rule.look_critical(n, case.budget, case.launches)(float(n - 1)) * x.std(axis=1, ddof=1)
        v = band.judge(np.exp(mean - half / math.sqrt(n)), np.exp(mean + half / math.sqrt(n)))
        now = open_ & ((v != 0) | (n == schedule[-1]))
        verdict[now], used[now] = v[now], n
        open_ &= ~now
    return verdict, used


CODES = {0: "inconclusive", 1: "confirmed", 2: "refuted"}


def agree(prep: Prepared, runs: int, seed: int) -> list[tuple[int, str, str, int, int]]:
    """(run, production verdict, bulk verdict, production blocks, bulk blocks) of runs where they differ: the
    same draws scored by report.scoring.scoring (block by block, as the runner asks) and by `run_all`."""
    case = prep.case
    drawn = draws(case, runs, seed)
    first = in_memory(prep, 0, explain=False, values=drawn.values(case, 0, prep))
    verdict, used = run_all(case, band_of(first), drawn.block_logs(case.truth))
    out: list[tuple[int, str, str, int, int]] = []
    for k in range(runs):
        s = first if k == 0 else in_memory(prep, k, explain=False, values=drawn.values(case, k, prep))
        if (s.verdict, s.n) != (CODES[int(verdict[k])], int(used[k])):
            out.append((k, s.verdict, CODES[int(verdict[k])], s.n, int(used[k])))
    return out


def paired(case: Case) -> bool:
    """Whether the bulk simulates the case: one server per arm and at least two launches (blocks pair arms)."""
    return case.server == "per-arm" and case.launches >= 2


def bulk(case: Case, sims: int = BULK_SIMS) -> Rates:
    """The case's false verdicts over `sims` runs drawn and judged in bulk (its band from one scored run)."""
    with tempfile.TemporaryDirectory() as tmp, models_read_once():
        band = band_of(in_memory(prepare(case, Path(tmp)), 0, explain=False))
    verdict, _ = run_all(case, band, draws(case, sims, case.seed).block_logs(case.truth))
    return Rates(case, sims, int((verdict == 1).sum()), int((verdict == 2).sum()))


def rates(case: Case) -> Rates:
    """A paired case in bulk, any other through production scoring (its own `sims`)."""
    return bulk(case) if paired(case) else simulate(case, workers=2)


def main(argv: Sequence[str]) -> int:
    """`python -m tests.report.simulate_fast [--broken]`: the suite's table, then the planner's runs; --broken:
    the table with report.stats.sequential spending 6% instead of 5%."""
    if "--broken" in argv:
        sequential_rule.ALPHA = 0.06
        print("report.stats.sequential.ALPHA = 0.06 (a broken rule):")
    print(table([rates(c) for c in cases()]))
    if "--broken" in argv:
        return 0
    print(f"\nthe planner (band 1 +- 2%, block SD {100 * block_sd():.2g}%, 3 required blocks):")
    for found, power in planner_checks(every=True):
        print(f"  {found.what}, {100 * power:.0f}% power: {found.blocks[0] if len(set(found.blocks)) == 1 else 'per pilot'}"
              f" blocks -> decided {100 * found.decided:.1f}% of {len(found.blocks)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
