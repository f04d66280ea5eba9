#!/usr/bin/env python3
"""Write studies/traces/mini_mooncake.jsonl: 200 requests in the Mooncake trace format, made here so the
tests and the example study replay a trace the repository owns. Deterministic (seeded): running it again
writes the same bytes.

Shape: four "system prompts" of 1 or 2 shared 512-token blocks, each request one of them plus 1 block
of its own (partial), 4 to 32 output tokens, arriving in bursts (a few requests within ms of each
other, then a pause), so a replay has shared prefixes to hit and a burst shape to keep.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

ROWS = 200
OUT = Path(__file__).resolve().parents[1] / "studies" / "traces" / "mini_mooncake.jsonl"


def rows(n: int = ROWS, seed: int = 33) -> list[dict[str, object]]:
    rng = random.Random(seed)
    prefixes = [[0], [1, 2], [3], [4, 5]]  # hash ids of each shared system prompt
    next_id = 100
    t = 0
    out = []
    for _ in range(n):
        prefix = prefixes[rng.randrange(len(prefixes))]
        own = 1
        ids = prefix + list(range(next_id, next_id + own))
        next_id += own
        length = 512 * (len(ids) - 1) + rng.randint(16, 512)  # the last block partial
        out.append({"timestamp": t, "input_length": length, "output_length": rng.randint(4, 32), "hash_ids": ids})
        t += rng.randint(1, 20) if rng.random() < 0.7 else rng.randint(400, 1500)  # bursts, then pauses
    return out


def main() -> int:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(r, separators=(", ", ": ")) + "\n" for r in rows()))
    print(f"wrote {OUT} ({ROWS} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
