"""Configurations to prime: which launches of a plan are one server to start once, unmeasured, before the
first launch (runner.execute.prime), and which arms are never primed. Pure; shared by the plan's estimate and
table and by the runner, so the count the plan states is the count the runner primes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from compiler.plan import Launch


def compile_cache_off(env: Mapping[str, str]) -> bool:
    """The arm turns vLLM's compile cache off (VLLM_DISABLE_COMPILE_CACHE): every start of it compiles, so it
    is never primed (runner.execute.prime) and every start is estimated as a compiling one."""
    return env.get("VLLM_DISABLE_COMPILE_CACHE", "0").strip().lower() not in ("", "0", "false")


def option_groups(argv: Sequence[str]) -> list[list[str]]:
    """A serve argv as its leading positionals (`serve MODEL`) then each option with its values, the options
    sorted: `--a 1 --b` and `--b --a=1` are one server (each option is given once; argparse reads them in any
    order), so they are one configuration across studies that spell their options in another order."""
    head: list[str] = []
    groups: list[list[str]] = []
    for arg in argv:
        if arg.startswith("--"):
            groups.append(arg.split("=", 1))
        elif groups:
            groups[-1].append(arg)
        else:
            head.append(arg)
    return [head, *sorted(groups)]


def configuration(launch: Launch) -> str:
    """What a launch's compile-cache entry can depend on that the plan sees: its options (`option_groups`,
    order aside) and its arm's env. One notion for the plan's prime count and the runner's primes
    (runner.execute.prime adds the engine command)."""
    return json.dumps([option_groups(launch.argv), launch.env], sort_keys=True)


def primed_configurations(launches: Sequence[Launch]) -> int:
    """Configurations a GPU run primes: one per `configuration`, none whose arm turns the compile cache off."""
    return len({configuration(s) for s in launches if not compile_cache_off(s.env)})
