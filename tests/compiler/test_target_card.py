"""The card a GPU's predictions are priced on: matched through the hardware table, its calibrations where
there are any, else its spec sheet scaled by the calibrated GPUs' measured-to-spec ratios."""

from __future__ import annotations

import pytest

from compiler.hardware import HARDWARE, hardware_key
from compiler.target_card import Calibration, spec_ratios, target_card

# Two real stored calibrations (results/h200): roofline-h100 20261206T095824-45d4b3 on an H100,
# five-models 20261205T045355-fc2a00 on an H200.
H100 = Calibration("H100 80GB HBM3", 3044659627205.949, 711418566153706.4, "20261206T095824-45d4b3")
H200 = Calibration("H200", 4230727984753.3667, 672027125751420.8, "20261205T045355-fc2a00")


def test_gpu_names_as_runs_record_them_match_the_table():
    assert hardware_key("NVIDIA H100 80GB HBM3") == "h100-sxm"  # the stored runs' nvidia-smi name
    assert hardware_key("H100 80GB HBM3") == hardware_key("h100-sxm") == "h100-sxm"
    assert hardware_key("NVIDIA H200") == "h200"
    assert hardware_key("NVIDIA GeForce RTX 4090") is None and hardware_key(None) is None and hardware_key("") is None


def test_a_calibrated_gpu_is_priced_on_the_median_of_its_calibrations():
    slower = Calibration("NVIDIA H100 80GB HBM3", 2.9e12, 7.0e14, "b")
    faster = Calibration("h100-sxm", 3.1e12, 7.2e14, "c")
    priced = target_card("h100-sxm", [H100, slower, faster, H200])
    assert priced.how == "calibrated"
    assert priced.card.bandwidth_Bps == pytest.approx(3.0446596e12) and priced.card.flops_per_s == pytest.approx(7.114e14, rel=1e-3)
    assert "median of 3 run(s)" in priced.note


def test_an_uncalibrated_gpu_gets_its_spec_sheet_scaled_by_the_calibrated_ones():
    priced = target_card("a100-80gb", [H100, H200])
    r100 = (H100.bandwidth_Bps / 3.35e12, H100.flops_per_s / 989e12)
    r200 = (H200.bandwidth_Bps / 4.8e12, H200.flops_per_s / 989e12)
    assert spec_ratios([H100, H200]) == {"h100-sxm": pytest.approx(r100), "h200": pytest.approx(r200)}
    assert priced.how == "spec-scaled"
    bw, flops = (r100[0] + r200[0]) / 2, (r100[1] + r200[1]) / 2  # the median of two: their mean
    assert priced.card.bandwidth_Bps == pytest.approx(HARDWARE["a100-80gb"].bandwidth_Bps * bw)
    assert priced.card.flops_per_s == pytest.approx(HARDWARE["a100-80gb"].flops_bf16 * flops)
    assert "no calibration of a100-80gb" in priced.note and "h100-sxm, h200" in priced.note
    # H100 from the H200's ratios alone: within 4% of its measured bandwidth, 7% of its FLOP/s
    alone = target_card("h100-sxm", [H200]).card
    assert alone.bandwidth_Bps == pytest.approx(H100.bandwidth_Bps, rel=0.04)
    assert alone.flops_per_s == pytest.approx(H100.flops_per_s, rel=0.07)


def test_a_nominal_entry_never_sets_the_ratios():
    cpu = Calibration("cpu", 1.5e10, 2e11, "cpu-run")
    assert spec_ratios([cpu]) == {}
    with pytest.raises(ValueError, match="no calibrated GPU to scale"):
        target_card("h200", [cpu])


def test_a_card_neither_in_the_table_nor_calibrated_has_no_card():
    with pytest.raises(ValueError, match="not in the hardware table and no run calibrated it"):
        target_card("NVIDIA GeForce RTX 4090", [H100, H200])
    own = Calibration("GeForce RTX 4090", 9e11, 1.5e14, "x")  # not in the table, but calibrated: its own
    assert target_card("GeForce RTX 4090", [own, H200]).card.bandwidth_Bps == 9e11
