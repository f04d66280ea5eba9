"""Print the default spreads of report.planning.decidability (DEFAULT_SPREADS) as computed from a results database:
`.venv/bin/python scripts/decidability_defaults.py results/h200` (docs/decidability.md)."""

from __future__ import annotations

import sys
from pathlib import Path

from report.planning.priors import defaults_table


def main(db: Path) -> None:
    print("family         launch SD  within SD  launch df  paired SD  paired df  configurations  pairs")
    for fam, launch, within, df, pair, pair_df, configs, pairs in defaults_table(db):
        shown = [f"{100 * x:.2g}%" if x is not None else "-" for x in (launch, within, pair)]
        print(f"{fam:<14} {shown[0]:>9}  {shown[1]:>9}  {df:>9}  {shown[2]:>9}  {pair_df:>9}  {configs:>14}  "
              f"{pairs:>5}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "results/h200"))
