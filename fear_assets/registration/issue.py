"""Registration as a stage transition (Appendix C step 4, D6): a family's mode and the issue
of its record.

A family is in pilot mode until its registration record is issued: ``issue_record`` turns
the draft that the pilot's ``registration_record`` wrote into the registered record (status
registered, the Stage 1 identifier the user supplies, the time, every frozen hash, and the
per-section, per-item and per-file hashes that let a later refusal name what changed). From
then on that family, and only it, is confirmatory: its registration gates block and any
step of it refuses inputs (settings, bank, registered code) other than the issued ones. No
registered file is edited and nothing is re-frozen.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from fear_assets.core.errors import FearAssetsError, FreezeError
from fear_assets.core.hashing import sha256_file, sha256_obj
from fear_assets.core.settings import DEFAULT_BANK_DIR, ProtocolSettings, load_settings, settings_path
from fear_assets.registration.freeze import diff_hashes
from fear_assets.registration.gates import REGISTERED
from fear_assets.registration.record import (atomic_write, frozen_differences, markdown, read_family_record,
                                             record_dir, registered_code_hashes)
from fear_assets.stimuli.bank import Bank, load_bank

PILOT, CONFIRMATORY = "pilot", "confirmatory"
#: The frozen hashes a registered family's every step compares with its issued record, and
#: the record's per-part hashes (``frozen_items``) that name what changed under each.
CHECKED = {"settings_sha256": ("settings", "settings section"), "bank_sha256": ("bank", "bank"),
           "analysis_code_sha256": ("code", "code file")}


#: What an issued rehearsal record says of itself (``fear rehearse``).
REHEARSAL_NOTE = ("REHEARSAL, NOT A REGISTRATION: random-weight stand-ins of the registered checkpoints at the "
                  "registered shape; every output is meaningless as science; issued despite failed gates so that "
                  "the confirmatory steps run; its gates never block.")


def is_issued(record: Mapping[str, Any] | None) -> bool:
    """Whether a family record is the issued (registered) one; a draft or a refused record is not."""
    return bool(record) and record.get("status") == REGISTERED


def family_mode(registration_dir: str | Path, family: str) -> str:
    """``confirmatory`` once the family's registration record is issued, else ``pilot``."""
    return CONFIRMATORY if is_issued(read_family_record(registration_dir, family)) else PILOT


def gate_blocks(mode: str, stops: bool = True, rehearsal: bool = False) -> bool:
    """Whether a failed registration gate stops the family's downstream steps: only for a
    registered family, and only where the gate's own verdict stops (a gate that merely warns,
    such as the bank-level matching tests before the final bank, never does). A rehearsal's
    gates never stop: its random-weight stand-ins fail them by construction, and what it
    rehearses is the confirmatory steps downstream."""
    return stops and mode == CONFIRMATORY and not rehearsal


def frozen_items(settings: ProtocolSettings, bank: Bank, code: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """The per-part hashes an issued record keeps: settings sections, bank items, code files."""
    return {"settings": settings.section_hashes(), "bank": bank.item_hashes(), "code": dict(code)}


def registered_changes(record: Mapping[str, Any], settings: ProtocolSettings, bank: Bank,
                       code: Mapping[str, str]) -> list[str]:
    """What differs between an issued record and the current inputs: each frozen hash that
    changed (registered vs now), with the sections, items or files under it that changed
    where the record keeps their hashes."""
    now = {"settings_sha256": settings.sha256, "bank_sha256": bank.sha256, "analysis_code_sha256": sha256_obj(code)}
    parts_now = frozen_items(settings, bank, code)
    parts_then = record.get("frozen_items") or {}
    out = []
    for line in frozen_differences(record, now):
        field = line.split(":", 1)[0]
        part, kind = CHECKED[field]
        named = diff_hashes(kind, parts_now[part], parts_then[part]) if part in parts_then else []
        out.append(line + (f" ({', '.join(named)})" if named else ""))
    return out


def refuse_changed_inputs(registration_dir: str | Path, family: str, record: Mapping[str, Any],
                          settings: ProtocolSettings, bank: Bank, code: Mapping[str, str] | None = None) -> None:
    """Refuse (FreezeError) a registered family whose settings, bank or registered code differ
    from its issued record, naming each change; other families are never compared."""
    code = registered_code_hashes() if code is None else code
    changes = registered_changes(record, settings, bank, code)
    if changes:
        path = record_dir(registration_dir, family) / "registration_record.json"
        raise FreezeError(
            f"{family} is registered ({path}, Stage 1 {record.get('stage1_id') or '?'}, issued "
            f"{record.get('issued_at') or '?'}) and its inputs changed since: {'; '.join(changes)}; nothing of "
            f"{family} runs on other inputs than the registered ones. Fix: restore them, or file an amendment "
            "(move the record aside and register again)")


def issue_record(registration_dir: str | Path, family: str, stage1_id: str, note_file: str | Path, now: str, *,
                 settings: ProtocolSettings | None = None, bank: Bank | None = None,
                 code: Mapping[str, str] | None = None) -> Path:
    """Issue the family's registration record: its pilot draft, checked, becomes the registered
    record with status registered, ``stage1_id``, ``issued_at`` (``now``, ISO 8601), the
    supplementary note's hash and every frozen hash, written atomically (JSON and Markdown).

    Refuses (FearAssetsError naming the fix) a family with no draft, a draft with a failed
    registration gate, a missing or empty note, a draft whose frozen hashes differ from the
    current settings, bank or registered code (FreezeError), and a record already issued.
    ``settings``, ``bank`` and ``code`` default to the files this process runs under. The
    model manifest's hash is the draft's: the ``model_manifest`` check compares it with the
    checkpoint's files at every run."""
    registration_dir = Path(registration_dir)
    path = record_dir(registration_dir, family) / "registration_record.json"
    if not str(stage1_id).strip():
        raise FearAssetsError(f"no Stage 1 identifier for {family}. Fix: give the one the journal assigned "
                              "(fear register FAMILY --stage1-id ID --supplementary-note FILE)")
    note = Path(note_file)
    if not note.is_file() or note.stat().st_size == 0:
        raise FearAssetsError(f"the supplementary note {note} is missing or empty: the registered record carries "
                              "its sha256 (Declarations; Appendix C step 4). Fix: give the note on unreviewed "
                              "reports with --supplementary-note FILE")
    draft = read_family_record(registration_dir, family)
    if draft is None:
        raise FearAssetsError(f"{path} not found: there is no draft registration record for {family}. Fix: run "
                              f"the family's pilot through registration_record (fear run {family} --through "
                              "registration), then register it")
    if is_issued(draft):
        raise FearAssetsError(f"{path} is already issued (Stage 1 {draft.get('stage1_id') or '?'}, issued "
                              f"{draft.get('issued_at') or '?'}): a registered record is never re-issued. Fix: file "
                              "an amendment (move the record aside, re-run the pilot's registration_record, "
                              "register again)")
    settings = load_settings(settings_path()) if settings is None else settings
    reduced = settings.family(family).reduced_design
    rehearsal = reduced is not None and reduced.rehearsal
    failed = list(draft.get("failed_gates") or [n for n, g in (draft.get("gates") or {}).items() if not g.get("passed")])
    if failed and not rehearsal:
        raise FearAssetsError(f"{path}: {family} cannot be registered while registration gates fail: "
                              f"{', '.join(failed)}. Fix: fix each as the record says, re-run the pilot assets it "
                              "names and registration_record, then register")
    bank = load_bank(DEFAULT_BANK_DIR, settings) if bank is None else bank
    code = registered_code_hashes() if code is None else code
    current = {"settings_sha256": settings.sha256, "bank_sha256": bank.sha256, "analysis_code_sha256": sha256_obj(code)}
    differences = frozen_differences(draft, current)
    if differences:
        raise FreezeError(f"{path} was drafted from other inputs than the current ones: {'; '.join(differences)}. "
                          f"Fix: re-run registration_record for {family} on the current inputs (or restore the "
                          "drafted ones), then register")
    issued = {**draft, "mode": CONFIRMATORY, "status": REGISTERED, "stage1_id": str(stage1_id).strip(),
              "issued_at": now, "supplementary_note": str(note), "supplementary_note_sha256": sha256_file(note),
              "frozen_items": frozen_items(settings, bank, code),
              **({"rehearsal": REHEARSAL_NOTE + (f" Gates that failed: {', '.join(failed)}." if failed else "")}
                 if rehearsal else {})}
    atomic_write(path, json.dumps(issued, indent=2, sort_keys=True) + "\n")
    atomic_write(path.with_suffix(".md"), markdown(issued))
    return path

