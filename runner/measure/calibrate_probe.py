"""Measure this GPU's ceilings: HBM copy bandwidth and dense bf16 matmul rate.

Runs in the ENGINE's python (it has torch; studyc's env does not) and prints one JSON line:
{"ok": true, "bandwidth_Bps": ..., "flops_bf16": ..., "device": ..., "details": {...}}
or {"ok": false, "reason": "..."}. Standard library + torch only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


def _emit(doc: dict[str, Any]) -> None:
    print(json.dumps(doc), flush=True)


def _time_ms(torch: Any, fn: Callable[[], object], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return out


def _copy_ms(torch: Any, dev: Any, n: int, warmup: int, repeats: int) -> list[float]:
    """Device-to-device copies of n bytes (buffers freed on return)."""
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    src.random_(0, 256)
    dst = torch.empty_like(src)
    for _ in range(warmup):
        dst.copy_(src)
    torch.cuda.synchronize()
    return _time_ms(torch, lambda: dst.copy_(src), repeats)


def _matmul_ms(torch: Any, dev: Any, m: int, warmup: int, repeats: int) -> list[float]:
    """m x m x m bf16 matmuls on random data (zeros would let the hardware idle)."""
    a = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    b = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    c = torch.empty(m, m, device=dev, dtype=torch.bfloat16)
    # Warm up for ~0.5 s, not a few calls: clocks and power settle before the timed runs, so
    # this is the sustained rate (H200: ~675 TFLOP/s sustained vs ~770 from a cold burst).
    torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    t_end = time.monotonic() + 0.5
    n_warm = 0
    while n_warm < warmup or time.monotonic() < t_end:
        for _ in range(10):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        n_warm += 10
    return _time_ms(torch, lambda: torch.matmul(a, b, out=c), repeats)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--copy-bytes", type=int, default=4 << 30)
    ap.add_argument("--matmul-n", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()

    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
    except (ImportError, OSError, RuntimeError) as exc:  # absent, or a broken install
        _emit({"ok": False, "reason": f"torch not importable in {sys.executable}: {exc}"})
        return 0
    if not torch.cuda.is_available():
        _emit({"ok": False, "reason": f"CUDA not available to torch {torch.__version__} ({sys.executable})"})
        return 0
    if args.device >= torch.cuda.device_count():
        _emit(
            {"ok": False, "reason": f"no CUDA device {args.device} (torch sees {torch.cuda.device_count()})"}
        )
        return 0

    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    props = torch.cuda.get_device_properties(dev)
    details: dict[str, Any] = {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "capability": f"{props.major}.{props.minor}",
        "memory_total_bytes": props.total_memory,
        "sm_count": props.multi_processor_count,
    }

    free, _ = torch.cuda.mem_get_info(dev)
    n = min(args.copy_bytes, int(free * 0.4)) // 4096 * 4096
    copy_ms = _copy_ms(torch, dev, n, args.warmup, args.repeats)
    bandwidth = 2 * n / (statistics.median(copy_ms) / 1e3)  # each byte read once, written once
    details.update(copy_bytes=n, copy_ms=copy_ms)
    torch.cuda.empty_cache()

    m = args.matmul_n
    mm_ms = _matmul_ms(torch, dev, m, args.warmup, args.repeats)
    flops = 2 * m**3 / (statistics.median(mm_ms) / 1e3)
    details.update(matmul_n=m, matmul_ms=mm_ms)

    _emit(
        {
            "ok": True,
            "bandwidth_Bps": bandwidth,
            "flops_bf16": flops,
            "device": torch.cuda.get_device_name(dev),
            "details": details,
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
