"""Machine settings: read from STUDYC_* once, bad values named, the engine's python found."""

from __future__ import annotations

from pathlib import Path

import pytest

from base.errors import StudycError
from base.settings import derive_python, load_settings, parse_cpus


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STUDYC_VLLM", "python3 -m vllm.entrypoints.cli.main")
    monkeypatch.setenv("STUDYC_STARTUP_TIMEOUT_S", "60")
    monkeypatch.setenv("STUDYC_RUNS_DIR", "/tmp/logs")
    settings = load_settings()
    assert settings.vllm_argv == ["python3", "-m", "vllm.entrypoints.cli.main"]
    assert settings.python_argv == ["python3"]
    assert settings.startup_timeout_s == 60.0 and settings.runs_dir == "/tmp/logs"


def test_bad_setting_is_one_line_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STUDYC_STARTUP_TIMEOUT_S", "-1")
    with pytest.raises(StudycError) as caught:
        load_settings()
    assert caught.value.message.startswith("bad machine settings: STUDYC_STARTUP_TIMEOUT_S:")
    assert "\n" not in caught.value.message


def test_python_beside_a_venv_script(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("vllm", "python3"):
        (bindir / name).write_text("#!/bin/sh\n")
        (bindir / name).chmod(0o755)
    assert derive_python(str(bindir / "vllm")) == str(bindir / "python3")
    assert derive_python("python3.12 -m vllm") == "python3.12"
    assert derive_python("/no/such/vllm") == "python3"


def test_client_cpus() -> None:
    assert parse_cpus("all", gpu_present=False) is None
    assert parse_cpus("auto", gpu_present=True) is None
    with pytest.raises(StudycError, match="STUDYC_CLIENT_CPUS"):
        parse_cpus("one,two", gpu_present=False)
