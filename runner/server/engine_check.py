"""Whether the engine command runs, told before any measuring: `COMMAND --version`, remembered per what the
command resolves to (`check_engine`)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from base.errors import EngineError
from runner.server.engine import _SET_STUDYC_VLLM, BASE_ENV
from runner.server.introspect import startup_failure

ENGINE_CHECK_TIMEOUT_S = 180.0  # `vllm --version` imports torch: ~15 s on two busy cores


@dataclass(frozen=True)
class EngineCheck:
    """The engine command, resolved, and the version it reports."""

    command: tuple[str, ...]
    executable: str  # command[0] as found on PATH
    version: str


def check_engine(command: Sequence[str], timeout_s: float = ENGINE_CHECK_TIMEOUT_S,
                 cache_dir: Path | None = None) -> EngineCheck:
    """Run `COMMAND --version` before any measuring: the version it prints, or an EngineError that
    says what is wrong and to set STUDYC_VLLM. With `cache_dir`, a command that passed before is not run
    again while what it resolves to is unchanged (`vllm --version` imports torch: ~10 s on two cores, and
    26-33 s a run on the GPU host): its words, its executable's file, PYTHONPATH, and for `python -m PKG...`
    the package's folder and install record where the interpreter would find them (an interpreter's file
    does not change when the package it runs does). A failure is never remembered."""
    words = tuple(command)
    if not words:
        raise EngineError(f"the engine command is empty: {_SET_STUDYC_VLLM}")
    executable = shutil.which(words[0])
    if executable is None:
        raise EngineError(f"engine command not found: {words[0]!r} ({_SET_STUDYC_VLLM})")
    passed = _PassedChecks(cache_dir, executable, words) if cache_dir is not None else None
    version = passed.version() if passed is not None else None
    if version is not None:
        return EngineCheck(command=words, executable=executable, version=version)
    shown = shlex.join([*words, "--version"])
    try:
        done = subprocess.run(
            [*words, "--version"], capture_output=True, text=True, timeout=timeout_s,
            stdin=subprocess.DEVNULL, env={**os.environ, **BASE_ENV}, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise EngineError(f"`{shown}` did not finish within {timeout_s:.0f} s ({_SET_STUDYC_VLLM})") from None
    except OSError as exc:
        raise EngineError(f"cannot run the engine command {words[0]!r}: {exc.strerror} ({_SET_STUDYC_VLLM})") from None
    if done.returncode != 0:
        output = done.stderr + "\n" + done.stdout
        lines = [line.strip() for line in output.splitlines() if line.strip()]
        cause = startup_failure(output) or (lines[-1] if lines else "no output")
        raise EngineError(
            f"the engine command fails: `{shown}` exited with code {done.returncode}: {cause} ({_SET_STUDYC_VLLM})"
        )
    # vLLM prints the bare version on stdout (warnings go to stderr).
    printed = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    if not printed:
        raise EngineError(f"`{shown}` printed no version: is it vLLM? ({_SET_STUDYC_VLLM})")
    if passed is not None:
        passed.remember(printed[-1])
    return EngineCheck(command=words, executable=executable, version=printed[-1])


class _PassedChecks:
    """The engine commands that passed `check_engine`, in `cache_dir/engine-checks.json`, each under what it
    resolves to (`_resolved`): reinstalling vLLM rewrites its `vllm` script or its package folder, so the
    next run checks again."""

    def __init__(self, cache_dir: Path, executable: str, words: Sequence[str]) -> None:
        self.path = cache_dir / "engine-checks.json"
        self.key = json.dumps(_resolved(executable, words))

    def _read(self) -> dict[str, str]:
        try:
            found = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def version(self) -> str | None:
        version = self._read().get(self.key)
        return version if isinstance(version, str) and version else None

    def remember(self, version: str) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**self._read(), self.key: version}, indent=1) + "\n")
        tmp.replace(self.path)


def _stat(path: str | Path) -> list[object]:
    try:
        st = os.stat(path)
    except OSError:
        return [str(path), None]
    return [os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns]


def _resolved(executable: str, words: Sequence[str]) -> list[object]:
    """What an engine command resolves to: its words, its executable's real file (inode, size, mtime) and
    PYTHONPATH; with `-m PKG.mod`, PKG's folder and its `*.dist-info` records in each folder the
    interpreter searches first (PYTHONPATH, then its environment's site-packages)."""
    out: list[object] = [list(words), _stat(executable), os.environ.get("PYTHONPATH", "")]
    if "-m" in words[:-1]:
        top = words[list(words).index("-m") + 1].split(".")[0]
        prefix = Path(executable).parent.parent  # a venv's bin/python -> the venv (not the resolved link)
        roots = [Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        roots += sorted(prefix.glob("lib/python*/site-packages"))
        for root in roots:
            if (root / top).exists():
                out += [_stat(root / top), _stat(root / top / "__init__.py"),
                        sorted(p.name for p in root.glob(f"{top}-*.dist-info"))]
                break
    return out
