"""The registration gates as Dagster asset checks (protocol 4.2-4.6, 6.3; D4, D6), each
shown to pass and to fail on constructed inputs at the registered boundaries, the
registration record, and the pilot/confirmatory modes through Dagster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

from fear_assets.analysis.controls import control_verdict
from fear_assets.defs.assets.analysis import posteriors_converged
from fear_assets.defs.assets.pilot.binding import binding_gate, scorer_agreement
from fear_assets.defs.assets.pilot.depths import positive_controls_pass
from fear_assets.defs.assets.pilot.matching import matching_gate, zero_preference_gate
from fear_assets.defs.assets.registration.record import registration_gates
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.reading.inputs import reading_inputs
from fear_assets.core.errors import FreezeError
from fear_assets.pilot.binding import in_context_rate
from fear_assets.pilot.matching import equivalence, frame_differences, frame_verdicts, select_frames
from fear_assets.pilot.report_scoring import agreement, kappa_verdict
from fear_assets.pilot.zero_preference import zero_preference_table, zero_preference_verdict
from fear_assets.registration.record import (frozen_differences, markdown, read_family_record,
                                             write_family_record)
from fear_assets.core.settings import PROJECT_ROOT


# -- zero preference (4.3) -------------------------------------------------------------------
def _zero_table(p_option1: float, settings) -> pd.DataFrame:
    band = settings.zero_preference
    lp = float(np.log(p_option1)), float(np.log(1 - p_option1))
    rows = pd.DataFrame([{"item_id": "TER-03", "fear": "termination", "frame_set": "confirmatory", "kind": "agent",
                          "agent": "self", "content": "threat", "rotation": 1, "first_listed": 1,
                          "logprob_a": lp[0], "logprob_b": lp[1]}])
    table = zero_preference_table(rows, band.low, band.high)
    passed, message = zero_preference_verdict(table, band.low, band.high)
    return table.assign(gate_passed=passed, message=message)


@pytest.mark.parametrize("p, passes", [(0.4, True), (0.6, True), (0.5, True), (0.399, False), (0.601, False)])
def test_zero_preference_check_at_its_bounds(settings, p, passes):
    result = zero_preference_gate(None, protocol=ProtocolResource(), zero_preference=_zero_table(p, settings))
    assert result.passed is passes
    if not passes:
        assert "TER-03" in result.description


# -- binding (4.2) ---------------------------------------------------------------------------
def _binding_table(n_correct: int, settings, frames_to_write=None) -> pd.DataFrame:
    rate, passed, message = in_context_rate([True] * n_correct + [False] * (40 - n_correct),
                                            settings.binding.pass_rate_min)
    return pd.DataFrame([{"item_id": "TER-01", "passes": True, "in_context_rate": rate, "in_context_passed": passed,
                          "in_context_message": message, "in_context_correct": n_correct, "in_context_documents": 40,
                          "frames_to_write": json.dumps(frames_to_write or {})}])


def test_binding_check_passes_at_36_of_40_and_fails_at_35(settings):
    assert binding_gate(None, protocol=ProtocolResource(), binding_results=_binding_table(36, settings)).passed
    failed = binding_gate(None, protocol=ProtocolResource(), binding_results=_binding_table(35, settings))
    assert not failed.passed and "uninterpretable" in failed.description


def test_binding_check_fails_when_a_fear_runs_short_of_frames(settings):
    result = binding_gate(None, protocol=ProtocolResource(), binding_results=_binding_table(40, settings, {"termination": 1}))
    assert not result.passed and "1 frame(s) for termination" in result.description


# -- scorer agreement (4.5) ------------------------------------------------------------------
def _kappa_vectors(disagreements: int) -> tuple[list[bool], list[bool]]:
    rule = [True] * 50 + [False] * 50
    scorer = list(rule)
    for i in range(disagreements):  # flip alternately on both sides to keep the margins even
        scorer[i if i % 2 == 0 else 50 + i] = not scorer[i if i % 2 == 0 else 50 + i]
    return rule, scorer


def _kappa_table(disagreements: int, settings) -> tuple[float, pd.DataFrame]:
    kappa, detail = agreement(*_kappa_vectors(disagreements))
    passed, message = kappa_verdict(kappa, settings.report_scoring.kappa_min, detail)
    return kappa, pd.DataFrame([{"kappa": kappa, "gate_passed": passed, "message": message, "refusal": False}])


def test_scorer_agreement_passes_at_081_and_fails_at_079(settings):
    kappa, table = _kappa_table(9, settings)  # 91/100 agree
    assert 0.80 < kappa < 0.83
    assert scorer_agreement(None, protocol=ProtocolResource(), report_scoring=table).passed
    kappa, table = _kappa_table(11, settings)  # 89/100 agree
    assert 0.77 < kappa < 0.80
    result = scorer_agreement(None, protocol=ProtocolResource(), report_scoring=table)
    assert not result.passed and "revise the keyword rule" in result.description


# -- matching (4.3) --------------------------------------------------------------------------
def _surprisal(shifts: dict[str, float]) -> pd.DataFrame:
    rows = []
    for item, number in (("TER-03", 3), ("TER-04", 4), ("TER-13", 13)):
        for rotation in (1, 2, 3):
            for option in (1, 2):
                for agent in ("self", "peer", "person"):
                    for content in ("threat", "harmless"):
                        rest = 3.0 + (shifts.get(item, 0.0) if (agent, content) == ("self", "threat") else 0.0)
                        rows.append({"item_id": item, "fear": "termination",
                                     "frame_set": "confirmatory" if number < 13 else "reserve",
                                     "rotation": rotation, "option": option, "agent": agent, "content": content,
                                     "rest_nll": rest})
    return pd.DataFrame(rows)


def _matched(shifts: dict[str, float], settings) -> pd.DataFrame:
    rule = settings.matching
    diffs = frame_differences(_surprisal(shifts))
    verdicts = frame_verdicts(diffs, rule.max_abs_difference)
    # Two confirmatory frames: the bank-level TOST has one difference per retained frame
    # (issue 10), so a single retained frame could never show equivalence.
    selection, shortfall = select_frames(verdicts, {"TER-03": 3, "TER-04": 4, "TER-13": 13}, 2)
    tost = equivalence(diffs, set(selection["item_id"]), rule.tost_bound)
    return verdicts.assign(frames_to_write=verdicts["fear"].map(shortfall).fillna(0).astype(int),
                           tost=tost.to_json(orient="records"), event_matching="[]")


def test_matching_check_replaces_a_frame_beyond_010_and_passes(settings):
    # TER-03 misses by a hair (0.1001), the reserve is exactly at the tolerance (0.10): kept.
    table = _matched({"TER-03": 0.1001, "TER-13": 0.0}, settings)
    assert not table.set_index("item_id").loc["TER-03", "passes"]
    assert matching_gate(None, protocol=_protocol(), matched_frames=table).passed


def test_matching_check_fails_and_says_how_many_frames_to_write(settings):
    table = _matched({"TER-03": 0.2, "TER-13": 0.2}, settings)
    result = matching_gate(None, protocol=_protocol(), matched_frames=table)
    assert not result.passed and "write 1 new frame(s) for termination" in result.description


def _protocol(**paths):
    from fear_assets.defs.resources.protocol import ProtocolResource

    return ProtocolResource(**paths)


# -- positive controls (4.6, D4) ---------------------------------------------------------------
@pytest.mark.parametrize("centre, passes", [(0.30, True), (0.10, False), (0.0, False)])
def test_positive_control_pass_rule(settings, centre, passes):
    draws = np.random.default_rng(1).normal(centre, 0.02, 4000)
    v = control_verdict("marked_priority", draws, settings.decision.hdi_prob,
                        settings.positive_controls.pass_min_mean, 0.0)
    assert v.passed is passes
    table = pd.DataFrame([v.__dict__])
    assert positive_controls_pass(None, protocol=ProtocolResource(), pilot_controls=table).passed is passes


def test_a_control_with_a_mean_at_the_sesoi_passes_and_just_below_fails(settings):
    rule = settings.positive_controls
    draws = np.random.default_rng(2).normal(0.0, 0.01, 4000)
    at = control_verdict("c", draws - draws.mean() + 0.15, 0.99, rule.pass_min_mean, 0.0)
    below = control_verdict("c", draws - draws.mean() + 0.149, 0.99, rule.pass_min_mean, 0.0)
    assert at.passed and not below.passed and "< 0.15" in below.reason


# -- registration record (D6) ------------------------------------------------------------------
def _record(**over) -> dict:
    record = {"protocol": "two-facts-one-gate", "protocol_version": "v", "family": "fam", "mode": "pilot",
              "status": "draft", "stand_in": "", "reduced_design": "", "settings_sha256": "a" * 64,
              "bank_sha256": "b" * 64, "manifest_sha256": "c" * 64, "analysis_code_sha256": "d" * 64,
              "selected_names": ["Orin", "Tavi", "Kemi", "Sora", "Pell"], "selected_frames": ["TER-03"],
              "replacements": {}, "depth_band": [1, 2], "band_rule": "r", "h5_depth": 2, "h5_rule": "r",
              "pilot_sigma": 0.3, "gates": {"binding (4.2)": {"passed": False, "numbers": {"in-context": "35/40"},
                                                              "message": "below 90%"}},
              "failed_gates": ["binding (4.2)"], "not_run": [],
              "binding_in_context": {"passed": False, "correct": 35, "documents": 40, "message": "below 90%"}}
    record.update(over)
    return record


def test_registration_record_is_written_as_json_and_markdown_and_compared(tmp_path):
    path = write_family_record(tmp_path, _record(), confirmatory=False)
    assert json.loads(path.read_text())["failed_gates"] == ["binding (4.2)"]
    md = (tmp_path / "fam" / "registration_record.md").read_text()
    assert "| binding (4.2) | **failed** | in-context: 35/40 | below 90% |" in md
    stored = read_family_record(tmp_path, "fam")
    assert frozen_differences(stored, {"bank_sha256": "b" * 64}) == []
    diffs = frozen_differences(stored, {"bank_sha256": "e" * 64, "analysis_code_sha256": "d" * 64})
    assert len(diffs) == 1 and diffs[0].startswith("bank_sha256")


def test_a_registered_record_is_never_overwritten_with_other_frozen_values(tmp_path):
    write_family_record(tmp_path, _record(status="registered", mode="confirmatory"), confirmatory=True)
    with pytest.raises(FreezeError, match="never overwritten"):
        write_family_record(tmp_path, _record(status="registered", depth_band=[2, 3]), confirmatory=True)
    # The stored record is unchanged.
    assert read_family_record(tmp_path, "fam")["depth_band"] == [1, 2]
    # A pilot draft is rewritten freely.
    write_family_record(tmp_path, _record(family="fam2"), confirmatory=False)
    write_family_record(tmp_path, _record(family="fam2", depth_band=[3, 4]), confirmatory=False)
    assert read_family_record(tmp_path, "fam2")["depth_band"] == [3, 4]


def test_markdown_lists_every_gate():
    md = markdown(_record(gates={"a": {"passed": True, "numbers": {}, "message": "ok"},
                                 "b": {"passed": False, "numbers": {"x": 1}, "message": "bad"}}))
    assert "| a | passed | none | ok | none |" in md and "| b | **failed** | x: 1 | bad |" in md
    assert "Failed gates: b." in md


def test_registration_gates_check_lists_the_failing_gates():
    table = pd.DataFrame([{"gate": "binding (4.2)", "passed": False, "numbers": "{}", "message": "below 90%"},
                          {"gate": "name_gate (4.2)", "passed": True, "numbers": "{}", "message": "ok"}])
    result = registration_gates(None, protocol=ProtocolResource(), registration_record=table)
    # A short description naming the failed gates; each gate's numbers and fix are in its row.
    assert not result.passed and result.description == "1 of 2 gates failed: binding (4.2)"
    rows = {r.data["gate"]: r.data for r in result.metadata["gate table"].value.records}
    assert rows["binding (4.2)"]["outcome"] == "failed" and rows["name_gate (4.2)"]["fix"] == "none"
    assert registration_gates(None, protocol=ProtocolResource(), registration_record=table.assign(passed=True)).passed


# -- convergence and the reading's inputs (6.1, D5) ---------------------------------------------
def test_convergence_check_names_the_contrast_that_did_not_converge():
    # "kind" tells the estimands that can change the reading from the rest (issue 10: only they block).
    table = pd.DataFrame([{"contrast": "H2", "kind": "confirmatory", "status": "estimated", "rhat": 1.002,
                           "ess_bulk": 900.0, "ess_tail": 800.0, "divergences": 0, "convergence_problems": ""},
                          {"contrast": "H5", "kind": "confirmatory", "status": "estimated", "rhat": 1.05,
                           "ess_bulk": 90.0, "ess_tail": 80.0, "divergences": 3,
                           "convergence_problems": "R-hat 1.050 > 1.01"}])
    result = posteriors_converged(None, protocol=ProtocolResource(), posteriors=table)
    assert not result.passed and "H5: R-hat" in result.description
    assert posteriors_converged(None, protocol=ProtocolResource(), posteriors=table.iloc[:1]).passed


def test_reading_inputs_treat_unscored_gates_and_controls_conservatively():
    table = pd.DataFrame([
        {"contrast": "H2", "kind": "confirmatory", "status": "estimated", "label": "supported",
         "practically_meaningful": True, "control_passed": np.nan},
        {"contrast": "gate_a_service_relevance_H2", "kind": "gate", "status": "not_scored", "label": "",
         "practically_meaningful": False, "control_passed": np.nan},
        {"contrast": "control_marked_priority", "kind": "control", "status": "not_scored", "label": "",
         "practically_meaningful": False, "control_passed": False}])
    args = reading_inputs(table, _record())
    # A gate that was not scored reads not_scored, which never passes (issue 10 item 3; it read
    # "unresolved" before, which for gate (b) counted as a pass).
    assert args["h2"] == "supported" and args["gate_a"] == "not_scored" and args["h5"] == "not_tested"
    assert args["controls_failed"] and args["binding_failed"]


# -- modes through Dagster (issue: pilot gates, acceptance 2) -----------------------------------
_MODE_RUN = textwrap.dedent("""
    import json, sys
    import dagster as dg
    import duckdb
    from fear_assets.defs.definitions import all_assets, all_checks, resources
    from fear_assets.defs.partitions import registered_partition_keys
    from fear_assets.core.settings import load_settings
    SETTINGS = load_settings()
    db, registration, families = sys.argv[1], sys.argv[2], sys.argv[3:]
    res = resources(db, registration_dir=registration)
    everything = [*all_assets, *all_checks]
    results = {}
    with dg.instance_for_test() as instance:
        dg.materialize(everything, selection=["frame_bank"], instance=instance, resources=res, raise_on_error=False)
        for family in families:
            out = {"mode": res["protocol"].mode(family)}
            # One run: the gate and a pilot asset downstream of it (same family partition).
            run = dg.materialize(everything, selection=["name_gate", "zero_preference"], partition_key=family,
                                 instance=instance, resources=res, raise_on_error=False)
            out["checks"] = [(e.check_name, e.passed, e.severity.name) for e in run.get_asset_check_evaluations()]
            out["materialised"] = sorted(e.asset_key.to_user_string() for e in run.get_asset_materialization_events())
            out["failed_steps"] = [e.step_key for e in run.all_events if e.is_step_failure]
            # The trial table (family x depth, so a run of its own) reads the gate's outcome.
            key = registered_partition_keys(SETTINGS, family)[0]
            run = dg.materialize(everything, selection=["pilot_trial_table"], partition_key=key, instance=instance,
                                 resources=res, raise_on_error=False)
            out["trial_table_materialised"] = bool(run.get_asset_materialization_events())
            out["trial_table_failed"] = any(e.is_step_failure for e in run.all_events)
            out["flags"] = []
            if out["trial_table_materialised"]:
                with duckdb.connect(db, read_only=True) as con:
                    out["flags"] = [r[0] for r in con.execute(
                        "select distinct name_gate_passed from two_facts_one_gate.pilot_trial_table "
                        "where family = ?", [family]).fetchall()]
            results[family] = out
    print(json.dumps(results))
""")


def _run_modes(tmp_path, registered_family: str, *families: str) -> dict:
    """Run ``families`` in one workspace (one instance, store and registration directory) in
    which only ``registered_family``'s record is issued; the settings are the registered file."""
    from fear_assets.core.settings import load_settings
    from fear_assets.stimuli.bank import load_bank
    from fear_assets_tests.issued import register

    settings = load_settings()
    registration = tmp_path / "registration"
    register(registration, registered_family, settings, load_bank(settings=settings))
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    env.pop("FEAR_ASSETS_SETTINGS", None)
    out = subprocess.run([sys.executable, "-c", _MODE_RUN, str(tmp_path / "modes.duckdb"), str(registration),
                          *families], env=env, capture_output=True, text=True, timeout=900, cwd=PROJECT_ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# Slow (about 4.5 CPU-minutes: two families' name gates, zero-preference scoring and trial tables in one
# subprocess). The default run keeps its rule through cheaper tests: test_dagster's failed name gate
# (flagged in pilot mode, refused once the record is issued) and test_flags' confirmatory run
# (a blocking check stops its downstream in the same run).
@pytest.mark.slow
def test_confirmatory_mode_runs_nothing_downstream_of_a_failed_gate(tmp_path):
    """The name gate fails for the registered names (docs/name_gate.md). Issuing family A's
    registration record switches A, and only A, to blocking: A's failed gate has ERROR
    severity, its blocking check stops the pilot asset downstream in the same run, and A's
    trial table refuses to build; family B, in pilot mode in the same workspace, fails the
    same gate as a warning: its downstream asset runs, its table builds and every row
    carries the flag. No settings file is edited."""
    a, b = "qwen2.5-7b", "smollm2-135m"  # A's downstream never runs, so its 7B model is never loaded
    runs = _run_modes(tmp_path, a, a, b)
    confirmatory, pilot = runs[a], runs[b]
    assert confirmatory["mode"] == "confirmatory"
    assert ("five_single_token_names", False) in [tuple(c[:2]) for c in confirmatory["checks"]]
    assert ("five_single_token_names", False, "ERROR") in [tuple(c) for c in confirmatory["checks"]]
    # The blocking gate stopped its downstream asset in the same run: only the check's own
    # step fails (that is how Dagster blocks), zero_preference is skipped, never started.
    assert confirmatory["materialised"] == ["name_gate"]
    assert confirmatory["failed_steps"] == ["name_gate_five_single_token_names"]
    assert not confirmatory["trial_table_materialised"] and confirmatory["trial_table_failed"]
    # The other family stays in its own mode: the same failure is a warning, nothing stops.
    assert pilot["mode"] == "pilot"
    assert ("five_single_token_names", False, "WARN") in [tuple(c) for c in pilot["checks"]]
    assert pilot["materialised"] == ["name_gate", "zero_preference"] and pilot["failed_steps"] == []
    assert pilot["trial_table_materialised"] and pilot["flags"] == [False]
