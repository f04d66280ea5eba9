"""Machine settings: where vLLM is, which GPU, how long a server may take to start.

Read once from `STUDYC_*` environment variables; study files never carry these.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from base.errors import StudycError

# `python`, `python3`, `python3.12`, `/x/bin/python3.11`: an interpreter, not a launcher script.
_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?$")


def is_python_executable(word: str) -> bool:
    return bool(_PYTHON_NAME.match(Path(word).name))


def derive_python(vllm_command: str) -> str:
    """The python that runs vLLM, for probes that need the engine's torch (calibration).

    `python3 -m vllm...` names it; otherwise the python beside the `vllm` script found
    on PATH (a venv's bin/), else the script's own `#!` interpreter, else "python3".
    """
    words = shlex.split(vllm_command)
    if not words:
        return "python3"
    if is_python_executable(words[0]):
        return words[0]
    found = shutil.which(words[0])
    if found is None:
        return "python3"
    # Not resolving symlinks: a venv's bin/vllm sits beside the venv's bin/python.
    bindir = Path(found).parent
    for name in ("python3", "python"):
        candidate = bindir / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    try:
        with open(found, "rb") as fh:
            first = fh.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return "python3"
    if first.startswith("#!"):
        shebang = shlex.split(first[2:])
        # `#!/usr/bin/env python3` or `#!/opt/x/bin/python3.12`
        if shebang and Path(shebang[0]).name == "env" and len(shebang) > 1:
            shebang = shebang[1:]
        if shebang and is_python_executable(shebang[0]):
            return shebang[0]
    return "python3"


class Settings(BaseSettings):
    """Where and how this machine runs engines. Every field reads `STUDYC_<NAME>`."""

    model_config = SettingsConfigDict(env_prefix="STUDYC_", frozen=True, extra="ignore")

    vllm: str = Field(
        default="vllm",
        description="Command that starts vLLM; may be several words, e.g. "
        "'python3 -m vllm.entrypoints.cli.main'. `serve ...` is appended.",
    )
    python: str = Field(
        default="",
        description="Python of the engine's environment, for calibration probes. "
        "Default: derived from `vllm`.",
    )
    host: Literal["127.0.0.1"] = Field(
        default="127.0.0.1", description="Engines bind here only; nothing listens beyond loopback."
    )
    gpu_index: int = Field(default=0, ge=0, description="NVML index of the GPU to sample and calibrate.")
    runs_dir: str | None = Field(
        default=None, description="Folder for server logs of each run; default: `runs/` beside the database."
    )
    cache_dir: str | None = Field(
        default=None, description="Folder (mode 0700) for vLLM's compile cache, shared by every run, the "
        "servers' API key and the step-time model's fits (fits/); default: ~/.cache/studyc.",
    )
    fit_cache: bool = Field(
        default=True, description="Keep the step-time model's fits in `fits/` of the cache folder, each "
        "named by the digest of its points and of the model's code (0: fit every time).",
    )
    client_cpus: str = Field(
        default="auto",
        description="CPUs for the load generator's workers: 'auto' (every CPU but 0 when no GPU is "
        "present, where a CPU vLLM pins its model thread to core 0), 'all', or a list like '1,2-3'.",
    )
    startup_timeout_s: float = Field(
        default=900.0, gt=0, description="Seconds a server may take to answer /health."
    )

    @model_validator(mode="before")
    @classmethod
    def _derive_python(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("python"):
            data = {**data, "python": derive_python(str(data.get("vllm") or "vllm"))}
        return data

    @property
    def cache_path(self) -> Path:
        return Path(self.cache_dir).expanduser() if self.cache_dir else Path.home() / ".cache" / "studyc"

    @property
    def vllm_argv(self) -> list[str]:
        return shlex.split(self.vllm)

    @property
    def python_argv(self) -> list[str]:
        return shlex.split(self.python)


def load_settings() -> Settings:
    """Settings from the environment now (not cached: tests and the CLI may change it)."""
    try:
        return Settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"STUDYC_{'.'.join(str(p) for p in e['loc']).upper()}: {e['msg']}" for e in exc.errors()
        )
        raise StudycError(f"bad machine settings: {problems}") from None


def parse_cpus(spec: str, *, gpu_present: bool) -> tuple[int, ...] | None:
    """The CPU set for load-generator workers; None means no pinning."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if spec == "all" or not allowed:
        return None
    if spec == "auto":
        rest = [c for c in allowed if c != 0]
        return None if gpu_present or not rest else tuple(rest)
    cpus: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            cpus += list(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise StudycError(f"STUDYC_CLIENT_CPUS: cannot read {spec!r} (use 'auto', 'all' or '1,2-3')") from None
    return tuple(c for c in cpus if c in allowed) or None
