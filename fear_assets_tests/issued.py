"""Registration directories in which a family's record is issued (its gates block)."""

from __future__ import annotations

import json
from pathlib import Path

from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.registration.issue import issue_record
from fear_assets.registration.record import analysis_code_sha256, write_family_record

NOW = "2026-12-01T16:00:00+00:00"


def issued_protocol(registration_dir: Path, family: str, **fields) -> ProtocolResource:
    """The protocol resource of a registration directory where ``family``'s record is issued
    (status registered, as ``registration.issue.issue_record`` writes it, with ``fields``, e.g.
    the frozen hashes) and no other is."""
    path = Path(registration_dir) / family / "registration_record.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"family": family, "mode": "confirmatory", "status": "registered",
                                "stage1_id": "S1-test", "issued_at": "2026-12-01T00:00:00+00:00", **fields}))
    return ProtocolResource(registration_dir=str(registration_dir))


def pilot_draft(settings, bank, family: str, **over) -> dict:
    """A pilot's draft record on the current inputs with every gate passed (as the
    ``registration_record`` asset writes it once the pilot passes)."""
    record = {"protocol": settings.protocol.name, "protocol_version": settings.protocol.version, "family": family,
              "mode": "pilot", "status": "draft", "stand_in": "", "reduced_design": "",
              "settings_sha256": settings.sha256, "bank_sha256": bank.sha256, "manifest_sha256": "c" * 64,
              "analysis_code_sha256": analysis_code_sha256(), "supplementary_note": "",
              "supplementary_note_sha256": None, "selected_names": ["Orin", "Tavi", "Kemi", "Sora", "Pell"],
              "selected_frames": ["TER-03"], "replacements": {}, "depth_band": [1, 2], "band_rule": "r",
              "h5_depth": 2, "h5_rule": "r", "pilot_sigma": 0.3, "pilot_sigma_judge": None,
              "gates": {"binding (4.2)": {"passed": True, "numbers": {}, "message": "ok"},
                        "name_gate (4.2)": {"passed": True, "numbers": {}, "message": "ok"}},
              "failed_gates": [], "not_run": [], "binding_in_context": None, "power": None}
    record.update(over)
    return record


def register(registration_dir: Path, family: str, settings, bank, stage1_id: str = "RR-7") -> Path:
    """Issue ``family``'s record the way ``fear register`` does: its passing pilot draft, a
    Stage 1 identifier and the supplementary note (written beside the directory)."""
    registration_dir = Path(registration_dir)
    write_family_record(registration_dir, pilot_draft(settings, bank, family), confirmatory=False)
    note = registration_dir.parent / f"{family}_note.pdf"
    note.write_bytes(b"%PDF the supplementary note on unreviewed reports")
    return issue_record(registration_dir, family, stage1_id, note, NOW, settings=settings, bank=bank)
