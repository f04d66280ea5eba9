"""Rewrite a results folder in the current file encoding (docs/results-format.md), table by table: each run's
files read (checked against its manifest) and written again into OUT, with its manifest's sha256 anew.

    .venv/bin/python scripts/rewrite_results.py FOLDER OUT

FOLDER is only read; OUT must be new or an empty folder. Rows, columns and their order stay as they are;
only the encoding changes (token times: `token_times_ns` -> `token_gaps_us`). The file format (Parquet or
CSV) stays FOLDER's. Prints both folders' sizes and the rows written.
"""

from __future__ import annotations

import sys
from pathlib import Path

from base.errors import StoreError
from runner.store.folder import rewrite_folder
from runner.store.store import SCHEMA_VERSION


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: " + __doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    folder, out = Path(argv[0]), Path(argv[1])
    try:
        counts = rewrite_folder(folder, out, SCHEMA_VERSION)
    except StoreError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    rows = ", ".join(f"{n} {name}" for name, n in counts.items())
    print(f"{folder} ({_size(folder) / 1e6:.1f} MB) -> {out} ({_size(out) / 1e6:.1f} MB): {rows}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
