"""Placement: device slots, rotation with the blocks (an arm never stays on one device), client CPUs
split between concurrent launches, devices per replica, --gpus parsing."""

from __future__ import annotations

from collections import defaultdict

import pytest

from base.errors import StudycError
from compiler.load import load_studies
from compiler.plan_compile import compile_study
from runner.server.placement import parse_gpus, place, rotated_slot, slots, split_cpus
from tests.conftest import REPO


@pytest.fixture
def two_arms_four_blocks(tmp_path):
    study = (REPO / "studies/quickstart.toml").read_text().replace("launches = 3 ", "launches = 4 ")
    path = tmp_path / "two_arms.toml"
    path.write_text(study.replace('"../models/tiny-qwen3"', f'"{REPO / "models/tiny-qwen3"}"'))
    return compile_study(load_studies([path])[0])


def test_rotation_moves_every_arm_across_slots(two_arms_four_blocks) -> None:
    plan = two_arms_four_blocks
    placed = place(plan, ("0", "1"), gpu_host=False)
    seen = defaultdict(list)
    for launch, p in zip(plan.launches, placed, strict=True):
        seen[launch.arm].append(p.slot)
    for arm, got in seen.items():
        assert sorted(set(got)) == [0, 1], arm
        assert got.count(0) == got.count(1) == 2, arm
    for b in range(1, 5):  # in every block the two arms are on different slots (they run side by side)
        assert {p.slot for launch, p in zip(plan.launches, placed, strict=True) if launch.block == b} == {0, 1}


def test_one_device_puts_everything_on_slot_zero(two_arms_four_blocks) -> None:
    placed = place(two_arms_four_blocks, ("0",), gpu_host=False)
    assert {p.slot for p in placed} == {0} and {p.devices for p in placed} == {("0",)}


def test_rotated_slot_formula() -> None:
    assert [rotated_slot(0, b, 2) for b in (1, 2, 3)] == [0, 1, 0]
    assert [rotated_slot(1, b, 2) for b in (1, 2, 3)] == [1, 0, 1]
    assert rotated_slot(5, 1, 1) == 0


def test_slots_cut_devices_into_groups() -> None:
    assert slots(("0", "1", "2", "3"), 2) == [("0", "1"), ("2", "3")]
    assert slots(("0", "1", "2"), 2) == [("0", "1")]


def test_client_cpus_split_between_launches() -> None:
    assert split_cpus((1, 2, 3, 4, 5), 2) == [(1, 2, 3), (4, 5)]
    assert split_cpus((1,), 2) == [(1,), (1,)]  # fewer CPUs than launches: shared
    assert split_cpus(None, 3) == [None, None, None]
    assert split_cpus((1, 2), 1) == [(1, 2)]


def test_parse_gpus() -> None:
    assert parse_gpus("0,1") == ("0", "1")
    assert parse_gpus("0-2,1") == ("0", "1", "2")
    with pytest.raises(StudycError, match="--gpus"):
        parse_gpus("a")
    with pytest.raises(StudycError, match="--gpus"):
        parse_gpus("-1")


def test_gpu_host_refuses_a_launch_larger_than_the_devices(two_arms_four_blocks) -> None:
    plan = two_arms_four_blocks
    big = plan.model_copy(update={"launches": tuple(
        launch.model_copy(update={"replicas": 2, "gpus": 2}) for launch in plan.launches)})
    with pytest.raises(StudycError, match="needs 2 GPUs"):
        place(big, ("0",), gpu_host=True)
    placed = place(big, ("0", "1"), gpu_host=True)
    assert {p.server_devices for p in placed} == {(("0",), ("1",))}
    shared = place(big, ("0",), gpu_host=False)  # CPU: logical devices are slots, servers share them
    assert {p.server_devices for p in shared} == {(("0",), ("0",))}


def test_interference_gate_rule() -> None:
    from runner.execute.parallel import interference_result

    calm = interference_result("p", [100.0, 98.0], 97.0, "other")  # 2% gap: threshold 4%, effect 2%
    assert calm["parallel"] and calm["threshold"] == pytest.approx(2 * 2 / 99)
    loud = interference_result("p", [100.0, 99.5], 80.0, "other")  # 20% slower, noise 0.5%: gated
    assert not loud["parallel"] and loud["effect"] == pytest.approx(1 - 80 / 99.75)
    floor = interference_result("p", [100.0, 100.0], 100.9, "other")  # no noise: the 1% floor applies
    assert floor["parallel"]
    missing = interference_result("p", [100.0, None], 90.0, None)  # fails closed: one at a time
    assert not missing["parallel"] and missing["effect"] is None
