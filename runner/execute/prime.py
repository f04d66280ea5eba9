"""Priming: each configuration of a run started once, unmeasured, before its first launch.

A configuration's first start on a host compiles its graphs (vLLM keys its compile cache by what it
compiles), and that start is not like the others: it takes 80-150 s where the later ones take 35-45 s on
the H200, its `startup_s` and KV capacity are left out of a server metric as not exchangeable, and its
first points can read apart (prefill-peak on 2026-12-04: 49.6 ms mean TTFT at 1,024 tokens on the launch
that compiled, 37.5 and 37.6 ms on the two that loaded). With three launches per arm that one launch is a
third of the design. Primed, the compile happens in a start nobody measures, and every measured launch
loads compiled graphs.

A configuration is the engine command, the launch's options (in any order) and the env its arm gives it. Which ones this
host has primed is remembered in the compile cache's folder (`primed.json`), so a run on a host that
already compiled them starts nothing extra; a cache emptied since is found by the launch's own log
(its `compile_cache` reads "cold"), as without priming.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from base.errors import EngineError
from compiler.configurations import compile_cache_off
from compiler.configurations import configuration as launch_configuration
from compiler.plan_compile import fingerprint
from runner.execute.launch import LaunchSpec, compile_cache_state, expect_logged, new_server
from runner.execute.point import log_size
from runner.server.tokenizer import ensure_tokenizer

RECORD = "primed.json"
DID = {"cold": "it compiled its graphs", "warm": "it loaded compiled graphs", None: "no torch.compile in its log"}


def primes(asked: bool | None, gpu_host: bool, ray: bool) -> bool:
    """Whether a run primes: as `--prime/--no-prime` says, else on a GPU host; never on a Ray cluster (its
    workers' hosts have compile caches of their own)."""
    return not ray and (gpu_host if asked is None else asked)


def configuration(spec: LaunchSpec) -> str:
    """What a compile-cache entry can depend on that the run sees: the engine command and the launch's
    configuration as the plan counts it (compiler.configurations.configuration: its options, order aside, and its arm's
    env). Two studies that serve the same model with the same options share it: the second starts nothing."""
    return fingerprint([list(spec.engine_command), launch_configuration(spec.launch)])


def to_prime(specs: Sequence[LaunchSpec], known: set[str]) -> list[LaunchSpec]:
    """The first launch of each configuration not in `known`, in run order; none whose arm turns the
    compile cache off."""
    seen, out = set(known), []
    for spec in specs:
        key = configuration(spec)
        if key not in seen and not compile_cache_off(spec.launch.env):
            seen.add(key)
            out.append(spec)
    return out


def known(folder: Path | None) -> set[str]:
    """The configurations primed on this host under `folder` (the compile cache's); none if unreadable."""
    if folder is None:
        return set()
    try:
        got = json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return set()
    return {k for k in got if isinstance(k, str)} if isinstance(got, list) else set()


def remember(folder: Path | None, keys: set[str]) -> None:
    """Add `keys` to the record (written whole, then renamed: a crash leaves the old one)."""
    if folder is None or not keys:
        return
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{RECORD}.{os.getpid()}"
    tmp.write_text(json.dumps(sorted(known(folder) | keys)))
    tmp.replace(folder / RECORD)


@dataclass(frozen=True)
class Primed:
    launch_id: str  # the first launch of the configuration
    seconds: float
    compile_cache: str | None  # what the prime start's log says: "cold" (it compiled), "warm", None
    error: str = ""  # why it did not come up (the launch itself will then fail, or start cold)


def prime(specs: Sequence[LaunchSpec], say: Callable[[str], None] = lambda _: None,
          server_for: Callable[..., Any] = new_server) -> list[Primed]:
    """Start and stop the first server of each configuration not primed yet under the specs' compile
    cache; remember those that came up. Nothing is measured and nothing is stored but what is returned.
    `server_for(spec, sid, devices)` makes the server (a test's stand-in makes faults happen)."""
    folder = specs[0].cache_root if specs else None
    done: list[Primed] = []
    up: set[str] = set()
    for spec in to_prime(specs, known(folder)):
        spec.log_dir.mkdir(parents=True, exist_ok=True)
        if Path(spec.launch.model_dir, "config.json").is_file():
            ensure_tokenizer(spec.launch.model_dir)
        sid = f"{spec.servers[0]}/prime"
        server = server_for(spec, sid, spec.placement.server_devices[0])
        start = log_size(server.log_path)
        say(f"server {sid}: starting, unmeasured (no measured launch is its configuration's first start)")
        t0 = time.monotonic()
        error = ""
        try:
            server.start()
            server.wait_ready()
            expect_logged(server.log_path, sid, start, spec.launch.expect_log)  # said now, before any launch
        except EngineError as exc:
            error = exc.message
        finally:
            server.stop()
        cache = compile_cache_state(server.log_path, start)
        done.append(Primed(spec.launch.id, time.monotonic() - t0, cache, error))
        if not error:
            up.add(configuration(spec))
        say(f"server {sid}: " + (f"failed: {error}" if error else f"ready and stopped ({DID[cache]})"))
    remember(folder, up)
    return done


def prime_note(primed: Sequence[Primed]) -> str:
    """The run's note: how many configurations were primed and what their starts did."""
    compiled = sum(p.compile_cache == "cold" for p in primed)
    failed = sum(bool(p.error) for p in primed)
    return (f"primed: {len(primed)} configuration(s) started once, unmeasured, before the first launch "
            f"({compiled} compiled their graphs" + (f", {failed} failed" if failed else "") + ")")
