"""The registration stage's step (Appendix C step 4, D6): the Stage 1 registration record of
one family, composed from the pilot's stored results, the power gate's result and the
frozen hashes, and written beside the registered inputs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from fear_assets.core.registered import Registered
from fear_assets.lm.models import manifest_digest
from fear_assets.registration.compose import compose_record, note_path, supplementary_note
from fear_assets.registration.pilot_gates import final_selection, gates_table, registration_gates
from fear_assets.registration.record import analysis_code_sha256, read_family_record, write_family_record
from fear_assets.stimuli.name_gate import selected_names


def stored_power_section(power_summary: pd.DataFrame) -> dict[str, Any] | None:
    """6.3: the power result ``power_summary`` stored (the section its table names in
    ``power_json``); None where that file is gone."""
    if not len(power_summary) or "power_json" not in power_summary:
        return None
    path = Path(str(power_summary["power_json"].iloc[0]))
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


@dataclass(frozen=True)
class RecordResult:
    """The written registration record: its gates table and the record itself."""

    table: pd.DataFrame
    record: dict[str, Any]
    path: Path


def registration_record(view: Registered, bank, name_gate: pd.DataFrame, model_manifest: pd.DataFrame,
                        matched_frames: pd.DataFrame, zero_preference: pd.DataFrame,
                        binding_results: pd.DataFrame, report_scoring: pd.DataFrame, pilot_depths: pd.DataFrame,
                        pilot_controls: pd.DataFrame, pilot_probe_controls: pd.DataFrame,
                        power_summary: pd.DataFrame, registration_dir: str | Path,
                        note_file: str = "") -> RecordResult:
    """The Stage 1 registration record (Appendix C step 4): "frozen hashes (bank, settings,
    model manifest, analysis code, supplementary note), selected names and frames, depth band
    and H5 depth, the pilot sigmas for gate (c) (frozen: 6.2), every gate's outcome with its
    numbers", what is carried to the reading (in-context binding, the power result) and the
    stated deviations; written as JSON and Markdown under ``registration_dir/<family>/`` (a
    draft in pilot mode; for a registered family, registered only when every gate passes)."""
    settings, family_key = view.settings, view.family.key
    confirmatory = view.confirmatory
    issued = read_family_record(registration_dir, family_key) if confirmatory else None
    # A registered family's note is the one its record was issued with, unless one is given.
    given = note_file or (str(issued.get("supplementary_note") or "") if issued else "")
    # Declarations, Appendix C step 4: a confirmatory run without the note is refused first.
    note = supplementary_note(note_path(registration_dir, given), confirmatory)
    frames, replacements, shortfall = final_selection(
        matched_frames, binding_results, {i: bank.item(i).number for i in matched_frames["item_id"]},
        settings.confirmatory_frames_per_fear(family_key), {r.rewrite_of: r.id for r in bank.rewrites})
    power = stored_power_section(power_summary)
    gates, binding_in_context = registration_gates(
        name_gate, matched_frames, settings.matching, zero_preference, binding_results, report_scoring,
        pilot_probe_controls, pilot_controls, frames, shortfall, power, family_key)
    hashes = {"settings_sha256": settings.sha256, "bank_sha256": bank.sha256,
              "manifest_sha256": manifest_digest(model_manifest), "analysis_code_sha256": analysis_code_sha256()}
    record = compose_record(settings, family_key, view.mode, hashes, selected_names(name_gate), frames, replacements,
                            pilot_depths, pilot_controls, gates, binding_in_context, power, note,
                            pilot_probe_controls)
    path = write_family_record(registration_dir, record, confirmatory)
    table = gates_table(gates, family_key).assign(record_json=json.dumps(record, sort_keys=True), record_path=str(path))
    return RecordResult(table, record, path)


def failed_gates(registration_record: pd.DataFrame) -> pd.DataFrame:
    """The registration gates that did not pass (Appendix C step 4 waits on every one)."""
    return registration_record[~registration_record["passed"].astype(bool)]
