"""The registered code hash (Appendix C step 4: "register ... with the frozen bank hash, model
manifest, analysis code and supplementary note hash"): every function that decides a
document, a score, a gate, a label or a reading is under it, and a change after registration
is refused by the freeze check. Coverage is derived from the package tree, not from a list.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from fear_assets.core.errors import FreezeError
from fear_assets.registration import record as record_module
from fear_assets.registration.record import PACKAGE_ROOT, analysis_code_sha256, read_family_record, write_family_record
from fear_assets.defs.resources.protocol import ProtocolResource

#: What the brief and the protocol name as deciding a document, a score, a gate, a label or a
#: reading: each must be hashed, whatever the module's list of wiring says.
SCIENCE = ("core", "lm", "stimuli", "design", "models", "pilot", "registration", "probes", "analysis", "reading",
           "simulation", "report")
MANIFEST = pd.DataFrame([{"family": "fam", "role": "tested", "checkpoint": "x", "file": "f", "sha256": "0" * 64,
                          "dtype": "float32", "context_window": 8192, "attn_implementation": "eager"}])


def _copy_tree(tmp_path: Path) -> Path:
    root = tmp_path / "fear_assets"
    shutil.copytree(PACKAGE_ROOT, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _edit_one_character(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1 and len(old) == len(new) and sum(a != b for a, b in zip(old, new)) == 1
    path.write_text(text.replace(old, new), encoding="utf-8")


def _registered(settings, bank, code_sha256: str, **over) -> dict:
    from fear_assets.lm.models import manifest_digest

    return {"protocol": "two-facts-one-gate", "protocol_version": "v", "family": "fam", "mode": "confirmatory",
            "status": "registered", "stand_in": "", "reduced_design": "", "settings_sha256": settings.sha256,
            "bank_sha256": bank.sha256, "manifest_sha256": manifest_digest(MANIFEST),
            "analysis_code_sha256": code_sha256, "selected_names": ["Orin", "Tavi", "Kemi", "Sora", "Pell"],
            "selected_frames": ["TER-03"], "replacements": {}, "depth_band": [1, 2], "band_rule": "r", "h5_depth": 2,
            "h5_rule": "r", "pilot_sigma": 0.8, "pilot_sigma_judge": 0.9, "gates": {}, "failed_gates": [],
            "not_run": [], "binding_in_context": None, "power": None, **over}


# -- coverage, derived from the tree ----------------------------------------------------------
def test_every_file_outside_the_wiring_moves_the_registered_hash(tmp_path):
    root = _copy_tree(tmp_path)
    before = analysis_code_sha256(root)
    assert before == analysis_code_sha256(PACKAGE_ROOT)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    moved, still = [], []
    for path in files:
        relative = path.relative_to(root)
        original = path.read_bytes()
        path.write_bytes(original + b"#")  # one character more
        (moved if analysis_code_sha256(root) != before else still).append(relative)
        path.write_bytes(original)
    assert analysis_code_sha256(root) == before
    science_unhashed = [p for p in still if p.parts[0] in SCIENCE]
    assert not science_unhashed, f"edits that leave the registered hash unchanged: {science_unhashed}"
    # Everything left out is declared wiring, with a reason; no science package is declared so.
    wiring = record_module.CODE_NOT_HASHED
    assert {p.parts[0] for p in still} <= set(wiring), still
    assert not set(SCIENCE) & set(wiring)
    assert all((PACKAGE_ROOT / name).exists() and reason for name, reason in wiring.items()), "stale wiring entry"
    # Every entry of the tree is one or the other: a science entry is in what was hashed.
    top = {p.name for p in PACKAGE_ROOT.iterdir() if p.name != "__pycache__" and not p.name.startswith(".")}
    assert top == {p.parts[0] for p in moved} | set(wiring)
    assert set(SCIENCE) <= {p.parts[0] for p in moved}


def test_a_new_package_or_a_data_file_is_hashed_without_being_named(tmp_path):
    root = _copy_tree(tmp_path)
    before = analysis_code_sha256(root)
    (root / "newstage").mkdir()
    (root / "newstage" / "__init__.py").write_text("", encoding="utf-8")
    (root / "newstage" / "rule.py").write_text("THRESHOLD = 0.5\n", encoding="utf-8")
    with_package = analysis_code_sha256(root)
    (root / "design" / "template.txt").write_text("{agent} was {verb}.\n", encoding="utf-8")
    assert len({before, with_package, analysis_code_sha256(root)}) == 3


def test_a_file_under_the_rehearsal_tooling_leaves_the_registered_hash_unchanged(tmp_path):
    # Rehearsal models are tooling: rebuilding or editing them must never change a
    # registered family's code hash (a new file there, or one character more in one).
    root = _copy_tree(tmp_path)
    before = analysis_code_sha256(root)
    (root / "rehearsal" / "new_tool.py").write_text("TINY_LAYERS = 3\n", encoding="utf-8")
    models = root / "rehearsal" / "models.py"
    models.write_bytes(models.read_bytes() + b"#")
    assert analysis_code_sha256(root) == before
    # The same edit inside a stage package does move it.
    (root / "lm" / "new_tool.py").write_text("TINY_LAYERS = 3\n", encoding="utf-8")
    assert analysis_code_sha256(root) != before


# -- an edit after registration changes the hash and is refused --------------------------------
EDITS = {
    # The primary outcome: Delta = agent report score - partner report score (4.5).
    "Delta assembly": ("design/trial_scores.py", 'rec["report_score_agent"] - rec["report_score_partner"]',
                       'rec["report_score_agent"] + rec["report_score_partner"]'),
    # 4.3: option 1 if k + depth index + cell index is even.
    "option rule": ("design/trials.py", "total % 2 == 0", "total % 2 == 1"),
    # 4.4: the agent sentence's content slot filled from the frame's template.
    "document template": ("design/documents.py",
                          "verb=verb, content=item.content_options[option - 1])\n\n\ndef canonical",
                          "verb=verb, content=item.content_options[option - 2])\n\n\ndef canonical"),
}


@pytest.mark.parametrize("what", list(EDITS))
def test_editing_one_character_of_the_outcome_code_changes_the_hash_and_is_refused(settings, bank, tmp_path,
                                                                                   monkeypatch, what):
    from fear_assets.defs.assets.pilot.surprisal import matches_registration_record

    module, old, new = EDITS[what]
    registered_code = analysis_code_sha256(PACKAGE_ROOT)
    registration = tmp_path / "registration"
    write_family_record(registration, _registered(settings, bank, registered_code), confirmatory=True)
    protocol = ProtocolResource(registration_dir=str(registration))
    root = _copy_tree(tmp_path)
    # Control: the unedited copy matches the registered record.
    monkeypatch.setattr(record_module, "PACKAGE_ROOT", root)
    assert matches_registration_record(None, protocol=protocol, model_manifest=MANIFEST).passed
    _edit_one_character(root / module, old, new)
    edited_code = analysis_code_sha256(root)
    assert edited_code != registered_code
    # Downstream is blocked: the freeze check fails (ERROR on a registered record, which is
    # blocking in confirmatory mode) naming the code hash, and the record is not rewritten.
    check = matches_registration_record(None, protocol=protocol, model_manifest=MANIFEST)
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    assert "analysis_code_sha256: registered " + registered_code[:16] in check.description
    with pytest.raises(FreezeError, match="analysis_code_sha256"):
        write_family_record(registration, _registered(settings, bank, edited_code), confirmatory=True)
    assert read_family_record(registration, "fam")["analysis_code_sha256"] == registered_code


def test_editing_one_character_of_the_banks_document_template_is_refused(settings, bank, bank_copy):
    """The documents' text templates are bank data (data/bank/templates.yaml): under the bank hash."""
    from fear_assets.defs.assets.pilot.surprisal import matches_registration_record

    registration = bank_copy.parent / "registration"
    write_family_record(registration, _registered(settings, bank, analysis_code_sha256()), confirmatory=True)
    _edit_one_character(bank_copy / "templates.yaml", "another company.\"\n  service_relevance",
                        "another company!\"\n  service_relevance")
    check = matches_registration_record(None, protocol=ProtocolResource(registration_dir=str(registration),
                                                                  bank_dir=str(bank_copy)), model_manifest=MANIFEST)
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR and "bank_sha256" in check.description


def test_the_decisions_moved_out_of_the_asset_bodies_are_under_the_hash():
    import inspect

    from fear_assets.design import scored
    from fear_assets.pilot import depth_rules, gate_c_scale
    from fear_assets.registration import compose

    hashed = set(record_module.registered_code_files())
    for fn in (gate_c_scale.sigma_depths, gate_c_scale.reader_sigma, compose.compose_record, compose.pilot_sigmas,
               compose.supplementary_note, scored.scored_rows, scored.control_rows, depth_rules.pooled_by_depth):
        assert Path(inspect.getsourcefile(fn)).resolve() in hashed, fn.__name__
    # 6.2's sigma is "the primary model in the pilot": every pilot depth, in depth order.
    assert gate_c_scale.sigma_depths(["d3", "d1", "d10", "d2", "d1"]) == ["d1", "d2", "d3", "d10"]
    # A judge block that is not scored has no sigma; the tested model's is required.
    never = lambda table: pytest.fail("no fit without rows")  # noqa: E731
    assert math.isnan(gate_c_scale.reader_sigma(never, pd.DataFrame(), "judge"))
    with pytest.raises(ValueError, match="no pilot_primary rows"):
        gate_c_scale.reader_sigma(never, pd.DataFrame(), "tested")


# -- the pilot sigmas are frozen fields (6.2) -------------------------------------------------
@pytest.mark.parametrize("field", ["pilot_sigma", "pilot_sigma_judge"])
def test_a_changed_pilot_sigma_after_registration_is_refused_naming_the_field(settings, bank, tmp_path, field):
    write_family_record(tmp_path, _registered(settings, bank, "d" * 64), confirmatory=True)
    changed = _registered(settings, bank, "d" * 64, **{field: round(_registered(settings, bank, "")[field] + 0.01, 6)})
    with pytest.raises(FreezeError, match=rf"{field}: registered 0\.[89], now 0\.[89]1"):
        write_family_record(tmp_path, changed, confirmatory=True)
    assert read_family_record(tmp_path, "fam")[field] == _registered(settings, bank, "")[field]


def test_the_record_inserts_each_readers_pilot_sigma(settings):
    from fear_assets.registration.compose import compose_record

    depths = pd.DataFrame([{"depth_band": "1,2", "band_rule": "r", "h5_depth": 2, "h5_rule": "r"}])
    controls = pd.DataFrame([{"pilot_sigma": 0.81234567, "pilot_sigma_judge": float("nan")}])
    hashes = {k: "a" * 64 for k in ("settings_sha256", "bank_sha256", "manifest_sha256", "analysis_code_sha256")}
    note = {"supplementary_note": "n.pdf", "supplementary_note_sha256": "e" * 64}
    family = next(iter(settings.families))
    record = compose_record(settings, family, "pilot", hashes, ["A"] * 5, ["TER-03"], {}, depths, controls, {}, None, None, note,
                            pd.DataFrame())
    assert record["pilot_sigma"] == 0.812346 and record["pilot_sigma_judge"] is None
    assert record["supplementary_note_sha256"] == "e" * 64 and record["depth_band"] == [1, 2]
    assert json.loads(json.dumps(record)) == record  # the JSON the record file holds


# -- the supplementary note's hash (Declarations, Appendix C step 4) ---------------------------
def test_confirmatory_registration_is_refused_without_the_supplementary_note(tmp_path):
    from fear_assets.registration.compose import note_path, supplementary_note

    path = note_path(tmp_path)
    with pytest.raises(FreezeError, match=r"supplementary note is missing.*supplementary_note\.pdf.*run config"):
        supplementary_note(path, confirmatory=True)
    path.write_bytes(b"")  # an empty file is not a note
    with pytest.raises(FreezeError, match="supplementary note is missing"):
        supplementary_note(path, confirmatory=True)
    # A pilot draft records it as not provided; the Markdown says it is required to register.
    assert supplementary_note(path, confirmatory=False)["supplementary_note_sha256"] is None
    path.write_bytes(b"Unreviewed reports: ...\n")
    entry = supplementary_note(path, confirmatory=True)
    assert entry["supplementary_note_sha256"] == hashlib.sha256(b"Unreviewed reports: ...\n").hexdigest()
    other = tmp_path / "elsewhere.md"
    other.write_text("note", encoding="utf-8")
    assert supplementary_note(note_path(tmp_path, str(other)), confirmatory=True)["supplementary_note"] == str(other)
    from fear_assets.registration.record import markdown

    assert "**not provided** (required to register)" in markdown(
        {**_markdown_record(), "supplementary_note": str(path), "supplementary_note_sha256": None})


def _markdown_record() -> dict:
    return {"protocol": "p", "protocol_version": "v", "family": "fam", "mode": "pilot", "status": "draft",
            "settings_sha256": "a" * 64, "bank_sha256": "b" * 64, "manifest_sha256": "c" * 64,
            "analysis_code_sha256": "d" * 64, "selected_names": ["A"] * 5, "depth_band": [1], "band_rule": "r",
            "h5_depth": 1, "h5_rule": "r", "pilot_sigma": 0.8, "selected_frames": [], "gates": {}}


def test_an_edited_supplementary_note_after_registration_is_refused(settings, bank, tmp_path):
    from fear_assets.defs.assets.pilot.surprisal import matches_registration_record
    from fear_assets.registration.compose import supplementary_note

    note = tmp_path / "supplementary_note.pdf"
    note.write_bytes(b"%PDF-1.7 unreviewed reports\n")
    entry = supplementary_note(note, confirmatory=True)
    registration = tmp_path / "registration"
    write_family_record(registration, _registered(settings, bank, analysis_code_sha256(), **entry), confirmatory=True)
    protocol = ProtocolResource(registration_dir=str(registration))
    assert matches_registration_record(None, protocol=protocol, model_manifest=MANIFEST).passed
    note.write_bytes(b"%PDF-1.7 unreviewed reportS\n")  # one character
    check = matches_registration_record(None, protocol=protocol, model_manifest=MANIFEST)
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    assert "supplementary_note_sha256" in check.description
    with pytest.raises(FreezeError, match="supplementary_note_sha256"):
        write_family_record(registration, _registered(settings, bank, analysis_code_sha256(),
                                                      **supplementary_note(note, confirmatory=True)), confirmatory=True)


def test_the_record_asset_refuses_a_confirmatory_registration_without_the_note(tmp_path):
    """The asset itself, for a registered family (confirmatory mode: its record is issued, on
    the current inputs) with no note at the default path: refused before any record is
    written, naming the file and the run-config key."""
    from fear_assets.defs.assets.registration.record import RecordConfig, registration_record
    from fear_assets_tests.issued import issued_protocol

    registration = tmp_path / "registration"
    plain = ProtocolResource()
    protocol = issued_protocol(registration, "smollm2-135m", settings_sha256=plain.settings().sha256,
                               bank_sha256=plain.bank().sha256, analysis_code_sha256=analysis_code_sha256())
    assert protocol.view("smollm2-135m").mode == "confirmatory"
    issued = (registration / "smollm2-135m" / "registration_record.json").read_text()
    empty = pd.DataFrame()
    with pytest.raises(FreezeError, match=r"supplementary note is missing.*registration/supplementary_note\.pdf"
                                          r".*ops: registration_record: config: supplementary_note"):
        registration_record(context=dg.build_asset_context(partition_key="smollm2-135m"), config=RecordConfig(),
                            protocol=protocol, name_gate=empty, model_manifest=empty, matched_frames=empty,
                            zero_preference=empty, binding_results=empty, report_scoring=empty,
                            pilot_depths=empty, pilot_controls=empty, pilot_probe_controls=empty,
                            power_summary=empty)
    assert (registration / "smollm2-135m" / "registration_record.json").read_text() == issued
    assert sorted(p.name for p in (registration / "smollm2-135m").iterdir()) == ["registration_record.json"]
