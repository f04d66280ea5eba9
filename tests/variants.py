"""A study file copied with edits, for tests that need a variant of a repository study: its tiny model named
by absolute path, so the copy plans from any folder."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "studies/quickstart.toml"
# The quickstart's design before it decided: one launch per arm, three repeats on it (v1 ids, no interval
# between launches). Tests of what one launch does start from it: `study_variant(tmp, *ONE_LAUNCH, ...)`.
ONE_LAUNCH = (("launches = 3 ", "launches = 1 "), ("repeats = 1 ", "repeats = 3 "))


def study_variant(tmp_path: Path, *edits: tuple[str, str], source: Path = QUICKSTART,
                  name: str = "variant.toml") -> Path:
    """`source` with each (old, new) made once, in order (old must be there), written to tmp_path/name."""
    text = re.sub(r'path = "[./]*models/tiny-qwen3"', f'path = "{ROOT / "models/tiny-qwen3"}"',
                  source.read_text())
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    path = tmp_path / name
    path.write_text(text)
    return path
