"""What the Section 8 reading reads (protocol 6.2, 6.3, 8; D5): the labels and flags of one
configuration, taken from its estimands (the ``posteriors`` table) and its registration
record, and the cross-family statement over the configurations' readings.

Pure functions of tables and the record's JSON, so the rules that decide a reading sit
under the registered code hash (``reading/``) rather than in the Dagster wiring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import pandas as pd

from fear_assets.analysis.estimands import READING_KINDS, convergence_split
from fear_assets.core.errors import FearAssetsError
from fear_assets.models.decision import ESTIMATION_ONLY, NOT_SCORED
from fear_assets.registration.gates import POWER_FIELD, declared_estimation_only, registered_power_result

GATE_CONTRASTS = {"gate_a": "gate_a_service_relevance_H2", "gate_b": "gate_b_recall_H2",
                  "gate_c": "gate_c_judge_H2_difference"}
#: The record fields the reading reads (written by the ``registration_record`` asset).
BINDING_FIELD = "binding_in_context"


def _label(by: pd.DataFrame, name: str, missing: str) -> str:
    if name not in by.index or by.loc[name, "status"] != "estimated" or not by.loc[name, "label"]:
        return missing
    return str(by.loc[name, "label"])


def binding_in_context_failed(record: Mapping[str, Any]) -> bool:
    """D5 row 2: the in-context binding pass rate (4.2) is below 90%. A rate that was not
    measured (no in-context documents scored) has not shown the binding either, so it counts
    as failed; the record's message says which. The single-sentence checks' frame-writing
    shortfall is not read here: it is a registration gate (the record's ``gates``)."""
    entry = record.get(BINDING_FIELD)
    if not isinstance(entry, Mapping) or not isinstance(entry.get("passed"), bool):
        raise FearAssetsError(
            f"registration record of family {record.get('family')!r}: field {BINDING_FIELD!r} is "
            f"{entry!r}; it must hold the in-context binding outcome ({{'passed': true/false, ...}}). "
            "Fix: re-materialise registration_record for this family")
    return not entry["passed"]


def gates_underpowered(record: Mapping[str, Any]) -> bool | None:
    """Whether the power rule of 6.3 made the gates descriptive, from the stored power result
    in the record (``record['power']['gates_underpowered']``); None when no power result is
    stored, i.e. the simulation has not run (the reading then carries ``power_gate_not_run``).
    A reduced demo or an incomplete simulation decides nothing, so it reads as not run too."""
    power = record.get(POWER_FIELD)
    if not registered_power_result(power):
        return None
    value = power.get("gates_underpowered") if isinstance(power, Mapping) else None
    if not isinstance(value, bool):
        raise FearAssetsError(
            f"registration record of family {record.get('family')!r}: field "
            f"{POWER_FIELD}.gates_underpowered is {value!r}; the stored power result must say true or false "
            "(6.3: whether the gates are the source of a shortfall). Fix: re-run power_summary, then "
            "registration_record")
    return value


def reading_inputs(posteriors: pd.DataFrame, record: Mapping[str, Any]) -> dict:
    """Labels and flags of D5's table from the estimands and the record. A gate that was
    not scored is ``not_scored`` (it cannot pass; see ``section8_reading``), an H5 that was
    not scored is ``not_tested``, controls that were not run count as not passed. A
    hypothesis the record declares estimation-only reads ``estimation_only`` whatever its
    posterior says (H5: D5 row 12), so the declaration holds even on an unrelabelled table."""
    declared = declared_estimation_only(record)
    by = posteriors.set_index("contrast")
    controls = posteriors[posteriors["kind"] == "control"]
    passed = controls["control_passed"] if "control_passed" in controls else pd.Series(False, index=controls.index)
    controls_failed = bool(len(controls) == 0 or not all(v is True or v == 1 for v in passed.tolist()))
    binding = record.get(BINDING_FIELD) or {}
    h2 = ESTIMATION_ONLY if "H2" in declared else _label(by, "H2", "unresolved")
    return {"h2": h2, "h5": ESTIMATION_ONLY if "H5" in declared else _label(by, "H5", "not_tested"),
            **{gate: _label(by, name, NOT_SCORED) for gate, name in GATE_CONTRASTS.items()},
            "controls_failed": controls_failed, "binding_failed": binding_in_context_failed(record),
            "gates_underpowered": gates_underpowered(record),
            "h2_meaningful": bool(by.loc["H2", "practically_meaningful"]) if "H2" in by.index and h2 != ESTIMATION_ONLY
            else False,
            "in_context": f"{binding.get('correct', '?')}/{binding.get('documents', '?')}"}


@dataclass(frozen=True)
class CrossFamily:
    labels: dict[str, str]  # H2 label of every family that may enter the statement
    missing: list[str]  # registered families with no reading yet
    descriptive: dict[str, int]  # families whose reading is row 1 or 2 -> that row
    statement: str


def cross_family_statement(readings: pd.DataFrame, registered: Sequence[str]) -> CrossFamily:
    """6.2: "A statement about current language models in general requires the same label on
    H2 in all three families." ``readings`` has one row per family (``family``, ``h2``,
    ``row``). A family whose reading is row 1 (controls failed: all results descriptive) or
    row 2 (binding failed: H2-H5 uninterpretable) has no H2 label to compare, so it cannot
    enter the statement, and without it there is no statement."""
    have = readings[readings["family"].isin(registered)]
    rows = dict(zip(have["family"], have["row"].astype(int)))
    descriptive = {k: r for k, r in rows.items() if r in (1, 2)}
    labels = {k: v for k, v in zip(have["family"], have["h2"]) if k not in descriptive}
    missing = [k for k in registered if k not in rows]
    if missing:
        statement = f"no general statement: no reading yet for {', '.join(missing)}"
    elif descriptive:
        statement = ("no general statement: H2 has no readable label in " + ", ".join(
            f"{k} (row {r}: {'all results descriptive' if r == 1 else 'H2-H5 uninterpretable'})"
            for k, r in descriptive.items()))
    elif len(set(labels.values())) == 1:
        statement = (f"H2 is {next(iter(labels.values()))} in all {len(labels)} families: a statement about "
                     "current language models may be made")
    else:
        statement = ("no general statement: the families' H2 labels differ ("
                     + ", ".join(f"{k} {v}" for k, v in labels.items()) + ")")
    return CrossFamily(labels, missing, descriptive, statement)


def reading_flags(reading, args: Mapping[str, Any], posteriors: pd.DataFrame) -> list[str]:
    """Every flag the Section 8 reading carries (8; D5): the decision's own, the estimands'
    (failed gates, pilot-only, stand-ins), binding below the registered rate, gates not
    scored, non-converged labels (not to be read) and secondary rows not converged."""
    not_converged, secondary_not_converged = convergence_split(posteriors)
    flags = [*reading.flags, *(f for f in str(posteriors["failed_gates"].iloc[0]).split("; ") if f)]
    if args["binding_failed"] and reading.row != 2:
        flags.append(f"in-context binding {args['in_context']} below the registered rate: H2-H5 uninterpretable")
    if reading.not_scored_gates:
        flags.append("gate(s) not scored, cannot pass: " + ", ".join(f"({g})" for g in reading.not_scored_gates))
    if len(not_converged):
        flags.append("NOT CONVERGED: " + ", ".join(not_converged["contrast"]) + " (labels not to be read)")
    if len(secondary_not_converged):
        flags.append("H4/secondary/sensitivity not converged (cannot change the reading): "
                     + ", ".join(secondary_not_converged["contrast"]))
    declared = posteriors[(posteriors["kind"] == "confirmatory") & (posteriors["label"] == ESTIMATION_ONLY)]
    if len(declared):
        flags.append("estimation-only, declared before collection (interval reported, no label): "
                     + ", ".join(declared["contrast"]))
    not_scored = posteriors[posteriors["status"].isin(["not_scored", "not_available"]) &
                            posteriors["kind"].isin(READING_KINDS)]
    if len(not_scored):
        flags.append("not scored in this design: " + ", ".join(not_scored["contrast"]))
    return flags
