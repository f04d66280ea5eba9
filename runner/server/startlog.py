"""A server start split into phases from its log: vLLM stamps its lines to the second, and a few of them
mark the end of a phase (imports, engine process, model load, torch.compile, KV cache, CUDA graphs, ...).

Only what the log shows is split: a span whose two ends are not consecutive phases of `START_PHASES`
(a line the log lacks) is "start (unsplit)", never divided by a guess.
"""

from __future__ import annotations

import re
from datetime import datetime

UNSPLIT = "start (unsplit)"
# (phase, the first log line that ends it): in the order vLLM starts. None: the server answered /health.
START_PHASES: tuple[tuple[str, re.Pattern[str] | None], ...] = (
    ("start: imports (API process)", re.compile(r"")),  # ends at the API process's first stamped line
    ("start: engine process (config, spawn, imports)", re.compile(r"Initializing a V1 LLM engine")),
    ("start: model load", re.compile(r"Model loading took|Initializing model took")),
    ("start: torch.compile", re.compile(r"torch\.compile took")),
    ("start: profiling, KV cache", re.compile(r"[GC]PU KV cache size")),
    ("start: CUDA graph capture", re.compile(r"Graph capturing finished")),
    ("start: post-capture", re.compile(r"init engine \(profile, create kv cache")),
    ("start: API server", re.compile(r"Starting vLLM server on")),
    ("start: until ready (health, introspection)", None),
)
# The run's first launch, held with nothing to overlap: its API process's imports, waited for before its
# start (runner.execute.prestart.Prestart.hold_first); its own imports row then reads about 0
HELD_FIRST_IMPORTS = "start: imports (first launch, held)"
_STAMP = re.compile(r"^(?:\(\w+ pid=\d+\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) ")
_SPAWN = "# studyc: "  # the line VllmServer writes before each spawn


def start_phases(log_text: str, spawned_at: datetime, total_s: float) -> list[tuple[str, float]]:
    """(phase, seconds) of one start, adding up to `total_s` (spawn to ready, measured by the caller).
    `log_text` is what the log gained since the spawn, `spawned_at` the local time of the spawn (vLLM
    stamps local time, to the second). A log that shows no phase, or two spawns (a port retry): unsplit."""
    if total_s <= 0:
        return []
    if log_text.count(_SPAWN) > 1:
        return [(UNSPLIT, total_s)]
    ends: list[tuple[int, float]] = []  # (index in START_PHASES, seconds after the spawn)
    k = 0
    for line in log_text.splitlines():
        if k >= len(START_PHASES) - 1:
            break
        stamp = _STAMP.match(line)
        if stamp is None:
            continue
        at = _offset(stamp, spawned_at)
        if at is None:
            continue
        for i in range(k, len(START_PHASES) - 1):
            pattern = START_PHASES[i][1]
            if pattern is not None and pattern.search(line):
                ends.append((i, min(max(at, ends[-1][1] if ends else 0.0), total_s)))
                k = i + 1
                break
    out: list[tuple[str, float]] = []
    prev_i, prev_t = -1, 0.0
    for i, t in [*ends, (len(START_PHASES) - 1, total_s)]:
        name = START_PHASES[i][0] if i == prev_i + 1 else UNSPLIT
        if name == UNSPLIT and t == prev_t:
            pass  # two lines in one second: nothing between them to account for
        elif out and out[-1][0] == name == UNSPLIT:
            out[-1] = (UNSPLIT, out[-1][1] + t - prev_t)
        else:
            out.append((name, t - prev_t))
        prev_i, prev_t = i, t
    return out


def _offset(stamp: re.Match[str], spawned_at: datetime) -> float | None:
    """Seconds from the spawn to a line's stamp (month-day hour:minute:second, no year: the spawn's, or
    the next one across a new year). The stamp drops the fraction: up to a second early, never negative."""
    month, day, hour, minute, second = (int(g) for g in stamp.groups())
    try:
        at = datetime(spawned_at.year, month, day, hour, minute, second)
        if (spawned_at.replace(tzinfo=None) - at).days > 180:
            at = at.replace(year=spawned_at.year + 1)
    except ValueError:
        return None
    whole = spawned_at.replace(tzinfo=None, microsecond=0)
    return max(0.0, (at - whole).total_seconds() - spawned_at.microsecond / 1e6)
