"""The fit cache: a fit's file is named by its observations, its key and the model's code, so any change
to one of them misses; a file unreadable, garbled or out of range is a miss; a folder that cannot be
written loses the cache, never the fit."""

from __future__ import annotations

import ast
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from compiler.modelmath import ModelShape
from compiler.stepcost import Card, Coefficients, EngineShape
from compiler.stepfit import Observation
from compiler.stepreplay import StepLoad
from report.ledger import fit_cache
from report.ledger.fit_cache import FitCache, code_digest, fit_digest

REPO = Path(__file__).resolve().parents[2]
COEF = Coefficients(step_s=0.004, seq_s=1.5e-5, mem=1.1, flop=1.3, request_s=2e-4, admit_s=1e-3, overlap=2.0)
SHAPE = ModelShape(name="m", family="qwen3", vocab_size=1000, hidden_size=64, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16, intermediate_size=128, tie_word_embeddings=True, dtype="bf16")
OBS = Observation(SHAPE, StepLoad(concurrency=4, requests=16, input_len=128, output_len=32), EngineShape(),
                  Card(4.2e12, 6.6e14), tpot_s=0.005, ttft_s=0.03, window_s=2.0, burst_s=0.1)


def test_a_fit_and_a_failure_come_back_as_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no such folder"))  # the temp file is beside
    cache = FitCache(tmp_path / "fits")
    assert cache.get("a") is None  # nothing kept yet
    cache.put("a", COEF)
    cache.put("b", "the fit of x failed: no points")
    assert cache.get("a") == COEF and cache.get("b") == "the fit of x failed: no points"
    assert sorted(p.name for p in (tmp_path / "fits").iterdir()) == ["a.json", "b.json"]  # no temp left
    assert (tmp_path / "fits").stat().st_mode & 0o777 == 0o700


def test_the_folder_is_made_with_its_parents(tmp_path):
    FitCache(tmp_path / "cache" / "studyc" / "fits").put("a", COEF)
    assert FitCache(tmp_path / "cache" / "studyc" / "fits").get("a") == COEF


def test_a_write_that_fails_leaves_no_temp_file(tmp_path):
    (tmp_path / "a.json").mkdir()  # the name is taken by a folder: the rename fails
    FitCache(tmp_path).put("a", COEF)
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"] and FitCache(tmp_path).get("a") is None


@pytest.mark.parametrize("text", [
    "not json",
    '{"coefficients": {"step_s": 1}}',  # a coefficient missing
    '{"coefficients": {"step_s": -1, "seq_s": 0, "mem": 1, "flop": 1, "request_s": 0, "admit_s": 0}}',
    '{"something": 1}',
    "[1, 2]",
])
def test_a_garbled_file_is_a_miss(tmp_path, text):
    (tmp_path / "a.json").write_text(text)
    assert FitCache(tmp_path).get("a") is None


def test_no_folder_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cache = FitCache(None)
    cache.put("a", COEF)
    assert cache.get("a") is None and list(tmp_path.iterdir()) == []


def test_a_folder_that_cannot_be_written_loses_the_cache_not_the_fit(tmp_path):
    blocked = tmp_path / "fits"
    blocked.write_text("a file where the folder would be")
    FitCache(blocked).put("a", COEF)  # no error
    assert FitCache(blocked).get("a") is None and blocked.read_text().startswith("a file")


def test_the_name_changes_with_each_observation_the_key_and_the_code(monkeypatch):
    base = fit_digest("key", [OBS, OBS])
    assert base == fit_digest("key", [OBS, replace(OBS)])  # equal inputs, equal name
    assert len({base, fit_digest("other", [OBS, OBS]), fit_digest("key", [OBS]),
                fit_digest("key", [OBS, replace(OBS, tpot_s=0.0050001)]),
                fit_digest("key", [OBS, replace(OBS, load=replace(OBS.load, cached_tokens=(1,) * 16))]),
                fit_digest("key", [OBS, replace(OBS, card=Card(4.2e12, 6.7e14))])}) == 6
    monkeypatch.setattr(fit_cache, "code_digest", lambda: "another model")
    assert fit_digest("key", [OBS, OBS]) != base


def _compiler_imports(module: str) -> set[str]:
    tree = ast.parse((REPO / (module.replace(".", "/") + ".py")).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("compiler"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("compiler"))
    return found


def test_the_code_digest_covers_every_module_a_fit_runs():
    seen, frontier = set(), ["compiler.stepfit"]
    while frontier:
        name = frontier.pop()
        if name not in seen:
            seen.add(name)
            frontier.extend(_compiler_imports(name))
    assert {m.__name__ for m in fit_cache.FIT_CODE} == seen
    assert len(code_digest()) == 64 and code_digest() == code_digest()


def test_a_kept_file_is_plain_json_of_the_coefficients(tmp_path):
    FitCache(tmp_path).put("a", COEF)
    assert json.loads((tmp_path / "a.json").read_text())["coefficients"]["overlap"] == 2.0
