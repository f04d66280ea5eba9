"""What encoding the request bodies ahead of the window does to the load generator's loop stall.

At high concurrency the first wave of a closed-loop point sends `concurrency` requests in one pass
of the event loop; encoding each long prompt to JSON at send time holds the loop for all of them,
and every chunk that lands meanwhile is read late. `Client.prepare` encodes the measured bodies
after warmup, before the window opens. This runs the same point with bodies encoded ahead and with
them encoded at send time, alternating, and prints each mode's median longest loop stall and the
ratio ahead / at send.

The worker runs in this process (`workers=0`, so switching the mode here reaches it), pinned to
core 1; the loopback instrument runs in its own process on core 0, pacing chunks `--itl-ms` apart.
Usage:

    .venv/bin/python benchmarks/prepared_bodies.py [--blocks 3] [--concurrency 128] [--input-len 1024]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

from runner.load.client import Client
from runner.load.loadgen import RequestSpec, make_prompts, run_load

PREPARE = Client.prepare


def _encode_when_sent(self: Client, specs: object, most_bytes: int = 0) -> int:
    self._prepared = []
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--requests", type=int, default=448)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--itl-ms", type=float, default=16.0)
    args = ap.parse_args()
    two_cores = (os.cpu_count() or 1) >= 2
    inst = subprocess.Popen(
        [sys.executable, "-m", "runner.load.instrument", "--port", "0", "--itl-ms", str(args.itl_ms), "--no-log",
         *(["--cpu", "0"] if two_cores else [])],
        stdout=subprocess.PIPE, text=True)
    try:
        line = inst.stdout.readline() if inst.stdout else ""
        if not line.startswith("READY "):
            raise SystemExit(f"the instrument did not start: {line!r}")
        url = f"http://127.0.0.1:{int(line.split()[1])}"
        if two_cores:
            os.sched_setaffinity(0, {1})
        prompts = make_prompts(args.requests + 8, args.input_len, vocab_lo=4, vocab_hi=30000, seed=5)
        specs = [RequestSpec(p, args.tokens) for p in prompts[:args.requests]]
        warmup = [RequestSpec(p, 2) for p in prompts[args.requests:]]
        stalls: dict[str, list[float]] = {"ahead": [], "at send": []}
        for _ in range(args.blocks):
            for mode in stalls:
                Client.prepare = PREPARE if mode == "ahead" else _encode_when_sent  # type: ignore[method-assign]
                res = run_load(url, "m", specs, warmup=warmup, concurrency=args.concurrency, workers=0)
                if res.stall_s is None or not all(r.ok for r in res.measured):
                    raise SystemExit(f"{mode}: the point failed or measured no stall")
                stalls[mode].append(res.stall_s * 1e3)
        Client.prepare = PREPARE  # type: ignore[method-assign]
    finally:
        inst.terminate()
        inst.wait(timeout=10)
    print(f"c{args.concurrency}, {args.requests} requests of {args.input_len} tokens in, {args.tokens} out, "
          f"chunks {args.itl_ms:g} ms apart; worker on {'core 1' if two_cores else 'the only core'}")
    for mode, got in stalls.items():
        print(f"{mode:>8}: median longest loop stall {statistics.median(got):.1f} ms over {len(got)} points "
              f"({', '.join(f'{x:.1f}' for x in got)})")
    print(f"ratio ahead / at send: {statistics.median(stalls['ahead']) / statistics.median(stalls['at send']):.2f}")


if __name__ == "__main__":
    main()
