"""Registration-gate verdicts of the record that are more than a copied flag (protocol 4.2,
6.3; Appendix C steps 3-4), the record's status, and the stated deviations.

Pure functions of the pilot outputs' numbers; the ``registration_record`` asset wires them.
"""

from __future__ import annotations

from typing import Any, Mapping

#: Statuses of a registration record: a pilot run writes a draft; a confirmatory run
#: registers only when every registration gate passes, and otherwise refuses.
DRAFT, REGISTERED, REFUSED = "draft", "registered", "refused"


#: A stored power result (6.3; ``power_summary``) puts its decisions under this key
#: of the registration record; the reading reads ``gates_underpowered`` and ``estimation_only``.
POWER_FIELD = "power"
#: The pilot probe's H4 declarations (6.1), carried by the record to H4's row (never a gate).
H4_PILOT_FIELD = "h4_pilot"

def binding_outcomes(in_context_passed: bool, in_context_correct: int, in_context_documents: int,
                     in_context_message: str, frames_failing: int,
                     frames_to_write: Mapping[str, int]) -> tuple[dict, dict]:
    """The two parts of binding (4.2), which the protocol treats differently:

    - the single-sentence checks replace failing frames; a fear left short of frames blocks
      registration (returned as a registration gate, what to write per fear);
    - the in-context pass rate below 90% declares H2-H5 uninterpretable: D5 row 2, carried
      to the reading (returned as the record's ``binding_in_context``), not a gate on
      registration, because the protocol reads it rather than stopping on it.
    """
    short = {f: int(n) for f, n in frames_to_write.items() if int(n) > 0}
    gate = {"passed": not short,
            "numbers": {"frames failing single checks": int(frames_failing),
                        "frames to write": ", ".join(f"{f} {n}" for f, n in short.items()) or "none"},
            "message": "every fear keeps its frames after replacing frames that fail a single-sentence check"
            if not short else "after replacing frames that fail a single-sentence check, write "
            + ", ".join(f"{n} frame(s) for {f}" for f, n in short.items()) + " before registration (4.2, 4.3)"}
    in_context = {"passed": bool(in_context_passed), "correct": int(in_context_correct),
                  "documents": int(in_context_documents), "message": str(in_context_message)}
    return gate, in_context


def registered_power_result(power: Mapping[str, Any] | None) -> bool:
    """Whether a stored power result is the registered simulation's decision (6.3): stored,
    not the embedded family's reduced demo, and complete (every target computable). A demo
    or a partial result (blocks not yet simulated) is shown in the record but decides nothing."""
    return bool(power) and not power.get("demo", False) and power.get("status") == "complete"


def power_numbers(power: Mapping[str, Any]) -> dict[str, Any]:
    """The power gate's numbers, worded so that they agree with its outcome: which simulation
    the stored result is, how its targets fared, and the underpowered gates only where the
    result is the registered one (a demo or partial result decides nothing, 6.3)."""
    # The targets the gate judges (the decided frame count, less what 6.3's rules excuse), as
    # power_summary's check counts them; a record stored before ``required`` counts every row.
    targets = [t for t in power.get("targets") or [] if isinstance(t, Mapping) and t.get("required", True)]
    met = [t.get("met") for t in targets]
    decides = registered_power_result(power)
    return {
        "simulation": "registered" if not power.get("demo", False) else
        "reduced demo, not the registered one (2,000 datasets per scenario)",
        "status": str(power.get("status")).split(":")[0],
        "targets met": sum(m is True for m in met), "targets missed": sum(m is False for m in met),
        "targets not computable": sum(m is None for m in met),
        "underpowered gates": ("yes" if power.get("gates_underpowered") else "none") if decides else
        "not decided (only the registered, complete simulation decides)",
    }


def power_gate(power: Mapping[str, Any] | None, family: str) -> dict:
    """The power gate (6.3, Appendix C step 3) as a registration gate: it passes once the
    registered simulation's complete result (``power_summary``) is in the record; its
    decisions (gates underpowered, estimation-only hypotheses, frames added) travel with it.
    A shortfall traced to the positive controls fails it: 6.3 has their manipulations
    strengthened once in the pilot, and a configuration still short is not run."""
    if power is None:
        return {"passed": False, "numbers": {"power result": "none stored"},
                "message": f"the power simulation (6.3, Appendix C step 3) has not run for {family}: materialise "
                           f"power_summary for {family}, then registration_record; confirmatory mode does not "
                           "register without it, and every reading carries power_gate_not_run until then"}
    numbers = power_numbers(power)
    if power.get("demo", False):
        return {"passed": False, "numbers": numbers,
                "message": f"the stored power result for {family} is the reduced demo simulation, not the "
                           "registered one (6.3: 2,000 datasets per scenario at the registered design)"}
    if power.get("status") != "complete":
        return {"passed": False, "numbers": numbers,
                "message": f"the power simulation for {family} is not complete ({power.get('status')}): "
                           "simulate the missing blocks or frame counts, then power_summary and registration_record"}
    if power.get("controls_to_strengthen"):
        return {"passed": False, "numbers": numbers,
                "message": "the joint target's shortfall is traced to the positive controls: strengthen their "
                           "manipulations once in the pilot (6.3); if still short, the configuration is not run"}
    return {"passed": True, "numbers": numbers,
            "message": "registered power result stored (its targets are judged by power_summary's check)"}


def registration_status(mode: str, failed_gates: list[str], rehearsal: bool = False) -> str:
    """``draft`` in pilot mode; in confirmatory mode ``registered`` only when every
    registration gate passes, else ``refused`` (the record says which gates failed). A
    rehearsal's issued record stays issued with failed gates (it says it is a rehearsal)."""
    if mode != "confirmatory":
        return DRAFT
    return REFUSED if failed_gates and not rehearsal else REGISTERED


def deviations(zero_preference_low: float, zero_preference_high: float) -> list[dict]:
    """Where the implementation reads the protocol in a way its wording does not state,
    said in the record so that a reviewer sees it before collection."""
    return [{
        "section": "4.3 zero preference",
        "protocol": f"with no document, the option probabilities of every forced-choice question lie within "
                    f"{zero_preference_low:g}-{zero_preference_high:g}",
        "implemented": "P(content option 1) is averaged over the question's two listing orders (option 1 as A, "
                       "then as B) before the band is applied",
        "why": "the listing order is counterbalanced in every cell and H5's criterion has an option-position "
               "term, so a preference for a letter or a position is absorbed by the design; read per listing, "
               "the band would reject frames for a letter bias, which is not a preference for a content. The "
               "mean P(first-listed letter) is reported beside the gate",
    }]


def declared_estimation_only(record: Mapping[str, Any]) -> dict[str, str]:
    """Every hypothesis declared estimation-only before collection, with why: those the
    registered power result lists (6.3: "any hypothesis still below target is declared
    estimation-only before collection"; a demo or incomplete result decides nothing, as for
    ``gates_underpowered``) and H4 when the pilot probe is at the ceiling (6.1)."""
    out: dict[str, str] = {}
    power = record.get(POWER_FIELD)
    if registered_power_result(power):
        for h in power.get("estimation_only") or []:
            out[str(h)] = "power simulation (6.3): below its targets at the registered frame count"
    h4 = record.get(H4_PILOT_FIELD)
    if isinstance(h4, Mapping) and h4.get("estimation_only"):
        out["H4"] = "; ".join(filter(None, (out.get("H4"), "pilot probe above the ceiling at the band depths (6.1)")))
    return out
