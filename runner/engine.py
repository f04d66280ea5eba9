"""The engine adapter: one `vllm serve` process group, started, awaited, described, stopped.

The runner holds a VllmServer per server configuration; its ServerInfo (versions, KV
capacity, startup time) is recorded with every point served by it.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol, Self

from runner import metrics
from studyc.errors import EngineError
from studyc.settings import derive_python, is_python_executable, load_settings

HOST = "127.0.0.1"
# Always set: dev mode exposes /reset_prefix_cache and /server_info; offline and no telemetry.
BASE_ENV = {
    "VLLM_SERVER_DEV_MODE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}
_RESERVED_FLAGS = ("--host", "--port", "--api-key")
_PORT_TAKEN = "Address already in use"
LOG_TAIL_LINES = 30

# vLLM >= 0.6 logs e.g. "GPU KV cache size: 407,248 tokens" (CPU: "CPU KV cache size: ...").
KV_LOG_RE = re.compile(r"\b([A-Za-z][\w +]*?) KV cache size: ([\d,]+) tokens")
_VERSION_LOG_RE = re.compile(r"LLM engine \(v([^)\s]+)\)")


class Engine(Protocol):
    """What the runner needs from an engine; VllmServer is the one implementation."""

    @property
    def base_url(self) -> str: ...

    def start(self) -> None: ...

    def wait_ready(self) -> ServerInfo: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class ServerInfo:
    base_url: str
    api_key: str
    port: int
    pid: int
    startup_s: float  # Popen to the first 200 from /health
    log_path: Path
    vllm_version: str | None
    torch_version: str | None
    kv_capacity_tokens: int | None
    gpu_name: str | None
    driver_version: str | None
    # Where kv_capacity_tokens came from: "metrics:kv_cache_size_tokens", "log", "metrics:blocks".
    kv_capacity_source: str | None = None


def free_port(host: str = HOST) -> int:
    """A port the OS says is free now (another process could still take it before vLLM binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_call(method: str, url: str, api_key: str | None = None, timeout_s: float = 10.0) -> tuple[int, str]:
    """(status, body) of one request; status 0 and the error text when nothing answered."""
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            return int(resp.status), resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        try:
            body = exc.read().decode("utf-8", "replace")
        except OSError:
            body = ""
        return int(exc.code), body
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(getattr(exc, "reason", exc))


def read_log_tail(path: Path, lines: int = LOG_TAIL_LINES, start: int = 0) -> str:
    """The last `lines` lines of the log written since byte offset `start`."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            end = fh.tell()
            begin = max(start, end - 64 * 1024)
            fh.seek(begin)
            text = fh.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(log unreadable: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def parse_kv_capacity_log(text: str) -> int | None:
    """KV capacity in tokens from vLLM's log line, e.g. 'CPU KV cache size: 262,144 tokens'."""
    m = KV_LOG_RE.search(text)
    return int(m.group(2).replace(",", "")) if m else None


def kv_capacity_from_metrics(snap: metrics.Snapshot) -> tuple[int | None, str | None]:
    """Tokens of KV cache summed over engines, from `vllm:cache_config_info` labels.

    `kv_cache_size_tokens` (vLLM >= 0.2x, group-aware) when present, else
    num_gpu_blocks x block_size.
    """
    infos = snap.cache_config_infos()
    if not infos:
        return None, None
    try:
        if all(_int_label(i, "kv_cache_size_tokens") is not None for i in infos):
            tokens = sum(_int_label(i, "kv_cache_size_tokens") or 0 for i in infos)
            return tokens, "metrics:kv_cache_size_tokens"
        total = 0
        for i in infos:
            blocks, size = _int_label(i, "num_gpu_blocks"), _int_label(i, "block_size")
            if blocks is None or size is None:
                return None, None
            total += blocks * size
        return total, "metrics:blocks"
    except ValueError:
        return None, None


def _int_label(labels: Mapping[str, str], key: str) -> int | None:
    v = labels.get(key)
    if v is None or v in ("", "None"):
        return None
    return int(v)


def _group_alive(pgid: int) -> list[int]:
    """Pids (not zombies) still in process group `pgid`."""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: signal 0 says whether anything is left
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    alive = []
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        rest = stat[stat.rfind(")") + 2 :].split()
        if len(rest) >= 3 and rest[0] != "Z" and int(rest[2]) == pgid:
            alive.append(int(d.name))
    return alive


_LIVE: weakref.WeakSet[VllmServer] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    # Safety net for an interpreter that exits without leaving a `with` block.
    for server in list(_LIVE):
        server.stop()


class VllmServer:
    """`vllm serve` in its own process group, bound to 127.0.0.1 with a random API key.

    `argv_tail` is what follows the vLLM command (`["serve", MODEL, ...]`), without
    --host/--port/--api-key. `command` defaults to STUDYC_VLLM, split like a shell would.
    """

    def __init__(
        self,
        argv_tail: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log_path: Path,
        command: Sequence[str] | None = None,
        startup_timeout_s: float | None = None,
        port: int | None = None,
        stop_timeout_s: float = 15.0,
        gpu_index: int | None = None,
    ) -> None:
        reserved = [a for a in argv_tail if a.split("=", 1)[0] in _RESERVED_FLAGS]
        if reserved:
            raise EngineError(f"engine arguments must not set {', '.join(reserved)}: studyc sets them")
        settings = None
        if command is None or startup_timeout_s is None or gpu_index is None:
            settings = load_settings()
        self.command = list(command) if command is not None else settings.vllm_argv  # type: ignore[union-attr]
        if not self.command:
            raise EngineError("empty engine command (STUDYC_VLLM)")
        self.argv_tail = list(argv_tail)
        self.extra_env = dict(env or {})
        self.log_path = Path(log_path)
        self.startup_timeout_s = (
            startup_timeout_s if startup_timeout_s is not None else settings.startup_timeout_s  # type: ignore[union-attr]
        )
        self.stop_timeout_s = stop_timeout_s
        self.gpu_index = gpu_index if gpu_index is not None else settings.gpu_index  # type: ignore[union-attr]
        self._auto_port = port is None
        self.port = port if port is not None else free_port()
        self.api_key = secrets.token_hex(20)  # hex: never starts with "-" (argparse would take it for a flag)
        self.info: ServerInfo | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._log_start = 0
        self._t0 = 0.0
        self._stopped = False

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def poll(self) -> int | None:
        """The engine's exit code once it has exited (a crash mid-run), else None."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def argv(self) -> list[str]:
        return [
            *self.command,
            *self.argv_tail,
            "--host", HOST,
            "--port", str(self.port),
            "--api-key", self.api_key,
        ]  # fmt: skip

    def _printable_argv(self) -> str:
        return shlex.join("REDACTED" if a == self.api_key else a for a in self.argv)

    def start(self) -> None:
        if self._proc is not None:
            raise EngineError("this server was already started; make a new VllmServer")
        self._t0 = time.monotonic()
        self._spawn()

    def _spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Append: an earlier start's log is kept. Held open for the server's lifetime.
        self._log = open(self.log_path, "ab")
        self._log_start = self._log.tell()
        self._log.write(f"# studyc: {self._printable_argv()}\n".encode())
        self._log.flush()
        env = {**os.environ, **BASE_ENV, **self.extra_env}
        try:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            self._log.close()
            self._log = None
            raise EngineError(
                f"cannot run the engine command {shlex.join(self.command)!r}: {exc} "
                "(set STUDYC_VLLM to the command that starts vLLM, e.g. .venv-vllm/bin/vllm)"
            ) from exc
        _LIVE.add(self)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return read_log_tail(self.log_path, lines, self._log_start)

    def wait_ready(self) -> ServerInfo:
        """Poll /health until 200; EngineError (with the log's tail) on crash or timeout."""
        if self._proc is None:
            self.start()
        assert self._proc is not None
        deadline = self._t0 + self.startup_timeout_s
        port_retries = 2
        try:
            while True:
                rc = self._proc.poll()
                if rc is not None and self._auto_port and port_retries and _PORT_TAKEN in self.log_tail():
                    # Another process took the port between free_port() and vLLM's bind: new port.
                    port_retries -= 1
                    self._end_group()
                    self.port = free_port()
                    self._spawn()
                    continue
                if rc is not None:
                    self.stop()
                    raise EngineError(
                        f"vLLM exited with code {rc} during startup ({self._printable_argv()}); "
                        f"last lines of {self.log_path}:\n{self.log_tail()}"
                    )
                status, _ = http_call("GET", self.base_url + "/health", self.api_key, timeout_s=5.0)
                # /health needs no key: check ours works, so a stranger on the port is not taken for us.
                if status == 200 and http_call("GET", self.base_url + "/v1/models", self.api_key)[0] == 200:
                    break
                if time.monotonic() >= deadline:
                    self.stop()
                    raise EngineError(
                        f"vLLM did not answer /health within {self.startup_timeout_s:.0f} s; "
                        f"last lines of {self.log_path}:\n{self.log_tail()}"
                    )
                time.sleep(0.25)
            startup_s = time.monotonic() - self._t0
            self.info = self._describe(startup_s)
        except BaseException:
            # Ctrl-C or anything else while waiting: never leave a half-started server behind.
            self.stop()
            raise
        return self.info

    def _describe(self, startup_s: float) -> ServerInfo:
        assert self._proc is not None
        log_text = read_log_tail(self.log_path, 100_000, self._log_start)
        vllm_version = None
        status, body = http_call("GET", self.base_url + "/version", self.api_key)
        if status == 200:
            vllm_version = _json_field(body, "version")
        if vllm_version is None:
            m = _VERSION_LOG_RE.search(log_text)
            vllm_version = m.group(1) if m else None

        # /server_info (dev mode) carries torch's collect_env: versions, GPU models, driver.
        system_env: dict[str, Any] = {}
        # The first call runs collect_env (pip, nvidia-smi, lscpu) on a thread: allow it time.
        status, body = http_call("GET", self.base_url + "/server_info", self.api_key, timeout_s=60.0)
        if status == 200:
            try:
                doc = json.loads(body)
                if isinstance(doc, dict) and isinstance(doc.get("system_env"), dict):
                    system_env = doc["system_env"]
            except ValueError:
                pass
        torch_version = _clean(system_env.get("torch_version")) or self._torch_version_from_python()

        from runner import nvml  # lazy: NVML is only loaded where a GPU is asked about

        gpu = nvml.gpu_info(self.gpu_index)
        gpu_name = gpu["name"] if gpu else _first_gpu_model(_clean(system_env.get("nvidia_gpu_models")))
        driver = gpu["driver_version"] if gpu else _clean(system_env.get("nvidia_driver_version"))

        kv_tokens, kv_source = None, None
        try:
            kv_tokens, kv_source = kv_capacity_from_metrics(metrics.scrape(self.base_url, self.api_key))
        except metrics.MetricsError:
            pass
        if kv_tokens is None:
            kv_tokens = parse_kv_capacity_log(log_text)
            kv_source = "log" if kv_tokens is not None else None

        return ServerInfo(
            base_url=self.base_url,
            api_key=self.api_key,
            port=self.port,
            pid=self._proc.pid,
            startup_s=startup_s,
            log_path=self.log_path,
            vllm_version=vllm_version,
            torch_version=torch_version,
            kv_capacity_tokens=kv_tokens,
            gpu_name=gpu_name,
            driver_version=driver,
            kv_capacity_source=kv_source,
        )

    def _torch_version_from_python(self) -> str | None:
        """Fallback when /server_info is missing: ask the engine's python (~1 s to import torch)."""
        words = self.command
        python = words[0] if is_python_executable(words[0]) else derive_python(shlex.join(words))
        try:
            out = subprocess.run(
                [python, "-c", "import torch; print(torch.__version__)"],
                capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return None
        return (out.stdout.strip() or None) if out.returncode == 0 else None

    def stop(self) -> None:
        """SIGTERM the group, wait up to stop_timeout_s, then SIGKILL it. Idempotent."""
        if self._stopped or self._proc is None:
            self._stopped = True
            return
        self._stopped = True
        try:
            self._end_group()
        finally:
            _LIVE.discard(self)

    def _end_group(self) -> None:
        """End the current process group, reap the leader, close our end of the log."""
        proc = self._proc
        assert proc is not None
        pgid = proc.pid  # start_new_session: pgid == pid
        try:
            self._signal_group(pgid, signal.SIGTERM)
            if not self._wait_group(proc, pgid, self.stop_timeout_s):
                self._signal_group(pgid, signal.SIGKILL)
                self._wait_group(proc, pgid, 10.0)
        finally:
            if proc.poll() is None:  # last resort if the group signal missed it
                proc.kill()
                proc.wait()
            if self._log is not None:
                self._log.close()
                self._log = None

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass

    @staticmethod
    def _wait_group(proc: subprocess.Popen[bytes], pgid: int, timeout_s: float) -> bool:
        """True once the leader is reaped and no member of the group is left."""
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None and not _group_alive(pgid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def __enter__(self) -> Self:
        self.start()
        self.wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _json_field(body: str, key: str) -> str | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    v = doc.get(key) if isinstance(doc, dict) else None
    return str(v) if v else None


def _clean(v: object) -> str | None:
    if v is None:
        return None
    s = str(v).strip()
    return s if s and s not in ("None", "N/A", "Could not collect") else None


def _first_gpu_model(models: str | None) -> str | None:
    """'GPU 0: NVIDIA H200\\nGPU 1: ...' (or a bare name) -> 'NVIDIA H200'."""
    if not models:
        return None
    first = models.splitlines()[0].strip()
    m = re.match(r"GPU \d+: (.+?)(?: \(UUID: .*\))?$", first)
    return m.group(1) if m else first
