"""scripts/changed_verdicts.py: the rows of two audits whose shown verdict differs, each with the why worked out
from the two rows (the alpha ledger's level, a percentile no longer locked on a cliff, a block set aside); rows
whose verdict is the same are not listed, whatever else changed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "changed_verdicts.py"
sys.path.insert(0, str(SCRIPT.parent))

import changed_verdicts  # noqa: E402


def row(hypothesis: str, label: str, **kw: Any) -> dict[str, Any]:
    out = {"study": "s", "hypothesis": hypothesis, "verdict_label": label, "confidence": 0.95, "look": None,
           "ci_low": 1.0, "ci_high": 2.0, "alpha_ledger": None, "set_aside": None, "reasons": []}
    return out | kw


def test_only_changed_verdicts_are_listed_with_their_why(tmp_path: Path) -> None:
    before = [row("same", "confirmed"), row("ledger", "refuted"), row("cliff", "inconclusive (on a cliff)"),
              row("gone", "confirmed")]
    after = [row("same", "confirmed", confidence=0.975, ci_low=0.9),  # level changed, verdict did not: not listed
             row("ledger", "inconclusive", confidence=0.975, ci_low=0.5,
                 alpha_ledger={"case": "shared", "m": 2}),
             row("cliff", "confirmed", reasons=[{"why": "on a cliff", "text": "on a cliff: its p95 sits between"}]),
             row("new", "refuted")]
    got = changed_verdicts.changed(before, after)
    assert [(h, b, a) for _, h, b, a, _ in got] == [("ledger", "refuted", "inconclusive"),
                                                    ("cliff", "inconclusive (on a cliff)", "confirmed"),
                                                    ("new", "(absent)", "refuted"), ("gone", "confirmed", "(absent)")]
    whys = {h: w for _, h, _, _, w in got}
    assert whys["ledger"] == ("alpha ledger: 2 complete runs state this prediction and share 5%: read at 97.5% "
                              "(was 95%), interval 1–2 -> 0.5–2")
    assert whys["cliff"].startswith("a percentile on a cliff is no longer a lock: read as the launches' mean p95")
    aside = changed_verdicts.why(row("x", "confirmed"), row("x", "inconclusive", look=[10, 12], confidence=0.9989,
                                                            set_aside={"blocks": [11], "verdict": "refuted"}))
    assert aside == ("read at 99.89% at look 10 of 12 (was 95%), interval 1–2 -> 1–2; block 11 set aside after the "
                     "run: published without it; the stopping rule saw refuted with it")
    b, a = tmp_path / "b.json", tmp_path / "a.json"
    b.write_text(json.dumps(before))
    a.write_text(json.dumps(after))
    out = subprocess.run([sys.executable, str(SCRIPT), str(b), "--after", str(a)], check=True, capture_output=True,
                         text=True).stdout
    assert out.startswith("| study | hypothesis | before | after | why |") and "4 of 4 verdicts changed." in out
