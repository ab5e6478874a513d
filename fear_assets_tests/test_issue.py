"""Registration as a stage transition (protocol Appendix C step 4, D6): "a family is in pilot
mode until its registration record is issued (status registered, a Stage 1 identifier the
user supplies, timestamp, every frozen hash); from then on that family's collection and
analysis are confirmatory ... without re-freezing anything. Other families stay in their own
mode." And: "a registered family whose bank, settings or code changes afterwards is refused,
naming what changed." Each test simulates the case that would break a sentence."""

from __future__ import annotations

import json
import shutil

import pytest

from fear_assets.core.errors import FearAssetsError, FreezeError
from fear_assets.core.settings import DEFAULT_BANK_DIR, REGISTERED_SETTINGS_PATH
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.registration import issue as issue_module
from fear_assets.registration.freeze import RECORD_NAME, read_record
from fear_assets.registration.issue import family_mode, issue_record, refuse_changed_inputs
from fear_assets.registration.record import (FROZEN_FIELDS, read_family_record, registered_code_hashes,
                                             write_family_record)
from fear_assets_tests.conftest import EMBEDDED, PRIMARY
from fear_assets_tests.issued import NOW, pilot_draft


def _draft(settings, bank, family: str = PRIMARY, **over) -> dict:
    return pilot_draft(settings, bank, family, **over)


def _note(tmp_path):
    note = tmp_path / "note.pdf"
    note.write_bytes(b"%PDF the supplementary note on unreviewed reports")
    return note


def _drafted(tmp_path, settings, bank, *families: str):
    registration = tmp_path / "registration"
    for family in families:
        write_family_record(registration, _draft(settings, bank, family), confirmatory=False)
    return registration


def test_issuing_the_record_registers_that_family_and_only_it(tmp_path, settings, bank):
    registration = _drafted(tmp_path, settings, bank, PRIMARY, EMBEDDED)
    frozen_before = (DEFAULT_BANK_DIR.parent / "registration" / RECORD_NAME).read_text()
    assert family_mode(registration, PRIMARY) == "pilot" and family_mode(registration, EMBEDDED) == "pilot"
    note = _note(tmp_path)
    path = issue_record(registration, PRIMARY, "RR-2026-0042", note, NOW, settings=settings, bank=bank)
    record = json.loads(path.read_text())
    assert record["status"] == "registered" and record["mode"] == "confirmatory"
    assert record["stage1_id"] == "RR-2026-0042" and record["issued_at"] == NOW
    assert record["supplementary_note"] == str(note) and len(record["supplementary_note_sha256"]) == 64
    # Every frozen hash is in the issued record, with the draft's values.
    draft = _draft(settings, bank)
    for field in ("settings_sha256", "bank_sha256", "manifest_sha256", "analysis_code_sha256"):
        assert record[field] == draft[field]
    assert set(FROZEN_FIELDS) <= set(record)
    assert "RR-2026-0042" in path.with_suffix(".md").read_text()
    # That family, and only it, is confirmatory; no registered file was edited or re-frozen.
    assert family_mode(registration, PRIMARY) == "confirmatory"
    assert family_mode(registration, EMBEDDED) == "pilot"
    assert (DEFAULT_BANK_DIR.parent / "registration" / RECORD_NAME).read_text() == frozen_before
    assert read_record()["settings_sha256"] == settings.sha256
    protocol = ProtocolResource(registration_dir=str(registration))
    assert protocol.view(PRIMARY).mode == "confirmatory" and protocol.view(PRIMARY).confirmatory
    assert protocol.view(EMBEDDED).mode == "pilot"


def test_issue_record_refuses_without_a_draft_with_a_failed_gate_or_without_the_note(tmp_path, settings, bank):
    registration = tmp_path / "registration"
    note = _note(tmp_path)
    with pytest.raises(FearAssetsError, match=r"no draft registration record.*registration_record"):
        issue_record(registration, PRIMARY, "RR-1", note, NOW, settings=settings, bank=bank)
    failing = _draft(settings, bank, gates={"binding (4.2)": {"passed": False, "numbers": {}, "message": "short"},
                                            "power (6.3)": {"passed": False, "numbers": {}, "message": "not run"}},
                     failed_gates=["binding (4.2)", "power (6.3)"])
    write_family_record(registration, failing, confirmatory=False)
    with pytest.raises(FearAssetsError, match=r"registration gates fail: binding \(4\.2\), power \(6\.3\)"):
        issue_record(registration, PRIMARY, "RR-1", note, NOW, settings=settings, bank=bank)
    write_family_record(registration, _draft(settings, bank), confirmatory=False)
    with pytest.raises(FearAssetsError, match=r"supplementary note .*missing\.pdf is missing or empty"):
        issue_record(registration, PRIMARY, "RR-1", tmp_path / "missing.pdf", NOW, settings=settings, bank=bank)
    empty = tmp_path / "empty.pdf"
    empty.write_bytes(b"")
    with pytest.raises(FearAssetsError, match="missing or empty"):
        issue_record(registration, PRIMARY, "RR-1", empty, NOW, settings=settings, bank=bank)
    with pytest.raises(FearAssetsError, match="Stage 1 identifier"):
        issue_record(registration, PRIMARY, "  ", note, NOW, settings=settings, bank=bank)
    # Every refusal left the draft a draft: the family is still in pilot mode.
    assert read_family_record(registration, PRIMARY)["status"] == "draft"
    assert family_mode(registration, PRIMARY) == "pilot"


def test_issue_record_refuses_a_draft_of_other_inputs_and_a_second_issue(tmp_path, settings, bank):
    registration = tmp_path / "registration"
    note = _note(tmp_path)
    write_family_record(registration, _draft(settings, bank, bank_sha256="b" * 64), confirmatory=False)
    with pytest.raises(FreezeError, match=r"drafted from other inputs.*bank_sha256: registered bbbbbbbbbbbbbbbb"):
        issue_record(registration, PRIMARY, "RR-1", note, NOW, settings=settings, bank=bank)
    write_family_record(registration, _draft(settings, bank), confirmatory=False)
    issue_record(registration, PRIMARY, "RR-1", note, NOW, settings=settings, bank=bank)
    issued = read_family_record(registration, PRIMARY)
    with pytest.raises(FearAssetsError, match=r"already issued \(Stage 1 RR-1.*never re-issued"):
        issue_record(registration, PRIMARY, "RR-2", note, "2026-12-02T00:00:00+00:00", settings=settings, bank=bank)
    assert read_family_record(registration, PRIMARY) == issued


def _registered_resource(tmp_path, settings, bank, **paths) -> ProtocolResource:
    registration = _drafted(tmp_path, settings, bank, PRIMARY, EMBEDDED)
    issue_record(registration, PRIMARY, "RR-7", _note(tmp_path), NOW, settings=settings, bank=bank)
    return ProtocolResource(registration_dir=str(registration), **paths)


def test_a_registered_family_whose_bank_changes_is_refused_naming_the_item(tmp_path, settings, bank):
    changed = tmp_path / "bank"
    shutil.copytree(DEFAULT_BANK_DIR, changed)
    events = changed / "events" / "generic_aversive.yaml"
    text = events.read_text()
    assert text.count("The old boiler in the basement will explode") == 1
    events.write_text(text.replace("The old boiler in the basement will explode", "The old boiler in the cellar will explode"))
    protocol = _registered_resource(tmp_path, settings, bank, bank_dir=str(changed))
    with pytest.raises(FreezeError) as err:
        protocol.view(PRIMARY)
    message = str(err.value)
    assert f"{PRIMARY} is registered" in message and "RR-7" in message
    assert "bank_sha256: registered" in message and "bank item:AVE-01 changed" in message
    assert "settings_sha256" not in message and "analysis_code_sha256" not in message
    # The other family, in pilot mode, is not compared.
    assert protocol.view(EMBEDDED).mode == "pilot"


def test_a_registered_family_whose_settings_change_is_refused_naming_the_section(tmp_path, settings, bank):
    text = REGISTERED_SETTINGS_PATH.read_text()
    assert text.count("  tost_alpha: 0.05\n") == 1
    changed = tmp_path / "protocol_settings.yaml"
    changed.write_text(text.replace("  tost_alpha: 0.05\n", "  tost_alpha: 0.04\n"))
    protocol = _registered_resource(tmp_path, settings, bank, settings_path=str(changed))
    with pytest.raises(FreezeError) as err:
        protocol.view(PRIMARY)
    message = str(err.value)
    assert "settings_sha256: registered" in message and "settings section matching changed" in message
    assert "bank_sha256" not in message
    assert protocol.view(EMBEDDED).mode == "pilot"


def test_a_registered_family_whose_code_changes_is_refused_naming_the_file(tmp_path, settings, bank, monkeypatch):
    protocol = _registered_resource(tmp_path, settings, bank)
    assert protocol.view(PRIMARY).mode == "confirmatory"  # unchanged inputs: the family runs
    edited = dict(registered_code_hashes())
    assert "analysis/h4.py" in edited
    edited["analysis/h4.py"] = "0" * 64
    # The registered code as it reads after an edit of one analysis module.
    monkeypatch.setattr(issue_module, "registered_code_hashes", lambda: edited)
    with pytest.raises(FreezeError) as err:
        protocol.view(PRIMARY)
    message = str(err.value)
    assert "analysis_code_sha256: registered" in message and "code file analysis/h4.py changed" in message
    assert protocol.view(EMBEDDED).mode == "pilot"
    # The pure comparison names an added file too.
    record = read_family_record(protocol.registration_dir, PRIMARY)
    with pytest.raises(FreezeError, match="code file analysis/new_rule.py added"):
        refuse_changed_inputs(protocol.registration_dir, PRIMARY, record, settings, bank,
                              {**registered_code_hashes(), "analysis/new_rule.py": "1" * 64})


def test_a_registered_familys_record_rerun_on_its_inputs_keeps_its_issue(tmp_path, settings, bank):
    """registration_record rerun for a registered family on the registered inputs rewrites
    the record with the same frozen values: it stays issued (identifier, time, per-part hashes);
    on other values, or with a gate failed, it is refused and the issued record stays."""
    protocol = _registered_resource(tmp_path, settings, bank)
    issued = read_family_record(protocol.registration_dir, PRIMARY)
    rerun = {k: v for k, v in issued.items() if k not in ("stage1_id", "issued_at", "frozen_items")}
    write_family_record(protocol.registration_dir, rerun, confirmatory=True)
    again = read_family_record(protocol.registration_dir, PRIMARY)
    assert again["stage1_id"] == "RR-7" and again["issued_at"] == NOW and again["frozen_items"] == issued["frozen_items"]
    assert family_mode(protocol.registration_dir, PRIMARY) == "confirmatory"
    with pytest.raises(FreezeError, match="never overwritten"):
        write_family_record(protocol.registration_dir, {**rerun, "depth_band": [3, 4]}, confirmatory=True)
    with pytest.raises(FreezeError, match="never replaced by one that is not"):
        write_family_record(protocol.registration_dir, {**rerun, "status": "refused", "failed_gates": ["x"]},
                            confirmatory=True)
    assert read_family_record(protocol.registration_dir, PRIMARY) == again
