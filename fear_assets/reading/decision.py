"""The Section 8 reading (protocol 8, D5 Table 8): a pure function of the labels 6.2's rule
(``models.decision``) gives, fixed before any data are seen.
"""

from __future__ import annotations

from dataclasses import dataclass

from fear_assets.models.decision import ESTIMATION_ONLY, GATE_LABELS, LABELS, NOT_SCORED, POWER_GATE_NOT_RUN

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
    not_scored_gates: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()

    @property
    def descriptive_only(self) -> bool:
        return self.row == 1

    @property
    def h2_readable(self) -> bool:
        """Whether H2's label may be read as a result: not under row 1 (all results
        descriptive) nor row 2 (H2-H5 uninterpretable). Only such a family can enter the
        cross-family statement (6.2)."""
        return self.row not in (1, 2)


def _check(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def section8_reading(h2: str, h5: str, gate_a: str, gate_b: str, gate_c: str, controls_failed: bool,
                     binding_failed: bool, gates_underpowered: bool | None,
                     h2_meaningful: bool | None = None) -> Reading:
    """The reading code of one configuration (D5 Table 8, first matching row wins) with the
    qualifiers the protocol requires. ``h2_meaningful``: whether a Supported H2 lies wholly
    above the SESOI (None: unknown, treated as not shown).

    ``binding_failed``: the in-context binding pass rate is below 90% (4.2; D5 row 2). A
    frame-writing shortfall of the single-sentence checks is a registration gate, not this.

    ``gates_underpowered``: the power rule of 6.3 made the gates descriptive (row 7). None
    means the power simulation has not run: nothing made the gates descriptive, so they are
    read as registered, and the reading carries the flag ``power_gate_not_run``.

    A gate may be ``not_scored`` (its block or outcome was not scored). Reading taken, since
    6.2 and Table 8 only name labels: a gate that was not scored never passes (rows 10-12
    need every gate to pass) and never fails (row 8 needs a Practically equivalent or
    Contrary label, which is evidence the gate lacks). It is read like an inconclusive gate:
    row 9 ``SELF_THREAT_WEIGHT_GATES_INCONCLUSIVE``, with the qualifier naming the gate. This
    holds for gate (b) too: its Unresolved counts as a pass because the branch was run and
    merely did not decide, whereas a branch that was not scored has shown nothing. Under
    row 8 a not-scored gate is named beside the failed one.

    ``h5`` may be ``estimation_only`` (declared before collection, 6.3): it never counts as
    Supported, so with H2 Supported and the gates passing it gives row 12 (D5: "H5 Unresolved
    or estimation-only"), and with H2 Practically equivalent row 6. ``h2`` may be
    ``estimation_only`` too (its own 6.3 targets missed at 100 frames). Reading taken, since
    Table 8 names no row for it: an estimation-only H2 has no label, and 6.2 gives an H2
    without a label "no reading ... reported as inconclusive", so it reads as row 3 with the
    qualifier saying why."""
    _check("h2", h2, (*LABELS, ESTIMATION_ONLY))
    _check("h5", h5, (*LABELS, "not_tested", ESTIMATION_ONLY))
    for name, gate in (("gate_a", gate_a), ("gate_b", gate_b), ("gate_c", gate_c)):
        _check(name, gate, GATE_LABELS)
    flags = (POWER_GATE_NOT_RUN,) if gates_underpowered is None else ()
    gates = (("a", gate_a), ("b", gate_b), ("c", gate_c))
    not_scored = tuple(name for name, gate in gates if gate == NOT_SCORED)
    qualifiers: list[str] = []
    if h2 == "supported" and not h2_meaningful:
        qualifiers.append("not shown to be practically meaningful")
    if h2 == "contrary":
        qualifiers.append("evidence that threats to the self are disfavoured")

    def reading(row: int, extra: tuple[str, ...] = (), failed: tuple[str, ...] = ()) -> Reading:
        return Reading(READINGS[row], row, (*extra, *qualifiers) if row in (1, 2) else (*qualifiers, *extra),
                       failed, not_scored, flags)

    if controls_failed:
        return reading(1, ("all results descriptive",))
    if binding_failed:
        return reading(2, ("H2-H5 uninterpretable",))
    if h2 == ESTIMATION_ONLY:
        return reading(3, ("H2 declared estimation-only before collection (6.3): reported with its interval, "
                           "no reading",))
    if h2 == "unresolved":
        return reading(3)
    if h2 == "contrary":
        return reading(4)
    if h2 == "practically_equivalent":
        return reading(5 if h5 == "supported" else 6)
    # H2 Supported
    if gates_underpowered:
        return reading(7)
    unscored = ("gate(s) not scored, so they cannot pass: " + ", ".join(f"({g})" for g in not_scored),) \
        if not_scored else ()
    fail = {"practically_equivalent", "contrary"}
    failed = tuple(name for name, gate in gates if gate in fail)
    if failed:
        return reading(8, ("failed gate(s): " + ", ".join(f"({g})" for g in failed), *unscored), failed)
    if "unresolved" in (gate_a, gate_c) or not_scored:  # an Unresolved gate (b) counts as a pass
        return reading(9, unscored)
    if h5 == "supported":
        return reading(10)
    if h5 in ("practically_equivalent", "contrary"):
        return reading(11)
    return reading(12)
