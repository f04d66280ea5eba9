"""What the load generator's loop-stall watch costs: chunks/s with it and without it, alternating.

The watch (`runner.load.workers._Worker._watch`, a 1 ms timer that measures how late it fires) bounds how
late the client read any chunk, which reconciliation uses to tell a late client from a server that
sent late. This drives the loopback instrument as fast as it streams (one write per chunk), with the
watch on and with it replaced by a 50 ms idle loop that measures nothing, in alternating blocks, and
prints the median chunks/s of each and their ratio. Usage:

    .venv/bin/python benchmarks/loop_watch_cost.py [--blocks 4] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from runner.load import workers
from runner.load.instrument import Instrument
from runner.load.loadgen import RequestSpec, make_prompts, run_load

WATCH = workers._Worker._watch


async def _no_watch(self: workers._Worker, period_s: float = 0.05) -> None:
    while self.watching:
        await asyncio.sleep(period_s)
    self.stall_s = None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=2000)
    args = ap.parse_args()
    specs = [RequestSpec(p, args.tokens) for p in make_prompts(args.concurrency, 16, vocab_lo=4, vocab_hi=4096, seed=3)]
    rates: dict[str, list[float]] = {"watch": [], "no watch": []}
    with Instrument(per_chunk_writes=True) as inst:
        for _ in range(args.blocks):
            for mode in rates:
                workers._Worker._watch = WATCH if mode == "watch" else _no_watch  # type: ignore[method-assign]
                res = run_load(inst.base_url, "m", specs, concurrency=args.concurrency, workers=1)
                rates[mode].append(sum(r.chunks for r in res.records) / (res.window_end_s - res.window_start_s))
    workers._Worker._watch = WATCH  # type: ignore[method-assign]
    for mode, got in rates.items():
        print(f"{mode:>9}: median {statistics.median(got):,.0f} chunks/s over {len(got)} blocks "
              f"({', '.join(f'{x:,.0f}' for x in got)})")
    print(f"ratio watch / no watch: {statistics.median(rates['watch']) / statistics.median(rates['no watch']):.3f}")


if __name__ == "__main__":
    main()
