"""The target card's notes at their edges (compiler.target_card): each names the card it priced on by the
hardware table's key (or, for a card the table does not hold, its name without "NVIDIA "), and shows the
card in TB/s and TFLOP/s rounded from the card itself. The values sit on a rounding half (exact in binary),
so a note computed from anything but the card reads otherwise."""

from __future__ import annotations

import pytest

from compiler.target_card import Calibration, target_card


def test_a_calibrated_note_names_the_table_key_and_the_card_at_its_rounding() -> None:
    priced = target_card("NVIDIA H100 80GB HBM3", [Calibration("H100 80GB HBM3", 2.375e12, 713.5e12, "r")])
    assert (priced.card.bandwidth_Bps, priced.card.flops_per_s) == (2.375e12, 713.5e12)
    assert priced.note == "priced on h100-sxm's calibration (median of 1 run(s): 2.38 TB/s, 714 TFLOP/s)"


def test_a_spec_scaled_note_gives_the_ratios_and_the_card_at_its_rounding() -> None:
    # H200 measured at 0.546875 of its spec bandwidth, 0.75 of its FLOP/s: a B200 at 4.375 TB/s, 1687.5 TFLOP/s
    priced = target_card("b200", [Calibration("NVIDIA H200", 2.625e12, 741.75e12, "r")])
    assert (priced.card.bandwidth_Bps, priced.card.flops_per_s) == (4.375e12, 1687.5e12)
    assert priced.note == ("no calibration of b200: its spec sheet scaled by the measured-to-spec ratios of h200 "
                           "(bandwidth 0.55, FLOP/s 0.75): 4.38 TB/s, 1688 TFLOP/s")


@pytest.mark.parametrize("asked", ["NVIDIA GeForce RTX 4090", "  NVIDIA GeForce RTX 4090 ", "GeForce RTX 4090"])
def test_a_card_outside_the_table_matches_its_calibrations_with_or_without_nvidia(asked: str) -> None:
    own = Calibration("GeForce RTX 4090", 1.0e12, 165.0e12, "x")
    other = Calibration("NVIDIA GeForce RTX 4080", 0.7e12, 97.0e12, "y")  # a prefix of neither: not matched
    priced = target_card(asked, [own, other])
    assert priced.card.bandwidth_Bps == 1.0e12 and priced.how == "calibrated"
    assert priced.note == "priced on GeForce RTX 4090's calibration (median of 1 run(s): 1.00 TB/s, 165 TFLOP/s)"
    # the run's name carries the prefix, the asked one does not
    assert target_card("GeForce RTX 4090", [Calibration("NVIDIA GeForce RTX 4090", 1.0e12, 165.0e12)]).how == "calibrated"


def test_nvidia_is_a_prefix_only() -> None:
    """A name that merely ends in "NVIDIA " (or spells it in lower case) is not stripped of it."""
    with pytest.raises(ValueError, match="not in the hardware table"):
        target_card("Acme NVIDIA", [Calibration("Acme", 1.0e12, 1.0e14)])
    with pytest.raises(ValueError, match="not in the hardware table"):
        target_card("nvidia Acme", [Calibration("Acme", 1.0e12, 1.0e14)])
