"""The design in the plan: launches in randomised blocks, stable ids, replicas and GPUs, points that
are not exchangeable, the sequential budget, and the errors of each, with file, line and key."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from compiler.load import check_file, load_study
from compiler.plan import Plan
from compiler.plan_compile import block_orders, compile_study, design_seed
from tests.variants import ONE_LAUNCH, study_variant

ROOT = Path(__file__).resolve().parents[2]


def _variant(tmp_path: Path, *edits: tuple[str, str], name: str = "variant.toml") -> Path:
    """The quickstart on one launch per arm (its first design), with `edits`."""
    return study_variant(tmp_path, *ONE_LAUNCH, *edits, name=name)


def _fp8_kv_as_first_run(tmp_path: Path) -> Path:
    """studies/fp8_kv.toml with the design of its first H200 run (one launch per arm, 3 repeats), the
    design its v1 plan was stored with; the file beside a link to the repo's models, so its model path
    reads the same."""
    text = (ROOT / "studies/fp8_kv.toml").read_text()
    text = re.sub(r"^launches = \d+ ", "launches = 1 ", text, count=1, flags=re.M)
    text = re.sub(r"^repeats = \d+ ", "repeats = 3 ", text, count=1, flags=re.M)
    text = re.sub(r"(?ms)^\[design\]\n.*?\n\n", "", text, count=1)  # its budget came later
    (tmp_path / "studies").mkdir(exist_ok=True)
    if not (tmp_path / "models").exists():
        (tmp_path / "models").symlink_to(ROOT / "models")
    path = tmp_path / "studies/fp8_kv.toml"
    path.write_text(text)
    return path


def _plan(path: Path) -> Plan:
    return compile_study(load_study(path))


def _problems(path: Path) -> list[str]:
    _, problems = check_file(path)
    return [str(p) for p in problems]


THREE_ARMS = ('[arms.warm]', '[arms.third]\ndescription = "a third arm"\n\n[arms.warm]')
LAUNCHES_1 = "launches = 1 "


def test_every_arm_appears_once_per_block_in_run_order(tmp_path: Path) -> None:
    plan = _plan(_variant(tmp_path, THREE_ARMS, (LAUNCHES_1, "launches = 6 ")))
    assert len(plan.design.blocks) == 6 and plan.design.launches == {"cold": 6, "third": 6, "warm": 6}
    for block in plan.design.blocks:
        launches = [s for s in plan.launches if s.block == block.index]
        assert sorted(s.arm for s in launches) == ["cold", "third", "warm"]
        assert tuple(s.id for s in launches) == block.launches  # plan.launches is in run order
        assert [s.order for s in launches] == [1, 2, 3]
        assert all(s.launch == block.index for s in launches)
    assert [s.block for s in plan.launches] == sorted(s.block for s in plan.launches)


def test_block_orders_differ_and_are_reproducible_from_the_seed(tmp_path: Path) -> None:
    plan = _plan(_variant(tmp_path, THREE_ARMS, (LAUNCHES_1, "launches = 6 ")))
    orders = [tuple(s.split("/")[1] for s in b.launches) for b in plan.design.blocks]
    assert len(set(orders)) > 1
    assert all(a != b for a, b in zip(orders, orders[1:], strict=False))  # never twice in a row
    assert [tuple(o) for o in block_orders([["cold", "third", "warm"]] * 6, plan.design.seed)] == orders
    # Same file, same order; another seed, another order; the seed is recorded with its source.
    assert _plan(_variant(tmp_path, THREE_ARMS, (LAUNCHES_1, "launches = 6 "), name="b.toml")).design == plan.design
    seeded = _plan(_variant(tmp_path, THREE_ARMS, (LAUNCHES_1, "launches = 6 "),
                            ("[load]", "[design]\nseed = 7\n\n[load]"), name="c.toml"))
    assert seeded.design.seed == 7 and seeded.design.seed_from == "study"
    assert [b.launches for b in seeded.design.blocks] != [b.launches for b in plan.design.blocks]
    assert plan.design.seed_from == "study id" and plan.design.seed == design_seed(load_study(ROOT / "studies/quickstart.toml").study)[0]


def test_two_arms_alternate_between_blocks() -> None:
    for seed in range(20):
        orders = block_orders([["a", "b"]] * 4, seed)
        assert orders[0] != orders[1] and orders[1] != orders[2] and orders[0] == orders[2]


def test_ids_one_launch_keeps_the_v1_ids_more_launches_carry_the_launch(tmp_path: Path) -> None:
    one = _plan(_variant(tmp_path, name="one.toml"))
    assert {s.id for s in one.launches} == {"quickstart/cold", "quickstart/warm"}
    assert one.points[0].id.count("/") == 4 and "/L" not in one.points[0].id
    # A study with one launch per arm keeps the ids and fingerprints its v1 plan had (the committed
    # H200 runs of fp8_kv were stored with that plan).
    v1 = json.loads((ROOT / "tests/compiler/golden/plan_v1_fp8_kv.json").read_text())
    v1_points = {p["id"]: p["fingerprint"] for s in v1["servers"] for p in s["points"]}
    now = {p.id: p.fingerprint for p in _plan(_fp8_kv_as_first_run(tmp_path)).points}
    assert now.keys() == v1_points.keys()
    # Since then c32 and c128 send more requests (3.5 waves): those fingerprints moved, the rest did not.
    moved = {i for i in now if "/c32/" in i or "/c128/" in i}
    assert {i for i in now if now[i] != v1_points[i]} == moved and len(moved) == 24
    three = _plan(_variant(tmp_path, (LAUNCHES_1, "launches = 3 "), name="three.toml"))
    cold = [s for s in three.launches if s.arm == "cold"]
    assert [s.id for s in cold] == ["quickstart/cold/L1", "quickstart/cold/L2", "quickstart/cold/L3"]
    assert cold[1].points[0].id == "quickstart/cold/L2/short/c1/r1"
    assert (cold[1].points[0].launch, cold[1].points[0].block) == (2, 2)
    # The same point on two launches: different ids and fingerprints; one launch's ids are unique.
    assert cold[0].points[0].fingerprint != cold[1].points[0].fingerprint
    ids = [p.id for p in three.points]
    assert len(ids) == len(set(ids)) == 3 * 2 * 2 * 3
    # Ids do not depend on the block order: a new seed reorders, never renames.
    reseeded = _plan(_variant(tmp_path, (LAUNCHES_1, "launches = 3 "), ("[load]", "[design]\nseed = 3\n\n[load]"),
                              name="three-b.toml"))
    assert {p.id: p.fingerprint for p in reseeded.points} == {p.id: p.fingerprint for p in three.points}


def test_defaults_are_five_launches_of_two_repeats(tmp_path: Path) -> None:
    text = _variant(tmp_path).read_text()
    path = tmp_path / "defaults.toml"
    path.write_text(text.replace(LAUNCHES_1, "# ").replace("repeats = 3", ""))
    plan = _plan(path)
    assert plan.design.launches == {"cold": 5, "warm": 5} and plan.design.repeats == 2
    assert len(plan.launches) == 10 and plan.server_starts == 10


def test_per_arm_launches_leave_later_blocks_to_the_arms_that_have_them(tmp_path: Path) -> None:
    plan = _plan(_variant(tmp_path, (LAUNCHES_1, "launches = 2 "), ('cache = "keep"', 'cache = "keep"\nlaunches = 4')))
    assert [len(b.launches) for b in plan.design.blocks] == [2, 2, 1, 1]
    assert plan.design.blocks[3].launches == ("quickstart/warm/L4",)


def test_kept_cache_first_send_is_not_exchangeable(tmp_path: Path) -> None:
    plan = _plan(_variant(tmp_path, (LAUNCHES_1, "launches = 2 ")))
    for launch in plan.launches:
        marked = [p.id.split("/", 3)[3] for p in launch.points if not p.exchangeable]
        if launch.arm == "warm":
            # c1 r1 sends the 8 prompts first; c4 r1 re-sends the same 8: warm.
            assert marked == ["short/c1/r1"]
            first = launch.points[0]
            assert "cache = keep" in first.not_exchangeable_because and "16 of its 16" in first.not_exchangeable_because
        else:
            assert marked == []
    assert all(p.not_exchangeable_because == "" for p in plan.points if p.exchangeable)


def test_growing_prompt_sets_are_cold_until_covered() -> None:
    plan = compile_study(load_study(ROOT / "studies/prefix_cache_ladder.toml"))
    kept = next(s for s in plan.launches if s.arm == "kept")
    marked = [p.id.rsplit("/", 2)[1:] for p in kept.points if not p.exchangeable]
    # requests [16, 64, 128, 448]: every level sends new prompts in repeat 1 (c128: 320 of its 448).
    assert marked == [["c1", "r1"], ["c8", "r1"], ["c32", "r1"], ["c128", "r1"]]
    assert all(p.exchangeable for s in plan.launches if s.arm == "reset" for p in s.points)


def test_per_point_servers_are_all_cold_alike(tmp_path: Path) -> None:
    plan = _plan(_variant(tmp_path, ('cache = "reset"', 'cache = "reset"\nserver = "per-point"')))
    assert all(p.exchangeable for p in plan.points)
    assert len(plan.launches) == 12 and {s.launch for s in plan.launches} == {1}


def test_replicas_and_data_parallel_size_give_gpus_per_launch(tmp_path: Path) -> None:
    plan = _plan(_variant(
        tmp_path,
        ('cache = "keep"', 'cache = "keep"\nreplicas = 2\nbalance = "round_robin"\ntensor_parallel_size = 2'),
        ('[arms.cold]', '[arms.dp]\ndata_parallel_size = 2\n\n[arms.cold]'),
    ))
    by_arm = {s.arm: s for s in plan.launches}
    warm, dp, cold = by_arm["warm"], by_arm["dp"], by_arm["cold"]
    assert (warm.replicas, warm.gpus_per_server, warm.gpus, warm.balance) == (2, 2, 4, "round_robin")
    assert warm.server_ids == ("quickstart/warm/s1", "quickstart/warm/s2")
    assert (dp.replicas, dp.gpus_per_server, dp.gpus, dp.server_ids) == (1, 2, 2, ("quickstart/dp",))
    assert "--data-parallel-size" in dp.argv
    assert (cold.gpus, cold.balance) == (1, "least_outstanding")
    assert plan.design.max_launch_gpus == 4 and plan.server_starts == 4
    kv = compile_study(load_study(ROOT / "studies/fp8_kv.toml"))
    assert kv.launches[0].server_ids == (kv.launches[0].id,)


@pytest.mark.parametrize(("edit", "said"), [
    (('cache = "keep"', 'cache = "keep"\nreplicas = 0'), ":30: arms.warm.replicas: should be greater than or equal to 1"),
    (('cache = "keep"', 'cache = "keep"\nreplicas = true'), ":30: arms.warm.replicas: should be a valid integer"),
    (('cache = "keep"', 'cache = "keep"\nreplicas = 1.5'), ":30: arms.warm.replicas: should be a valid integer"),
    (('cache = "keep"', 'cache = "keep"\ndata_parallel_size = 0'),
     ":30: arms.warm.data_parallel_size: should be a positive integer (GPUs per server), not 0"),
    (('cache = "keep"', 'cache = "keep"\ndata_parallel_size = true'),
     ":30: arms.warm.data_parallel_size: `--data-parallel-size` takes an integer, not true/false"),
    (("enforce_eager = true", "enforce_eager = true\ntensor_parallel_size = -2"),
     ":19: engine.tensor_parallel_size: should be a positive integer (GPUs per server), not -2"),
    (('cache = "keep"', 'cache = "keep"\nbalance = "random"'), ":30: arms.warm.balance: should be 'least_outstanding' or"),
    (('cache = "keep"', 'cache = "keep"\nreplicas = 4\n\n[design]\ngpus = 2'),
     ":30: arms.warm.replicas: a launch of this arm needs 4 GPUs (4 replica(s) x 1 per server), more than design.gpus = 2"),
    (("repeats = 3", 'repeats = "auto"'), ':41: load.repeats: repeats counts repeats inside one launch; to add blocks'),
    ((LAUNCHES_1, "launches = 0 "), ":40: load.launches: should be greater than or equal to 1"),
])
def test_design_errors_name_file_line_and_key(tmp_path: Path, edit: tuple[str, str], said: str) -> None:
    path = _variant(tmp_path, edit)
    problems = _problems(path)
    assert len(problems) == 1, problems
    assert problems[0].startswith(str(path) + said.split(":", 2)[0] + ":" + said.split(":", 2)[1]), problems
    assert said.split(":", 2)[2] in problems[0], problems


def test_a_clean_design_has_no_problem(tmp_path: Path) -> None:
    path = _variant(tmp_path, ('cache = "keep"', 'cache = "keep"\nreplicas = 2\ndata_parallel_size = 1'),
                    (LAUNCHES_1, "launches = 3 "), ("[load]", "[design]\ngpus = 2\nbudget = { blocks = 6, minutes = 30 }\n\n[load]"))
    assert _problems(path) == []


BUDGET = "[design]\nbudget = { blocks = %s }\n\n[load]"


@pytest.mark.parametrize(("edits", "said"), [
    (((LAUNCHES_1, "launches = 3 "), ("[load]", BUDGET % 2)),
     "design.budget.blocks: 2 blocks is fewer than load.launches = 3 required blocks"),
    (((LAUNCHES_1, "launches = 1 "), ("[load]", BUDGET % 6)),
     "load.launches: a sequential design needs at least 2 launches per arm"),
    (((LAUNCHES_1, "launches = 3 "), ("[load]", BUDGET % 6), ('cache = "keep"', 'cache = "keep"\nlaunches = 4')),
     "arms.warm.launches: per-arm launches and design.budget don't mix"),
    (((LAUNCHES_1, "launches = 3 "), ("[load]", BUDGET % 1)), "design.budget.blocks: should be greater than or equal to 2"),
    (((LAUNCHES_1, "launches = 3 "), ("[load]", "[design]\nbudget = { minutes = 30 }\n\n[load]")),
     "design.budget.blocks: required key is missing"),
    (((LAUNCHES_1, "launches = 3 "), ("[load]", "[design]\nbudget = { blocks = 6, minutes = 0 }\n\n[load]")),
     "design.budget.minutes: should be greater than 0"),
])
def test_budget_validation(tmp_path: Path, edits: tuple[tuple[str, str], ...], said: str) -> None:
    path = _variant(tmp_path, *edits)
    problems = _problems(path)
    assert len(problems) == 1 and said in problems[0], problems
    assert problems[0].startswith(f"{path}:") and problems[0].split(":")[1].isdigit()


def test_budget_lists_sequential_blocks_after_the_required_ones(tmp_path: Path) -> None:
    plan = _plan(_variant(tmp_path, (LAUNCHES_1, "launches = 3 "),
                          ("[load]", "[design]\nbudget = { blocks = 5, minutes = 30 }\n\n[load]")))
    assert [b.required for b in plan.design.blocks] == [True, True, True, False, False]
    assert plan.design.budget is not None and plan.design.budget.minutes == 30
    assert {s.id for s in plan.launches if not s.required} == {
        "quickstart/cold/L4", "quickstart/warm/L4", "quickstart/cold/L5", "quickstart/warm/L5"}
    assert plan.estimated_max_s > plan.estimated_s
    assert plan.server_starts == 6
    # Hypotheses rest on every launch the budget may run.
    batching = next(h for h in plan.hypotheses if h.id == "batching-helps")
    assert len(batching.numerator.launches) == 5 and len(batching.numerator.points) == 15


def test_balance_on_one_replica_is_a_warning_not_an_error(tmp_path: Path) -> None:
    path = _variant(tmp_path, ('cache = "keep"', 'cache = "keep"\nbalance = "round_robin"'))
    loaded, problems = check_file(path)
    assert problems == [] and loaded is not None
    assert [w.path for w in loaded.warnings] == ["arms.warm.balance"]


def test_plans_stored_as_v1_read_back_as_one_block_of_single_launches(tmp_path: Path) -> None:
    plan = Plan.model_validate_json((ROOT / "tests/compiler/golden/plan_v1_fp8_kv.json").read_text())
    assert plan.schema_version == 1 and [s.id for s in plan.launches] == ["fp8-kv/bf16", "fp8-kv/fp8"]
    assert [b.launches for b in plan.design.blocks] == [("fp8-kv/bf16", "fp8-kv/fp8")]
    assert plan.design.seed_from == "none" and plan.design.repeats == 3
    assert all(s.server_ids == (s.id,) and s.gpus == 1 for s in plan.launches)
    assert all(p.launch == 1 and p.block == 1 and p.exchangeable for p in plan.points)
    # The same ids and fingerprints as the plan compiled now: stored runs resume.
    now = {p.id: p.fingerprint for p in _plan(_fp8_kv_as_first_run(tmp_path)).points}
    stored = {p.id: p.fingerprint for p in plan.points}
    assert stored.keys() == now.keys()  # c32 and c128 send more requests since: only those moved
    assert {i for i in now if now[i] != stored[i]} == {i for i in now if "/c32/" in i or "/c128/" in i}
    capacity = next(h for h in plan.hypotheses if h.metric == "kv_capacity_tokens")
    assert capacity.numerator.launches == capacity.numerator.servers == ("fp8-kv/fp8",)


def test_replica_studies_plan_their_gpus() -> None:
    small = compile_study(load_study(ROOT / "studies/replicas_1v2.toml"))
    gpus = {s.arm: (s.replicas, s.gpus_per_server, s.gpus) for s in small.launches}
    assert gpus == {"one": (1, 1, 1), "two": (2, 1, 2), "dp2": (1, 2, 2)}
    assert small.design.gpus == 2 and small.design.max_launch_gpus == 2
    big = compile_study(load_study(ROOT / "studies/replicas_4v8.toml"))
    gpus = {s.arm: (s.replicas, s.gpus) for s in big.launches}
    assert gpus == {"r4-default": (4, 4), "r4-mns64": (4, 4), "r8-default": (8, 8)}
    assert big.design.max_launch_gpus == 8 and big.server_starts == 3 * (4 + 4 + 8)
    knee = next(h for h in big.hypotheses if h.id == "knee-ttft-explodes")
    assert knee.denominator is not None and knee.numerator.concurrency == 1000 and knee.denominator.concurrency == 400


def test_plan_table_shows_blocks_launches_gpus_and_the_estimate() -> None:
    from click.testing import CliRunner

    from studyc.cli import main

    result = CliRunner().invoke(main, ["plan", str(ROOT / "studies/replicas_1v2.toml")])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "3 block(s) of 3 arm(s), 9 launch(es), 2 repeat(s) per launch, 18 point(s)" in out
    # two configurations ("one" and "two" share an argv), each primed once: 2 x 45 s more
    assert "12 server start(s) and 2 unmeasured prime start(s) ~11m25s, GPUs per launch 1/2 of 2 available" in out
    assert "that start is an unmeasured prime, 2 x 45 s more, unless --no-prime" in out
    assert "sequential: up to 3 more block(s)" in out and "block 4  (sequential: only while undecided)" in out
    assert "launch replicas-1v2/two/L1" in out and "2 servers (least_outstanding), 2 GPU(s)" in out
    assert "estimated 15m08s one launch at a time on h200 (server starts 75%)" in out


def test_an_arm_with_the_compile_cache_off_compiles_every_start_and_is_not_primed() -> None:
    from compiler.configurations import compile_cache_off, primed_configurations
    from compiler.plan_table import summary

    plan = compile_study(load_study(ROOT / "studies/warmup_trap.toml"))
    starts = {arm: sorted(s.estimated_start_s for s in plan.launches if s.arm == arm) for arm in ("cold", "warmed")}
    # three required blocks and two of its budget: every cold start compiles, only the warmed arm's first
    assert starts == {"cold": [140.0] * 5, "warmed": [45.0, 45.0, 45.0, 45.0, 140.0]}
    assert primed_configurations(plan.launches) == 1 and plan.prime_s == 45.0
    assert "1 unmeasured prime start(s)" in "\n".join(summary(plan))
    cpu = compile_study(load_study(ROOT / "studies/quickstart.toml"))
    assert cpu.prime_s == 0.0 and '"prime_s"' not in cpu.to_json()  # a CPU plan: no prime, bytes as before
    assert compile_cache_off({"VLLM_DISABLE_COMPILE_CACHE": "true"}) and not compile_cache_off({"VLLM_DISABLE_COMPILE_CACHE": " 0"})


def test_the_plan_counts_a_configuration_as_the_runner_primes_it_options_in_any_order() -> None:
    """Two launches whose argv differ only in the order of their options are one configuration to prime
    (compiler.configurations.configuration, which runner.execute.prime keys on too); another value is another."""
    from compiler.configurations import configuration, primed_configurations

    plan = compile_study(load_study(ROOT / "studies/fp8_weights.toml"))
    bf16 = next(s for s in plan.launches if s.arm == "bf16")
    head, options = list(bf16.argv[:2]), list(bf16.argv[2:])
    pairs = [options[i:i + 2] for i in range(0, len(options), 2)]
    assert all(p[0].startswith("--") and not p[1].startswith("--") for p in pairs)  # this argv: options with values
    swapped = bf16.model_copy(update={"argv": tuple(head + [a for p in reversed(pairs) for a in p])})
    assert swapped.argv != bf16.argv and configuration(swapped) == configuration(bf16)
    assert primed_configurations([bf16, swapped]) == 1
    other = bf16.model_copy(update={"argv": tuple(head + [a for p in pairs for a in p] + ["--enforce-eager"])})
    assert primed_configurations([bf16, swapped, other]) == 2


def _with_minutes(plan: Plan, minutes: float | None, blocks: int = 5) -> Plan:
    from compiler.study import Budget

    design = plan.design.model_copy(update={"budget": Budget(blocks=blocks, minutes=minutes)})
    return plan.model_copy(update={"design": design})


def test_the_plan_warns_where_the_budgets_minutes_end_before_its_blocks() -> None:
    """warmup-trap's budget (five blocks, 12 minutes): by the estimate its three required blocks and prime take
    12m19s, so block 4 would start past the minutes (the runner starts no budget block past them: on an H100 on
    2026-12-05 it ran block 4 and stopped before block 5). The cut-off block starts once the minutes are spent,
    not before (the runner's `>=`), and a required block is never cut."""
    from compiler.plan_table import budget_cutoff, summary

    plan = compile_study(load_study(ROOT / "studies/warmup_trap.toml"))
    block_s = {b: sum(s.estimated_s for s in plan.launches if s.block == b) for b in range(1, 6)}
    four = plan.prime_s + sum(block_s[b] for b in (1, 2, 3))
    assert four == pytest.approx(plan.estimated_s) and four > 12 * 60
    assert budget_cutoff(plan) == (4, pytest.approx(four))
    assert ("  warning: by the estimate, block 4 would start 12m19s in, past the budget's 12 min: blocks 4-5 run "
            "only if the run is faster (a resumed segment has minutes of its own)") in summary(plan)
    assert budget_cutoff(_with_minutes(plan, four / 60)) == (4, pytest.approx(four))  # at the minute: cut
    assert budget_cutoff(_with_minutes(plan, four / 60 + 1e-6)) == (5, pytest.approx(four + block_s[4]))
    assert budget_cutoff(_with_minutes(plan, 0.01)) == (4, pytest.approx(four))  # blocks 1-3 are required
    five = four + block_s[4]
    assert budget_cutoff(_with_minutes(plan, five / 60 + 1e-6)) is None  # block 5 starts inside them
    assert budget_cutoff(_with_minutes(plan, None)) is None
    assert not any("warning: by the estimate" in line for line in summary(_with_minutes(plan, 60)))
    fixed = plan.model_copy(update={"design": plan.design.model_copy(update={"budget": None})})
    assert budget_cutoff(fixed) is None
