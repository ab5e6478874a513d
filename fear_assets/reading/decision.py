"""The decision rule (protocol 6.2, D5) and the Section 8 reading (protocol 8, D5 Table 8).

Both are pure functions of numbers and labels, fixed before any data are seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Label = Literal["practically_equivalent", "supported", "contrary", "unresolved"]
H5Label = Literal["practically_equivalent", "supported", "contrary", "unresolved", "not_tested"]
LABELS: tuple[str, ...] = ("practically_equivalent", "supported", "contrary", "unresolved")


@dataclass(frozen=True)
class Decision:
    label: Label
    practically_meaningful: bool  # Supported with the whole HDI above the SESOI

    def __iter__(self):  # allows `label, meaningful = fear_assets.label(...)`
        return iter((self.label, self.practically_meaningful))


def label(hdi_low: float, hdi_high: float, sesoi: float) -> Decision:
    """One label per contrast, first match wins (6.2): Practically equivalent (99% HDI inside
    the ROPE of +-SESOI) > Supported (HDI wholly above 0; practically meaningful if wholly
    above the SESOI) > Contrary (wholly below 0) > Unresolved."""
    if not hdi_low <= hdi_high:
        raise ValueError(f"HDI bounds out of order: low {hdi_low} > high {hdi_high}; pass (low, high)")
    if sesoi <= 0:
        raise ValueError(f"SESOI must be positive, got {sesoi}; use the registered 0.15")
    if -sesoi < hdi_low and hdi_high < sesoi:
        return Decision("practically_equivalent", False)
    if hdi_low > 0:
        return Decision("supported", hdi_low > sesoi)
    if hdi_high < 0:
        return Decision("contrary", False)
    return Decision("unresolved", False)


READINGS = {
    1: "NO_READING_CONTROLS_FAILED",
    2: "NO_READING_BINDING_FAILED",
    3: "INCONCLUSIVE",
    4: "SELF_THREAT_DISFAVOURED",
    5: "USE_WITHOUT_REPORT_PRIORITY",
    6: "NO_SELF_THREAT_WEIGHT",
    7: "SELF_THREAT_WEIGHT_GATES_UNDERPOWERED",
    8: "SELF_THREAT_NOT_SPECIFIC",
    9: "SELF_THREAT_WEIGHT_GATES_INCONCLUSIVE",
    10: "CONSISTENT_WITH_FRAMEWORK",
    11: "SELF_THREAT_WEIGHT_USE_NOT_SHOWN",
    12: "SELF_THREAT_WEIGHT_USE_UNRESOLVED_OR_NOT_TESTED",
}


@dataclass(frozen=True)
class Reading:
    code: str
    row: int
    qualifiers: tuple[str, ...]
    failed_gates: tuple[str, ...] = ()

    @property
    def descriptive_only(self) -> bool:
        return self.row == 1


def _check(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def section8_reading(h2: str, h5: str, gate_a: str, gate_b: str, gate_c: str, controls_failed: bool,
                     binding_failed: bool, gates_underpowered: bool, h2_meaningful: bool | None = None) -> Reading:
    """The reading code of one configuration (D5 Table 8, first matching row wins) with the
    qualifiers the protocol requires. ``h2_meaningful``: whether a Supported H2 lies wholly
    above the SESOI (None: unknown, treated as not shown)."""
    _check("h2", h2, LABELS)
    _check("h5", h5, (*LABELS, "not_tested"))
    for name, gate in (("gate_a", gate_a), ("gate_b", gate_b), ("gate_c", gate_c)):
        _check(name, gate, LABELS)
    qualifiers: list[str] = []
    if h2 == "supported" and not h2_meaningful:
        qualifiers.append("not shown to be practically meaningful")
    if h2 == "contrary":
        qualifiers.append("evidence that threats to the self are disfavoured")
    if controls_failed:
        return Reading(READINGS[1], 1, ("all results descriptive", *qualifiers))
    if binding_failed:
        return Reading(READINGS[2], 2, ("H2-H5 uninterpretable", *qualifiers))
    if h2 == "unresolved":
        return Reading(READINGS[3], 3, tuple(qualifiers))
    if h2 == "contrary":
        return Reading(READINGS[4], 4, tuple(qualifiers))
    if h2 == "practically_equivalent":
        return Reading(READINGS[5 if h5 == "supported" else 6], 5 if h5 == "supported" else 6, tuple(qualifiers))
    # H2 Supported
    if gates_underpowered:
        return Reading(READINGS[7], 7, tuple(qualifiers))
    fail = {"practically_equivalent", "contrary"}
    failed = tuple(name for name, gate in (("a", gate_a), ("b", gate_b), ("c", gate_c)) if gate in fail)
    if failed:
        return Reading(READINGS[8], 8, (*qualifiers, "failed gate(s): " + ", ".join(f"({g})" for g in failed)), failed)
    if "unresolved" in (gate_a, gate_c):  # an Unresolved gate (b) counts as a pass
        return Reading(READINGS[9], 9, tuple(qualifiers))
    if h5 == "supported":
        return Reading(READINGS[10], 10, tuple(qualifiers))
    if h5 in ("practically_equivalent", "contrary"):
        return Reading(READINGS[11], 11, tuple(qualifiers))
    return Reading(READINGS[12], 12, tuple(qualifiers))
