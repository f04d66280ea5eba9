"""How many routed experts does vLLM's dummy-weight router reach in a decode batch? (moe-union's premise)

Serves a DeepSeek-V2-Lite-shaped model cut to its first `--layers` layers (models/deepseek-v2-lite/config.json,
every other dimension as it is: 64 routed experts, 6 per token, 2,048 hidden, 102,400 ids) with dummy weights
on the CPU build of vLLM, in this process, and greedy-decodes `--batch` sequences of random prompts. Every
call of the MoE router is recorded (vLLM's BaseRouter._select_experts, wrapped): the distinct experts it
picked across the tokens of that call. Prints the distinct next tokens at a few decode steps and, per call
size, the distinct experts per call (min, median, max).

    .venv-vllm/bin/python benchmarks/dummy_routing.py --batch 64       # ~1 min on 2 cores

The CPU generator is not the GPU's: the dummy values differ, their distribution does not (uniform in
+-1e-3, one seed for every tensor). What it shows is whether dummy weights route a decode batch unevenly by
construction; a GPU run with and without VLLM_MOE_ROUTING_SIMULATION_STRATEGY settles the GPU's case.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--layers", type=int, default=3, help="first_k_dense_replace is 1: layer 0 is dense")
    ap.add_argument("--steps", type=int, default=24, help="decode steps (output tokens)")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: the wrap sees it
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(REPO))
    from vllm import LLM, SamplingParams
    from vllm.model_executor.layers.fused_moe.router import base_router

    from runner.server.tokenizer import build

    calls: dict[int, list[int]] = collections.defaultdict(list)
    select = base_router.BaseRouter._select_experts

    def recorded(self: object, hidden_states: object, router_logits: object, *a: object, **k: object) -> object:
        weights, ids = select(self, hidden_states, router_logits, *a, **k)
        calls[ids.shape[0]].append(len(set(ids.flatten().tolist())))
        return weights, ids

    base_router.BaseRouter._select_experts = recorded
    with tempfile.TemporaryDirectory() as tmp:
        config = json.loads((REPO / "models/deepseek-v2-lite/config.json").read_text())
        config["num_hidden_layers"] = args.layers
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        build(Path(tmp))
        llm = LLM(model=tmp, load_format="dummy", max_model_len=1024, max_num_seqs=args.batch, enforce_eager=True,
                  kv_cache_memory_bytes=1 << 30, block_size=64, trust_remote_code=True,
                  distributed_executor_backend="uni")
        rng = random.Random(0)
        vocab = config["vocab_size"]
        prompts = [{"prompt_token_ids": [rng.randrange(4, vocab) for _ in range(32)]} for _ in range(args.batch)]
        calls.clear()
        outs = llm.generate(prompts, SamplingParams(max_tokens=args.steps, temperature=0, ignore_eos=True))
    tokens = [o.outputs[0].token_ids for o in outs]
    for step in sorted({0, 1, args.steps // 2, args.steps - 1}):
        print(f"decode step {step}: {len({t[step] for t in tokens})} distinct next tokens of {args.batch}")
    for n, picked in sorted(calls.items()):
        picked = sorted(picked)
        print(f"router calls of {n} tokens: {len(picked)}; distinct experts per call min {picked[0]}, "
              f"median {picked[len(picked) // 2]}, max {picked[-1]} (of {config['n_routed_experts']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
