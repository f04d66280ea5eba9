"""Merging another results database into this one: the part of `runner.store.store.Store` that copies runs
(`studyc merge`). SQL through the store's own connection; nothing here opens a database.
"""

from __future__ import annotations

import shutil
import tempfile
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from base.errors import StoreError
from runner.store.tables import TABLES


class Merging:
    """`Store.merge_from`; the store gives the connection, its transactions and what it knows of files."""

    con: Any
    schema_version: str

    def transaction(self) -> AbstractContextManager[None]:
        raise NotImplementedError

    def _columns(self, table: str, schema: str = "main", catalog: str | None = None) -> set[str]:
        raise NotImplementedError

    @staticmethod
    def _file_version(path: Path) -> str | None:
        raise NotImplementedError

    @classmethod
    def _migrated(cls, path: Path) -> None:
        """Open the database at `path` for writing once, which migrates it in place."""
        raise NotImplementedError

    def merge_from(self, other: Path) -> dict[str, int]:
        """Copy every run of another results database into this one. A run already present is replaced
        when the source holds every point of it and more (the same run continued with `--resume`
        elsewhere: `runs_continued`), kept otherwise (`runs_kept`). An older schema is migrated on a
        temporary copy first; the source file is never written."""
        version = self._file_version(Path(other))
        if version == self.schema_version:
            return self._merge_attached(Path(other))
        if version is None:
            raise StoreError(f"{other}: not a studyc results database (no schema version)")
        with tempfile.TemporaryDirectory(prefix="studyc-merge-") as tmp:
            copy = Path(tmp) / "source.duckdb"
            shutil.copyfile(other, copy)
            self._migrated(copy)  # or refused: a version it does not know
            return self._merge_attached(copy)

    def _merge_attached(self, source: Path) -> dict[str, int]:
        alias = "src"
        path = str(source).replace("'", "''")
        self.con.execute(f"ATTACH '{path}' AS {alias} (READ_ONLY)")
        try:
            new = [r[0] for r in self.con.execute(
                f"SELECT run_id FROM {alias}.runs WHERE run_id NOT IN (SELECT run_id FROM runs)"
            ).fetchall()]
            both = [r[0] for r in self.con.execute(
                f"SELECT run_id FROM {alias}.runs WHERE run_id IN (SELECT run_id FROM runs)"
            ).fetchall()]
            continued = [run_id for run_id in both if self._continues(alias, run_id)]
            copied: dict[str, int] = {}
            with self.transaction():
                if continued:
                    marks = ", ".join("?" for _ in continued)
                    for table in TABLES:
                        self.con.execute(f"DELETE FROM {table.name} WHERE run_id IN ({marks})", continued)
                taken = new + continued
                for table in TABLES:
                    if not taken:
                        break
                    marks = ", ".join("?" for _ in taken)
                    have = self._columns(table.name, catalog=alias)  # a source of the same version may lack
                    names = ", ".join(c for c in table.column_names if c in have)  # a column added since
                    self.con.execute(
                        f"INSERT INTO {table.name} ({names}) SELECT {names} FROM {alias}.{table.name} "
                        f"WHERE run_id IN ({marks})", taken,
                    )
                    row = self.con.execute(
                        f"SELECT count(*) FROM {alias}.{table.name} WHERE run_id IN ({marks})", taken
                    ).fetchone()
                    copied[table.name] = int(row[0]) if row else 0
            return copied | {"runs_new": len(new), "runs_continued": len(continued),
                             "runs_kept": len(both) - len(continued)}
        finally:
            self.con.execute(f"DETACH {alias}")

    def _continues(self, alias: str, run_id: str) -> bool:
        """Whether the attached database's copy of `run_id` holds every point this one has, and more."""
        def points(catalog: str) -> set[str]:
            rows = self.con.execute(f"SELECT point_id FROM {catalog}.points WHERE run_id = ?", [run_id])
            return {r[0] for r in rows.fetchall()}
        here, there = points("main"), points(alias)
        return here < there
