"""Every registration gate of the pilot as data (protocol 4.2-4.6, 6.1, 6.3; Appendix C
step 4): "every gate's outcome with its numbers" for the registration record, and the final
confirmatory frame selection after all pilot gates (4.3).

Pure functions of the pilot assets' tables, under the registered code hash; the
``registration_record`` asset only wires them and writes the record.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import pandas as pd

from fear_assets.stimuli.name_gate import selected_names
from fear_assets.pilot.gate_c_scale import sigma_gate
from fear_assets.pilot.matching import final_bank_matching, matching_problems, select_frames
from fear_assets.pilot.zero_preference import content_slot_rewrites, rewrite_message
from fear_assets.registration.gate_table import gate_fix
from fear_assets.registration.gates import binding_outcomes, power_gate
from fear_assets.core.sections import Matching


def final_selection(matched: pd.DataFrame, binding: pd.DataFrame, numbers: Mapping[str, int],
                    required_per_fear: int, rewrites: Mapping[str, str]) -> tuple[list[str], dict, dict]:
    """Confirmatory frames after every pilot gate (4.3): a frame is kept if it passes
    matching and the single-sentence binding checks; else replaced by its registered rewrite
    or the lowest-numbered passing reserve ("a confirmatory frame that fails matching or
    binding is replaced"). Zero preference does not replace a frame: a failing item keeps
    its place and its content slot is rewritten (:func:`zero_preference_gate`). Returns
    (frames, replacements {replaced: replacement}, shortfall by fear)."""
    b = binding.set_index("item_id")["passes"]
    v = matched[["item_id", "fear", "frame_set", "passes"]].copy()
    v["passes"] = v["passes"] & v["item_id"].map(b).fillna(False)
    selection, shortfall = select_frames(v, {i: numbers[i] for i in v["item_id"]}, required_per_fear, rewrites)
    replacements = {r.replaces: r.item_id for r in selection.itertuples() if r.replaces}
    return list(selection["item_id"]), replacements, shortfall


def zero_preference_gate(zero: pd.DataFrame, frames: list[str]) -> dict:
    """4.3 zero preference on the final selection: passes when no selected frame has a
    question outside the band; otherwise each failing item is reported as "rewrite the
    content slot" (before registration, like a fear's frames to write)."""
    rewrites = content_slot_rewrites(zero, frames)
    unasked = [f for f in frames if f not in set(zero["item_id"])]
    problems = [rewrite_message(rewrites)] if len(rewrites) else []
    if unasked:
        problems.append(f"no zero-preference question was asked for {', '.join(unasked)}: run zero_preference on "
                        "every selected frame")
    return {"passed": not problems,
            "numbers": {"items failing": int(zero.loc[~zero["passes"].astype(bool), "item_id"].nunique()),
                        "selected frames to rewrite": len(rewrites)},
            "message": "; ".join(problems) or "every selected frame's forced-choice questions lie within the band"}


def _first(table: pd.DataFrame, column: str, default: Any = False) -> Any:
    return table[column].iloc[0] if len(table) else default


def h4_pilot_declarations(probe_controls: pd.DataFrame) -> dict:
    """6.1's two H4 rules on the pilot probe, as declarations the record carries to H4's row
    (never a registration gate: 6.2, H4 does not change the reading): a control probe away
    from chance makes H4 uninterpretable; mean accuracy above the ceiling at the band depths
    makes H4 estimation-only before collection. None where no pilot probe ran."""
    ctrl = probe_controls[probe_controls["frame_set"] == "pilot"] if "frame_set" in probe_controls else probe_controls
    if ctrl.empty:
        return {"ran": False, "interpretable": None, "estimation_only": None, "message": "no pilot probe outputs"}
    interpretable = bool(ctrl["h4_interpretable"].iloc[0])
    ceiling = bool(ctrl["h4_estimation_only"].fillna(False).iloc[0]) if "h4_estimation_only" in ctrl else False
    said = [m for m, on in (("H4 declared estimation-only before collection (ceiling)", ceiling),
                            ("H4 uninterpretable (a pilot control probe decodes away from chance)",
                             not interpretable)) if on]
    return {"ran": True, "interpretable": interpretable, "estimation_only": ceiling,
            "message": ("; ".join(said) + ": carried to H4's row, not a stop") if said
            else "control probes at chance, no ceiling"}


def probe_rules_gate(probe_controls: pd.DataFrame) -> dict:
    """6.1 on the pilot probes as the record lists it. Its two rules are declarations about
    H4 alone (``h4_pilot_declarations``, carried to H4's row), so they never fail the gate:
    a ceiling or an uninterpretable H4 still registers. It fails only where no pilot probe
    ran, since then the pilot has not established what 6.3 asks of it."""
    h4 = h4_pilot_declarations(probe_controls)
    if not h4["ran"]:
        return {"passed": False, "numbers": {"pilot probe": "not run"}, "message": h4["message"]}
    # The two rules are declarations carried to H4's row, so the numbers say so: a "no" beside
    # a passed gate is not a contradiction once it reads as what it declares.
    return {"passed": True,
            "numbers": {"pilot probe": "ran",
                        "H4 interpretable (controls at chance)": "yes" if h4["interpretable"] else
                        "no (declared uninterpretable, carried to H4's row)",
                        "H4 estimation-only (ceiling)": "yes (declared, carried to H4's row)"
                        if h4["estimation_only"] else "no"},
            "message": h4["message"]}


def registration_gates(name_gate: pd.DataFrame, matched: pd.DataFrame, matching_rule: Matching, zero: pd.DataFrame,
                       binding: pd.DataFrame, report_scoring: pd.DataFrame, probe_controls: pd.DataFrame,
                       pilot_controls: pd.DataFrame, frames: list[str], shortfall: Mapping[str, int],
                       power: Mapping[str, Any] | None, family: str) -> tuple[dict[str, dict], dict]:
    """Every registration gate with its verdict, numbers and message, and the in-context
    binding result the reading carries (4.2 / D5 row 2). Names follow the protocol section.
    ``matching_rule`` is the registered ``settings.matching``; the bank-level TOST and the
    event matching run on ``frames``, the final selection (4.3)."""
    tost, events = final_bank_matching(matched, frames, matching_rule.tost_bound, matching_rule.max_abs_difference)
    matching = matching_problems(matched, matching_rule.tost_alpha, tost, events)
    b0, r0 = binding.iloc[0], report_scoring.iloc[0]
    binding_gate, in_context = binding_outcomes(
        bool(b0["in_context_passed"]), int(b0["in_context_correct"]), int(b0["in_context_documents"]),
        str(b0["in_context_message"]), int((~binding["passes"]).sum()), json.loads(b0["frames_to_write"]))
    names_pass = bool(name_gate["gate_passed"].iloc[0])
    gates = {
        "name_gate (4.2)": {"passed": names_pass, "numbers": {"selected": ", ".join(selected_names(name_gate))},
                            "message": "five registered names single-token in every tokenizer" if names_pass
                            else "fewer than five names are single tokens everywhere; the registered-order names stand in"},
        "matching (4.3)": {"passed": not matching,
                           "numbers": {"frames passing": int(matched["passes"].sum()), "frames examined": len(matched),
                                       "events failing": int((~events["passes"].astype(bool)).sum()),
                                       "max TOST p": round(float(tost["tost_p"].max()), 4) if len(tost) else "n/a"},
                           "message": "; ".join(matching) or "matching passes (frames to write: none)"},
        "zero_preference (4.3)": zero_preference_gate(zero, frames),
        "binding single-sentence (4.2)": binding_gate,
        "scorer_agreement (4.5)": {"passed": bool(r0["gate_passed"]),
                                   "numbers": {"kappa": None if pd.isna(r0["kappa"]) else round(float(r0["kappa"]), 3)},
                                   "message": str(r0["message"])},
        "probe rules (6.1)": probe_rules_gate(probe_controls),
        "positive_controls (4.6)": {"passed": bool(pilot_controls["passed"].all()),
                                    "numbers": {r.control: f"{r.mean:.3f} [{r.hdi_low:.3f}, {r.hdi_high:.3f}]"
                                                for r in pilot_controls.itertuples()},
                                    "message": "; ".join(f"{r.control}: {r.reason}" for r in pilot_controls.itertuples())},
        "gate_c_scale (6.2)": sigma_gate(float(pilot_controls["pilot_sigma"].iloc[0]),
                                         float(pilot_controls["pilot_sigma_judge"].iloc[0])),
        "frame_selection (4.3)": {"passed": not shortfall, "numbers": {"confirmatory frames": len(frames)},
                                  "message": "every fear has its frames" if not shortfall else
                                  "write " + ", ".join(f"{n} frame(s) for {f}" for f, n in shortfall.items())},
        "power (6.3)": power_gate(power, family),
    }
    return gates, in_context


def gates_table(gates: Mapping[str, dict], family: str) -> pd.DataFrame:
    """One row per gate (the ``registration_record`` table), with what to do next for it."""
    return pd.DataFrame([{"family": family, "gate": n, "passed": g["passed"], "numbers": json.dumps(g["numbers"]),
                          "message": g["message"], "fix": gate_fix(n, bool(g["passed"]), g["message"])}
                         for n, g in gates.items()])
