"""An arm's own `warmup` overrides load.warmup for that arm's points only (studies/warmup_trap.toml:
an under-warmed arm beside a warmed one); a study that sets none plans exactly as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from compiler.load import check_file, load_study
from compiler.plan import Plan
from compiler.plan_compile import compile_study
from tests.variants import study_variant

COLD_ARM = 'description = "Prefix cache reset and verified before every point"'


def _variant(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    return study_variant(tmp_path, *edits)


def _plan(path: Path) -> Plan:
    return compile_study(load_study(path))


def _points(plan: Plan, arm: str) -> dict[str, tuple[int, str, float]]:
    return {p.id: (p.warmup, p.fingerprint, p.estimated_s) for s in plan.launches if s.arm == arm for p in s.points}


def test_an_arm_warmup_overrides_load_warmup_for_that_arm_only(tmp_path: Path) -> None:
    before = _plan(_variant(tmp_path))
    after = _plan(_variant(tmp_path, (COLD_ARM, COLD_ARM + "\nwarmup = 0")))
    cold = _points(after, "cold")
    assert cold and {w for w, _, _ in cold.values()} == {0}
    assert {w for w, _, _ in _points(after, "warm").values()} == {4}  # load.warmup
    # the other arm's points are the same points; the overriding arm's are new ones (fingerprint, estimate)
    assert _points(after, "warm") == _points(before, "warm")
    old = _points(before, "cold")
    assert set(cold) == set(old)
    assert all(cold[i][1] != old[i][1] and cold[i][2] < old[i][2] for i in cold)


def test_an_arm_warmup_equal_to_load_warmup_plans_the_same_points(tmp_path: Path) -> None:
    before = _plan(_variant(tmp_path))
    same = _plan(_variant(tmp_path, (COLD_ARM, COLD_ARM + "\nwarmup = 4")))
    assert [p.model_dump() for p in same.points] == [p.model_dump() for p in before.points]
    assert [s.argv for s in same.launches] == [s.argv for s in before.launches]


def test_an_arm_warmup_is_not_a_vllm_serve_option(tmp_path: Path) -> None:
    plan = _plan(_variant(tmp_path, (COLD_ARM, COLD_ARM + "\nwarmup = 32")))
    cold = next(s for s in plan.launches if s.arm == "cold")
    assert "--warmup" not in cold.argv
    assert all(p.warmup == 32 for p in cold.points)
    assert load_study(_variant(tmp_path, (COLD_ARM, COLD_ARM + "\nwarmup = 32"))).study.arms["cold"].args == {}


@pytest.mark.parametrize(("value", "said"), [
    ("-1", "arms.cold.warmup: should be greater than or equal to 0"),
    ("true", "arms.cold.warmup:"),
    ('"none"', "arms.cold.warmup:"),
])
def test_a_bad_arm_warmup_names_file_line_and_key(tmp_path: Path, value: str, said: str) -> None:
    path = _variant(tmp_path, (COLD_ARM, COLD_ARM + f"\nwarmup = {value}"))
    _, problems = check_file(path)
    messages = [str(p) for p in problems]
    assert len(messages) == 1, messages
    assert messages[0].startswith(f"{path}:26: "), messages
    assert said in messages[0], messages
