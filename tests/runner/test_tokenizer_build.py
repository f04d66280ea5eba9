"""runner.server.tokenizer's build: each file is renamed into place whole, so processes that build the same
folder at once (two pytest-xdist workers) never let a reader see half a file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from runner.server.tokenizer import build, ensure_tokenizer
from tests.conftest import TINY_MODEL

NAMES = ("tokenizer.json", "tokenizer_config.json")


def test_a_build_renames_whole_files_into_place_and_leaves_no_partial_one(tmp_path: Path) -> None:
    for name in ("config.json", "generation_config.json"):
        shutil.copyfile(TINY_MODEL / name, tmp_path / name)
    for name in NAMES:  # a file written in place keeps its inode; one renamed into place has a new one
        (tmp_path / name).write_text("{half")
    before = {name: (tmp_path / name).stat().st_ino for name in NAMES}
    keep = [(tmp_path / name).open() for name in NAMES]  # held open: an inode is not reused while in use
    build(tmp_path)
    for f in keep:
        f.close()
    assert all((tmp_path / name).stat().st_ino != before[name] for name in NAMES)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["config.json", "generation_config.json", *NAMES])
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["tokenizer_class"]
    assert ensure_tokenizer(tmp_path) is False  # both there: not built again
