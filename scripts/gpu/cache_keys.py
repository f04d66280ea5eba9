"""Copy what vLLM hashed into each compile-cache key (`cache_key_factors.json`) to OUT/cache-keys/, without
secrets: an env entry whose name says key, secret, token or password is dropped, and so is any value that
holds the servers' API key. Two starts of one configuration whose cache folders differ (a primed
DeepSeek-V2-Lite that compiled again on its first measured start) can then be diffed factor by factor.

    python3 scripts/gpu/cache_keys.py CACHE_DIR OUT
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

SECRET_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD", re.I)


def redacted(factors: dict, secret: str) -> dict:
    env = factors.get("env")
    if isinstance(env, dict):
        factors["env"] = {k: v for k, v in env.items()
                          if not SECRET_NAME.search(k) and not (secret and secret in json.dumps(v))}
    text = json.dumps(factors, indent=2, sort_keys=True)
    if secret and secret in text:  # anywhere else: nothing of this file leaves the machine
        return {"redacted": "the API key appeared outside env; file left out"}
    return factors


def main(cache_dir: Path, out: Path) -> int:
    key = cache_dir / "api-key"
    secret = key.read_text().strip() if key.exists() else ""
    target = out / "cache-keys"
    for f in sorted(cache_dir.glob("compile-cache/torch_compile_cache/*/rank_*/*/cache_key_factors.json")):
        folder, rank, prefix = f.parts[-4], f.parts[-3], f.parts[-2]
        target.mkdir(parents=True, exist_ok=True)
        factors = redacted(json.loads(f.read_text()), secret)
        (target / f"{folder}-{rank}-{prefix}.json").write_text(json.dumps(factors, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
