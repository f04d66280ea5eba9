"""Is a server woken from sleep mode the same as a fresh start? And what does a swap cost?

Two arms (two `vllm serve` commands, e.g. bf16 and fp8 KV) are started with --enable-sleep-mode on one
GPU, one after the other, the first asleep (level 1: weights to host memory, KV discarded) while the
second starts. In each fresh launch, every arm is measured twice back to back ("fresh", then "again",
the control for a second measurement on the same process), put to sleep, and then woken and measured
once per cycle ("woken"), the arms alternating as the blocks of a study would. The launches are then
stopped and started fresh again (--launches), so woken measurements can be set beside the spread of
fresh starts.

Printed per arm and concurrency: output tok/s of every measurement, woken / again on the same process,
fresh launch to launch spread, and the arm ratio (second / first) from fresh launches and from each
wake cycle; the start, sleep and wake times; GPU memory while asleep (NVML). Needs a CUDA build of
vLLM (sleep mode uses its CUDA memory pool):

    python3 benchmarks/sleep_swap.py --model models/qwen3-8b \
        --arm "bf16=--kv-cache-dtype auto" --arm "fp8=--kv-cache-dtype fp8" --launches 2 --cycles 3
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from base.settings import load_settings  # noqa: E402
from runner.checks.cache import reset_prefix_cache  # noqa: E402
from runner.load.loadgen import RequestSpec, make_prompts, run_load  # noqa: E402
from runner.server.engine import VllmServer  # noqa: E402
from runner.server.http import http_call  # noqa: E402
from runner.server.tokenizer import ensure_tokenizer  # noqa: E402

GPU_SERVE = "--load-format dummy --max-model-len 4096 --enable-prefix-caching --enable-sleep-mode"


def _gpu_used_gib(index: int) -> float | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        used = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).used
        return used / 2**30
    except Exception:  # no NVML here: the figure is left out, never guessed
        return None


def _call(server: VllmServer, path: str, timeout_s: float = 300.0) -> float:
    """POST path, checked; its seconds."""
    t0 = time.perf_counter()
    status, body = http_call("POST", server.base_url + path, server.api_key, timeout_s)
    if status != 200:
        raise RuntimeError(f"POST {path}: {status} {body[:200]}")
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default=os.environ.get("STUDYC_VLLM", "vllm"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--serve-args", default=GPU_SERVE)
    ap.add_argument("--arm", action="append", required=True, help="NAME=extra serve flags (two or more)")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--concurrency", default="8,128")
    ap.add_argument("--waves", type=float, default=3.0, help="measured requests per point = waves x concurrency")
    ap.add_argument("--launches", type=int, default=2)
    ap.add_argument("--cycles", type=int, default=3, help="wake cycles per launch")
    ap.add_argument("--vocab", type=int, default=100000)
    ap.add_argument("--json", default=None)
    ap.add_argument("--logs", default=None, help="folder for the server logs (default: a new temporary one)")
    args = ap.parse_args()
    arms = [a.split("=", 1) for a in args.arm]
    levels = [int(c) for c in args.concurrency.split(",")]
    settings = load_settings()
    ensure_tokenizer(Path(args.model))
    logs = Path(args.logs) if args.logs else Path(tempfile.mkdtemp(prefix="sleep-swap-"))
    logs.mkdir(parents=True, exist_ok=True)
    salt = iter(range(10**6))
    rows: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []

    def measure(server: VllmServer, arm: str, launch: int, cond: str, cycle: int) -> None:
        if not reset_prefix_cache(server.base_url, server.api_key).ok:
            raise RuntimeError("prefix cache reset failed")
        for c in levels:
            def specs(n: int) -> list[RequestSpec]:
                prompts = make_prompts(n, args.input_len, vocab_lo=4, vocab_hi=args.vocab, seed=7,
                                       salt=f"s{next(salt)}")
                return [RequestSpec(p, args.output_len) for p in prompts]

            res = run_load(server.base_url, args.model, specs(int(args.waves * c)), api_key=server.api_key,
                           concurrency=c, warmup=specs(min(c, 16)))
            ok = [r for r in res.measured if r.ok]
            if len(ok) != len(res.measured):
                raise RuntimeError(f"{arm} c{c}: {len(res.measured) - len(ok)} requests failed")
            tps = sum(r.output_tokens for r in ok) / (res.window_end_s - res.window_start_s)
            rows.append({"arm": arm, "launch": launch, "cond": cond, "cycle": cycle, "c": c, "tok_s": tps})
            print(f"  {arm:<6} launch {launch} {cond:<6} cycle {cycle} c{c:<4} {tps:10.1f} tok/s", flush=True)

    for launch in range(1, args.launches + 1):
        servers: dict[str, VllmServer] = {}
        try:
            for name, extra in arms:
                srv = VllmServer(["serve", args.model, *shlex.split(args.serve_args), *shlex.split(extra)],
                                 command=shlex.split(args.engine), startup_timeout_s=900,
                                 key_dir=settings.cache_path, log_path=logs / f"{name}-{launch}.log")
                t0 = time.perf_counter()
                srv.start()
                srv.wait_ready()
                events.append({"launch": launch, "arm": name, "what": "start", "s": time.perf_counter() - t0,
                               "gpu_gib_after": _gpu_used_gib(0)})
                servers[name] = srv
                measure(srv, name, launch, "fresh", 0)
                measure(srv, name, launch, "again", 0)
                s = _call(srv, "/sleep?level=1")
                events.append({"launch": launch, "arm": name, "what": "sleep", "s": s, "gpu_gib_after": _gpu_used_gib(0)})
            for cycle in range(1, args.cycles + 1):
                for name, _ in arms:
                    srv = servers[name]
                    w = _call(srv, "/wake_up")
                    events.append({"launch": launch, "arm": name, "what": "wake", "s": w,
                                   "gpu_gib_after": _gpu_used_gib(0)})
                    measure(srv, name, launch, "woken", cycle)
                    s = _call(srv, "/sleep?level=1")
                    events.append({"launch": launch, "arm": name, "what": "sleep", "s": s,
                                   "gpu_gib_after": _gpu_used_gib(0)})
        finally:
            for srv in servers.values():
                srv.stop()

    _report(rows, events, [a for a, _ in arms], levels)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows, "events": events}, indent=1))
    return 0


def _report(rows: list[dict[str, Any]], events: list[dict[str, Any]], arms: list[str], levels: list[int]) -> None:
    def vals(arm: str, c: int, cond: str, launch: int | None = None) -> list[float]:
        return [r["tok_s"] for r in rows if r["arm"] == arm and r["c"] == c and r["cond"] == cond
                and (launch is None or r["launch"] == launch)]

    print("\noutput tok/s: fresh = first measurement of each start; again = second on the same process; "
          "woken = after /wake_up")
    for arm in arms:
        for c in levels:
            fresh, again, woken = vals(arm, c, "fresh"), vals(arm, c, "again"), vals(arm, c, "woken")
            spread = (max(fresh) - min(fresh)) / statistics.mean(fresh) if len(fresh) > 1 else float("nan")
            launches = sorted({r["launch"] for r in rows if r["cond"] == "woken"})
            per = [statistics.mean(vals(arm, c, "woken", k)) / statistics.mean(vals(arm, c, "again", k))
                   for k in launches if vals(arm, c, "woken", k) and vals(arm, c, "again", k)]
            print(f"{arm:<6} c{c:<4} fresh {' '.join(f'{x:.0f}' for x in fresh):<20} again "
                  f"{' '.join(f'{x:.0f}' for x in again):<20} woken {' '.join(f'{x:.0f}' for x in woken)}")
            print(f"{'':<12} fresh launch spread {spread:.2%}; woken / again on the same process: "
                  + ", ".join(f"{x:.4f}" for x in per))
    if len(arms) >= 2:
        a, b = arms[0], arms[1]
        print(f"\narm ratio {b} / {a}: from each fresh launch, then from each wake cycle")
        for c in levels:
            fresh = [x / y for x, y in zip(vals(b, c, "fresh"), vals(a, c, "fresh"), strict=False)]
            woken = [x / y for x, y in zip(vals(b, c, "woken"), vals(a, c, "woken"), strict=False)]
            print(f"c{c:<4} fresh {' '.join(f'{x:.4f}' for x in fresh)}   woken {' '.join(f'{x:.4f}' for x in woken)}")
    print("\nstart / sleep / wake seconds (GPU GiB used after)")
    for e in events:
        gib = "-" if e["gpu_gib_after"] is None else f"{e['gpu_gib_after']:.1f}"
        print(f"  launch {e['launch']} {e['arm']:<6} {e['what']:<6} {e['s']:8.2f} s  {gib} GiB")


if __name__ == "__main__":
    sys.exit(main())
