"""Priming (`runner.execute.prime`): each configuration started once, unmeasured, before the first launch,
and remembered per compile cache. The pure parts at their edges; then a real run on the CPU vLLM server
with a configuration that serves and one that dies at start: both primed, the run's phase and note
stored, only the one that served remembered (that a remembered one is not started again, and a failed one
is, the stand-in server shows without a second real run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from base.errors import EngineError
from compiler.configurations import compile_cache_off, option_groups
from compiler.plan_compile import fingerprint
from runner.execute.prime import (
    RECORD,
    Primed,
    configuration,
    known,
    prime,
    prime_note,
    primes,
    remember,
    to_prime,
)
from runner.execute.segments import PHASES, PRIME
from runner.store.store import Store
from tests.conftest import REPO, vllm_missing


def spec(argv: tuple[str, ...], env: dict[str, str] | None = None, command: tuple[str, ...] = ("vllm",),
         lid: str = "s/a/L1") -> Any:
    return SimpleNamespace(engine_command=command, launch=SimpleNamespace(
        argv=argv, env=env or {}, id=lid, fingerprint=fingerprint({"argv": list(argv), "env": env or {}})))


def test_a_configuration_is_command_argv_and_env() -> None:
    base = configuration(spec(("serve", "m")))
    assert len(base) == 16 and int(base, 16) >= 0
    assert base == configuration(spec(("serve", "m"), lid="s/a/L2"))  # another launch of it: the same
    assert base != configuration(spec(("serve", "m", "--x")))
    assert base != configuration(spec(("serve", "m"), {"VLLM_X": "1"}))
    assert base != configuration(spec(("serve", "m"), command=("python3", "-m", "vllm")))
    assert configuration(spec(("serve", "m"), {"A": "1", "B": "2"})) == configuration(spec(("serve", "m"), {"B": "2", "A": "1"}))


def test_options_in_another_order_are_the_same_configuration() -> None:
    """fp8-weights' bf16 arm and max-num-seqs' mns32 arm spell one server in two orders (2026-12-04: primed
    twice); `--x=1` is `--x 1`; a value, a flag or the model that differs is another configuration."""
    one = ("serve", "/m/qwen3-4b", "--max-model-len", "4096", "--max-num-batched-tokens", "4096", "--max-num-seqs", "32")
    other = ("serve", "/m/qwen3-4b", "--max-num-seqs", "32", "--max-model-len=4096", "--max-num-batched-tokens", "4096")
    assert configuration(spec(one)) == configuration(spec(other))
    assert option_groups(other) == [["serve", "/m/qwen3-4b"], ["--max-model-len", "4096"],
                                    ["--max-num-batched-tokens", "4096"], ["--max-num-seqs", "32"]]
    assert option_groups(("serve", "m", "--enforce-eager", "--a", "1", "2")) == [["serve", "m"], ["--a", "1", "2"],
                                                                                ["--enforce-eager"]]
    assert option_groups(()) == [[]]
    assert configuration(spec(one)) != configuration(spec(one[:-1] + ("64",)))
    assert configuration(spec(one)) != configuration(spec(one + ("--enforce-eager",)))
    assert configuration(spec(one)) != configuration(spec(("serve", "/m/qwen3-8b") + one[2:]))
    assert configuration(spec(("serve", "m", "--a", "1", "--b"))) != configuration(spec(("serve", "m", "--a", "--b", "1")))


def test_to_prime_takes_the_first_launch_of_each_new_configuration() -> None:
    a1, b1, a2, b2 = spec(("a",), lid="L1a"), spec(("b",), lid="L1b"), spec(("a",), lid="L2a"), spec(("b",), lid="L2b")
    assert [s.launch.id for s in to_prime([a1, b1, a2, b2], set())] == ["L1a", "L1b"]
    assert [s.launch.id for s in to_prime([a1, b1, a2, b2], {configuration(a1)})] == ["L1b"]
    assert to_prime([a1, a2], {configuration(a1)}) == []
    assert to_prime([], set()) == []
    off = spec(("c",), {"VLLM_DISABLE_COMPILE_CACHE": "1"}, lid="L1c")  # compiles on every start: nothing to warm
    assert [s.launch.id for s in to_prime([off, a1], set())] == ["L1a"]
    for value, skipped in (("1", True), ("True", True), ("0", False), ("false", False), ("", False), (" 0 ", False)):
        assert len(to_prime([spec(("c",), {"VLLM_DISABLE_COMPILE_CACHE": value})], set())) == (0 if skipped else 1), value
    assert compile_cache_off({"VLLM_DISABLE_COMPILE_CACHE": "1"}) and not compile_cache_off({})
    assert not compile_cache_off({"X": "1"})


def test_the_record_is_read_whole_or_not_at_all(tmp_path: Path) -> None:
    assert known(None) == set() and known(tmp_path) == set()
    deep = tmp_path / "a" / "b"
    remember(deep, {"k0"})  # folders made as needed
    assert known(deep) == {"k0"}
    remember(tmp_path, {"k1"})
    remember(tmp_path, {"k2"})
    assert known(tmp_path) == {"k1", "k2"}
    assert json.loads((tmp_path / RECORD).read_text()) == ["k1", "k2"]
    remember(tmp_path, set())  # nothing to add: the file is untouched
    assert known(tmp_path) == {"k1", "k2"}
    remember(None, {"k3"})  # no folder: nothing written anywhere
    (tmp_path / RECORD).write_text("{not json")
    assert known(tmp_path) == set()
    (tmp_path / RECORD).write_text('{"k1": 1}')  # not a list
    assert known(tmp_path) == set()
    (tmp_path / RECORD).write_text('["k1", 2]')  # only strings count
    assert known(tmp_path) == {"k1"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_prime_note_counts_compiles_and_failures() -> None:
    assert prime_note([Primed("L1", 1.0, "cold"), Primed("L2", 1.0, "warm")]) == (
        "primed: 2 configuration(s) started once, unmeasured, before the first launch (1 compiled their graphs)")
    assert prime_note([Primed("L1", 1.0, None, "exited")]).endswith("(0 compiled their graphs, 1 failed)")
    assert prime(()) == []  # no launch: nothing started
    assert PHASES.index(PRIME) < PHASES.index("warmup")  # before every launch's own phases


class Stand:
    """A server that comes up (its log saying what vLLM's would) or exits at start: faults on demand."""

    def __init__(self, log: Path, lines: str = "", fails: str = "") -> None:
        self.log_path, self.lines, self.fails, self.calls = log, lines, fails, []

    def start(self) -> None:
        self.calls.append("start")
        with self.log_path.open("a") as f:
            f.write(self.lines)

    def wait_ready(self) -> None:
        self.calls.append("wait_ready")
        if self.fails:
            raise EngineError(self.fails)

    def stop(self) -> None:
        self.calls.append("stop")


COLD = "INFO 12-04 15:30:01 [backends.py:393] Compiling a graph for compile range (1, 8192) takes 15.35 s\n"
WARM = "INFO 12-04 15:36:19 [backends.py:292] Directly load the compiled graph(s) for compile range (1, 8192)\n"


def launch_spec(tmp: Path, argv: tuple[str, ...], lid: str, env: dict[str, str] | None = None,
                expect_log: tuple[str, ...] = ()) -> Any:
    return SimpleNamespace(
        engine_command=("vllm",), launch=SimpleNamespace(argv=argv, env=env or {}, id=lid, model_dir=str(tmp / "none"),
                                                        fingerprint=fingerprint({"argv": list(argv), "env": env or {}}),
                                                        expect_log=expect_log),
        servers=(lid,), placement=SimpleNamespace(server_devices=(("0",),)), log_dir=tmp / "runs" / "r1",
        cache_root=tmp / "cache" / "compile-cache")


def test_prime_starts_each_new_configuration_once_and_remembers_what_came_up(tmp_path: Path) -> None:
    specs = [launch_spec(tmp_path, ("a",), "s/a/L1"), launch_spec(tmp_path, ("b",), "s/b/L1"),
             launch_spec(tmp_path, ("a",), "s/a/L2"), launch_spec(tmp_path, ("c",), "s/c/L1")]
    made: dict[str, Stand] = {}
    behaviour = {"s/a/L1/prime": (COLD, ""), "s/b/L1/prime": ("", "vLLM exited with code 1 during startup"),
                 "s/c/L1/prime": (WARM, "")}

    def server_for(spec: Any, sid: str, devices: tuple[str, ...]) -> Stand:
        assert devices == ("0",)
        made[sid] = Stand(spec.log_dir / (sid.replace("/", "__") + ".log"), *behaviour[sid])
        return made[sid]

    said: list[str] = []
    done = prime(specs, said.append, server_for)
    assert [(p.launch_id, p.compile_cache, p.error) for p in done] == [
        ("s/a/L1", "cold", ""), ("s/b/L1", None, "vLLM exited with code 1 during startup"), ("s/c/L1", "warm", "")]
    assert all(0 <= p.seconds < 60 for p in done)  # this start's own seconds
    assert list(made) == ["s/a/L1/prime", "s/b/L1/prime", "s/c/L1/prime"]  # the second launch of a: not again
    assert all(m.calls == ["start", "wait_ready", "stop"] for m in made.values())  # stopped, failed or not
    assert said == [
        "server s/a/L1/prime: starting, unmeasured (no measured launch is its configuration's first start)",
        "server s/a/L1/prime: ready and stopped (it compiled its graphs)",
        "server s/b/L1/prime: starting, unmeasured (no measured launch is its configuration's first start)",
        "server s/b/L1/prime: failed: vLLM exited with code 1 during startup",
        "server s/c/L1/prime: starting, unmeasured (no measured launch is its configuration's first start)",
        "server s/c/L1/prime: ready and stopped (it loaded compiled graphs)",
    ]
    assert (tmp_path / "runs" / "r1").is_dir()  # the log folder is made before the first start
    assert known(tmp_path / "cache" / "compile-cache") == {configuration(specs[0]), configuration(specs[3])}
    assert prime_note(done).endswith("(1 compiled their graphs, 1 failed)")
    # Again under the same cache: only the one that failed is started.
    made.clear()
    done = prime(specs, said.append, server_for)
    assert list(made) == ["s/b/L1/prime"] and [p.launch_id for p in done] == ["s/b/L1"]
    # A log that already held an earlier start's lines: only this start's own count.
    made.clear()
    (tmp_path / "cache" / "compile-cache" / RECORD).unlink()
    behaviour["s/a/L1/prime"] = (WARM, "")
    done = prime(specs[:1], said.append, server_for)
    assert done[0].compile_cache == "warm"


def test_a_prime_whose_log_lacks_an_expected_text_says_so_and_is_not_remembered(tmp_path: Path) -> None:
    """The unmeasured start checks the arm's expect_log first, so the operator reads it before any launch;
    the configuration is not remembered as primed."""
    specs = [launch_spec(tmp_path, ("a",), "s/a/L1", expect_log=("Directly load", "Simulating MoE routing")),
             launch_spec(tmp_path, ("b",), "s/b/L1", expect_log=("Directly load",))]

    def server_for(spec: Any, sid: str, devices: tuple[str, ...]) -> Stand:
        return Stand(spec.log_dir / (sid.replace("/", "__") + ".log"), WARM)

    said: list[str] = []
    done = prime(specs, said.append, server_for)
    log = tmp_path / "runs" / "r1" / "s__a__L1__prime.log"
    assert [(p.launch_id, p.error) for p in done] == [
        ("s/a/L1", f"server s/a/L1/prime is ready but its log does not say 'Simulating MoE routing' (the arm's "
                   f"expect_log): see {log}"), ("s/b/L1", "")]
    assert said[1] == f"server s/a/L1/prime: failed: {done[0].error}"
    assert known(tmp_path / "cache" / "compile-cache") == {configuration(specs[1])}


def test_a_gpu_host_primes_unless_told_not_to() -> None:
    assert primes(None, gpu_host=True, ray=False) and not primes(None, gpu_host=False, ray=False)
    assert primes(True, gpu_host=False, ray=False) and not primes(False, gpu_host=True, ray=False)
    assert not primes(True, gpu_host=True, ray=True) and not primes(None, gpu_host=True, ray=True)


STUDY = f'''[study]
id = "prime"
title = "t"
question = "q"
hardware = "cpu"

[model]
path = "{REPO / "models/tiny-qwen3"}"
name = "tiny-qwen3"

[engine]
max_model_len = 512
max_num_seqs = 4
kv_cache_memory_bytes = "64M"
block_size = 32
enforce_eager = true
distributed_executor_backend = "uni"

[env]
VLLM_ENABLE_V1_MULTIPROCESSING = "0"

[arms.good]
description = "Serves"

[arms.broken]
description = "Asks for a context longer than the model's: vLLM exits at start"
max_model_len = 999999

[workloads.short]
input_len = 32
output_len = 8

[load]
concurrency = [1]
requests = 2
warmup = 1
launches = 1
repeats = 1

[[hypothesis]]
id = "it-streams"
claim = "The arm streams tokens"
metric = "output_throughput"
where = {{ arm = "good" }}
predict = {{ relation = ">", value = 0 }}
'''


@pytest.mark.vllm
@pytest.mark.skipif(vllm_missing() is not None, reason=str(vllm_missing()))
def test_a_run_primes_each_configuration_once(tmp_path: Path) -> None:
    path = tmp_path / "prime.toml"
    path.write_text(STUDY)
    cache, runs = tmp_path / "cache", tmp_path / "runs"
    env = os.environ | {"STUDYC_CACHE_DIR": str(cache), "STUDYC_RUNS_DIR": str(runs), "PYTHONUNBUFFERED": "1"}

    def run(db: Path, *flags: str) -> str:
        out = subprocess.run([sys.executable, "-m", "studyc", "run", str(path), "--db", str(db), "--keep-going",
                              "--no-calibrate", *flags], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 1, out.stdout + out.stderr  # the broken arm fails: keep-going reports it
        return out.stdout + out.stderr

    def stored(db: Path) -> tuple[Any, list[Any], list[Any]]:
        with Store(db, read_only=True) as store:
            r = store.runs()[0]
            return r, list(store.timing(r.run_id)[1]), store.servers(r.run_id)

    text = run(tmp_path / "one.duckdb", "--prime")
    assert "prime/good/prime: ready and stopped (no torch.compile in its log)" in text
    assert "prime/broken/prime: failed" in text
    r, phases, servers = stored(tmp_path / "one.duckdb")
    primed = [p for p in phases if p.phase == PRIME]
    assert len(primed) == 1 and primed[0].launch_id == "" and primed[0].seconds > 0
    assert "primed: 2 configuration(s) started once, unmeasured, before the first launch " \
           "(0 compiled their graphs, 1 failed)" in (r.notes or "")
    # the broken launch fails twice: its start and its one cold retry (runner.execute.launch.run_launch_retried)
    assert {s.server_id: s.status for s in servers} == {"prime/good": "ready", "prime/broken": "failed",
                                                        "prime/broken~2": "failed"}
    log = runs / r.run_id / "prime__good__prime.log"  # the prime start's own log, beside the launches'
    assert log.is_file() and "# studyc: " in log.read_text()
    assert len(known(cache / "compile-cache")) == 1  # the configuration that served, not the broken one

