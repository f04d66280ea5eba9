"""Every verdict that changed between two audits of the same results: study, hypothesis, before, after, why.

    .venv/bin/python scripts/changed_verdicts.py BEFORE.json [--after AFTER.json] [--db results/h200]

BEFORE.json is `studyc audit studies/*.toml --db ... --format json` as an earlier studyc wrote it; the after
side is AFTER.json, or else this checkout's audit of studies/*.toml against --db (read only). Prints a
markdown table; the why is worked out from the two rows (the level the interval was read at and the alpha
ledger, a block set aside after the run, a percentile on a cliff), never typed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
Row = dict[str, Any]


def _level(row: Row) -> str:
    look = row.get("look")
    return f"{100 * row['confidence']:.4g}%" + (f" at look {look[0]} of {look[1]}" if look else "")


def _span(row: Row) -> str:
    if row.get("ci_low") is None:
        return "no interval"
    return f"{row['ci_low']:.4g}–{row['ci_high']:.4g}"


def why(before: Row, after: Row) -> str:
    """What differs between the two rows that explains the change, in words."""
    out = []
    if "on a cliff" in before.get("verdict_label", ""):
        cliff = next((r["text"].split(":")[1].split(" sits")[0].strip() for r in after.get("reasons", [])
                      if r.get("why") == "on a cliff"), "percentile")
        out.append(f"a percentile on a cliff is no longer a lock: read as the launches' mean {cliff.removeprefix('its ')} "
                   f"with its between-launch interval ({_span(after)})")
    ledger = after.get("alpha_ledger") or {}
    if before.get("confidence") != after.get("confidence") and ledger.get("case") == "shared":
        out.append(f"alpha ledger: {ledger['m']} complete runs state this prediction and share 5%: read at "
                   f"{_level(after)} (was {_level(before)}), interval {_span(before)} -> {_span(after)}")
    elif before.get("confidence") != after.get("confidence") or before.get("look") != after.get("look"):
        out.append(f"read at {_level(after)} (was {_level(before)}), interval {_span(before)} -> {_span(after)}")
    aside = after.get("set_aside")
    if aside:
        out.append(f"block {', '.join(map(str, aside['blocks']))} set aside after the run: published without it; "
                   f"the stopping rule saw {aside['verdict']} with it")
    if not out:
        out.append(f"interval {_span(before)} -> {_span(after)}, {_level(before)} -> {_level(after)}")
    return "; ".join(out)


def changed(before: Sequence[Row], after: Sequence[Row]) -> list[tuple[str, str, str, str, str]]:
    """(study, hypothesis, before, after, why) for each row whose shown verdict differs, in the after order;
    a hypothesis on one side only is listed as "(absent)" on the other."""
    old = {(r["study"], r["hypothesis"]): r for r in before}
    new = {(r["study"], r["hypothesis"]): r for r in after}
    rows = []
    for key, a in new.items():
        b = old.get(key)
        if b is None:
            rows.append((*key, "(absent)", a["verdict_label"], "a hypothesis the earlier audit did not have"))
        elif b["verdict_label"] != a["verdict_label"]:
            rows.append((*key, b["verdict_label"], a["verdict_label"], why(b, a)))
    rows += [(*key, b["verdict_label"], "(absent)", "no longer in the audit") for key, b in old.items()
             if key not in new]
    return rows


def table(rows: Sequence[tuple[str, ...]]) -> str:
    lines = ["| study | hypothesis | before | after | why |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def audit_now(db: Path) -> list[Row]:
    sys.path.insert(0, str(REPO))
    from compiler.load import load_study
    from report.audit import audit_studies, json_rows

    studies = [load_study(p) for p in sorted((REPO / "studies").glob("*.toml"))]
    return json_rows(audit_studies(studies, [db]))


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("--after", type=Path)
    parser.add_argument("--db", type=Path, default=REPO / "results/h200")
    args = parser.parse_args(argv)
    before = json.loads(args.before.read_text())
    after = json.loads(args.after.read_text()) if args.after else audit_now(args.db)
    rows = changed(before, after)
    print(table(rows))
    print(f"\n{len(rows)} of {len(after)} verdicts changed.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
