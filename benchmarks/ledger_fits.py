"""The ledger's leave-one-study-out fits in one process against the same fits in worker processes.

`studyc site` (the ledger page) and `studyc model --db` fit the step-time model once per held-out
study; each fit is a pure function of its training points. This runs the folds of a results database
both ways, alternating the order over `--repeats`, checks that they give the same predictions, and
prints each wall time and the ratio one process / workers.

    .venv/bin/python benchmarks/ledger_fits.py --db results/h200.duckdb [--workers N] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from report import ledger_fit
from report.ledger import read_points


def timed(points: list[ledger_fit.StoredPoint], workers: int) -> tuple[float, list[ledger_fit.Scored]]:
    ledger_fit._FITS.clear()  # every fit made afresh
    ledger_fit._PREDICTIONS.clear()
    t0 = time.perf_counter()
    scored = ledger_fit.leave_one_study_out(points, workers=workers)
    return time.perf_counter() - t0, scored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, default=Path("results/h200.duckdb"))
    parser.add_argument("--workers", type=int, default=ledger_fit.fit_workers())
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    points = read_points(args.db)
    studies = len({p.study for p in points})
    print(f"{len(points)} stored points of {studies} studies in {args.db}; workers {args.workers}")
    walls: dict[str, list[float]] = {"one process": [], "workers": []}
    reference = None
    for repeat in range(args.repeats):
        order = [("one process", 1), ("workers", args.workers)]
        for name, workers in order if repeat % 2 == 0 else reversed(order):
            wall, scored = timed(points, workers)
            if reference is None:
                reference = scored
            elif scored != reference:
                raise SystemExit(f"{name}: predictions differ from the first pass")
            walls[name].append(wall)
            print(f"  repeat {repeat + 1}, {name}: {wall:.1f} s")
    one, many = statistics.median(walls["one process"]), statistics.median(walls["workers"])
    print(f"median one process {one:.1f} s, {args.workers} workers {many:.1f} s: ratio one/workers {one / many:.2f}"
          f" (same predictions: yes, {args.repeats} repeats each)")


if __name__ == "__main__":
    main()
