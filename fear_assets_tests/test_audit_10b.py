"""Issue 10, part B: registered-rule corrections in the reading, the pilot gate verdicts and
the registration record. Each test is named after its audit item and fails on the code
before the correction."""

from __future__ import annotations

import itertools
import json

import dagster as dg
import numpy as np
import pandas as pd
import pytest

import fear_assets
from fear_assets.analysis.gate_b import recall_rows
from fear_assets.defs.assets.analysis import posteriors_converged
from fear_assets.defs.assets.reading import section8_reading as section8_reading_asset
from fear_assets.defs.assets.pilot.binding import binding_gate
from fear_assets.defs.assets.pilot.depths import pilot_depths
from fear_assets.defs.assets.registration.record import registration_gates
from fear_assets.core.errors import FearAssetsError, FreezeError
from fear_assets.pilot.binding import in_context_rate
from fear_assets.pilot.depth_rules import depth_band, neutral_mention_rates
from fear_assets.pilot.report_scoring import score_reports
from fear_assets.models.decision import GATE_LABELS, LABELS, POWER_GATE_NOT_RUN
from fear_assets.reading.inputs import cross_family_statement, reading_inputs
from fear_assets.registration.gates import (binding_outcomes, deviations, power_gate, registration_status)
from fear_assets.registration.record import markdown, read_family_record, write_family_record
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets_tests.issued import issued_protocol

REFUSALS = ["I can't", "I cannot", "I'm sorry"]


# The shape power_summary stores (issue 11): only a complete, non-demo result decides anything.
REGISTERED_POWER = {"demo": False, "status": "complete", "controls_to_strengthen": False, "frames": 50,
                    "frames_simulated": [50], "estimation_only": [], "joint_shortfall_source": None, "fits": 0,
                    "fits_missing_convergence_rule": 0, "not_simulated": {}, "targets": []}


def _record(**over) -> dict:
    record = {"protocol": "two-facts-one-gate", "protocol_version": "v", "family": "fam", "mode": "pilot",
              "status": "draft", "stand_in": "", "reduced_design": "", "settings_sha256": "a" * 64,
              "bank_sha256": "b" * 64, "manifest_sha256": "c" * 64, "analysis_code_sha256": "d" * 64,
              "selected_names": ["Orin", "Tavi", "Kemi", "Sora", "Pell"], "selected_frames": ["TER-03"],
              "replacements": {}, "depth_band": [1, 2], "band_rule": "r", "h5_depth": 2, "h5_rule": "r",
              "pilot_sigma": 0.3, "gates": {}, "failed_gates": [], "not_run": [],
              "binding_in_context": {"passed": True, "correct": 38, "documents": 40, "message": "ok"},
              "power": None}
    record.update(over)
    return record


def _posteriors(**labels) -> pd.DataFrame:
    """H2 and the three gates estimated with the given labels (a label None: row absent),
    every control passing."""
    names = {"H2": "H2", "H5": "H5", "a": "gate_a_service_relevance_H2", "b": "gate_b_recall_H2",
             "c": "gate_c_judge_H2_difference"}
    rows = [{"contrast": names[k], "kind": "confirmatory" if k in ("H2", "H5") else "gate", "status": "estimated",
             "label": v, "practically_meaningful": True, "control_passed": np.nan, "convergence_problems": ""}
            for k, v in labels.items() if v is not None]
    rows.append({"contrast": "control_marked_priority", "kind": "control", "status": "estimated", "label": "passes",
                 "practically_meaningful": False, "control_passed": True, "convergence_problems": ""})
    return pd.DataFrame(rows)


# -- 3. a gate that was not scored never passes; a few missing values do not unscore it ---------
def test_audit_gate_b_not_scored_never_passes():
    # Every combination with at least one gate not scored and H2 Supported: never rows 10-12.
    for h5, a, b, c in itertools.product((*LABELS, "not_tested"), GATE_LABELS, GATE_LABELS, GATE_LABELS):
        if "not_scored" not in (a, b, c):
            continue
        r = fear_assets.section8_reading("supported", h5, a, b, c, False, False, False, h2_meaningful=True)
        assert r.row in (8, 9), (h5, a, b, c)
        assert set(r.not_scored_gates) == {g for g, x in zip("abc", (a, b, c)) if x == "not_scored"}
        assert any("not scored" in q for q in r.qualifiers)
    # The audited case: gates (a) and (c) pass, (b) never scored -> inconclusive, not consistent.
    r = fear_assets.section8_reading("supported", "supported", "supported", "not_scored", "supported",
                                     False, False, False, h2_meaningful=True)
    assert (r.row, r.code) == (9, "SELF_THREAT_WEIGHT_GATES_INCONCLUSIVE")
    assert "gate(s) not scored, so they cannot pass: (b)" in r.qualifiers
    # An Unresolved (b) that was scored still counts as a pass (6.2).
    assert fear_assets.section8_reading("supported", "supported", "supported", "unresolved", "supported",
                                        False, False, False, h2_meaningful=True).row == 10
    # The reading's inputs: a gate row that is absent or not_scored reads not_scored, not Unresolved.
    args = reading_inputs(_posteriors(H2="supported", H5="supported", a="supported", c="supported"), _record())
    assert args["gate_b"] == "not_scored" and args["gate_a"] == "supported"
    table = _posteriors(H2="supported", H5="supported", a="supported", b="supported", c="supported")
    table.loc[table["contrast"] == "gate_b_recall_H2", ["status", "label"]] = ["not_scored", ""]
    args = reading_inputs(table, _record(power={"gates_underpowered": False}))
    args.pop("in_context")
    assert args["gate_b"] == "not_scored" and fear_assets.section8_reading(**args).row == 9


def _primary(n_per_cell: int = 4, depths=("d1", "d2")) -> pd.DataFrame:
    rows = [{"agent": a, "content": c, "depth": d, "delta": 0.1, "delta_recall": 0.2 + i / 100}
            for a in ("self", "peer", "person") for c in ("threat", "harmless") for d in depths
            for i in range(n_per_cell)]
    return pd.DataFrame(rows)


def test_audit_gate_b_fits_the_rows_present_and_counts_the_missing():
    primary = _primary()
    primary.loc[[0, 5, 17], "delta_recall"] = np.nan
    rows = recall_rows(primary, ["d1", "d2"])
    assert rows.scored and rows.missing == 3 and rows.total == 48
    assert len(rows.data) == 45 and rows.data["outcome"].notna().all()
    assert "3 of 48 primary rows lack a recall Delta, fitted on the 45 present" in rows.note
    # No recall Delta at all: not scored, with the count.
    none = recall_rows(primary.assign(delta_recall=np.nan), ["d1", "d2"])
    assert not none.scored and none.missing == 48 and "not read" in none.note
    # A cell empty at a band depth: H2 cannot be formed, so not scored (and says where).
    hole = primary.copy()
    hole.loc[(hole.agent == "self") & (hole.content == "threat") & (hole.depth == "d2"), "delta_recall"] = np.nan
    result = recall_rows(hole, ["d1", "d2"])
    assert not result.scored and "self/threat/d2" in result.note
    # ...but a hole outside the band does not unscore it.
    assert recall_rows(hole, ["d1"]).scored


# -- 4. D5 row 2 is the in-context binding rate only ------------------------------------------
def test_audit_binding_reading_is_the_in_context_rate_only(settings, tmp_path):
    minimum = settings.binding.pass_rate_min
    # 40/40 in context but a fear short of frames: a registration gate fails, the reading is not row 2.
    _, ok, message = in_context_rate([True] * 40, minimum)
    gate, carried = binding_outcomes(ok, 40, 40, message, 3, {"termination": 1, "isolation": 0})
    assert not gate["passed"] and "1 frame(s) for termination" in gate["message"] and carried["passed"]
    record = _record(gates={"binding single-sentence (4.2)": gate}, failed_gates=["binding single-sentence (4.2)"],
                     binding_in_context=carried)
    args = reading_inputs(_posteriors(H2="supported", H5="supported", a="supported", b="supported",
                                      c="supported"), record)
    assert args["binding_failed"] is False
    args.pop("in_context")
    assert fear_assets.section8_reading(**args).code != "NO_READING_BINDING_FAILED"
    # 35/40 in context: row 2, whatever the frames.
    _, failed, message = in_context_rate([True] * 35 + [False] * 5, minimum)
    gate, carried = binding_outcomes(failed, 35, 40, message, 0, {})
    assert gate["passed"] and not carried["passed"]
    args = reading_inputs(_posteriors(H2="supported"), _record(binding_in_context=carried))
    args.pop("in_context")
    assert fear_assets.section8_reading(**args).code == "NO_READING_BINDING_FAILED"
    # A record without the in-context outcome is an error that says what to re-run.
    with pytest.raises(FearAssetsError, match="re-materialise registration_record"):
        reading_inputs(_posteriors(H2="supported"), _record(binding_in_context=None))
    # The check: a shortfall stops (ERROR); the in-context rate alone is a warning, carried.
    # A gate stops only once the family's record is issued, so the family here is registered.
    registered_family = issued_protocol(tmp_path / "registration", "fam")
    table = pd.DataFrame([{"family": "fam", "item_id": "TER-01", "passes": True, "in_context_passed": False,
                           "in_context_message": message, "in_context_correct": 35, "in_context_documents": 40,
                           "frames_to_write": json.dumps({})}])
    result = binding_gate(None, protocol=registered_family, binding_results=table)
    assert not result.passed and result.severity == dg.AssetCheckSeverity.WARN
    shortfall = table.assign(in_context_passed=True, frames_to_write=json.dumps({"termination": 1}))
    result = binding_gate(None, protocol=registered_family, binding_results=shortfall)
    assert not result.passed and result.severity == dg.AssetCheckSeverity.ERROR
    # In pilot mode (no issued record) the same shortfall is advisory: reported, never a stop.
    pilot = ProtocolResource(registration_dir=str(tmp_path / "pilot"))
    result = binding_gate(None, protocol=pilot, binding_results=shortfall)
    assert not result.passed and result.severity == dg.AssetCheckSeverity.WARN


# -- 6. the depth band reads the resolved mention; refusals stay out of the rate ---------------
def _reports() -> pd.DataFrame:
    """Partner reports at two depths. d1: 4 mentions that only the scorer and the stem pass
    see ("meetings" for "meeting"), 4 plain non-mentions, 2 refusals. d2: 9 keyword mentions,
    1 non-mention."""
    keywords = ["Room 3", "weekly planning meeting"]
    rows = []
    def add(depth, text, rule, scorer):
        n = len(rows)
        rows.append({"trial_id": f"t{n}", "depth": depth, "side": "partner", "generated_text": text,
                     "keywords": keywords, "rule": rule, "scorer": scorer})
    for _ in range(4):
        add("d1", "The weekly planning meetings moved.", False, True)
    for _ in range(4):
        add("d1", "Nothing to report.", False, False)
    for _ in range(2):
        add("d1", "I'm sorry, I cannot help with that.", None, None)
    for _ in range(9):
        add("d2", "The weekly planning meeting moved to Room 3.", True, True)
    add("d2", "Nothing.", False, False)
    return score_reports(pd.DataFrame(rows), REFUSALS)


def test_audit_depth_band_reads_resolved_mentions_and_leaves_refusals_out(settings):
    rates = neutral_mention_rates(_reports()).set_index("depth_index")
    assert rates.loc[1, "refusals"] == 2 and rates.loc[1, "mentions"] == 4
    assert rates.loc[1, "neutral_mention_rate"] == pytest.approx(0.5)  # 4 / 8 answers; keyword rule alone: 0 / 10
    assert rates.loc[2, "neutral_mention_rate"] == pytest.approx(0.9)
    rule = settings.depth_band_rule
    band, _ = depth_band(rates["neutral_mention_rate"].to_dict(), rule.neutral_mention_low,
                         rule.neutral_mention_high, rule.min_depths, rule.fallback_target)
    assert band == [1, 2]  # fallback: only d1 in 0.2-0.8; the two closest to 0.5
    # The asset reads report_scoring's resolved outcome (the keyword rule alone would give d1 0%).
    scores = pd.DataFrame([{"block": "pilot_primary", "depth": d, "trial_id": f"s{d}{i}", "fc_correct": i % 2 == 0,
                            # 4.8's exclusion flags, which every stored scores table carries
                            "excluded_context": False, "generation_truncated": False}
                           for d in ("d1", "d2") for i in range(10)])
    out = pilot_depths(context=dg.build_asset_context(partition_key="smollm2-135m"), protocol=ProtocolResource(),
                       pilot_scores=scores, report_scoring=_reports())
    table = out.value.set_index("depth")
    assert table.loc["d1", "neutral_mention_rate"] == pytest.approx(0.5) and table.loc["d1", "refusals"] == 2
    # All refusals at a depth: no rate there, and a band cannot then be formed from one depth.
    all_refused = neutral_mention_rates(_reports().assign(category="refusal"))
    assert all_refused["neutral_mention_rate"].isna().all()
    with pytest.raises(FearAssetsError, match="needs 2"):
        depth_band({1: float("nan"), 2: 0.5}, 0.2, 0.8, 2, 0.5)


# -- 9. the power gate: flagged until it runs; confirmatory mode does not register without it --
def test_audit_power_gate_not_run_is_flagged_and_blocks_registration(tmp_path):
    for h2, controls, binding in itertools.product(LABELS, (False, True), (False, True)):
        r = fear_assets.section8_reading(h2, "supported", "supported", "supported", "supported", controls, binding,
                                         None, h2_meaningful=True)
        assert POWER_GATE_NOT_RUN in r.flags
    assert not fear_assets.section8_reading("supported", "supported", "supported", "supported", "supported",
                                            False, False, False, h2_meaningful=True).flags
    # No stored power result: gates_underpowered is unknown (None), never a hard-coded False.
    table = _posteriors(H2="supported", H5="supported", a="supported", b="supported", c="supported")
    assert reading_inputs(table, _record())["gates_underpowered"] is None
    # A stored power result supplies it: gates underpowered -> row 7.
    args = reading_inputs(table, _record(power=REGISTERED_POWER | {"gates_underpowered": True}))
    args.pop("in_context")
    reading = fear_assets.section8_reading(**args)
    assert reading.code == "SELF_THREAT_WEIGHT_GATES_UNDERPOWERED" and not reading.flags
    with pytest.raises(FearAssetsError, match="power.gates_underpowered"):
        reading_inputs(table, _record(power={"demo": False, "status": "complete", "targets": "met"}))
    # The registration gate fails and says what to run; a confirmatory record is then refused.
    gate = power_gate(None, "qwen2.5-7b")
    assert not gate["passed"] and "materialise power_summary for qwen2.5-7b" in gate["message"]
    assert power_gate(REGISTERED_POWER | {"gates_underpowered": False}, "qwen2.5-7b")["passed"]
    assert registration_status("confirmatory", ["power (6.3)"]) == "refused"
    assert registration_status("confirmatory", []) == "registered"
    assert registration_status("pilot", ["power (6.3)"]) == "draft"
    check = registration_gates(None, protocol=ProtocolResource(), registration_record=pd.DataFrame([{"gate": "power (6.3)", "passed": False,
                                                                  "numbers": "{}", "message": gate["message"]}]))
    fix = check.metadata["gate table"].value.records[0].data["fix"]
    assert not check.passed and "power (6.3)" in check.description and "power_summary" in fix
    # A registered record is never replaced by a refused one.
    write_family_record(tmp_path, _record(status="registered", mode="confirmatory",
                                          power=REGISTERED_POWER | {"gates_underpowered": False}), confirmatory=True)
    with pytest.raises(FreezeError, match="never replaced"):
        write_family_record(tmp_path, _record(status="refused", mode="confirmatory", failed_gates=["power (6.3)"]),
                            confirmatory=True)
    assert read_family_record(tmp_path, "fam")["status"] == "registered"
    assert "Power simulation (6.3): **not run**" in markdown(_record())


def test_audit_power_refused_record_does_not_freeze_the_next_run(tmp_path):
    """After a refused registration (e.g. no power result) the fix changes inputs; the freeze
    check then warns against the refused record instead of blocking the re-run. A registered
    record still blocks."""
    from fear_assets.defs.assets.pilot.surprisal import matches_registration_record

    manifest = pd.DataFrame([{"family": "fam", "role": "tested", "checkpoint": "x", "file": "f", "sha256": "0" * 64,
                              "dtype": "float32", "context_window": 8192, "attn_implementation": "eager"}])
    protocol = ProtocolResource(registration_dir=str(tmp_path))
    write_family_record(tmp_path, _record(status="refused", mode="confirmatory"), confirmatory=True)
    result = matches_registration_record(None, protocol=protocol, model_manifest=manifest)
    assert not result.passed and result.severity == dg.AssetCheckSeverity.WARN
    write_family_record(tmp_path, _record(status="registered", mode="confirmatory"), confirmatory=True)
    result = matches_registration_record(None, protocol=protocol, model_manifest=manifest)
    assert not result.passed and result.severity == dg.AssetCheckSeverity.ERROR


def _reading_context(**labels):
    posteriors = _posteriors(**labels).assign(failed_gates="", rhat=1.0)
    record = _record()
    reg = pd.DataFrame([{"record_json": json.dumps(record)}])
    return section8_reading_asset(context=dg.build_asset_context(partition_key="qwen2.5-7b"),
                                  posteriors=posteriors, registration_record=reg)


def test_audit_power_gate_not_run_reaches_the_reading_asset():
    out = _reading_context(H2="supported", H5="supported", a="supported", b="supported", c="supported").value.iloc[0]
    assert POWER_GATE_NOT_RUN in out["flags"] and out["gates_underpowered"] == "not run"
    out = _reading_context(H2="supported", H5="supported", a="supported", c="supported").value.iloc[0]
    assert out["row"] == 9 and out["gate_b"] == "not_scored" and out["gates_not_scored"] == "b"


# -- minor: the cross-family statement leaves out descriptive-only families --------------------
def test_audit_cross_family_statement_excludes_descriptive_families():
    registered = ["qwen2.5-7b", "llama-3.1-8b", "gemma-2-9b"]
    readings = pd.DataFrame([{"family": "qwen2.5-7b", "h2": "supported", "row": 10},
                             {"family": "llama-3.1-8b", "h2": "supported", "row": 9},
                             {"family": "gemma-2-9b", "h2": "supported", "row": 1}])
    result = cross_family_statement(readings, registered)
    assert result.statement.startswith("no general statement") and result.descriptive == {"gemma-2-9b": 1}
    assert "gemma-2-9b" not in result.labels
    result = cross_family_statement(readings.assign(row=[10, 2, 9]), registered)
    assert result.statement.startswith("no general statement") and "H2-H5 uninterpretable" in result.statement
    result = cross_family_statement(readings.assign(row=[10, 9, 12]), registered)
    assert result.statement.startswith("H2 is supported in all 3 families")
    # The embedded family never counts, and a missing family blocks the statement.
    result = cross_family_statement(pd.DataFrame([{"family": "smollm2-135m", "h2": "supported", "row": 10}]),
                                    registered)
    assert result.missing == registered


# -- minor: convergence blocks only on the estimands that can change the reading ---------------
def test_audit_posteriors_converged_blocks_on_confirmatory_estimands_only(tmp_path):
    def row(contrast, kind, problems):
        return {"contrast": contrast, "kind": kind, "status": "estimated", "rhat": 1.0, "ess_bulk": 900.0,
                "ess_tail": 900.0, "divergences": 0, "convergence_problems": problems}
    secondary = pd.DataFrame([row("H2", "confirmatory", ""), row("H2_role_play", "secondary", "R-hat 1.050 > 1.01"),
                              row("H2_summed_logprob", "sensitivity", "bulk ESS 90 < 400")]).assign(family="fam")
    # The family is registered: a blocking verdict is an ERROR only then (pilot mode: WARN, below).
    registered_family = issued_protocol(tmp_path / "registration", "fam")
    result = posteriors_converged(None, protocol=registered_family, posteriors=secondary)
    assert not result.passed and result.severity == dg.AssetCheckSeverity.WARN
    assert "H2_role_play" in result.description and "cannot change the reading" in result.description
    for kind, name in (("confirmatory", "H5"), ("gate", "gate_b_recall_H2"), ("control", "control_marked_priority")):
        table = pd.concat([secondary, pd.DataFrame([row(name, kind, "3 divergences")])], ignore_index=True)
        result = posteriors_converged(None, protocol=registered_family, posteriors=table)
        assert not result.passed and result.severity == dg.AssetCheckSeverity.ERROR and name in result.description
        pilot = posteriors_converged(None, protocol=ProtocolResource(registration_dir=str(tmp_path / "pilot")),
                                     posteriors=table)
        assert not pilot.passed and pilot.severity == dg.AssetCheckSeverity.WARN


# -- minor: the zero-preference averaging is stated as a deviation in the record ---------------
def test_audit_zero_preference_deviation_is_in_the_record(settings, tmp_path):
    band = settings.zero_preference
    listed = deviations(float(band.low), float(band.high))
    entry = next(d for d in listed if d["section"].startswith("4.3 zero preference"))
    assert "0.4-0.6" in entry["protocol"] and "two listing orders" in entry["implemented"] and entry["why"]
    path = write_family_record(tmp_path, _record(deviations=listed), confirmatory=False)
    assert json.loads(path.read_text())["deviations"] == listed
    md = (tmp_path / "fam" / "registration_record.md").read_text()
    assert "## Deviations from the protocol's wording" in md and "| 4.3 zero preference |" in md
