"""Which ledger points sit near saturation, from what the store holds: every engine slot busy, the KV cache
preempting sequences in the measured window, or the point's KV demand near the server's KV capacity. There
the replay's queueing and the engine's preemptions dominate, so the ledger reports such points apart
(docs/predictions.md, "The ledger: per GPU, and saturation")."""

from __future__ import annotations

from compiler.stepcost import EngineShape
from compiler.stepreplay import StepLoad

KV_NEAR_FULL = 0.9  # the share of the server's KV capacity (tokens) a point's demand must reach


def kv_demand_tokens(load: StepLoad) -> int:
    """The most KV tokens the point's slots hold at once: every slot with the longest prompt and its output
    (a conversation's turns add up)."""
    prompt = max(load.input_lens) if load.input_lens else load.input_len
    return min(load.concurrency, load.requests) * load.turns * (prompt + load.output_len)


def saturation(load: StepLoad, engine: EngineShape, preemptions: float | None,
               kv_capacity_tokens: int | None) -> str:
    """Why a point is near saturation ("; " between reasons), or "" where it is not."""
    why = []
    if load.concurrency >= engine.max_num_seqs:
        why.append(f"concurrency {load.concurrency} >= max_num_seqs {engine.max_num_seqs}")
    if preemptions:
        why.append(f"{preemptions:.0f} preemption(s) in the window")
    demand = kv_demand_tokens(load)
    if kv_capacity_tokens and demand >= KV_NEAR_FULL * kv_capacity_tokens:
        why.append(f"KV demand {demand:,} tokens >= {KV_NEAR_FULL:.0%} of the server's {kv_capacity_tokens:,}")
    return "; ".join(why)
