"""Leave one GPU out: predict every point measured on one GPU from the other GPUs' points alone.

Copies the results database to a temporary folder, deletes the held-out GPU's points there (its runs and
their calibrations stay), and predicts each of its stored runs' plans as `studyc plan --db` would
(`report.ledger.ledger.predict_points`: a key the GPU never measured is fitted on the other GPUs' points and
priced on the GPU's card). Twice: on the GPU's calibrations, then with those removed too (its spec sheet
scaled by the other GPUs' measured-to-spec ratios). Prints the median and worst absolute error of
output throughput, TPOT and TTFT per study and overall, against the points as the ledger reads them
(the whole measured window). The committed file is only read.

    nice .venv/bin/python benchmarks/leave_one_gpu_out.py [--db results/h200] [--gpu h100-sxm]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from compiler.plan import Plan
from report.ledger.ledger import gpu_id, predict_points, read_calibrations, read_points
from report.ledger.ledger_fit import METRICS, StoredPoint
from runner.store.store import Store

LABELS = {"output_throughput": "throughput", "tpot_s": "TPOT", "ttft_s": "TTFT"}


def held_out_copy(db: Path, gpu: str, folder: Path) -> tuple[Path, list[str]]:
    """A copy of `db` in `folder` without the points (and their requests and checks) of `gpu`'s runs."""
    path = folder / "leave-one-gpu-out.duckdb"
    shutil.copyfile(Store.database_file(db, read_only=True), path)  # a results folder: the database built from it
    with Store(path) as store:
        runs = [r.run_id for r in store.runs() if gpu_id(r.gpu_name) == gpu]
        if not runs:
            raise SystemExit(f"{db}: no run on {gpu}")
        marks = ", ".join("?" for _ in runs)
        for table in ("points", "requests", "checks"):
            store.con.execute(f"DELETE FROM {table} WHERE run_id IN ({marks})", runs)
    return path, runs


def errors(truth: Sequence[StoredPoint], copy: Path, gpu: str, spec: bool) -> dict[str, list[tuple[str, dict[str, float]]]]:
    """Per study: (point, metric -> signed % error) for each held-out point predicted."""
    train = read_points(copy)
    assert not any(gpu_id(p.key.gpu) == gpu for p in train), "the held-out GPU's points were not removed"
    calibrations = [c for c in read_calibrations(copy) if not (spec and gpu_id(c.gpu) == gpu)]
    by_run: dict[str, list[StoredPoint]] = defaultdict(list)
    for p in truth:
        by_run[p.run_id].append(p)
    with Store(copy, read_only=True) as store:
        plans = {r.run_id: (r.gpu_name, Plan.from_stored(r.plan_json)) for r in store.runs() if r.run_id in by_run}
    out: dict[str, list[tuple[str, dict[str, float]]]] = defaultdict(list)
    notes = set()
    for run_id, held in sorted(by_run.items()):
        gpu_name, plan = plans[run_id]
        assert plan is not None
        predicted = predict_points(plan, train, hardware=gpu_name, calibrations=calibrations)
        for p in held:
            pp = predicted[p.point_id]
            notes.add(pp.note)
            errs = {m: 100.0 * (v - measured) / measured for m in METRICS
                    if (v := pp.values[m]) is not None and (measured := p.measured[m]) and measured > 0}
            if errs:
                out[p.study].append((p.point_id, errs))
    for note in sorted(notes):
        print(f"  note: {note}")
    return out


def table(found: dict[str, list[tuple[str, dict[str, float]]]], total: int) -> str:
    head = f"{'study':<20} {'n':>3}" + "".join(f"  {LABELS[m] + ' med':>15} {'worst':>7}" for m in METRICS)
    lines = [head]
    every = [row for rows in found.values() for row in rows]
    for study, rows in [*sorted(found.items()), ("overall", every)]:
        cells = ""
        for m in METRICS:
            e = [errs[m] for _, errs in rows if m in errs]
            cells += (f"  {statistics.median(abs(x) for x in e):>14.1f}% {max(e, key=abs):>+6.1f}%" if e
                      else f"  {'-':>15} {'-':>7}")
        lines.append(f"{study:<20} {len(rows):>3}{cells}")
    lines.append(f"predicted {len(every)} of {total} held-out points (median |error| %, worst signed error %)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, default=Path("results/h200"))
    parser.add_argument("--gpu", default="h100-sxm", help="the GPU left out (a hardware-table key or name)")
    parser.add_argument("--points", action="store_true", help="also each point's signed errors")
    args = parser.parse_args()
    gpu = gpu_id(args.gpu)
    truth = [p for p in read_points(args.db) if gpu_id(p.key.gpu) == gpu]
    with tempfile.TemporaryDirectory(prefix="studyc-logo-") as folder:
        copy, runs = held_out_copy(args.db, gpu, Path(folder))
        print(f"{len(truth)} stored points of {gpu} in {len({p.run_id for p in truth})} latest run(s) held out; "
              f"{len(runs)} run(s) on it keep their calibrations")
        for spec, title in ((False, f"priced on {gpu}'s calibrations"), (True, f"no calibration of {gpu}: spec-scaled")):
            t0 = time.perf_counter()
            found = errors(truth, copy, gpu, spec)
            print(f"\n{title} ({time.perf_counter() - t0:.0f} s)\n{table(found, len(truth))}")
            if args.points:
                for pid, errs in (row for rows in found.values() for row in rows):
                    print(f"  {pid:<48}" + "".join(f" {LABELS[m]} {errs[m]:+6.1f}%" for m in errs))


if __name__ == "__main__":
    main()
