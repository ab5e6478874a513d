"""What the Stage 1 registration record holds (Appendix C step 4, 6.2, Declarations; D6).

Pure functions of the pilot's outputs and the registered settings: the record's fields, the
pilot sigmas inserted at registration, and the supplementary note's hash. The
``registration_record`` asset only gathers its inputs and writes what these return, so the
record's composition is under the registered code hash.
"""

from __future__ import annotations

import math

from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from fear_assets.core.errors import FreezeError
from fear_assets.core.hashing import sha256_file
from fear_assets.pilot.depth_rules import stored_band
from fear_assets.registration.gates import deviations, registered_power_result, registration_status
from fear_assets.registration.pilot_gates import h4_pilot_declarations

#: Where the supplementary note is looked for when the record asset's run config names none
#: (a path is an input the user provides, not a registered setting).
DEFAULT_NOTE_NAME = "supplementary_note.pdf"


def note_path(registration_dir: str | Path, given: str = "") -> Path:
    """The note's file: the path given at registration, else ``<registration_dir>/supplementary_note.pdf``."""
    return Path(given) if given else Path(registration_dir) / DEFAULT_NOTE_NAME


def supplementary_note(path: str | Path, confirmatory: bool) -> dict[str, Any]:
    """The record's note fields: its path and sha256 (Declarations: the note's "file hash will
    be part of the registered record"; Appendix C step 4). A missing or empty file refuses a
    confirmatory registration, naming what to provide; a pilot draft records it as missing."""
    path = Path(path)
    if path.is_file() and path.stat().st_size > 0:
        return {"supplementary_note": str(path), "supplementary_note_sha256": sha256_file(path)}
    if confirmatory:
        raise FreezeError(
            f"the supplementary note is missing ({path} is not a non-empty file): a confirmatory registration "
            "carries its sha256 (Declarations; Appendix C step 4: 'register ... with the frozen bank hash, model "
            "manifest, analysis code and supplementary note hash'). Place the note on unreviewed reports at "
            f"{path}, or give its path in the run config of registration_record "
            "(ops: registration_record: config: supplementary_note: <path>), then materialise it again.")
    return {"supplementary_note": str(path), "supplementary_note_sha256": None}


def note_now(record: Mapping[str, Any]) -> dict[str, str | None]:
    """The note's current sha256 at the path the record names, for the freeze check; empty
    where the record holds no note hash (nothing to compare)."""
    if not record.get("supplementary_note_sha256"):
        return {}
    path = Path(str(record.get("supplementary_note", "")))
    return {"supplementary_note_sha256": sha256_file(path) if path.is_file() else None}


def pilot_sigmas(pilot_controls: pd.DataFrame) -> dict[str, float | None]:
    """6.2: "only the value of sigma is inserted at registration": each reader's pilot residual
    SD, as ``pilot_controls`` estimated it (None where no judge block is scored, or where the
    SD is not finite).
    Rounded to 6 decimals so the frozen value is the one printed."""
    row = pilot_controls.iloc[0]
    # None where not scored or not finite (the gate-(c)-scale gate says which); JSON has no inf.
    value = lambda v: round(float(v), 6) if pd.notna(v) and math.isfinite(float(v)) else None  # noqa: E731
    return {"pilot_sigma": value(row["pilot_sigma"]), "pilot_sigma_judge": value(row["pilot_sigma_judge"])}


def compose_record(settings, family_key: str, mode: str, hashes: Mapping[str, str], names: list[str], frames: list[str],
                   replacements: Mapping[str, str], pilot_depths: pd.DataFrame, pilot_controls: pd.DataFrame,
                   gates: Mapping[str, Mapping], binding_in_context: Mapping | None, power: Mapping | None,
                   note: Mapping[str, Any], probe_controls: pd.DataFrame) -> dict:
    """The registration record of one family (Appendix C step 4): "frozen hashes (bank,
    settings, model manifest, analysis code) and supplementary note hash", the selected names
    and frames, the depth band and H5 depth, the pilot sigmas for gate (c), every gate's
    outcome, what is carried to the reading and the stated deviations; its status follows
    from the family's mode (``registration.issue.family_mode``) and the failed gates."""
    family = settings.family(family_key)
    failed_gates = [n for n, g in gates.items() if not g["passed"]]
    p0, band = pilot_depths.iloc[0], stored_band(pilot_depths)
    zero = settings.zero_preference
    return {
        "protocol": settings.protocol.name, "protocol_version": settings.protocol.version,
        "family": family_key, "mode": mode, "status": registration_status(mode, failed_gates,
                                                                  bool(family.reduced_design and family.reduced_design.rehearsal)),
        "stand_in": family.stand_in or "", "reduced_design": family.reduced_design.reason if family.reduced_design else "",
        **{k: hashes[k] for k in ("settings_sha256", "bank_sha256", "manifest_sha256", "analysis_code_sha256")},
        **note,
        "selected_names": list(names), "selected_frames": list(frames),
        "replacements": dict(replacements), "depth_band": list(band.indices),
        "band_rule": str(p0["band_rule"]), "h5_depth": int(p0["h5_depth"]), "h5_rule": str(p0["h5_rule"]),
        **pilot_sigmas(pilot_controls),
        "gates": dict(gates), "failed_gates": failed_gates, "binding_in_context": binding_in_context, "power": power,
        "h4_pilot": h4_pilot_declarations(probe_controls),  # 6.1: carried to H4's row, never a gate
        "not_run": [] if registered_power_result(power) else
                   ["power simulation (6.3, Appendix C step 3): no registered power result (none stored, "
                    "a reduced demo, or incomplete)"],
        "deviations": deviations(zero.low, zero.high),
    }
