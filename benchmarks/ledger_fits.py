"""The ledger's leave-one-study-out fits in one process against the same fits in worker processes,
and against the same fits read back from the fit cache.

`studyc site` (the ledger page) and `studyc model --db` fit the step-time model once per held-out
study; each fit is a pure function of its training points. This runs the folds of a results database
three ways, alternating the order over `--repeats`: fitted in one process, fitted in worker processes
(the cache off for both), and read from a fit cache a first, untimed pass filled (a fresh folder). It
checks that all give the same predictions and prints each wall time and the ratios one process /
workers and workers / kept.

    .venv/bin/python benchmarks/ledger_fits.py --db results/h200 [--workers N] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from report.ledger import ledger_fit
from report.ledger.ledger import read_points


def timed(points: list[ledger_fit.StoredPoint], workers: int,
          kept: str | None = None) -> tuple[float, list[ledger_fit.Scored]]:
    """One pass over the folds, nothing fitted in this process yet; with `kept`, the fit cache there."""
    os.environ["STUDYC_FIT_CACHE"] = "0" if kept is None else "1"
    if kept is not None:
        os.environ["STUDYC_CACHE_DIR"] = kept
    ledger_fit._FITS.clear()  # every fit made afresh, or read from the cache
    ledger_fit._PREDICTIONS.clear()
    t0 = time.perf_counter()
    scored = ledger_fit.leave_one_study_out(points, workers=workers)
    return time.perf_counter() - t0, scored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, default=Path("results/h200"))
    parser.add_argument("--workers", type=int, default=ledger_fit.fit_workers())
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    points = read_points(args.db)
    studies = len({p.study for p in points})
    print(f"{len(points)} stored points of {studies} studies in {args.db}; workers {args.workers}")
    walls: dict[str, list[float]] = {"one process": [], "workers": [], "kept": []}
    kept = tempfile.mkdtemp(prefix="studyc-fits-")
    wall, reference = timed(points, args.workers, kept)
    print(f"  filling the fit cache ({args.workers} workers): {wall:.1f} s")
    for repeat in range(args.repeats):
        order = [("one process", 1, None), ("workers", args.workers, None), ("kept", args.workers, kept)]
        for name, workers, folder in order if repeat % 2 == 0 else reversed(order):
            wall, scored = timed(points, workers, folder)
            if reference is None:
                reference = scored
            elif scored != reference:
                raise SystemExit(f"{name}: predictions differ from the first pass")
            walls[name].append(wall)
            print(f"  repeat {repeat + 1}, {name}: {wall:.1f} s")
    one, many, read = (statistics.median(walls[k]) for k in ("one process", "workers", "kept"))
    print(f"median one process {one:.1f} s, {args.workers} workers {many:.1f} s, kept {read:.2f} s: "
          f"ratio one/workers {one / many:.2f}, workers/kept {many / read:.0f} "
          f"(same predictions: yes, {args.repeats} repeats each)")


if __name__ == "__main__":
    main()
