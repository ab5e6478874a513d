"""The decision rule and the Section 8 reading over every combination (protocol 6.2, 8; D5)."""

import itertools

import pytest

import fear_assets
from fear_assets.models.decision import LABELS
from fear_assets.reading.decision import READINGS

SESOI = 0.15


@pytest.mark.parametrize("low, high, expected, meaningful", [
    (-0.14, 0.14, "practically_equivalent", False),
    (0.02, 0.14, "practically_equivalent", False),   # small positive inside the ROPE: equivalent wins
    (-0.15, 0.10, "unresolved", False),              # touching the ROPE edge is not inside it
    (0.01, 0.40, "supported", False),
    (0.16, 0.40, "supported", True),
    (0.15, 0.40, "supported", False),                # wholly above the SESOI means strictly above
    (-0.40, -0.01, "contrary", False),
    (-0.05, 0.30, "unresolved", False),
    (-0.30, 0.0, "unresolved", False),
])
def test_label(low, high, expected, meaningful):
    decision = fear_assets.label(low, high, SESOI)
    assert (decision.label, decision.practically_meaningful) == (expected, meaningful)


def test_label_rejects_bad_input():
    with pytest.raises(ValueError, match="out of order"):
        fear_assets.label(0.3, 0.1, SESOI)
    with pytest.raises(ValueError, match="SESOI"):
        fear_assets.label(0.1, 0.3, 0)


def _expected(h2, h5, a, b, c, controls, binding, underpowered):
    """Table 8 written out independently, row by row."""
    if controls:
        return 1
    if binding:
        return 2
    if h2 == "unresolved":
        return 3
    if h2 == "contrary":
        return 4
    if h2 == "practically_equivalent":
        return 5 if h5 == "supported" else 6
    if underpowered:
        return 7
    if a in ("practically_equivalent", "contrary") or b in ("practically_equivalent", "contrary") \
            or c in ("practically_equivalent", "contrary"):
        return 8
    if a == "unresolved" or c == "unresolved":
        return 9
    if h5 == "supported":
        return 10
    if h5 in ("practically_equivalent", "contrary"):
        return 11
    return 12


def test_every_combination_of_labels_and_flags():
    h5_labels = (*LABELS, "not_tested")
    seen = set()
    for h2, h5, a, b, c, controls, binding, underpowered in itertools.product(
            LABELS, h5_labels, LABELS, LABELS, LABELS, (False, True), (False, True), (False, True)):
        reading = fear_assets.section8_reading(h2, h5, a, b, c, controls, binding, underpowered)
        row = _expected(h2, h5, a, b, c, controls, binding, underpowered)
        assert (reading.row, reading.code) == (row, READINGS[row]), (h2, h5, a, b, c, controls, binding, underpowered)
        seen.add(row)
    assert seen == set(READINGS)  # every row of Table 8 is reachable


def test_qualifiers():
    r = fear_assets.section8_reading("supported", "supported", "supported", "unresolved", "supported",
                                     False, False, False, h2_meaningful=False)
    assert r.code == "CONSISTENT_WITH_FRAMEWORK" and "not shown to be practically meaningful" in r.qualifiers
    r = fear_assets.section8_reading("supported", "supported", "contrary", "supported", "supported",
                                     False, False, False, h2_meaningful=True)
    assert r.code == "SELF_THREAT_NOT_SPECIFIC" and r.failed_gates == ("a",) and not any(
        "practically meaningful" in q for q in r.qualifiers)
    r = fear_assets.section8_reading("contrary", "not_tested", "unresolved", "unresolved", "unresolved",
                                     False, False, False)
    assert "disfavoured" in " ".join(r.qualifiers)
    assert fear_assets.section8_reading("supported", "supported", "supported", "supported", "supported",
                                        True, False, False).descriptive_only


def test_bad_labels_are_rejected():
    with pytest.raises(ValueError, match="h2 must be one of"):
        fear_assets.section8_reading("yes", "supported", "supported", "supported", "supported", False, False, False)
