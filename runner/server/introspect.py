"""What a vLLM server is, read from its HTTP endpoints and its log: versions, GPU, KV capacity, and,
when it failed to start, the line of its log that says why.

The lifecycle (`runner.server.engine`) owns the process; this module only asks and reads.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from base.settings import derive_python, is_python_executable
from runner.measure import nvml, prometheus
from runner.server.http import http_call

__all__ = [
    "ServerInfo",
    "describe",
    "kv_capacity_from_metrics",
    "parse_kv_capacity_log",
    "read_log_tail",
    "startup_failure",
]

LOG_TAIL_LINES = 30

# vLLM >= 0.6 logs e.g. "GPU KV cache size: 407,248 tokens" (CPU: "CPU KV cache size: ...").
KV_LOG_RE = re.compile(r"\b([A-Za-z][\w +]*?) KV cache size: ([\d,]+) tokens")
_VERSION_LOG_RE = re.compile(r"LLM engine \(v([^)\s]+)\)")
# vLLM's line prefixes: "(EngineCore_DP0 pid=12) " then "ERROR 12-01 01:20:11 [core.py:1510] ".
_LOG_PREFIX_RE = re.compile(
    r"^(?:\([\w.-]+(?: pid=\d+)?\) )?"
    r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] )?"
)
# The last line of a Python traceback: "ValueError: ...", "torch.OutOfMemoryError: ...".
_EXCEPTION_RE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)(?:: (?P<message>.*))?$")
# An exception that only points at another one.
_WRAPPER_RE = re.compile(r"root cause above|stack trace above|for the root cause", re.IGNORECASE)
_CONTINUATION_LINES = 3


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


# ------------------------------------------------------------------------------------- the log
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


def startup_failure(log_text: str) -> str | None:
    """The root cause of a failed start, from the log: the exception line of the engine's traceback
    (with the indented lines that continue its message), or None when the log holds no exception.

    vLLM wraps the failure of a worker or engine process in further exceptions ("Worker failed with
    error '...'", "Engine core initialization failed. See root cause above."): an exception whose
    message points above or quotes an earlier one is a wrapper, and the last one that is not wins.
    """
    lines = [_LOG_PREFIX_RE.sub("", line, count=1) for line in log_text.splitlines()]
    found: list[tuple[int, str]] = []  # (line number, message) of each exception line
    for no, line in enumerate(lines):
        m = _EXCEPTION_RE.match(line)
        if m is None:
            continue
        message = (m.group("message") or "").strip()
        if _WRAPPER_RE.search(line) or any(
            len(earlier) >= 20 and earlier[:80] in message for _, earlier in found if earlier != message
        ):
            continue
        found.append((no, message))
    if not found:
        return None
    no = found[-1][0]
    out = [lines[no].strip()]
    for line in lines[no + 1 : no + 1 + _CONTINUATION_LINES]:
        if not line[:1].isspace() or not line.strip() or line.lstrip().startswith("For further information"):
            break
        out.append(line.strip())
    return "\n".join(out)


# --------------------------------------------------------------------------- the running server
def describe(
    *, base_url: str, api_key: str, port: int, pid: int, startup_s: float, log_path: Path, log_start: int,
    command: Sequence[str], gpu_index: int,
) -> ServerInfo:
    """Ask a ready server (and its log, from byte `log_start`) what it is."""
    log_text = read_log_tail(log_path, 100_000, log_start)
    vllm_version = None
    status, body = http_call("GET", base_url + "/version", api_key)
    if status == 200:
        vllm_version = _json_field(body, "version")
    if vllm_version is None:
        m = _VERSION_LOG_RE.search(log_text)
        vllm_version = m.group(1) if m else None

    # /server_info (dev mode) carries torch's collect_env: versions, GPU models, driver.
    system_env: dict[str, Any] = {}
    # The first call runs collect_env (pip, nvidia-smi, lscpu) on a thread: allow it time.
    status, body = http_call("GET", base_url + "/server_info", api_key, timeout_s=60.0)
    if status == 200:
        try:
            doc = json.loads(body)
            if isinstance(doc, dict) and isinstance(doc.get("system_env"), dict):
                system_env = doc["system_env"]
        except ValueError:
            pass
    torch_version = _clean(system_env.get("torch_version")) or _torch_version_from_python(command)

    gpu = nvml.gpu_info(gpu_index)
    gpu_name = gpu["name"] if gpu else _first_gpu_model(_clean(system_env.get("nvidia_gpu_models")))
    driver = gpu["driver_version"] if gpu else _clean(system_env.get("nvidia_driver_version"))

    kv_tokens, kv_source = None, None
    try:
        kv_tokens, kv_source = kv_capacity_from_metrics(prometheus.scrape(base_url, api_key))
    except prometheus.MetricsError:
        pass
    if kv_tokens is None:
        kv_tokens = parse_kv_capacity_log(log_text)
        kv_source = "log" if kv_tokens is not None else None

    return ServerInfo(
        base_url=base_url,
        api_key=api_key,
        port=port,
        pid=pid,
        startup_s=startup_s,
        log_path=log_path,
        vllm_version=vllm_version,
        torch_version=torch_version,
        kv_capacity_tokens=kv_tokens,
        gpu_name=gpu_name,
        driver_version=driver,
        kv_capacity_source=kv_source,
    )


def kv_capacity_from_metrics(snap: prometheus.Snapshot) -> tuple[int | None, str | None]:
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


def _torch_version_from_python(command: Sequence[str]) -> str | None:
    """Fallback when /server_info is missing: ask the engine's python (~1 s to import torch)."""
    python = command[0] if is_python_executable(command[0]) else derive_python(shlex.join(command))
    try:
        out = subprocess.run(
            [python, "-c", "import torch; print(torch.__version__)"],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


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
