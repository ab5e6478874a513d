"""The registration gates as a researcher reads them: one row per gate with its outcome,
its numbers as text and what to do next for it (Appendix C step 4).

Presentation only: the gates' verdicts, numbers and messages are decided in
``registration.pilot_gates`` and ``registration.gates``; this module writes them (every
number through ``core.numbers``, no Python reprs) so the ``registration_gates`` check, the
``registration_record`` asset and the record's Markdown show the same rows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pandas as pd

from fear_assets.core.numbers import MISSING, Quantity, is_missing, number, passed_failed

#: Columns of the gate table, in the order a reader reads a row.
GATE_COLUMNS = ("gate", "outcome", "numbers", "fix")
#: The fix of a gate that passed.
NO_FIX = "none"

#: What the researcher does next for a failed gate, by the gate's name (before its section);
#: where the gate's message itself lists what to write or rewrite, the fix is that message
#: followed by what to re-run.
FIXES: Mapping[str, str] = {
    "name_gate": "take the five names name_candidates proposes (single-token in every tokenizer), apply them "
                 "as a settings amendment (4.2), then re-run name_gate and the pilot",
    "matching": "re-run sentence_surprisal, matched_frames and registration_record (4.3)",
    "zero_preference": "re-run zero_preference and registration_record (4.3)",
    "binding single-sentence": "run the new frames through the pilot gates, then binding_results and "
                               "registration_record",
    "scorer_agreement": "revise the keyword rule on pilot data and rescore (report_scoring) before "
                        "registration (4.5)",
    "probe rules": "materialise pilot_probe_outputs for the family, then registration_record (6.1, 6.3)",
    "positive_controls": "strengthen the failing controls' manipulations (4.6 allows this once, before "
                         "registration), then re-run pilot_control_scores, pilot_controls and registration_record",
    "frame_selection": "run the new frames through the pilot gates, then registration_record (4.3)",
    "gate_c_scale": "check the pilot's report scores for a few extreme Deltas (a scoring fault gives the "
                    "Student-t residual nu <= 2); if the scores are right, gate (c)'s scale needs a protocol "
                    "amendment before registration (6.2 standardises by a residual SD, which does not exist here)",
}
#: The power gate's fix depends on why it failed (``registration.gates.power_gate``).
POWER_FIXES: Mapping[str, str] = {
    "none": "materialise power_summary for the family, then registration_record (6.3, Appendix C step 3)",
    "demo": "run the registered power simulation (a registered family's power_simulation batches, then "
            "power_summary and registration_record); the embedded demo's reduced simulation decides nothing",
    "partial": "simulate the missing blocks or frame counts (power_simulation), then power_summary and "
               "registration_record (6.3)",
    "controls": "strengthen the positive controls' manipulations once in the pilot (6.3); if still short, the "
                "configuration is not run",
}


def gate_key(name: str) -> str:
    """A gate's name without its section: ``"matching (4.3)"`` -> ``"matching"``."""
    return name.split(" (")[0].strip()


def _quantity(key: str, value: Any) -> Quantity:
    words = key.lower().split()
    if "p" in words:
        return "p"
    if "kappa" in words:
        return "kappa"
    if "rate" in words:
        return "rate"
    return "count" if isinstance(value, int) and not isinstance(value, bool) else "estimate"


def value_text(key: str, value: Any) -> str:
    """One number of a gate as text: flags yes/no, missing n/a, numbers by quantity, a
    mapping or list as its items (never a Python or JSON repr)."""
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {value_text(str(k), v)}" for k, v in value.items()) or NO_FIX
    if isinstance(value, (list, tuple)):
        return ", ".join(value_text(key, v) for v in value) or NO_FIX
    if is_missing(value):
        return MISSING
    return number(value, _quantity(key, value))


def numbers_text(numbers: Mapping[str, Any] | str | None) -> str:
    """A gate's numbers as one line, ``key value; key value`` (the stored JSON is read first)."""
    if isinstance(numbers, str):
        numbers = json.loads(numbers) if numbers.strip() else {}
    if not numbers:
        return NO_FIX
    return "; ".join(f"{k}: {value_text(str(k), v)}" for k, v in numbers.items())


def _power_reason(message: str) -> str:
    if "has not run" in message:
        return "none"
    if "reduced demo" in message:
        return "demo"
    if "positive controls" in message:
        return "controls"
    return "partial"


def gate_fix(name: str, passed: bool, message: str) -> str:
    """What the researcher does next for one gate: ``none`` when it passed; otherwise the
    gate's fix, with the message's own list of what to write where it has one."""
    if passed:
        return NO_FIX
    key = gate_key(name)
    if key == "power":
        return POWER_FIXES[_power_reason(message)]
    fix = FIXES.get(key)
    if fix is None:
        return message
    if key in ("matching", "zero_preference", "binding single-sentence", "frame_selection"):
        return f"{message}; then {fix}"
    if key == "positive_controls":
        failing = [part.split(":")[0].strip() for part in message.split("; ") if ":" in part]
        return fix + (f" (failing: {', '.join(dict.fromkeys(failing))})" if failing else "")
    return fix


def gate_rows(gates: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """One row per gate: gate, outcome (passed/failed), its numbers as text, the fix."""
    return pd.DataFrame([{"gate": name, "outcome": passed_failed(g["passed"]), "numbers": numbers_text(g.get("numbers")),
                          "fix": gate_fix(name, bool(g["passed"]), str(g.get("message", "")))}
                         for name, g in gates.items()], columns=list(GATE_COLUMNS))


def gates_of_table(registration_record: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """The gates of a stored ``registration_record`` table (one row per gate)."""
    return {str(r["gate"]): {"passed": bool(r["passed"]), "numbers": r.get("numbers", "{}"),
                             "message": str(r.get("message", ""))} for r in registration_record.to_dict("records")}


def gates_summary(gates: Mapping[str, Mapping[str, Any]], family: str | None = None) -> str:
    """The gates' outcome in one short sentence, starting with the family where known:
    ``smollm2-135m: 6 of 9 gates failed: name_gate (4.2), ...``."""
    failed = [n for n, g in gates.items() if not g["passed"]]
    text = (f"all {len(gates)} gates passed" if not failed else
            f"{len(failed)} of {len(gates)} gates failed: {', '.join(failed)}")
    return f"{family}: {text}" if family else text
