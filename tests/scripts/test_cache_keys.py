"""The compile-cache keys copied back from a GPU host carry no secret: not the API key's value, not an env
entry named like a credential, and a file where the key turns up outside env is left out whole."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu" / "cache_keys.py"
SECRET = "sk-test-3f9a1c"


def _factors(root: Path, folder: str, factors: dict) -> None:
    where = root / "compile-cache" / "torch_compile_cache" / folder / "rank_0_0" / "backbone"
    where.mkdir(parents=True)
    (where / "cache_key_factors.json").write_text(json.dumps(factors))


def _run(cache: Path, out: Path) -> dict[str, dict]:
    subprocess.run([sys.executable, str(SCRIPT), str(cache), str(out)], check=True)
    return {f.name: json.loads(f.read_text()) for f in sorted((out / "cache-keys").glob("*.json"))}


def test_factors_come_back_without_the_key(tmp_path: Path) -> None:
    cache, out = tmp_path / "cache", tmp_path / "out"
    cache.mkdir()
    (cache / "api-key").write_text(SECRET + "\n")
    _factors(cache, "cc51145535", {"env": {"VLLM_API_KEY": SECRET, "HF_TOKEN": "hf_x", "OTHER": f"x{SECRET}",
                                           "VLLM_USE_AOT_COMPILE": "1"},
                                   "config_hash": "a1", "code_hash": "c1", "compiler_hash": "k1"})
    _factors(cache, "7bb871f6de", {"env": {"VLLM_USE_AOT_COMPILE": "1"}, "config_hash": "a1", "code_hash": "c2",
                                   "compiler_hash": "k1"})
    found = _run(cache, out)
    assert set(found) == {"cc51145535-rank_0_0-backbone.json", "7bb871f6de-rank_0_0-backbone.json"}
    first = found["cc51145535-rank_0_0-backbone.json"]
    assert first["env"] == {"VLLM_USE_AOT_COMPILE": "1"} and first["code_hash"] == "c1"
    assert found["7bb871f6de-rank_0_0-backbone.json"]["code_hash"] == "c2"
    assert SECRET not in (out / "cache-keys" / "cc51145535-rank_0_0-backbone.json").read_text()


def test_a_key_outside_env_leaves_the_file_out(tmp_path: Path) -> None:
    cache, out = tmp_path / "cache", tmp_path / "out"
    cache.mkdir()
    (cache / "api-key").write_text(SECRET)
    _factors(cache, "abc", {"env": {}, "config_hash": SECRET})
    (only,) = _run(cache, out).values()
    assert only == {"redacted": "the API key appeared outside env; file left out"}


def test_no_cache_no_folder(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "none"), str(tmp_path / "out")], check=True)
    assert not (tmp_path / "out" / "cache-keys").exists()
